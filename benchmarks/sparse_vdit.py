"""`sparse-vdit` on the lent GPU (not a test): each pattern's attention time against dense cuDNN, and a pattern file.

1. Correctness at full size: for each mode of `vsagen.sparsity.patterns.default_catalog()` (all heads one mode)
   and for a mixed layer (heads cycling through the modes, one launch), the backend's Triton output of two heads
   against the masked float32 reference (`sparse_vdit.masked_attention`, the mask from the tile grid); on a
   smaller grid the q / k / v gradients of the mixed layer against the reference's autograd.
2. Timings (`vsagen.bench.bench_ms` medians, ms) at each shape: SDPA cuDNN forward and forward+backward, then each
   mode through `SparseVDiTAttention.attend` (its one block-sparse launch; all-dense runs SDPA, all-skip nothing),
   the mixed layer, and with `--file`, every layer of a pattern file (summed over the layers, against cuDNN times
   the layer count). Each row: block density, token density, speed-up against cuDNN of the same run, the ideal
   1 / token density, and their ratio (the issue's target: >= 0.8). `--both`: every layer also with the backend's
   `sdpa_heads` option off (every head in the block-sparse kernel).
3. `--sweep`: forward and backward launch tables of the kernels for two layers (multi-diagonal, the mixed layer).
4. `--write-file PATH`: a hand-written pattern file for the Wan2.1-1.3B architecture at 480x832x81 (30 layers x
   12 heads, modes rotating across layers), about 31% block density, for `vsagen profile`'s DiT speed-up (random
   weights make searched modes meaningless; this file is written by hand and says so in its model field);
   with `--sparse`, about 22% block density.

Usage: python benchmarks/sparse_vdit.py [--shapes 1.3b,5b,14b] [--file patterns.json] [--no-check] [--no-time]
       [--sweep] [--both] [--json out.json]
       python benchmarks/sparse_vdit.py --write-file patterns.json [--sparse]
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from vsagen.attention import shared
from vsagen.attention.sparse_vdit import SparseVDiTAttention, SparseVDiTOptions, masked_attention
from vsagen.bench import SHAPES, AttentionShape, bench_ms, rel_l2, sdpa
from vsagen.layout import tile_layout
from vsagen.sparsity.files import PatternFile, StepRange, load_patterns, save_patterns
from vsagen.sparsity.patterns import block_density, block_map, default_catalog, token_density

DEFAULT_LAUNCH = dict(shared.QUERY_LAUNCH)

# Heads of one layer of the hand-written 1.3B file (12 heads), rotated by one head per layer.
HAND_LAYER = ("dense", "dense", "mixed", "mixed", "vertical-stripe", "vertical-stripe", "multi-diagonal",
              "multi-diagonal", "multi-diagonal", "multi-diagonal", "diagonal", "skip")


# A sparser layer (about 22% block density): dense 1, mixed 1, vertical-stripe 2, multi-diagonal 4, diagonal 3, skip 1.
HAND_LAYER_SPARSE = ("dense", "mixed", "vertical-stripe", "vertical-stripe", "multi-diagonal", "multi-diagonal",
                     "multi-diagonal", "multi-diagonal", "diagonal", "diagonal", "diagonal", "skip")


def write_file(path: str, sparse: bool = False) -> None:
    modes = {p.name: p for p in default_catalog()}
    heads = HAND_LAYER_SPARSE if sparse else HAND_LAYER
    layers = tuple(tuple(heads[(h + i) % 12] for h in range(12)) for i in range(30))
    pf = PatternFile(model="wan2.1-t2v-1.3b (written by hand for timing, not searched)",
                     architecture={"layers": 30, "heads": 12, "head_dim": 128, "in_channels": 16, "ffn_dim": 8960,
                                   "patch_size": [1, 2, 2]},
                     experts=("transformer",), height=480, width=832, frames=81, grid=(21, 30, 52), steps=50,
                     lam=0.0, eps=0.0, prompts=0, modes=modes, ranges=(StepRange(0, 50, {"transformer": layers}),))
    save_patterns(pf, path, overwrite=True)
    print(f"wrote {path}: block density {pf.density():.4f}, modes {pf.mode_counts()}")


def backend(tuning=None, query_block: int | None = None, sdpa_heads: bool = True) -> SparseVDiTAttention:
    """The backend without a file (`attend` takes the modes directly), with `tuning` (None: the defaults),
    `query_block` (None: the default) and `sdpa_heads` (the option)."""
    kw = {} if query_block is None else dict(query_block=query_block)
    return SparseVDiTAttention(SparseVDiTOptions(tuning=tuning, sdpa_heads=sdpa_heads, **kw))


# --sweep: the forward per query tile (query_block 0) and over query groups of 64 / 128 rows with their launches
# (block_m, num_warps, num_stages), then the backward's launch tables (dQ, dK/dV).
FWD_SWEEP = {"per tile (64,4,3)": (0, None), "groups 64 (4,3)": (64, (64, 4, 3)), "groups 64 (4,2)": (64, (64, 4, 2)),
             "groups 128 (8,3)": (128, (128, 8, 3)), "groups 128 (8,2)": (128, (128, 8, 2)),
             "groups 128 (4,3)": (128, (128, 4, 3)), "groups 128 (8,4)": (128, (128, 8, 4))}
# fwd+bwd: (query_block, dQ launch over the groups, or None: per tile's tables) with the best forward per block
BWD_SWEEP = {"per tile": (0, None), "groups 64, dq (4,3)": (64, (64, 4, 3)), "groups 64, dq (4,2)": (64, (64, 4, 2)),
             "groups 128, dq (8,2)": (128, (128, 8, 2)), "groups 128, dq (8,3)": (128, (128, 8, 3)),
             "groups 128, dq (8,1)": (128, (128, 8, 1)), "groups 128, dq (4,2)": (128, (128, 4, 2))}


def sweep(shape: AttentionShape, layers: dict, rows: list) -> None:
    layout = tile_layout(shape.grid, device="cuda")
    q, k, v = inputs(shape, 0)
    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
    do = torch.randn_like(q)
    print(f"\nsweep at {shape.name} (ms)", flush=True)
    for name in ("diagonal", "multi-diagonal", "vertical-stripe", "mixed layer"):
        modes = layers[name]
        best: dict[int, tuple[float, tuple]] = {}
        for label, (qb, launch) in FWD_SWEEP.items():
            if launch is not None:
                shared.QUERY_LAUNCH[qb] = launch + DEFAULT_LAUNCH[qb][3:]  # the benchmark's override
            be = SparseVDiTAttention(SparseVDiTOptions(query_block=qb))
            with torch.no_grad():
                ms = bench_ms(lambda: be.attend(q, k, v, modes, layout))
            if launch is not None and ms < best.get(qb, (float("inf"),))[0]:
                best[qb] = (ms, launch)
            rows.append({"sweep": "fwd", "mode": name, "variant": label, "ms": ms})
            print(f"  fwd {name:16s} {label:26s} {ms:8.3f}", flush=True)
        for label, (qb, launch) in BWD_SWEEP.items():
            if launch is not None:
                shared.QUERY_LAUNCH[qb] = best[qb][1] + launch
            be = SparseVDiTAttention(SparseVDiTOptions(query_block=qb))

            def run():
                for x in (qg, kg, vg):
                    x.grad = None
                be.attend(qg, kg, vg, modes, layout).backward(do)
            ms = bench_ms(run)
            rows.append({"sweep": "fwd+bwd", "mode": name, "variant": label, "ms": ms})
            print(f"  fwd+bwd {name:12s} {label:26s} {ms:8.3f}", flush=True)
        shared.QUERY_LAUNCH.update(DEFAULT_LAUNCH)


def inputs(shape: AttentionShape, seed: int, grad: bool = False) -> list[torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn((1, shape.tokens, shape.heads, shape.head_dim), generator=g, device="cuda",
                        dtype=torch.bfloat16).requires_grad_(grad) for _ in range(3)]


def reference(q, k, v, modes, layout, heads):
    """Float32 masked attention of the listed heads."""
    tt = layout.token_tile
    outs = []
    for h in heads:
        mask = block_map(modes[h], layout.tiles_per_dim, "cuda")[tt][:, tt][None]
        outs.append(masked_attention(q[:, :, h:h + 1].float(), k[:, :, h:h + 1].float(), v[:, :, h:h + 1].float(),
                                     mask))
    return torch.cat(outs, dim=2)


def check(shape: AttentionShape, layers: dict, rows: list) -> None:
    layout = tile_layout(shape.grid, device="cuda")
    q, k, v = inputs(shape, 1)
    be = backend()
    for name, modes in layers.items():
        with torch.no_grad():
            out = be.attend(q, k, v, modes, layout)
            heads = [0, shape.heads // 2]
            ref = reference(q, k, v, modes, layout, heads)
            err = rel_l2(out[:, :, heads].float(), ref) if ref.abs().sum() > 0 else float(out[:, :, heads].abs().max())
        rows.append({"check": f"{shape.name} {name} fwd heads {heads}", "rel_l2": err})
        print(f"check {name:16s} fwd rel L2 {err:.2e}", flush=True)
    small = AttentionShape("small", (9, 14, 22), shape.heads)
    lay = tile_layout(small.grid, device="cuda")
    q, k, v = inputs(small, 2, grad=True)
    modes = layers["mixed layer"]
    out = be.attend(q, k, v, modes, lay)
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), do)
    qf, kf, vf = (x.detach().float().requires_grad_() for x in (q, k, v))
    ref = reference(qf, kf, vf, modes, lay, range(small.heads))
    rgrads = torch.autograd.grad(ref, (qf, kf, vf), do.float())
    for n, a, b in zip("qkv", grads, rgrads):
        err = rel_l2(a.float(), b)
        rows.append({"check": f"small {small.grid} mixed layer d{n}", "rel_l2": err})
        print(f"check mixed layer d{n} (grid {small.grid}) rel L2 {err:.2e}", flush=True)


def time_shape(shape: AttentionShape, layers: dict, rows: list, pattern_file: PatternFile | None,
               variants: tuple[bool, ...] = (True,)) -> None:
    """Time every layer and the file under each `variants` value of the sdpa_heads option."""
    layout = tile_layout(shape.grid, device="cuda")
    q, k, v = inputs(shape, 0)
    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
    do = torch.randn_like(q)
    from torch.nn.attention import SDPBackend

    def fwd(f):
        def run():
            with torch.no_grad():
                return f(q, k, v)
        return run

    def fb(f):
        def run():
            for x in (qg, kg, vg):
                x.grad = None
            f(qg, kg, vg).backward(do)
        return run

    def cudnn(a, b, c):
        return sdpa(a, b, c, SDPBackend.CUDNN_ATTENTION)

    base_f, base_fb = bench_ms(fwd(cudnn)), bench_ms(fb(cudnn))
    print(f"\n{shape.name}: cuDNN fwd {base_f:.3f} ms, fwd+bwd {base_fb:.3f} ms", flush=True)
    sizes = layout.tile_sizes
    tiles = layout.tiles_per_dim

    def add(name, ms_f, ms_fb, bd, td, layers=1):  # against `layers` x cuDNN
        base = (layers * base_f, layers * base_fb)
        ideal = 1.0 / td if td > 0 else float("inf")
        row = {"shape": shape.name, "mode": name, "block_density": bd, "token_density": td,
               "fwd_ms": ms_f, "fwd_bwd_ms": ms_fb, "x_cudnn_fwd": base[0] / ms_f, "x_cudnn_fwd_bwd": base[1] / ms_fb,
               "ideal": ideal, "of_ideal_fwd": base[0] / ms_f / ideal, "of_ideal_fwd_bwd": base[1] / ms_fb / ideal}
        rows.append(row)
        print(f"  {name:18s} block {bd:6.1%} token {td:6.1%} fwd {ms_f:8.3f} ms ({row['x_cudnn_fwd']:6.2f}x, "
              f"{row['of_ideal_fwd']:.2f} of ideal {ideal:.2f}x)  fwd+bwd {ms_fb:8.3f} ms "
              f"({row['x_cudnn_fwd_bwd']:6.2f}x, {row['of_ideal_fwd_bwd']:.2f} of ideal)", flush=True)

    for sdpa_heads in variants:
        _time_layers(shape, layers, layout, pattern_file, backend(sdpa_heads=sdpa_heads), fwd, fb, add,
                     "" if variants == (True,) else (" [sdpa heads]" if sdpa_heads else " [kernel only]"))


def _time_layers(shape, layers, layout, pattern_file, be, fwd, fb, add, suffix) -> None:
    sizes = layout.tile_sizes
    tiles = layout.tiles_per_dim
    for name, modes in layers.items():
        if all(p.kind == "skip" for p in modes):
            continue
        call = (lambda a, b, c, m=modes: be.attend(a, b, c, m, layout))
        bd = sum(block_density(p, tiles) for p in modes) / len(modes)
        td = sum(token_density(p, sizes, tiles) for p in modes) / len(modes)
        add(name + suffix, bench_ms(fwd(call)), bench_ms(fb(call)), bd, td)
    if pattern_file is not None and tuple(pattern_file.grid) == tuple(shape.grid):
        per_layer = [pattern_file.layer_modes(pattern_file.experts[0], i) for i in range(len(
            pattern_file.ranges[0].heads[pattern_file.experts[0]]))]

        def whole(a, b, c):
            out = None
            for modes in per_layer:
                o = be.attend(a, b, c, modes, layout)
                out = o if out is None else out + o
            return out

        n = len(per_layer)
        bd = sum(block_density(p, tiles) for m in per_layer for p in m) / (n * shape.heads)
        td = sum(token_density(p, sizes, tiles) for m in per_layer for p in m) / (n * shape.heads)
        add(f"file ({n} layers){suffix}", bench_ms(fwd(whole), rep_ms=1000), bench_ms(fb(whole), rep_ms=1000), bd,
            td, layers=n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1.3b")
    ap.add_argument("--file", default=None)
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--no-time", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--write-file", default=None)
    ap.add_argument("--sparse", action="store_true", help="with --write-file: the ~22%% density layer")
    ap.add_argument("--both", action="store_true",
                    help="time every layer with the sdpa_heads option on and off (default: on only)")
    a = ap.parse_args()
    if a.write_file:
        write_file(a.write_file, a.sparse)
        return
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    pattern_file = load_patterns(a.file) if a.file else None
    rows: list = []
    catalog = default_catalog()
    for key in a.shapes.split(","):
        shape = SHAPES[key]
        layers = {p.name: (p,) * shape.heads for p in catalog}
        layers["mixed layer"] = tuple(catalog[h % len(catalog)] for h in range(shape.heads))
        if shape.heads == len(HAND_LAYER):
            by_name = {p.name: p for p in catalog}
            layers["hand-written layer"] = tuple(by_name[n] for n in HAND_LAYER)
        if not a.no_check:
            check(shape, layers, rows)
        if not a.no_time:
            time_shape(shape, layers, rows, pattern_file, (True, False) if a.both else (True,))
        if a.sweep:
            sweep(shape, layers, rows)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
