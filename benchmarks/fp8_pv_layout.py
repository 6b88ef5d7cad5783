"""Why the 8-bit fine stage is slower than bf16 on Hopper (issue 46: 0.37-0.41x in `benchmarks/sage_fine.py`, Triton
3.6, H100): a dense FlashAttention-2 style forward in Triton with the fine stage's numerics and four operand layouts,
timed side by side on one GPU.

* `bf16`: q, k, v bf16 (the fine stage as it runs today);
* `int8 qk, fp8 v`: q, k int8 (per-token scales folded into one scalar here), P and V e4m3 with V stored (S, D) as
  vsagen's `precision=int8` stores it: the P.V product's B operand is then not K-major, which Hopper's FP8 wgmma
  needs (an operand in the wrong order is transposed in shared memory or the dot falls back to the older MMA);
* `int8 qk, fp8 v^T`: the same with V stored transposed (D, S) (SageAttention's and FlashAttention-3-FP8's layout);
* `bf16 qk, fp8 v^T`: bf16 Q.K^T with the transposed fp8 V (isolates the P.V product).

Each variant is checked against a float32 softmax(q k^T) v of the same (dequantized) inputs on the first head, then
timed (triton.testing.do_bench, median). The table prints ms and x bf16 per (BLOCK_N, warps, stages).

    python benchmarks/fp8_pv_layout.py [--tokens 32760] [--heads 12]
    TRITON_INTERPRET=1 python benchmarks/fp8_pv_layout.py --smoke     (the CPU: tiny shapes, correctness only)
"""

from __future__ import annotations

import argparse
import os

import torch
import triton
import triton.language as tl

SMOKE = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _attn_fwd(q_ptr, k_ptr, v_ptr, o_ptr, seq_len, scale,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              V_T: tl.constexpr, P_FP8: tl.constexpr):
    """One (query block, head): q, k (H, S, D); v (H, S, D) or, V_T, (H, D, S); o (H, S, D) fp32. S a multiple of
    both blocks. scale: the base-2 softmax scale times the q / k dequantizing scales."""
    pid_m, h = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    base = h.to(tl.int64) * seq_len * HEAD_DIM
    q = tl.load(q_ptr + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        k = tl.load(k_ptr + base + (start + offs_n)[:, None] * HEAD_DIM + offs_d[None, :])
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if V_T:  # (D, S): a (HEAD_DIM, BLOCK_N) tile, used transposed
            vt = tl.load(v_ptr + base + offs_d[:, None] * seq_len + (start + offs_n)[None, :])
            v = tl.trans(vt)
        else:
            v = tl.load(v_ptr + base + (start + offs_n)[:, None] * HEAD_DIM + offs_d[None, :])
        if P_FP8:
            acc = tl.dot(p.to(tl.float8e4nv), v, acc)
        else:
            acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], out)


def _int8(x: torch.Tensor) -> tuple[torch.Tensor, float]:
    amax = float(x.float().abs().max())
    return torch.round(x.float() * (127.0 / amax)).clamp(-127, 127).to(torch.int8), amax / 127.0


def _inputs(heads: int, tokens: int, dim: int, device: str):
    g = torch.Generator(device).manual_seed(0)
    q, k, v = (torch.randn(heads, tokens, dim, device=device, generator=g) for _ in range(3))
    qi, qs = _int8(q)
    ki, ks = _int8(k)
    vamax = float(v.abs().max())
    v8 = (v * (448.0 / vamax)).to(torch.float8_e4m3fn)
    return dict(q=q, k=k, v=v, qi=qi, qs=qs, ki=ki, ks=ks, v8=v8, vs=vamax / 448.0)


def _variants(t: dict) -> dict:
    wide = torch.float32 if SMOKE else torch.bfloat16  # the interpreter's bf16 dot is not bf16's (garbage)
    bf = {n: t[n].to(wide) for n in ("q", "k", "v")}
    v8t = t["v8"].transpose(1, 2).contiguous()
    return {  # name: (q, k, v, V_T, P_FP8, q.k scale, output scale)
        "bf16": (bf["q"], bf["k"], bf["v"], False, False, 1.0, 1.0),
        "int8 qk, fp8 v": (t["qi"], t["ki"], t["v8"], False, True, t["qs"] * t["ks"], t["vs"]),
        "int8 qk, fp8 v^T": (t["qi"], t["ki"], v8t, True, True, t["qs"] * t["ks"], t["vs"]),
        "bf16 qk, fp8 v^T": (bf["q"], bf["k"], v8t, True, True, 1.0, t["vs"]),
    }


def _run(q, k, v, v_t, p_fp8, qk_scale, out_scale, softmax_scale, block_m, block_n, warps, stages):
    heads, tokens, dim = q.shape
    o = torch.empty(heads, tokens, dim, device=q.device, dtype=torch.float32)
    grid = (tokens // block_m, heads)
    _attn_fwd[grid](q, k, v, o, tokens, qk_scale * softmax_scale * 1.4426950408889634, HEAD_DIM=dim,
                    BLOCK_M=block_m, BLOCK_N=block_n, V_T=v_t, P_FP8=p_fp8, num_warps=warps, num_stages=stages)
    return o * out_scale


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    device = "cpu" if args.smoke else "cuda"
    tokens, heads, dim = (128, 2, 64) if args.smoke else (args.tokens, args.heads, 128)
    softmax_scale = dim ** -0.5
    t = _inputs(heads, tokens, dim, device)
    ref = torch.softmax((t["q"][0].double() @ t["k"][0].double().T) * softmax_scale, -1) @ t["v"][0].double()
    configs = [(64, 64, 4, 2)] if args.smoke else [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 2),
                                                    (128, 128, 8, 3)]
    if not args.smoke:
        print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    print(f"{heads} heads x {tokens} tokens x {dim}, dense")
    print(f"{'variant':20} {'BLOCK_N, warps, stages':>22} {'ms':>8} {'x bf16':>7} {'rel L2 vs fp64':>15}")
    for block_m, block_n, warps, stages in configs:
        base = None
        for name, (q, k, v, v_t, p_fp8, qks, outs) in _variants(t).items():
            run = lambda: _run(q, k, v, v_t, p_fp8, qks, outs, softmax_scale, block_m, block_n, warps, stages)  # noqa: E731
            try:
                o = run()
            except Exception as e:  # a layout Triton cannot compile here: say so, go on
                print(f"{name:20} {str((block_n, warps, stages)):>22}  failed: {type(e).__name__}: {str(e)[:80]}")
                continue
            err = float((o[0].double() - ref).norm() / ref.norm())
            ms = float("nan") if args.smoke else float(triton.testing.do_bench(run, warmup=10, rep=100,
                                                                              return_mode="median"))
            base = base or ms
            print(f"{name:20} {str((block_n, warps, stages)):>22} {ms:8.3f} {base / ms:7.2f} {err:15.2e}")


if __name__ == "__main__":
    main()
