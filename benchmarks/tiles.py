"""Issue 33 on the lent GPU (not a test): VSA at tile volumes 64 / 128 / 256, vsagen's kernels, FA4's and FastVideo's.

For each shape (default the Wan2.1-1.3B 480p and 14B 720p problems, B=1, D=128, bf16):
* the whole backend (coarse + fine stage, as `vsagen profile --kernels` times it), per variant:
    vsa tile=4x4x4                       (VSA's paper tile; the Triton fine stage)
    vsa tile=4x4x8 / 4x8x8, query_rows 64    (the cube's 64-token kernel tiles, one program each)
    vsa tile=4x4x8 / 4x8x8, query_rows 128   (one program per 128 rows of a cube)
    vsa tile=4x4x8 / 4x8x8, impl=fa4         (FA4's block-sparse fine stage; only where `fa4_unavailable` is None)
* the fine stage alone ("fine <tile> ..." rows), per tile volume, every engine on the same inputs and the same cube
  selection (vsagen's Triton coarse stage on those inputs, held fixed), each row from the cube lists (q2k, q2k_cnt)
  and tile-order (B, S, H, D) q, k, v to the (B, S, H, D) output, whatever index conversion and padding the engine
  needs included:
    vsagen rows 64 / rows 128    `block_sparse_attention` over `shared.kernel_lists`'s kernel-tile lists, and (cubes of
                                 128 / 256) the grouped kernel over the backend's `query_groups` (one program per 128
                                 rows of a cube)
    FastVideo Triton             FastVideo 0.2.1's Triton VSA kernel from its sdist (`benchmarks/fastvideo_vsa.py`:
                                 padded (B, H, T, D) layout, route A's 64-token lists by `map_to_index`, its backward
                                 with `invert_indices`); skipped with the reason when `--fastvideo-sdist` is missing
    FA4                          `kernels.fa4_block_sparse.fa4_block_sparse_attention` (cubes of 128 / 256, where
                                 `fa4_unavailable` is None)
1. correctness at full size, on the 1.3B shape only (the 14B float32 reference would not fit): each row's forward
   output and q / k / v gradients against a float32 reference with its selection (cube lists ->
   `reference.block_sparse_attention_reference` over the layout's padded cubes), relative L2;
2. timings through `vsagen.bench.time_attention`, every row of a shape in one call, forward and forward+backward,
   each with its ratio against dense SDPA cuDNN timed in the same call.
A table closes the output; `--json` writes every row. `benchmarks/attention.py --tiles` runs the same rows.

Usage: python benchmarks/tiles.py [--shapes 1.3b,14b] [--sparsity 0.875] [--no-check]
       [--fastvideo-sdist .peers/fastvideo-0.2.1.tar.gz] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from vsagen.attention.shared import QUERY_LAUNCH, kernel_lists
from vsagen.attention.vsa import VSAAttention, VSAOptions
from vsagen.bench import SHAPES, make_inputs, rel_l2, time_attention
from vsagen.kernels import reference as ref
from vsagen.layout import parse_tile, tile_layout
from vsagen.timing import NullTimer

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/fastvideo_vsa.py, also when loaded by path
import fastvideo_vsa  # noqa: E402

FINE_TILES = ("4x4x4", "4x4x8", "4x8x8")
SEED = 0  # the timed inputs' seed: time_attention's, and the fine rows' selection is made on the same inputs


def variants(sparsity: float, device: torch.device) -> list[tuple[str, VSAAttention | str]]:
    """(label, backend) per variant, or (label, why it cannot run here) for FA4 where it cannot."""
    from vsagen.kernels.fa4_block_sparse import fa4_unavailable

    out: list[tuple[str, VSAAttention | str]] = [("vsa 4x4x4", VSAAttention(VSAOptions(sparsity, tile="4x4x4")))]
    for tile in ("4x4x8", "4x8x8"):
        for rows in (64, 128):
            out.append((f"vsa {tile} rows {rows}", VSAAttention(VSAOptions(sparsity, tile=tile, query_rows=rows))))
        why = fa4_unavailable(device, math.prod(int(x) for x in tile.split("x")))
        out.append((f"vsa {tile} fa4", why if why else VSAAttention(VSAOptions(sparsity, tile=tile, impl="fa4"))))
    return out


# ------------------------------------------------------------------------------------------- fine stage alone

def cube_selection(q: torch.Tensor, k: torch.Tensor, layout, sparsity: float) -> tuple[torch.Tensor, torch.Tensor]:
    """vsagen's cube selection on (B, S, H, D) tile-order q, k: the Triton coarse stage's (q2k (B, H, nC, K) int32,
    q2k_cnt (B, H, nC) int32), as `vsa` makes it (default tuning)."""
    from vsagen.kernels.coarse import coarse_stage

    with torch.no_grad():
        c = coarse_stage(q.detach(), k.detach(), layout.tile_offsets_i32,
                         ref.top_k_from_sparsity(sparsity, layout.num_tiles))
    return c.q2k, c.q2k_cnt


def vsagen_fine(backend: VSAAttention):
    """vsagen's fine stage as `backend` runs it (rows 64: `block_sparse_attention`; rows 128: the grouped kernel over
    `backend.query_groups`): run(q, k, v, q2k, q2k_cnt, layout) -> (B, S, H, D)."""
    from vsagen.kernels.block_sparse_attn import block_sparse_attention, block_sparse_attention_grouped

    def run(q, k, v, q2k, cnt, layout):
        lists, counts, offsets = kernel_lists(layout, q2k, cnt)
        if backend.options.query_rows == 128:
            return block_sparse_attention_grouped(q, k, v, lists, counts, offsets,
                                                  backend.query_groups(layout, q.shape[2]), QUERY_LAUNCH[128],
                                                  tuning=backend.tuning(q))[0]
        return block_sparse_attention(q, k, v, lists, counts, offsets, tuning=backend.tuning(q))[0]
    return run


def fa4_fine(q, k, v, q2k, cnt, layout):
    """FA4's adapter on the cube lists: (B, S, H, D)."""
    from vsagen.kernels.fa4_block_sparse import fa4_block_sparse_attention

    return fa4_block_sparse_attention(q, k, v, q2k, cnt, layout.tile_sizes, layout.slots, layout.slot_valid,
                                      layout.tile_volume)


class FineStage:
    """One engine's fine stage on a fixed cube selection, shaped as a tiled vsagen backend so that
    `vsagen.bench.time_attention` times it beside the others (it must be called on the inputs the selection was
    made on: `time_attention`'s of seed SEED)."""

    tiled = True
    bench_params = None
    per_layer = False

    def __init__(self, tile: str, run, q2k: torch.Tensor, q2k_cnt: torch.Tensor) -> None:
        self.tile, self.run, self.q2k, self.q2k_cnt = parse_tile(tile), run, q2k, q2k_cnt

    def __call__(self, q, k, v, ctx):
        return self.run(q, k, v, self.q2k, self.q2k_cnt, ctx.layout)


def fine_engines(tile: str, sparsity: float, device: torch.device, fastvideo) -> list[tuple[str, object]]:
    """(label, run) per fine-stage engine at `tile`, or (label, why it cannot run here); `fastvideo`: the
    modules of `fastvideo_vsa.load`, or why they are missing (str)."""
    from vsagen.kernels.fa4_block_sparse import fa4_unavailable

    vol = math.prod(parse_tile(tile))
    out: list[tuple[str, object]] = [(f"fine {tile} vsagen rows 64",
                                      vsagen_fine(VSAAttention(VSAOptions(sparsity, tile=tile))))]
    if vol > 64:
        out.append((f"fine {tile} vsagen rows 128",
                    vsagen_fine(VSAAttention(VSAOptions(sparsity, tile=tile, query_rows=128)))))
    if isinstance(fastvideo, str):
        out.append((f"fine {tile} FastVideo Triton", fastvideo))
    else:
        out.append((f"fine {tile} FastVideo Triton",
                    lambda q, k, v, q2k, cnt, lay: fastvideo_vsa.fastvideo_fine(fastvideo, q, k, v, q2k, cnt, lay)))
    if vol > 64:
        why = fa4_unavailable(device, vol)
        out.append((f"fine {tile} FA4", why or fa4_fine))
    return out


def _fails(fine: FineStage, shape, device: torch.device) -> str:
    """"" if `fine` runs forward+backward at `shape`, else why not (one line)."""
    try:
        lay = tile_layout(shape.grid, fine.tile, device=device)
        q, k, v = make_inputs(shape, SEED, requires_grad=True, device=device)
        fine.run(q, k, v, fine.q2k, fine.q2k_cnt, lay).sum().backward()
        return ""
    except Exception as e:  # noqa: BLE001 - e.g. a launch that does not fit: report, go on without the row
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    finally:
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------- correctness

def _errors(shape, lay, device: torch.device, seed: int, run) -> dict[str, float]:
    """Relative L2 of run(q, k, v) -> (out, q2k) and its q / k / v gradients against float32 with that q2k."""
    q, k, v = (x.detach().requires_grad_(True) for x in make_inputs(shape, seed, device=device, dtype=torch.bfloat16))
    out, q2k = run(q, k, v)
    do = torch.randn_like(out)
    out.backward(do)
    q32, k32, v32 = (x.detach().float().requires_grad_(True) for x in (q, k, v))
    want, _ = ref.block_sparse_attention_reference(q32, k32, v32, q2k.long(), lay.slots, lay.slot_valid)
    want.backward(do.float())
    res = {"fwd": rel_l2(out.float(), want)}
    for name, got, exp in (("dq", q.grad, q32.grad), ("dk", k.grad, k32.grad), ("dv", v.grad, v32.grad)):
        res[name] = rel_l2(got.float(), exp)
    del want, q32, k32, v32
    torch.cuda.empty_cache()
    return res


def check(shape, backend: VSAAttention, device: torch.device, seed: int = 0) -> dict[str, float]:
    """Relative L2 of the forward and the q / k / v gradients against float32 with the backend's own selection."""
    lay = tile_layout(shape.grid, backend.tile, device=device)
    return _errors(shape, lay, device, seed, lambda q, k, v: backend.attend(q, k, v, lay, None, NullTimer()))


def check_fine(shape, tile: str, run, sparsity: float, device: torch.device, seed: int = 0) -> dict[str, float]:
    """As `check`, for a fine-stage engine `run` on vsagen's cube selection of the check's inputs."""
    lay = tile_layout(shape.grid, parse_tile(tile), device=device)

    def call(q, k, v):
        q2k, cnt = cube_selection(q, k, lay, sparsity)
        return run(q, k, v, q2k, cnt, lay), q2k
    return _errors(shape, lay, device, seed, call)


# ------------------------------------------------------------------------------------------- the run

def run_tiles(shape_keys: list[str], sparsity: float, device: torch.device, *, with_check: bool = True,
              fastvideo_sdist: str | None = None) -> dict:
    """Every row at every shape (checks on the 1.3B shape), printing progress.

    Returns:
        {"rows": `KernelRow.to_dict()` rows with "shape_key", "checks": {label: {fwd, dq, dk, dv}}, "skipped":
        {label: why}, "sparsity"}.
    """
    fastvideo = "--fastvideo-sdist not given"
    if fastvideo_sdist:
        mods, why = fastvideo_vsa.load(fastvideo_sdist)
        fastvideo = mods if mods is not None else why
    skipped: dict[str, str] = {}
    found = variants(sparsity, device)
    fine = {tile: fine_engines(tile, sparsity, device, fastvideo) for tile in FINE_TILES}
    for label, b in found + [e for t in FINE_TILES for e in fine[t]]:
        if isinstance(b, str):
            skipped[label] = b
            print(f"{label}: skipped ({b})", flush=True)
    runnable = [(label, b) for label, b in found if not isinstance(b, str)]
    rows, checks = [], {}
    for name in shape_keys:
        shape = SHAPES[name]
        if name == "1.3b" and with_check:
            for label, b in runnable:
                checks[label] = check(shape, b, device)
                print(f"check {label}: " + " ".join(f"{k} {v:.2e}" for k, v in checks[label].items()), flush=True)
            for tile in FINE_TILES:
                for label, run in fine[tile]:
                    if label in skipped:
                        continue
                    try:
                        checks[label] = check_fine(shape, tile, run, sparsity, device)
                    except Exception as e:  # noqa: BLE001 - a peer that fails: report, time the rest
                        skipped[label] = f"check failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
                        print(f"{label}: skipped ({skipped[label]})", flush=True)
                        continue
                    print(f"check {label}: " + " ".join(f"{k} {v:.2e}" for k, v in checks[label].items()),
                          flush=True)
        timed: list[tuple[str, object]] = list(runnable)
        q, k, _ = make_inputs(shape, SEED, device=device)
        for tile in FINE_TILES:
            lay = tile_layout(shape.grid, parse_tile(tile), device=device)
            q2k, cnt = cube_selection(q, k, lay, sparsity)
            for label, run in fine[tile]:
                if label in skipped:
                    continue
                stage = FineStage(tile, run, q2k, cnt)
                why = _fails(stage, shape, device)
                if why:
                    skipped[f"{label} at {name}"] = why
                    print(f"{label} at {name}: skipped ({why})", flush=True)
                    continue
                timed.append((label, stage))
        del q, k
        for r in time_attention(shape, timed, device=device, dtype=torch.bfloat16, seed=SEED):
            rows.append(dict(r.to_dict(), shape_key=name))
        torch.cuda.empty_cache()
    return {"rows": rows, "checks": checks, "skipped": skipped, "sparsity": sparsity}


def print_table(report: dict) -> None:
    """The rows of `run_tiles`: per shape and label, fwd and fwd+bwd ms with their ratio against SDPA cuDNN of the
    same call, and the 1.3B check's forward and worst gradient relative L2."""
    rows, checks = report["rows"], report["checks"]
    print(f"\n{'shape':5} {'variant':34} {'fwd ms':>8} {'fwd x':>6} {'fwd+bwd ms':>10} {'f+b x':>6} "
          f"{'L2 fwd':>8} {'L2 grad':>8}")
    for name in dict.fromkeys(r["shape_key"] for r in rows):
        mine = [r for r in rows if r["shape_key"] == name]
        for label in dict.fromkeys(r["kernel"] for r in mine):
            f = next(r for r in mine if r["kernel"] == label and r["kind"] == "fwd")
            fb = next(r for r in mine if r["kernel"] == label and r["kind"] == "fwd+bwd")
            c = checks.get(label) if name == "1.3b" else None
            err = f"{c['fwd']:8.1e} {max(c['dq'], c['dk'], c['dv']):8.1e}" if c else ""
            print(f"{name:5} {label:34} {f['ms']:8.3f} {f['speedup_vs_baseline']:6.2f} {fb['ms']:10.3f} "
                  f"{fb['speedup_vs_baseline']:6.2f} {err}")
    for label, why in report["skipped"].items():
        print(f"skipped: {label}: {why}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1.3b,14b")
    ap.add_argument("--sparsity", type=float, default=0.875)
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--fastvideo-sdist", default=None, help="FastVideo 0.2.1's sdist (.tar.gz), for its Triton rows")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    device = torch.device("cuda")
    print(torch.cuda.get_device_name(device), "torch", torch.__version__)
    report = run_tiles(args.shapes.split(","), args.sparsity, device, with_check=not args.no_check,
                       fastvideo_sdist=args.fastvideo_sdist)
    print_table(report)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
