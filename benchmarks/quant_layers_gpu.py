"""Issue 46: one Wan2.1-1.3B block's ten linears at their real sizes (hidden 1536, FFN 8960, 32,760 latent tokens,
512 text tokens), timed as the DiT runs them: in bf16 (`nn.Linear`) and as vsagen's FP8 / int8 W8A8 layers built
by the builders `--quant`'s swap uses (each layer alone: no input shared between q / k / v, every layer low-bit), on
a one-block `WanTransformer3DModel` built from the bundled preset's architecture (random weights).

Prints, for the GPU it runs on:
  1. checks: the Triton activation quantizers (`vsagen.kernels.act_quant`) against the torch formulas of
     `vsagen.quant` on this GPU, at each input shape (codes bit for bit; scales to the ulp, `check_quantizers`);
  2. each layer's forward, ms (CUDA-synchronized median, `triton.testing.do_bench`, L2 flushed between calls) and
     the speed-up over bf16, the ten layers in sequence ("block linears"), and each output's relative L2 distance
     to a float32 linear of the bf16 weights on the same input;
  3. for the low-bit layers, the forward split into its parts: the activation quantizer alone, the GEMM alone
     (quantized input given), and the rest (forward - quantizer - GEMM: the bias add for FP8, Python); and the FP8
     bias both ways (in place in bf16, now; through a float32 copy of the output, before), and for reference
     `_scaled_mm` with the bias in its epilogue (not used: it rounds once where the layer's formula rounds twice);
  4. the quantizers' launch candidates (`act_quant.ROW_CANDIDATES`, `BLOCK_CANDIDATES`) at K = 1536 and 8960, and with
     `--compiled-baseline` the torch formulas under torch.compile as the DiT ran them before (every block shape
     seen first, so the timed graph is the dynamic-shape one; about a minute more).
Writes everything as JSON to $OUT/quant_layers.json where $OUT is set. Exits 1 when a check fails (after the tables).

Usage, from the repository root (torch 2.11 / triton 3.6 on the lent H100; about a minute):
    python benchmarks/quant_layers_gpu.py [--rep-ms 50] [--compiled-baseline]
On the CPU, the script's own check (tiny shapes, the Triton interpreter, CPU paths of the layers; not a measurement):
    TRITON_INTERPRET=1 python benchmarks/quant_layers_gpu.py --smoke
"""

from __future__ import annotations

import os
import sys

if "--smoke" in sys.argv:  # before triton decorates any kernel
    os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vsagen.kernels import act_quant  # noqa: E402
from vsagen.quant import fp8_linear, int8_linear  # noqa: E402
from vsagen.quant.lowbit import LowBitLinear  # noqa: E402
from vsagen.quant.swap import block_linears  # noqa: E402

VARIANTS = ("bf16", "fp8", "int8")
REAL = dict(tokens=32760, text=512, arch={})  # the preset's architecture as it is
SMOKE = dict(tokens=300, text=40, arch=dict(num_attention_heads=2, attention_head_dim=128, ffn_dim=384, text_dim=64))


def build_layers(device: str, arch: dict) -> dict[str, list[tuple[str, torch.nn.Module]]]:
    """{variant: [(name in the block, module)]}: the ten block linears of a one-block 1.3B transformer in bf16, and
    each built as FP8 / int8 by the swap's own builders (`Fp8Linear.from_linear`, `Int8Linear.from_linear`), one
    layer each, with no input shared between q / k / v (`quantize_transformer` shares it, and keeps the text k / v in
    bf16 under FP8: here every layer is timed alone, on its own input)."""
    from diffusers import WanTransformer3DModel

    from vsagen.models.presets import load_preset
    from vsagen.quant.fp8_linear import Fp8Linear
    from vsagen.quant.int8_linear import Int8Linear

    torch.manual_seed(0)
    config = {**load_preset("wan2.1-t2v-1.3b").transformer, **arch, "num_layers": 1}
    base = WanTransformer3DModel(**config).eval().to(device, torch.bfloat16)
    out = {"bf16": block_linears(base)}
    for precision, cls in (("fp8", Fp8Linear), ("int8", Int8Linear)):
        out[precision] = [(n, cls.from_linear(m)) for n, m in out["bf16"]]
    assert len(out["bf16"]) == 10
    return {v: [(n.removeprefix("blocks.0."), m) for n, m in layers] for v, layers in out.items()}


def layer_inputs(layers, tokens: int, text: int, device: str) -> dict[str, torch.Tensor]:
    """A random bf16 (1, rows, in) input per layer: the cross-attention's k / v read the text's rows, the rest the
    latent tokens (the FFN's second linear a GELU output, as in the block)."""
    g = torch.Generator(device=device).manual_seed(1)
    out = {}
    for name, m in layers:
        rows = text if name in ("attn2.to_k", "attn2.to_v") else tokens
        x = torch.randn(1, rows, m.in_features, device=device, generator=g)
        out[name] = (torch.nn.functional.gelu(x, approximate="tanh") if name == "ffn.net.2" else x).to(torch.bfloat16)
    return out


def bench(fn, rep_ms: int, cuda: bool) -> float:
    """Median ms of fn: do_bench on CUDA (synchronized, L2 flushed); one timed call on the CPU (--smoke)."""
    if not cuda:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    return float(triton.testing.do_bench(fn, warmup=10, rep=rep_ms, return_mode="median"))


def rel_l2(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.float() - ref).norm() / ref.norm())


def check_quantizers(xs: dict[str, torch.Tensor]) -> tuple[list[str], bool]:
    """The Triton quantizers against the torch formulas on each distinct input shape; (notes, all as expected).
    Codes must agree bit for bit. Scales may differ by one ulp for FP8 only: torch on CUDA divides by a Python
    scalar as a product with its reciprocal (`amax / 448` = fl(amax * fl(1 / 448)), its div_true_kernel_cuda), the
    kernel divides correctly rounded, as torch does on the CPU; int8's / 128 is exact either way."""
    notes, ok = [], True
    seen = set()
    for x in xs.values():
        x2 = x.reshape(-1, x.shape[-1])
        if tuple(x2.shape) in seen:
            continue
        seen.add(tuple(x2.shape))
        pairs = (("fp8 rows", act_quant.quantize_fp8_rows(x2), fp8_linear.quantize_fp8_rows(x2), 1),
                 ("int8 blocks", act_quant.quantize_int8_blocks(x2), int8_linear.quantize_int8_blocks(x2), 0))
        for what, (q, s), (rq, rs), ulps_allowed in pairs:
            codes = (q.float() - rq.float()).abs()
            n_codes = int((codes > 0).sum())
            ulps = (s.view(torch.int32).long() - rs.view(torch.int32).long()).abs()
            good = n_codes == 0 and int(ulps.max()) <= ulps_allowed
            ok &= good
            notes.append(f"{what} {tuple(x2.shape)}: {'as expected' if good else 'DIFFERENT'}: {n_codes} codes "
                         f"differ from the torch formula (max {float(codes.max()):.3g} steps); scales: "
                         f"{int((ulps > 0).sum())} of {ulps.numel()} differ, max {int(ulps.max())} ulp "
                         f"(allowed {ulps_allowed})")
    return notes, ok


def parts(name: str, m: LowBitLinear, x: torch.Tensor, rep: int, cuda: bool) -> dict:
    """The low-bit forward's parts: quantizer alone, GEMM alone, and for FP8 the bias both ways."""
    x2 = x.reshape(-1, x.shape[-1])
    if isinstance(m, fp8_linear.Fp8Linear):
        xq, xs = fp8_linear.quantize_activations(x2)
        y = fp8_linear.fp8_matmul(xq, xs, m.weight_fp8, m.weight_scale, x.dtype)
        row = {"quant": bench(lambda: fp8_linear.quantize_activations(x2), rep, cuda),
               "gemm": bench(lambda: fp8_linear.fp8_matmul(xq, xs, m.weight_fp8, m.weight_scale, x.dtype), rep, cuda),
               "bias_inplace": bench(lambda: y.add_(m.bias), rep, cuda),
               "bias_f32_round_trip": bench(lambda: (y.float() + m.bias.float()).to(x.dtype), rep, cuda)}
        if cuda:  # not what the layer does: the bias in _scaled_mm's epilogue rounds once, the formula twice
            try:
                row["gemm_bias_epilogue"] = bench(lambda: torch._scaled_mm(
                    xq, m.weight_fp8.t(), scale_a=xs, scale_b=m.weight_scale.t(), bias=m.bias,
                    out_dtype=torch.bfloat16), rep, cuda)
            except RuntimeError:  # refused by this torch
                row["gemm_bias_epilogue"] = float("nan")
    else:
        xq, xs = int8_linear.quantize_activations(x2)
        row = {"quant": bench(lambda: int8_linear.quantize_activations(x2), rep, cuda),
               "gemm": bench(lambda: int8_linear.int8_block_matmul(xq, xs, m.int8_weight, m.scale, x.dtype, m.bias),
                             rep, cuda)}
    return row


def quantizer_configs(device: str, rep: int, cuda: bool, tokens: int, text: int, compiled: bool) -> list[dict]:
    """The quantizers' launch candidates (FP8 rows, int8 blocks) at (tokens, 1536) and (tokens, 8960);
    with `compiled`, both torch formulas under torch.compile as the DiT ran them before: first called on every
    shape a block gives them ((tokens, 1536), (text, 1536), (tokens, 8960): automatic dynamic shapes recompile to
    a graph with M and K symbolic), then timed."""
    ks = (1536, 8960) if cuda else (256, 384)
    xs = {k: torch.randn(tokens, k, device=device).to(torch.bfloat16) for k in ks}
    compiled_fns = []
    if compiled:
        for what, fn in (("torch.compile fp8 rows (before)", fp8_linear.quantize_fp8_rows),
                         ("torch.compile int8 blocks (before)", int8_linear.quantize_int8_blocks)):
            fn = torch.compile(fn)
            for x in (xs[ks[0]], xs[ks[0]][:text], xs[ks[1]]):
                fn(x)
            compiled_fns.append((what, fn))
    rows = []
    for k, x in xs.items():
        for cfg in act_quant.ROW_CANDIDATES:
            rows.append({"what": f"triton fp8 rows {tuple(cfg)}", "shape": f"{tokens}x{k}",
                         "ms": bench(lambda cfg=cfg: act_quant.quantize_fp8_rows(x, cfg), rep, cuda)})
        for cfg in act_quant.BLOCK_CANDIDATES:
            rows.append({"what": f"triton int8 blocks {tuple(cfg)}", "shape": f"{tokens}x{k}",
                         "ms": bench(lambda cfg=cfg: act_quant.quantize_int8_blocks(x, cfg), rep, cuda)})
        for what, fn in compiled_fns:
            rows.append({"what": what, "shape": f"{tokens}x{k}", "ms": bench(lambda fn=fn: fn(x), rep, cuda)})
    for r in rows:
        r["GB/s"] = tokens * int(r["shape"].split("x")[1]) * 3 / r["ms"] / 1e6  # bf16 read + 1-byte codes written
    return rows


def print_layer_tables(table: list[dict], totals: dict, breakdown: list[dict]) -> None:
    head = " ".join(f"{v + ' ms':>9} {'x bf16':>6} {'relL2':>8}" for v in VARIANTS)
    print(f"\n{'layer':16} {'M x K x N':>18} {head}")
    for r in table + [totals]:
        cells = []
        for v in VARIANTS:
            err = r.get(f"{v}_err")
            cells.append(f"{r[v]:9.3f} {r['bf16'] / r[v]:6.2f} {'' if err is None else format(err, '.2e'):>8}")
        print(f"{r['layer']:16} {r['shape']:>18} " + " ".join(cells))
    print(f"\n{'layer':16} {'variant':5} {'forward':>8} {'quant':>8} {'gemm':>8} {'rest':>8} {'bias add_':>9} "
          f"{'bias f32 (before)':>17} {'gemm+bias epilogue (unused)':>27}")
    for r in breakdown:
        rest = r["forward"] - r["quant"] - r["gemm"]
        epilogue = r.get("gemm_bias_epilogue")
        epilogue = "" if epilogue is None else f"{epilogue:.3f}"
        extra = (f"{r['bias_inplace']:9.3f} {r['bias_f32_round_trip']:17.3f} {epilogue:>27}"
                 if "bias_inplace" in r else "")
        print(f"{r['layer']:16} {r['variant']:5} {r['forward']:8.3f} {r['quant']:8.3f} {r['gemm']:8.3f} {rest:8.3f} "
              f"{extra}", flush=True)


def print_quantizer_table(qrows: list[dict]) -> None:
    print(f"\n{'quantizer':52} {'M x K':>12} {'ms':>8} {'GB/s':>8}")
    for r in qrows:
        print(f"{r['what']:52} {r['shape']:>12} {r['ms']:8.3f} {r['GB/s']:8.0f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rep-ms", type=int, default=50)
    ap.add_argument("--compiled-baseline", action="store_true", help="also time the torch.compile'd torch formulas")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU, Triton interpreter: the script's "
                    "own check, not a measurement")
    args = ap.parse_args()
    cuda = not args.smoke
    device = "cuda" if cuda else "cpu"
    shapes = SMOKE if args.smoke else REAL
    dev = (f"{torch.cuda.get_device_name()}, sm{''.join(map(str, torch.cuda.get_device_capability()))}" if cuda
           else "cpu (smoke)")
    print(f"{dev}, torch {torch.__version__}, triton {triton.__version__}")
    layers = build_layers(device, shapes["arch"])
    xs = layer_inputs(layers["bf16"], shapes["tokens"], shapes["text"], device)
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.inference_mode():
        notes, ok = check_quantizers(xs)
        for line in notes:
            print("check:", line, flush=True)
        table, breakdown = [], []
        for i, (name, lin) in enumerate(layers["bf16"]):
            x = xs[name]
            ref = torch.nn.functional.linear(x.float(), lin.weight.float(), lin.bias.float())
            row = {"layer": name, "shape": f"{x.shape[1]}x{lin.in_features}x{lin.out_features}"}
            for v in VARIANTS:
                m = layers[v][i][1]
                row[v] = bench(lambda m=m: m(x), args.rep_ms, cuda)
                row[f"{v}_err"] = rel_l2(m(x), ref)
                if v != "bf16":
                    breakdown.append({"layer": name, "variant": v, "forward": row[v],
                                      **parts(name, m, x, args.rep_ms, cuda)})
            table.append(row)
        totals = {"layer": "block linears", "shape": "10 in sequence"}
        for v in VARIANTS:
            totals[v] = bench(lambda v=v: [m(xs[n]) for n, m in layers[v]], args.rep_ms, cuda)
        print_layer_tables(table, totals, breakdown)  # printed before the quantizer sweep, which may be cut short
        qrows = quantizer_configs(device, args.rep_ms, cuda, shapes["tokens"], shapes["text"],
                                  args.compiled_baseline)
    print_quantizer_table(qrows)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "quant_layers.json").write_text(json.dumps(
            {"device": dev, "notes": notes, "layers": table, "total": totals, "parts": breakdown,
             "quantizers": qrows}, indent=1))
    if not ok:
        print("FAILED: a Triton quantizer differs from its torch formula on this GPU (see the checks)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
