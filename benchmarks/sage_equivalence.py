"""vsagen's 8-bit fine-stage quantization (`kernels.sage`, `kernels.sage_attn`) against SpargeAttn's own code, run as
data (not a test): SpargeAttn's `spas_sage_attn/utils.py` (thu-ml/SpargeAttn, bfd980b), the file whose
`get_vanilla_qk_quant` TurboDiffusion's SageSLA calls (`turbodiffusion/SLA/core.py:197-203`), is loaded from a path
given here and its Triton quantization run beside vsagen's on the same bf16 q, k: SageSLA's sm90 blocks (64 query,
128 key tokens) and the other GPUs' (128 / 64), K smoothed by its token mean as core.py:197 computes it. Its CUDA
parts (V's fp8 quantization, the attention kernels: the `spas_sage_attn` extension) are not run here.

On a CPU the Triton interpreter runs both (TRITON_INTERPRET=1), with one limit: SpargeAttn's fused smoothing
(`x -= x_mean` on bf16 blocks, utils.py:125-128) is bf16 arithmetic, which the interpreter (triton 3.9) does on the
raw bits (scales of 1e-7 and 1e36 come out), so there its kernel gets K smoothed by torch (k - km in bf16, the same
rounding) and the fused path runs on a GPU only. On a GPU, Triton runs both paths. The int8 values and the scales are
compared exactly; a GPU may differ in an int8 value by one where x / scale lies within 2 ulp of a half (both use
Triton's default fp32 division there; vsagen's torch formulas divide exactly).

Usage: TRITON_INTERPRET=1 python benchmarks/sage_equivalence.py --utils PATH/spas_sage_attn/utils.py [--seq 331]
(`git -C SPARGEATTN_CHECKOUT show bfd980b:spas_sage_attn/utils.py > utils.py`; einops is stubbed if missing: the
quantization does not use it)
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import types

import torch


def load_utils(path: str) -> types.ModuleType:
    """SpargeAttn's utils.py as a module (its package's other modules are not needed by the quantization)."""
    if "einops" not in sys.modules:
        try:
            import einops  # noqa: F401
        except ImportError:
            stub = types.ModuleType("einops")
            stub.rearrange = stub.repeat = None
            sys.modules["einops"] = stub
    spec = importlib.util.spec_from_file_location("sparge_utils", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    from vsagen.kernels import sage
    from vsagen.kernels.sage_attn import quantize_operands_triton

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--utils", required=True, help="SpargeAttn's spas_sage_attn/utils.py")
    ap.add_argument("--seq", type=int, default=331)
    ap.add_argument("--heads", type=int, default=3)
    args = ap.parse_args()
    theirs = load_utils(args.utils)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(0)
    b, s, h, d = 2, args.seq, args.heads, 128
    q, k = (torch.randn(b, s, h, d, generator=g, device=dev).to(torch.bfloat16) for _ in range(2))
    k = k + torch.randn(1, 1, h, d, generator=g, device=dev).to(torch.bfloat16)  # a channel bias, as real keys have
    ok = True
    for bq, bk in ((64, 128), (128, 64)):
        qh, kh = (x.transpose(1, 2).contiguous() for x in (q, k))  # (B, H, S, D), SageSLA's layout
        km = kh.mean(dim=-2, keepdim=True)  # core.py:197
        if dev == "cuda":  # their fused smoothing
            tq, tqs, tk, tks = theirs.get_vanilla_qk_quant(qh, kh, km, bq, bk)
        else:  # K smoothed by torch first (module docstring)
            tq, tqs, tk, tks = theirs.get_vanilla_qk_quant(qh, kh - km, None, bq, bk)
        qo, ko = sage.block_offsets(s, bq, dev), sage.block_offsets(s, bk, dev)
        tiles = sage.block_offsets(s, 64, dev)  # V's slots (not compared here)
        for name, fn in (("torch formulas", sage.quantize_operands),
                         ("Triton", lambda *xs: quantize_operands_triton(*xs, tiles))):
            mq, mqs, mk, mks = fn(q, k, k, qo, ko)[:4]
            same = {"q int8": torch.equal(mq.transpose(1, 2), tq), "k int8": torch.equal(mk.transpose(1, 2), tk),
                    "q scale": torch.equal(mqs[:, :, qo[:-1].long()], tqs),
                    "k scale": torch.equal(mks[:, :, ko[:-1].long()], tks)}
            diff = {"q": int((mq.transpose(1, 2).int() - tq.int()).abs().max()),
                    "k": int((mk.transpose(1, 2).int() - tk.int()).abs().max())}
            ok &= all(same.values())
            print(f"blocks {bq}/{bk}, vsagen's {name:14}: equal {same}, largest int8 difference {diff}")
    print("all equal" if ok else "NOT all equal")


if __name__ == "__main__":
    main()
