"""Issue 33 on the lent GPU (not a test): VSA at tile volumes 64 / 128 / 256, vsagen's kernels and FA4's.

For each shape (default the Wan2.1-1.3B 480p and 14B 720p problems, B=1, D=128, bf16) and each variant:
    vsa tile=4x4x4                       (VSA's paper tile; the Triton fine stage)
    vsa tile=4x4x8 / 4x8x8, query_rows 64    (the cube's 64-token kernel tiles, one program each)
    vsa tile=4x4x8 / 4x8x8, query_rows 128   (one program per 128 rows of a cube)
    vsa tile=4x4x8 / 4x8x8, impl=fa4         (FA4's block-sparse fine stage; only where `fa4_unavailable` is None)
1. correctness at full size, on the 1.3B shape only (the 14B float32 reference would not fit): the backend's
   forward output and q / k / v gradients against a float32 reference with the selection it made (cube lists ->
   `reference.block_sparse_attention_reference` over the layout's padded cubes), relative L2;
2. timings through `vsagen.bench.time_attention` (as `vsagen profile --kernels` times a backend: the processor's
   call, coarse + fine stage), forward and forward+backward, each with its ratio against dense SDPA cuDNN timed in
   the same process.
A table closes the output; `--json` writes every row.

Usage: python benchmarks/tiles.py [--shapes 1.3b,14b] [--sparsity 0.875] [--no-check] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math

import torch

from vsagen.attention.vsa import VSAAttention, VSAOptions
from vsagen.bench import SHAPES, make_inputs, rel_l2, time_attention
from vsagen.kernels import reference as ref
from vsagen.layout import tile_layout
from vsagen.timing import NullTimer


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


def check(shape, backend: VSAAttention, device: torch.device, seed: int = 0) -> dict[str, float]:
    """Relative L2 of the forward and the q / k / v gradients against float32 with the backend's own selection."""
    lay = tile_layout(shape.grid, backend.tile, device=device)
    q, k, v = (x.detach().requires_grad_(True) for x in make_inputs(shape, seed, device=device, dtype=torch.bfloat16))
    out, q2k = backend.attend(q, k, v, lay, None, NullTimer())
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1.3b,14b")
    ap.add_argument("--sparsity", type=float, default=0.875)
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    device = torch.device("cuda")
    print(torch.cuda.get_device_name(device), "torch", torch.__version__)
    found = variants(args.sparsity, device)
    for label, b in found:
        if isinstance(b, str):
            print(f"{label}: skipped ({b})")
    runnable = [(label, b) for label, b in found if not isinstance(b, str)]
    rows, checks = [], {}
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        if name == "1.3b" and not args.no_check:
            for label, b in runnable:
                checks[label] = check(shape, b, device)
                print(f"check {label}: " + " ".join(f"{k} {v:.2e}" for k, v in checks[label].items()), flush=True)
        for r in time_attention(shape, runnable, device=device, dtype=torch.bfloat16):
            rows.append(dict(r.to_dict(), shape_key=name))
    print(f"\n{'shape':5} {'variant':22} {'fwd ms':>8} {'fwd x':>6} {'fwd+bwd ms':>10} {'f+b x':>6} {'rel L2 fwd':>10}")
    for name in args.shapes.split(","):
        mine = [r for r in rows if r["shape_key"] == name]
        for label in dict.fromkeys(r["kernel"] for r in mine):
            f = next(r for r in mine if r["kernel"] == label and r["kind"] == "fwd")
            fb = next(r for r in mine if r["kernel"] == label and r["kind"] == "fwd+bwd")
            err = checks.get(label, {}).get("fwd")
            print(f"{name:5} {label:22} {f['ms']:8.3f} {f['speedup_vs_baseline']:6.2f} {fb['ms']:10.3f} "
                  f"{fb['speedup_vs_baseline']:6.2f} {'' if err is None else f'{err:10.2e}'}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": rows, "checks": checks, "sparsity": args.sparsity}, fh, indent=1)


if __name__ == "__main__":
    main()
