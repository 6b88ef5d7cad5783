"""Low-bit GEMMs at the Wan DiT's own linear shapes, for the lent GPU (not a test; issue 46's first measurement):
bf16 `torch.mm` against FP8 e4m3 `torch._scaled_mm` (row-wise scales), int8 `torch._int_mm` (per-token x
per-channel scales, rescaled after), and TurboDiffusion's block-scaled int8 GEMM (`vsagen.kernels.int8_block_gemm`,
128 x 128 scales on both operands, their numerics), each with its activation quantization included (the quantizers
of `vsagen.quant`, torch.compile'd) and alone. Prints one table (ms, TFLOP/s, speed-up over bf16, relative L2
error against float32 on the same inputs) and writes it as JSON to $OUT/lowbit_gemm.json where $OUT is set.

Before timing it checks, on the GPU: each compiled quantizer against its eager self (bitwise), the Triton
block GEMM against a float64 re-enactment of TurboDiffusion's formula on a slice of rows (every config timed),
and whether `torch._scaled_mm` takes a bias with row-wise scales on this torch.

Usage (repository root, torch 2.11 / triton 3.6; about 2 minutes on an H100):
    python benchmarks/lowbit_gemm.py [--models 1.3b,14b] [--rep-ms 60]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import triton
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vsagen.kernels.int8_block_gemm import CANDIDATE_CONFIGS, int8_block_gemm  # noqa: E402
from vsagen.quant import fp8_linear, int8_linear  # noqa: E402

# (model, M tokens, K in, N out) per linear: q / k / v / o and cross-attention q / o are dim -> dim, the FFN
# dim -> ffn and ffn -> dim (480p 81 frames: 32,760 tokens for 1.3B; 720p: 75,600 for 14B).
SHAPES = {
    "1.3b": [(32760, 1536, 1536), (32760, 1536, 8960), (32760, 8960, 1536)],
    "14b": [(75600, 5120, 5120), (75600, 5120, 13824), (75600, 13824, 5120)],
}


def rel_l2(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative L2 distance of `got` from the float32 `ref`."""
    return float((got.float() - ref).norm() / ref.norm())


DEVICE = "cuda"


def bench(fn, rep_ms: int) -> float:
    """Median milliseconds of `fn` (triton.testing.do_bench: L2 flushed between calls, launches included; one
    timed call under --smoke)."""
    if DEVICE != "cuda":
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    return float(triton.testing.do_bench(fn, warmup=15, rep=rep_ms, return_mode="median"))


def int8_rowwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8: scale = amax / 127, round half to even. ((rows, cols) int8, (rows, 1) float32)."""
    amax = x.float().abs().amax(-1, keepdim=True).clamp_min(1e-12)
    return torch.round(x.float() * (127.0 / amax)).clamp(-127, 127).to(torch.int8), amax / 127.0


def rescale(acc: torch.Tensor, xs: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    """_int_mm's int32 result times the row and column scales, as bf16."""
    return (acc.float() * xs * ws.t()).to(torch.bfloat16)


def checks(x: torch.Tensor, w: torch.Tensor, q_fp8, q_int8, q_rows) -> list[str]:
    """Correctness on the GPU before timing; returns the notes (raises AssertionError on a mismatch)."""
    notes = []
    for name, compiled, eager in (("fp8 row quantizer", q_fp8, fp8_linear.quantize_fp8_rows),
                                  ("int8 block quantizer", q_int8, int8_linear.quantize_int8_blocks),
                                  ("int8 row quantizer", q_rows, int8_rowwise)):
        (a, sa), (b, sb) = compiled(x), eager(x)
        same = torch.equal(a.view(torch.uint8), b.view(torch.uint8)) and torch.equal(sa, sb)
        if same:
            notes.append(f"{name}: compiled == eager (bitwise)")
        else:  # the compiled division may differ by an ulp, moving a value across a rounding boundary
            codes = (a.float() - b.float()).abs()
            notes.append(f"{name}: compiled != eager: {float((codes > 0).float().mean()):.2e} of the codes differ, "
                         f"max {float(codes.max()):.0f} code(s); scales max rel diff "
                         f"{float(((sa.float() - sb.float()).abs() / sb.float().abs().clamp_min(1e-30)).max()):.1e}")
            assert float(codes.max()) <= 1.0, notes[-1]
    xq, xs = int8_linear.quantize_int8_blocks(x[:384])
    wq, ws = int8_linear.quantize_int8_blocks(w)
    ref = torch.zeros(xq.shape[0], wq.shape[0], dtype=torch.float64, device=x.device)
    for kb in range(xs.shape[1]):
        sl = slice(kb * 128, (kb + 1) * 128)
        t = xq[:, sl].double() @ wq[:, sl].double().t()
        ref += t * xs[:, kb].double().repeat_interleave(128)[:xq.shape[0], None] * \
            ws[:, kb].double().repeat_interleave(128)[None, :wq.shape[0]]
    for cfg in CANDIDATE_CONFIGS:
        got = int8_block_gemm(xq, xs, wq, ws, torch.float32, config=cfg)
        err = float((got.double() - ref).abs().max() / ref.abs().max())
        assert err < 1e-5, f"int8_block_gemm {cfg}: max error {err:.2e} against float64"
    notes.append(f"int8_block_gemm: every config within 1e-5 of float64 (their formula) on {xq.shape[0]} rows")
    xf, xsf = fp8_linear.quantize_fp8_rows(x[:256])
    wf, wsf = fp8_linear.quantize_fp8_rows(w)
    try:
        bias = torch.randn(w.shape[0], device=x.device, dtype=torch.bfloat16)
        with_bias = torch._scaled_mm(xf, wf.t(), scale_a=xsf, scale_b=wsf.t(), bias=bias, out_dtype=torch.bfloat16)
        plain = torch._scaled_mm(xf, wf.t(), scale_a=xsf, scale_b=wsf.t(), out_dtype=torch.bfloat16)
        notes.append(f"_scaled_mm row-wise with bias: works, max |diff| vs adding after "
                     f"{float((with_bias.float() - plain.float() - bias.float()).abs().max()):.3g}")
    except RuntimeError as e:
        notes.append(f"_scaled_mm row-wise with bias: refused ({str(e).splitlines()[0][:100]})")
    return notes


def torchao_row(x: torch.Tensor, w: torch.Tensor, add) -> None:
    """torchao's float8 dynamic-activation row-wise linear (what diffusers' `TorchAoConfig` applies), where torchao
    is importable here (it is not in the lent GPU's environment unless a wheel is carried); a row either way."""
    try:
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_
    except ImportError:
        return  # main() said so
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device=x.device, dtype=torch.bfloat16)
    lin.weight.data.copy_(w)
    quantize_(lin, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()))
    with torch.no_grad():
        add("torchao float8 row-wise (quantize + GEMM)", lambda: lin(x), lin(x))


def run_shape(m: int, k: int, n: int, rep_ms: int, quantizers) -> list[dict]:
    """Every variant at one shape: rows of {variant, ms, tflops, speedup, rel_err}."""
    q_fp8, q_int8, q_rows, q_rescale = quantizers
    g = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(m, k, device=DEVICE, generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, device=DEVICE, generator=g) * k ** -0.5).to(torch.bfloat16)
    torch.backends.cuda.matmul.allow_tf32 = False
    ref = x.float() @ w.float().t()
    flops = 2.0 * m * n * k
    rows = []

    def add(variant: str, fn, out=None):
        ms = bench(fn, rep_ms)
        rows.append({"shape": f"{m}x{k}x{n}", "variant": variant, "ms": ms, "tflops": flops / ms / 1e9,
                     "rel_err": None if out is None else rel_l2(out, ref)})

    add("bf16 mm", lambda: x @ w.t(), x @ w.t())
    wf, wsf = fp8_linear.quantize_fp8_rows(w)
    xf, xsf = q_fp8(x)

    def fp8_mm(xf=xf, xsf=xsf):
        return torch._scaled_mm(xf, wf.t(), scale_a=xsf, scale_b=wsf.t(), out_dtype=torch.bfloat16)

    add("fp8 _scaled_mm (GEMM only)", fp8_mm)
    add("fp8 quantize + _scaled_mm", lambda: fp8_mm(*q_fp8(x)), fp8_mm(*q_fp8(x)))
    wi, wsi = int8_rowwise(w)
    xi, _ = q_rows(x)

    def int8_mm():
        a, sa = q_rows(x)
        return q_rescale(torch._int_mm(a, wi.t()), sa, wsi)

    add("int8 _int_mm (GEMM only)", lambda: torch._int_mm(xi, wi.t()))
    add("int8 row quantize + _int_mm + rescale", int8_mm, int8_mm())
    wb, wsb = int8_linear.quantize_int8_blocks(w)
    xb, xsb = q_int8(x)
    best = None
    for cfg in CANDIDATE_CONFIGS:
        ms = bench(lambda cfg=cfg: int8_block_gemm(xb, xsb, wb, wsb, torch.bfloat16, config=cfg), rep_ms)
        best = (ms, cfg) if best is None or ms < best[0] else best
    cfg = best[1]
    add(f"int8 block GEMM only (TurboDiffusion) {cfg.block_m}x{cfg.block_n}w{cfg.num_warps}s{cfg.num_stages}",
        lambda: int8_block_gemm(xb, xsb, wb, wsb, torch.bfloat16, config=cfg))
    add("int8 block quantize + GEMM (TurboDiffusion)",
        lambda: int8_block_gemm(*q_int8(x), wb, wsb, torch.bfloat16, config=cfg),
        int8_block_gemm(*q_int8(x), wb, wsb, torch.bfloat16, config=cfg))
    torchao_row(x, w, add)
    add("fp8 quantize alone", lambda: q_fp8(x))
    add("int8 block quantize alone", lambda: q_int8(x))
    base = rows[0]["ms"]
    for r in rows:
        r["speedup"] = base / r["ms"]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="1.3b,14b")
    ap.add_argument("--rep-ms", type=int, default=60)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (Triton interpreter): the script's "
                    "own check, not a measurement")
    args = ap.parse_args()
    global DEVICE
    if args.smoke:
        DEVICE = "cpu"
        SHAPES["smoke"] = [(300, 256, 136)]
        args.models = "smoke"
        dev = "cpu (smoke)"
    else:
        dev = f"{torch.cuda.get_device_name()}, sm{''.join(map(str, torch.cuda.get_device_capability()))}"
    print(f"{dev}, torch {torch.__version__}, triton {triton.__version__}")
    quantizers = (torch.compile(fp8_linear.quantize_fp8_rows, dynamic=None),
                  torch.compile(int8_linear.quantize_int8_blocks, dynamic=None),
                  torch.compile(int8_rowwise, dynamic=None), torch.compile(rescale, dynamic=None))
    g = torch.Generator(device=DEVICE).manual_seed(1)
    rows, k = (200, 256) if args.smoke else (1000, 1536)
    notes = checks(torch.randn(rows, k, device=DEVICE, generator=g).to(torch.bfloat16),
                   (torch.randn(rows, k, device=DEVICE, generator=g) * 0.03).to(torch.bfloat16), *quantizers[:3])
    try:
        import torchao

        notes.append(f"torchao {torchao.__version__}: its float8 row-wise linear timed too")
    except ImportError:
        notes.append("torchao: not importable here (not in this environment): no torchao row")
    for line in notes:
        print("check:", line)
    rows = []
    for model in args.models.split(","):
        for m, k, n in SHAPES[model]:
            rows += [dict(r, model=model) for r in run_shape(m, k, n, args.rep_ms, quantizers)]
            torch.cuda.empty_cache()
    print(f"\n{'model':5} {'M x K x N':>18} {'variant':50} {'ms':>8} {'TFLOP/s':>8} {'x bf16':>7} {'rel err':>9}")
    for r in rows:
        err = "" if r["rel_err"] is None else f"{r['rel_err']:.2e}"
        alone = r["variant"].endswith("alone")  # a quantizer: no FLOPs, no speed-up
        print(f"{r['model']:5} {r['shape']:>18} {r['variant']:50} {r['ms']:8.3f} "
              f"{'' if alone else format(r['tflops'], '8.1f'):>8} {'' if alone else format(r['speedup'], '7.2f'):>7} "
              f"{err:>9}")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "lowbit_gemm.json").write_text(json.dumps({"device": dev, "notes": notes,
                                                                           "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
