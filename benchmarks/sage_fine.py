"""The 8-bit fine stage (`vsa:precision=int8`, `kernels.sage_attn`) against the bf16 fine stage on the lent GPU (not
a test): at the Wan2.1-1.3B 480p (32760 tokens, 12 heads x 128) and 14B 720p (75600 tokens, 40 heads x 128) grids,
VSA's (4, 4, 4) tiles, its default sparsity, the coarse stage's own selection of random bf16 q, k, v (batch 1).

Timed (triton.testing.do_bench, ms): the bf16 forward `vsa` runs (`block_sparse_attention`, default tuning), the
8-bit kernel alone (`bsa_fwd_sage` over operands quantized beforehand) at a few launches (TMA loads and tile plans
as the device's default tuning; then the best launch with pointer loads, and without tile plans), the quantization
(torch formulas `sage.quantize_operands`; Triton `quantize_operands_triton`, what runs), and the two together
(`sage_block_sparse_attention`, what `vsa:precision=int8` runs). Errors (relative L2) on a subset of
`--check-heads` heads: each fine stage against float64 attention over the same selection, and the 8-bit kernel
(tile plans off) against the float64 reference of its own formulas (`sage.sage_fine_reference`). The 8-bit kernel
reads V transposed in one 64-token slot per kernel tile (`sage.v_slots`, written so by the Triton quantizer): every
V^T box starts at a multiple of 64 tokens whatever the grid's partial tiles; the line "V^T tiles" says whether they
come by TMA boxes (the tuning's TMA loads) and that the quantizer's layout is that one.

Usage: python benchmarks/sage_fine.py [--shapes 1.3b,14b,1.3b-crop] [--sparsity 0.875] [--check-heads 2] [--smoke]
       on the lent GPU (torch 2.11, triton 3.6; needs no wheel), from the repository root:
       PYTHONPATH=$PWD python3 benchmarks/sage_fine.py 2>&1 | tee $OUT/sage_fine.txt
       TRITON_INTERPRET=1 python benchmarks/sage_fine.py --smoke  (CPU: --shapes smoke, a small grid, one call per
       timing)
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time

import torch
import triton.testing

from vsagen.kernels import sage
from vsagen.kernels.block_sparse_attn import block_sparse_attention
from vsagen.kernels.bsa_primitives import v_t_tma_ok
from vsagen.kernels.coarse import coarse_stage
from vsagen.kernels.reference import top_k_from_sparsity
from vsagen.kernels.sage_attn import bsa_fwd_sage, quantize_operands_triton, sage_block_sparse_attention
from vsagen.kernels.tuning import kernel_tuning
from vsagen.layout import tile_layout

SHAPES = {"1.3b": ((21, 30, 52), 12), "14b": ((21, 45, 80), 40), "smoke": ((5, 6, 7), 2),  # grid, heads
          "1.3b-crop": ((20, 28, 52), 12)}  # the 1.3B grid cropped to whole tiles: no partial tiles
INT8_LAUNCHES = ((64, 4, 2), (64, 4, 3), (64, 8, 2))  # (BLOCK_M, warps, stages); the bf16 table's sm90 row: 64, 4, 3


def bench(fn) -> float:
    """ms per call: triton.testing.do_bench on a GPU, one timed call on the CPU (the smoke run)."""
    if torch.cuda.is_available():
        return triton.testing.do_bench(fn)
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def attention_fp64(q, k, v, lists, counts, offsets) -> torch.Tensor:
    """float64 softmax attention of each query tile over its listed key tiles, q, k, v (1, S, H, D), per head."""
    tile = sage.group_of_tokens(offsets)
    n = offsets.numel() - 1
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    for h in range(q.shape[2]):
        sel = torch.zeros(n, n, dtype=torch.bool, device=q.device)
        used = torch.arange(lists.shape[-1], device=q.device) < counts[0, h, :, None]
        rows = torch.arange(n, device=q.device)[:, None].expand_as(used)
        sel[rows[used], lists[0, h][used].long()] = True
        qh, kh, vh = (x[0, :, h].double() for x in (q, k, v))
        for a in range(0, q.shape[1], 4096):  # query chunks: (4096, S) scores
            sc = (qh[a:a + 4096] @ kh.T) * q.shape[-1] ** -0.5
            sc = sc.masked_fill(~sel[tile[a:a + 4096]][:, tile], -math.inf)
            out[0, a:a + 4096, h] = sc.softmax(-1) @ vh
    return out


def errors(q, k, v, lists, counts, offsets, bf16_out, tuning, heads: int) -> dict[str, float]:
    """Relative L2 errors on the first `heads` heads (module docstring)."""
    sub = [x[:, :, :heads].contiguous() for x in (q, k, v)]
    ls, cs = lists[:, :heads].contiguous(), counts[:, :heads].contiguous()
    want = attention_fp64(*sub, ls, cs, offsets)
    ops = sage.quantize_operands(*sub, offsets, offsets)
    unpacked = dataclasses.replace(tuning, pack_partial_tiles=False)
    out8 = bsa_fwd_sage(*ops, ls, cs, offsets, tuning=tuning)[0]
    out8_plain = bsa_fwd_sage(*ops, ls, cs, offsets, tuning=unpacked, out_dtype=torch.float32)[0]
    same = sage.sage_fine_reference(*ops, ls, cs, offsets)[0]
    return {"bf16 vs fp64": rel(bf16_out[:, :, :heads], want), "int8 vs fp64": rel(out8, want),
            "int8 (no plans) vs its fp64 formulas": rel(out8_plain, same)}


def bench_shape(name: str, sparsity: float, check_heads: int) -> None:
    grid, heads = SHAPES[name]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    lay = tile_layout(grid, device=dev)
    offsets = lay.tile_offsets_i32
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(1, lay.num_tokens, heads, 128, generator=g, device=dev, dtype=torch.bfloat16)
               for _ in range(3))
    top_k = top_k_from_sparsity(sparsity, lay.num_tiles)
    tuning = kernel_tuning(q.device, 128)
    c = coarse_stage(q, k, offsets, top_k, tuning=tuning)
    lists, counts = c.q2k.to(torch.int32), c.q2k_cnt.to(torch.int32)
    ops = quantize_operands_triton(q, k, v, offsets, offsets, offsets)
    bits = (lambda x: x.view(torch.uint8) if x.dtype == sage.FP8 else x)  # noqa: E731
    want = list(sage.quantize_operands(q, k, v, offsets, offsets))
    want[4] = sage.v_slots(want[4], offsets)
    same = all(torch.equal(bits(a), bits(b)) for a, b in zip(ops, want))
    print(f"\n{name}: {lay.num_tokens} tokens, {heads} heads x 128, {lay.num_tiles} tiles, top-k {top_k} "
          f"(sparsity {sparsity})")
    print(f"  V^T tiles: 64-token slots {tuple(ops[4].shape)} (every box at a multiple of 64 tokens), TMA boxes "
          f"{'on' if tuning.tma_loads and v_t_tma_ok(ops[4]) else 'off'}; "
          f"{int((offsets.diff() < 64).sum())} of {lay.num_tiles} tiles partial")
    bf16_out = block_sparse_attention(q, k, v, lists, counts, offsets, tuning=tuning)[0]
    t_bf16 = bench(lambda: block_sparse_attention(q, k, v, lists, counts, offsets, tuning=tuning))
    print(f"  bf16 fine stage (default tuning)          {t_bf16:8.3f} ms")
    best = None
    for launch in INT8_LAUNCHES if dev == "cuda" else INT8_LAUNCHES[:1]:
        t = dataclasses.replace(tuning, fwd_launch=(launch,))
        ms = bench(lambda: bsa_fwd_sage(*ops, lists, counts, offsets, tuning=t))
        print(f"  int8 kernel {str(launch):14}               {ms:8.3f} ms  {t_bf16 / ms:5.2f}x")
        best = min(best or (ms, launch), (ms, launch))
    for what, change in (("pointer loads", dict(tma_loads=False)), ("no tile plans", dict(pack_partial_tiles=False))):
        t = dataclasses.replace(tuning, fwd_launch=(best[1],), **change)
        ms = bench(lambda: bsa_fwd_sage(*ops, lists, counts, offsets, tuning=t))
        print(f"  int8 kernel {str(best[1]):14} {what:14} {ms:8.3f} ms  {t_bf16 / ms:5.2f}x")
    t_quant = bench(lambda: sage.quantize_operands(q, k, v, offsets, offsets))
    t_qtri = bench(lambda: quantize_operands_triton(q, k, v, offsets, offsets, offsets))
    best_t = dataclasses.replace(tuning, fwd_launch=(best[1],))
    t_all = bench(lambda: sage_block_sparse_attention(q, k, v, lists, counts, offsets, offsets,
                                                                         offsets, tuning=best_t))
    print(f"  quantization of q, k, v: torch             {t_quant:8.3f} ms")
    print(f"  quantization of q, k, v: Triton            {t_qtri:8.3f} ms  (bitwise the torch one: {same}; GPU "
          "division within 2 ulp)")
    print(f"  int8 quantize + kernel {str(best[1]):14}    {t_all:8.3f} ms  {t_bf16 / t_all:5.2f}x  "
          f"(kernel alone {t_bf16 / best[0]:.2f}x)")
    for key, val in errors(q, k, v, lists, counts, offsets, bf16_out, best_t, check_heads).items():
        print(f"  rel L2 {key:38} {val:.3e}  ({check_heads} heads)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="1.3b,14b")
    ap.add_argument("--sparsity", type=float, default=0.875)
    ap.add_argument("--check-heads", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="--shapes smoke (CPU, TRITON_INTERPRET=1)")
    args = ap.parse_args()
    if args.smoke:
        args.shapes = "smoke"
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (interpreter)"
    print(gpu, "torch", torch.__version__, "triton", triton.__version__)
    with torch.inference_mode():
        for name in args.shapes.split(","):
            bench_shape(name, args.sparsity, args.check_heads)


if __name__ == "__main__":
    main()
