"""The warp-specialized fine-stage forward (`vsagen.kernels.bsa_forward_ws`) on the lent GPU (sm_90; not a test).

1. Correctness: small odd layouts (partial tiles, batch 2, D 64 and 128, bf16 and fp16, empty rows) against a
   float64 reference; at full size (the Wan2.1-1.3B grid, every tile volume, coarse-stage lists at 87.5% sparsity)
   against float64 and beside the pipelined kernel; the backward through `block_sparse_attention` with the
   warp-specialized forward against the one with the pipelined forward.
2. Kernel times: dense SDPA, the pipelined forward and the warp-specialized one on the same lists, per tile volume,
   on the models' grids and on grids of whole cubes.
3. The DiT (random weights, eager, bf16, one transformer call at 480x832x81 for 1.3B, 720x1280x81 for 14B): `full`,
   `vsa` with its default tuning (the warp-specialized forward where `ws_forward_pays`), and `vsa` with the same
   tuning passed as an option (which keeps the pipelined forward), in one process.

Usage (from the repository root, on the GPU): python3 benchmarks/fwd_ws.py [--shapes 1.3b,14b] [--dit 1.3b]
    [--skip-check]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import torch

from vsagen.attention.shared import kernel_lists
from vsagen.bench import SHAPES, AttentionShape, bench_ms, make_inputs, rel_l2
from vsagen.kernels import reference as ref
from vsagen.kernels.block_sparse_attn import block_sparse_attention
from vsagen.kernels.bsa_forward import bsa_fwd
from vsagen.kernels.bsa_forward_ws import bsa_fwd_ws, ws_unsupported
from vsagen.kernels.coarse import coarse_stage
from vsagen.kernels.tuning import kernel_tuning
from vsagen.layout import parse_tile, tile_layout

TILES = ("4x4x4", "4x4x8", "4x8x8")
DEV = "cuda"  # where everything runs (a CPU dry run of the script's own code sets "cpu")


def _lists(q, k, lay, sparsity=0.875):
    c = coarse_stage(q, k, lay.tile_offsets_i32, ref.top_k_from_sparsity(sparsity, lay.num_tiles))
    return c, kernel_lists(lay, c.q2k, c.q2k_cnt)


def _fp64(q, k, v, lay, c, empty=None):
    """VSA's fine stage in float64 on the coarse stage's cube lists (every row holds top-k cubes), with the rows
    of the `empty` (batch, head, query cube) entries zeroed and their lse -inf (lists emptied by the caller)."""
    assert bool((c.q2k_cnt == c.q2k.shape[-1]).all())
    out, lse = ref.block_sparse_attention_reference(*(x.double() for x in (q, k, v)), c.q2k.long(), lay.slots,
                                                    lay.slot_valid)
    if empty is not None:
        for (b, h, cube) in empty:
            rows = lay.token_tile == cube
            out[b, rows, h] = 0
            lse[b, h, rows] = float("-inf")
    return out, lse


def check_small() -> bool:
    ok = True
    for grid, tile, b, h, d, dtype in (((5, 6, 7), "4x4x4", 2, 3, 64, torch.bfloat16),
                                       ((6, 10, 9), "4x4x8", 2, 2, 128, torch.float16),
                                       ((5, 9, 17), "4x8x8", 1, 2, 128, torch.bfloat16),
                                       ((8, 8, 16), "4x4x4", 2, 2, 128, torch.bfloat16)):
        lay = tile_layout(grid, parse_tile(tile), device=DEV)
        g = torch.Generator(device=DEV).manual_seed(11)
        q, k, v = (torch.randn(b, lay.num_tokens, h, d, device=DEV, generator=g).to(dtype) for _ in range(3))
        c, (lists, counts, off) = _lists(q, k, lay, sparsity=0.6)
        # an empty row (cube 1 of batch 0, head 0): zero its count on each of the cube's kernel tiles
        first, n = int(lay.tile_kernel_first[1]), int(lay.tile_kernel_count[1])
        counts = counts.clone()
        counts[0, 0, first:first + n] = 0
        out, lse = bsa_fwd_ws(q, k, v, lists, counts, off)
        want, want_lse = _fp64(q, k, v, lay, c, empty=[(0, 0, 1)])
        fin = torch.isfinite(want_lse)
        e_out, e_lse = rel_l2(out, want), rel_l2(lse[fin], want_lse[fin])
        good = e_out < 1e-2 and e_lse < 1e-4 and torch.equal(torch.isfinite(lse), fin) and bool(out.isfinite().all())
        ok &= good
        print(f"small {grid} {tile} B={b} H={h} D={d} {str(dtype)[6:]}: out rel {e_out:.1e}, lse rel {e_lse:.1e}, "
              f"empty rows {'ok' if torch.equal(torch.isfinite(lse), fin) else 'WRONG'}: {'ok' if good else 'FAIL'}")
    return ok


def check_full(shape: AttentionShape) -> bool:
    ok = True
    q, k, v = make_inputs(shape, seed=4, device=DEV)
    for tile in TILES:
        lay = tile_layout(shape.grid, parse_tile(tile), device=DEV)
        c, (lists, counts, off) = _lists(q, k, lay)
        out, lse = bsa_fwd_ws(q, k, v, lists, counts, off)
        pipe, pipe_lse = bsa_fwd(q, k, v, lists, counts, off)
        want, _ = _fp64(q, k, v, lay, c)
        e_ws, e_pipe = rel_l2(out, want), rel_l2(pipe, want)
        good = e_ws < 1e-2 and e_ws < 1.5 * e_pipe + 1e-4 and rel_l2(lse, pipe_lse) < 1e-5
        # the backward of `block_sparse_attention` with each forward (the same kernels; out / lse from each)
        tuning = kernel_tuning(q.device, shape.head_dim)
        grads = []
        for t in (tuning, dataclasses.replace(tuning, fwd_warp_specialized=True)):
            xs = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
            o, _ = block_sparse_attention(*xs, lists, counts, off, tuning=t)
            o.float().square().sum().backward()
            grads.append([x.grad for x in xs])
        e_grad = max(rel_l2(a, b) for a, b in zip(*grads))
        good &= e_grad < 1e-2
        ok &= good
        print(f"full {shape.name} {tile}: out rel vs float64 ws {e_ws:.2e} pipelined {e_pipe:.2e}; lse ws vs "
              f"pipelined {rel_l2(lse, pipe_lse):.1e}; grads ws-forward vs pipelined-forward {e_grad:.1e}: "
              f"{'ok' if good else 'FAIL'}")
        del grads
    return ok


def kernel_times(shape: AttentionShape) -> None:
    q, k, v = make_inputs(shape, seed=4, device=DEV)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    dense = bench_ms(lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt))
    print(f"| {shape.name} {shape.grid} | dense SDPA | {dense:.3f} | | |")
    for tile in TILES:
        lay = tile_layout(shape.grid, parse_tile(tile), device=DEV)
        _, (lists, counts, off) = _lists(q, k, lay)
        t_pipe = bench_ms(lambda: bsa_fwd(q, k, v, lists, counts, off))
        t_ws = bench_ms(lambda: bsa_fwd_ws(q, k, v, lists, counts, off))
        print(f"| {shape.name} {shape.grid} | {tile} | {t_pipe:.3f} ({dense / t_pipe:.2f}x) | "
              f"{t_ws:.3f} ({dense / t_ws:.2f}x) | {t_pipe / t_ws:.3f} |", flush=True)


def _whole(shape: AttentionShape) -> AttentionShape:
    grid = tuple(-(-g // m) * m for g, m in zip(shape.grid, (4, 8, 8)))
    return AttentionShape(shape.name + " whole", grid, shape.heads, shape.head_dim)


def _sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


DIT = {"1.3b": ("wan2.1-t2v-1.3b", (21, 60, 104), 3), "14b": ("wan2.1-t2v-14b", (21, 90, 160), 2)}


def dit(key: str) -> None:
    """One transformer call per variant after 1 warm-up: the median of 3 (1.3B) or the mean of 2 (14B), host clock
    around a synchronized call."""
    import vsagen
    from diffusers import WanTransformer3DModel

    from vsagen.models.presets import load_preset

    name, latent, timed = DIT[key]
    preset = load_preset(name)
    t0 = time.perf_counter()
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bf16: the 14B in float32 first would not fit an 80 GB GPU
    try:
        with torch.device(DEV):
            model = WanTransformer3DModel(**preset.transformer).eval()
    finally:
        torch.set_default_dtype(default)
    print(f"DiT {name}: built in {time.perf_counter() - t0:.0f} s, {next(model.parameters()).dtype}", flush=True)
    g = torch.Generator(device=DEV).manual_seed(0)
    x = torch.randn(1, model.config.in_channels, *latent, device=DEV, generator=g, dtype=torch.bfloat16)
    text = torch.randn(1, 512, model.config.text_dim, device=DEV, generator=g, dtype=torch.bfloat16)
    step = torch.tensor([500.0], device=DEV)
    grid = (latent[0], latent[1] // 2, latent[2] // 2)
    sm90 = kernel_tuning(DEV, 128)
    variants = [("full", "full", {}), ("vsa tile=4x8x8, default tuning", "vsa", {"tile": "4x8x8"}),
                ("vsa tile=4x8x8, the same tuning as an option", "vsa", {"tile": "4x8x8", "tuning": sm90})]
    base = None
    for label, backend, options in variants:
        applied = vsagen.apply(model, backend, grid=grid, **options)
        times = []
        with torch.no_grad():
            for i in range(1 + timed):
                _sync()
                start = time.perf_counter()
                model(hidden_states=x, timestep=step, encoder_hidden_states=text, return_dict=False)
                _sync()
                if i:
                    times.append(time.perf_counter() - start)
        sec = sorted(times)[(timed - 1) // 2] if timed % 2 else sum(times) / timed
        base = base or sec
        info = applied.backend.describe(torch.device(DEV)) if hasattr(applied, "backend") else {}
        ran = {k: info[k] for k in ("impl_ran", "fine_kernel") if k in info}
        print(f"| {name} | {label} | {sec:.4f} | {base / sec:.2f}x | {ran} |", flush=True)
        applied.remove()
    del model
    torch.cuda.empty_cache()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="1.3b,14b")
    ap.add_argument("--dit", default="1.3b", help="comma list of 1.3b / 14b, or none")
    ap.add_argument("--skip-check", action="store_true")
    a = ap.parse_args(argv)
    import triton

    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    probe = torch.empty(1, 64, 1, 128, device=DEV, dtype=torch.bfloat16)
    why = ws_unsupported(probe, probe, probe)
    if why:
        print(f"the warp-specialized forward cannot run here: {why}")
        return 1
    ok = True
    if not a.skip_check:
        ok &= check_small()
        ok &= check_full(SHAPES["1.3b"])
    print("| grid | tile | pipelined ms (vs dense) | warp-specialized ms (vs dense) | ws speed-up |")
    print("|---|---|---|---|---|")
    for key in a.shapes.split(","):
        for shape in (SHAPES[key], _whole(SHAPES[key])):
            kernel_times(shape)
    if a.dit != "none":
        print("| model | attention | s per transformer call | vs full | ran |")
        print("|---|---|---|---|---|")
        for key in a.dit.split(","):
            dit(key)
    print("all checks passed" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
