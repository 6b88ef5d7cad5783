"""SLA*'s fused linear branch (`vsagen.kernels.linear_branch`) on the lent GPU (not a test).

1. Correctness at each shape (B=1, bf16, D=128): `linear_branch_add` forward and the gradients of o, q, k, v, the
   projection's weight and bias against the float32 torch branch (`reference.linear_attention_branch` and
   `F.linear`), as relative L2; the backward run twice must be bitwise equal.
2. Timings (do_bench medians, ms): the branch alone (fused Triton, and the torch float32 branch as `sla-star`
   ran it before), forward and forward+backward, for each `LinearLaunch` in the sweep; the memory floor
   (bytes the fused forward must move / 4.8 TB/s).
3. The global branch in VSA's forward epilogue (`LinearLaunch.fused_epilogue`) against VSA's forward and the
   apply kernel as two launches: difference and forward times (`epilogue`).
4. The marginal scope (`vsagen.kernels.linear_marginal`) with the coarse stage's selection at 87.5% sparsity:
   the same correctness check against the float32 torch branch, and its forward / forward+backward times beside
   the torch branch's (and a sweep of its warps; `--profile`: its kernels' GPU times).

Usage: python benchmarks/linear_branch.py [--shapes 1.3b,5b,14b] [--kind softmax] [--no-sweep] [--profile]
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
import torch.nn.functional as F

from vsagen.bench import SHAPES, bench_ms, make_inputs, rel_l2
from vsagen.kernels import reference as ref
from vsagen.kernels.linear_branch import DEFAULT_LAUNCH, LinearLaunch, linear_branch_add

SWEEP = (DEFAULT_LAUNCH, LinearLaunch(64, 8, 8, 4, 8, 2), LinearLaunch(32, 4, 8, 4, 8, 2),
         LinearLaunch(32, 8, 8, 2, 16, 2), LinearLaunch(64, 4, 8, 4, 8, 3))
# the marginal kernels take only the warp counts of a LinearLaunch (forward kernels and the tile sums, backward)
MARGINAL_SWEEP = (LinearLaunch(fwd_warps=8, bwd_warps=4), LinearLaunch(fwd_warps=4, bwd_warps=8))
HBM_TB_S = 4.8  # H200 HBM3e peak


def torch_branch(o, q, k, v, w, b, kind):
    """o + proj(o_l) as `sla-star` computes it with impl=torch (float32 branch and projection)."""
    o_l = ref.linear_attention_branch(q, k, v, kind=kind)
    return o + F.linear(o_l.float(), w.float(), b.float()).to(o.dtype)


def run_shape(name: str, kind: str, sweep: bool, profile: bool) -> None:
    shape = SHAPES[name]
    q, k, v = make_inputs(shape, seed=5)
    o = torch.randn_like(q)
    d = shape.head_dim
    g = torch.Generator(device="cuda").manual_seed(6)
    w = (torch.randn(d, d, device="cuda", generator=g) / d ** 0.5).requires_grad_(True)
    b = (torch.randn(d, device="cuda", generator=g) * 0.01).requires_grad_(True)
    dout = torch.randn_like(q)
    leaves = [x.detach().clone().requires_grad_(True) for x in (o, q, k, v)]

    def grads(fn):
        for x in (*leaves, w, b):
            x.grad = None
        out = fn(*leaves, w, b)
        out.backward(dout)
        return out.detach(), [x.grad.clone() for x in (*leaves, w, b)]

    out_t, g_t = grads(lambda *a: linear_branch_add(*a, kind=kind))
    _, g_t2 = grads(lambda *a: linear_branch_add(*a, kind=kind))
    f32 = [x.detach().float().requires_grad_(True) for x in (o, q, k, v)]
    w32, b32 = w.detach().clone().requires_grad_(True), b.detach().clone().requires_grad_(True)
    out_r = f32[0] + F.linear(ref.linear_attention_branch(*f32[1:], kind=kind), w32, b32)
    out_r.backward(dout.float())
    errs = [rel_l2(out_t, out_r)] + [rel_l2(x, y.grad) for x, y in zip(g_t, (*f32, w32, b32))]
    same = all(torch.equal(x, y) for x, y in zip(g_t, g_t2))
    print(f"{shape.name} {kind}: rel L2 vs fp32  out {errs[0]:.2e}  do {errs[1]:.1e} dq {errs[2]:.2e} "
          f"dk {errs[3]:.2e} dv {errs[4]:.2e} dW {errs[5]:.2e} db {errs[6]:.2e}; backward bitwise repeatable: "
          f"{same}", flush=True)
    del f32, out_r, w32, b32, g_t, g_t2

    floor_ms = 6 * q.numel() * q.element_size() / (HBM_TB_S * 1e12) * 1e3  # read q, k, v, o; write out (+ k, v)

    fwd, fwd_bwd = runners((o, q, k, v, w, b), (*leaves, w, b), dout)

    variants = [("torch fp32 branch", lambda *a: torch_branch(*a, kind))]
    for la in (SWEEP if sweep else (DEFAULT_LAUNCH,)):
        variants.append((f"fused {la.block}/{la.fwd_warps}+{la.bwd_warps}w/{la.programs_per_sm}+{la.stream_programs_per_sm}pps/"
                          f"{la.num_stages}st",
                         lambda *a, la=la: linear_branch_add(*a, kind=kind, launch=la)))
    print(f"  memory floor of the forward (6 x |q| bytes at {HBM_TB_S} TB/s): {floor_ms:.3f} ms")
    print(f"  {'variant':34s} {'fwd ms':>8s} {'fwd+bwd ms':>11s}")
    for label, fn in variants:
        try:
            print(f"  {label:34s} {bench_ms(fwd(fn)):8.3f} {bench_ms(fwd_bwd(fn)):11.3f}", flush=True)
        except Exception as e:  # noqa: BLE001 - e.g. a launch past the shared memory: report and go on
            print(f"  {label:34s} failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}", flush=True)
    if profile:
        kernel_profile(fwd_bwd(lambda *a: linear_branch_add(*a, kind=kind)))
    epilogue(shape, kind, (q, k, v, w, b))
    marginal(shape, kind, (o, q, k, v, w, b), dout, sweep, profile)


def epilogue(shape, kind: str, inputs) -> None:
    """VSA's forward with the global branch in its epilogue (`sla_star_attention` without gradients, with
    `LinearLaunch.fused_epilogue`) against the same two parts as separate launches (`block_sparse_attention`, then
    `linear_branch_add`) on the coarse stage's selection at 87.5%: rel L2 and max abs difference, and their forward
    times (ms)."""
    from vsagen.kernels.block_sparse_attn import block_sparse_attention
    from vsagen.kernels.coarse import coarse_stage
    from vsagen.kernels.sla_star_attn import sla_star_attention
    from vsagen.layout import tile_layout

    lay = tile_layout(shape.grid, device="cuda")
    off = lay.tile_offsets_i32
    q, k, v, w, b = (x.detach() for x in inputs)
    c = coarse_stage(q, k, off, ref.top_k_from_sparsity(0.875, lay.num_tiles))

    def fused():
        return sla_star_attention(q, k, v, c.q2k, c.q2k_cnt, off, w, b, kind=kind,
                                  launch=dataclasses.replace(DEFAULT_LAUNCH, fused_epilogue=True))

    def separate():
        o_s, _ = block_sparse_attention(q, k, v, c.q2k, c.q2k_cnt, off)
        return linear_branch_add(o_s, q, k, v, w, b, kind=kind)

    with torch.no_grad():
        got, want = fused(), separate()
        diff = (got.float() - want.float()).abs().max().item()
        print(f"  vsa + global branch, fused epilogue vs two launches: rel L2 {rel_l2(got, want):.2e}, max abs "
              f"{diff:.2e}; fwd ms fused {bench_ms(fused):.3f}, two launches {bench_ms(separate):.3f}", flush=True)


def runners(inputs, leaves, dout):
    """(fwd, fwd_bwd): given a branch fn(o, q, k, v, w, b), a no-grad forward on `inputs` and a forward+backward
    on `leaves` (their grads reset each call), as do_bench callables."""
    def fwd(fn):
        def run():
            with torch.no_grad():
                fn(*inputs)
        return run

    def fwd_bwd(fn):
        def run():
            for x in leaves:
                x.grad = None
            fn(*leaves).backward(dout)
        return run
    return fwd, fwd_bwd


def marginal(shape, kind: str, inputs, dout, sweep: bool, profile: bool) -> None:
    """Section 4 of the module docstring."""
    from vsagen.kernels.coarse import coarse_stage
    from vsagen.kernels.linear_marginal import marginal_branch_add
    from vsagen.layout import tile_layout

    lay = tile_layout(shape.grid, device="cuda")
    off = lay.tile_offsets_i32
    o, q, k, v, w, b = inputs
    c = coarse_stage(q, k, off, ref.top_k_from_sparsity(0.875, lay.num_tiles))
    block_map = ref.block_map_from_q2k(c.q2k.long(), lay.num_tiles)

    def fused(o_, q_, k_, v_, w_, b_):
        return marginal_branch_add(o_, q_, k_, v_, w_, b_, c.q2k, c.q2k_cnt, off, kind=kind)

    def torch_marginal(o_, q_, k_, v_, w_, b_):
        o_l = ref.linear_attention_branch(q_, k_, v_, kind=kind, block_map=block_map, slots=lay.slots,
                                          slot_valid=lay.slot_valid)
        return o_ + F.linear(o_l.float(), w_.float(), b_.float()).to(o_.dtype)

    got = [x.detach().clone().requires_grad_(True) for x in (o, q, k, v, w, b)]
    out = fused(*got)
    out.backward(dout)
    f32 = [x.detach().float().requires_grad_(True) for x in (o, q, k, v, w, b)]
    want = torch_marginal(*f32)
    want.backward(dout.float())
    errs = [rel_l2(out, want)] + [rel_l2(x.grad, y.grad) for x, y in zip(got, f32)]
    print(f"  marginal: rel L2 vs fp32  out {errs[0]:.2e}  do {errs[1]:.1e} dq {errs[2]:.2e} dk {errs[3]:.2e} "
          f"dv {errs[4]:.2e} dW {errs[5]:.2e} db {errs[6]:.2e}", flush=True)
    del f32, want
    run_fwd, run_fwd_bwd = runners(inputs, [x.detach().clone().requires_grad_(True) for x in inputs], dout)

    variants = [("torch fp32 marginal branch", torch_marginal), ("fused marginal", fused)]
    for la in (MARGINAL_SWEEP if sweep else ()):
        variants.append((f"fused marginal {la.fwd_warps}+{la.bwd_warps}w",
                         lambda *a, la=la: marginal_branch_add(*a, c.q2k, c.q2k_cnt, off, kind=kind, launch=la)))
    for label, fn in variants:
        print(f"  {label:34s} {bench_ms(run_fwd(fn)):8.3f} {bench_ms(run_fwd_bwd(fn)):11.3f}", flush=True)
    if profile:
        kernel_profile(run_fwd_bwd(fused))


def kernel_profile(run) -> None:
    """GPU time per kernel of one fused forward+backward (torch.profiler, 5 calls after a warm-up)."""
    from torch.profiler import ProfilerActivity, profile as tprofile

    run()
    torch.cuda.synchronize()
    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            run()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="1.3b,5b,14b")
    ap.add_argument("--kind", default="softmax", choices=ref.FEATURE_MAPS)
    ap.add_argument("--no-sweep", action="store_true", help="time the default launch only")
    ap.add_argument("--profile", action="store_true",
                    help="GPU time per kernel of the default fused fwd+bwd (global, then marginal)")
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    for name in args.shapes.split(","):
        run_shape(name, args.kind, not args.no_sweep, args.profile)


if __name__ == "__main__":
    main()
