"""Attention kernel benchmark for the lent GPU (not a test): correctness at full size, then timings.

1. Correctness at the Wan2.1-1.3B 480p shape (B=1, grid 21x30x52, S=32,760, H=12, D=128, bf16, tile order):
   VSA fine stage with every tile selected against SDPA; at 87.5% sparsity against the eager reference with the
   same selection (forward output and q/k/v gradients, relative L2 vs a float32 reference); the Triton coarse
   stage's q2k against the reference top-k.
2. Timings (triton.testing.do_bench medians, ms) at the 1.3B 480p, 5B 704x1280x121 and 14B 720p shapes:
   SDPA cuDNN and flash (forward, forward+backward), FlexAttention block-sparse at the same density (64-token
   blocks over the padded tile layout with the same q2k, and 128-token blocks at the same density), the VSA
   coarse stage alone, the fine stage alone, VSA and `rocm-vsa` forward (coarse + fine) and forward+backward.
   Each row has the ratio against dense cuDNN measured in the same run (forward rows vs cuDNN forward, fwd+bwd vs
   cuDNN forward+backward) and, for the fine stage, its rate in TFLOP/s on the 64x64 blocks it computes.
3. Issue 12 (`benchmarks/sla_peer.py`): at each shape, forward and forward+backward of dense cuDNN, `vsa` and
   `sla-star` (global and marginal scopes, with a random projection of trained size) through their backend objects
   as `vsagen profile --kernels` times them (`vsagen.bench.time_attention`), beside SLA as its released code runs
   it (the sparse Triton kernel of fastvideo-kernel 0.3.5's `sla_triton.py`, loaded from `--sla-kernel`, with
   SLA's torch block map, linear branch and projection) and SLA's parts alone; SLA checked once on a small problem
   against a float32 reference. A table of these rows and the issue's ratios closes the output.
   `--sla-only` runs only this part (and its check); `--no-sla` skips it.
4. Issue 14, with `--patterns FILE` (a `vsagen search` file, or one written by hand: benchmarks/sparse_vdit.py
   --write-file): at each shape the file fits (its head count and head dim; its grid, or any with `--remap`),
   `sparse-vdit` forward and forward+backward through `vsagen.bench.time_attention` (as `vsagen profile --kernels`
   times it): layer 0's modes alone, and the mean per layer over every layer of the file, each with its block
   density and its ratio to SDPA cuDNN timed in the same call. `--patterns-only` runs only these rows.
5. Issue 33, with `--tiles` (`benchmarks/tiles.py`, imported): VSA at tile volumes 64 / 128 / 256 at each shape,
   the whole backends (query rows 64 / 128, impl=fa4) and the fine stage alone of vsagen, FA4's adapter and FastVideo's
   Triton VSA (from `--fastvideo-sdist`, FastVideo 0.2.1's sdist) on one selection, forward and forward+backward
   against SDPA cuDNN in the same call, correctness at full size against float32 for every row at 1.3B; its table
   closes the output. `--tiles-only` runs only these rows.
6. Optional `--sweep` / `--sweep-bwd`: launch tables (tile-size classes, warps, stages) of the fine-stage
   kernels at the 1.3B shape; `--profile`: GPU kernel time against wall time for VSA forward+backward;
   `--probe`: the fine forward's memory walk alone, and with its two dots but no softmax.

Usage: python benchmarks/attention.py [--shapes 1.3b,5b,14b] [--sparsity 0.875] [--sweep] [--sweep-bwd] [--profile]
       [--probe] [--tile-loads auto|on|off] [--bwd-streams 1|2] [--pack on|off]
       [--no-check] [--no-flex] [--sla-only | --no-sla] [--sla-kernel PATH] [--patterns FILE [--remap]]
       [--patterns-only] [--tiles | --tiles-only] [--fastvideo-sdist .peers/fastvideo-0.2.1.tar.gz]
       [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from vsagen.bench import (LAYER0, SHAPES, AttentionShape, bench_ms, make_inputs, rel_l2, sdpa, time_attention,
                          timed_layers)
from vsagen.errors import BadInput
from vsagen.kernels import block_sparse_attn as bsa
from vsagen.kernels import reference as ref
from vsagen.kernels.coarse import coarse_stage
from vsagen.kernels.tuning import KernelTuning, kernel_tuning
from vsagen.layout import tile_layout

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/sla_peer.py, also when loaded by path (tests)
import sla_peer  # noqa: E402
import tiles  # noqa: E402


Shape = AttentionShape  # the shapes, timing and input helpers live in vsagen.bench (shared with `vsagen profile`)


def bench(fn, warmup_ms: float = 100, rep_ms: float = 500) -> float:
    return bench_ms(fn, device="cuda", warmup_ms=warmup_ms, rep_ms=rep_ms)


def check(shape: Shape, sparsity: float, out: dict, tuning: KernelTuning) -> None:
    layout = tile_layout(shape.grid, device="cuda")
    off = layout.tile_offsets.to(torch.int32)
    n = layout.num_tiles
    q, k, v = make_inputs(shape, seed=1)
    # every tile selected == dense attention
    all_idx = torch.arange(n, device="cuda", dtype=torch.int32).expand(1, shape.heads, n, n).contiguous()
    all_cnt = torch.full((1, shape.heads, n), n, device="cuda", dtype=torch.int32)
    o_all, _ = bsa.bsa_fwd(q, k, v, all_idx, all_cnt, off, tuning=tuning)
    o_dense = F.scaled_dot_product_attention(*(x.float().transpose(1, 2) for x in (q, k, v))).transpose(1, 2)
    out["all_tiles_vs_sdpa_fp32_rel_l2"] = rel_l2(o_all, o_dense)
    del all_idx, o_all, o_dense
    # sparse: same selection as the reference
    top_k = ref.top_k_from_sparsity(sparsity, n)
    c = coarse_stage(q, k, off, top_k, tuning=tuning)
    q_c = ref.tile_mean_pool(q, layout.token_tile, layout.tile_sizes)
    k_c = ref.tile_mean_pool(k, layout.token_tile, layout.tile_sizes)
    ref_q2k = ref.select_top_k(ref.tile_scores(q_c, k_c), top_k)
    same = (ref.block_map_from_q2k(c.q2k.long(), n) == ref.block_map_from_q2k(ref_q2k, n)).float().mean()
    out["coarse_block_map_agreement"] = float(same)
    qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    o, _ = bsa.block_sparse_attention(qg, kg, vg, c.q2k, c.q2k_cnt, off, tuning=tuning)
    do = torch.randn_like(o)
    o.backward(do)
    qr, kr, vr = (x.detach().float().requires_grad_(True) for x in (q, k, v))
    o_ref, _ = ref.block_sparse_attention_reference(qr, kr, vr, c.q2k.long(), layout.slots, layout.slot_valid)
    o_ref.backward(do.float())
    out["sparse_fwd_vs_ref_rel_l2"] = rel_l2(o, o_ref)
    for name, a, b in (("dq", qg, qr), ("dk", kg, kr), ("dv", vg, vr)):
        out[f"sparse_{name}_vs_ref_rel_l2"] = rel_l2(a.grad, b.grad)
        out[f"sparse_{name}_finite"] = bool(torch.isfinite(a.grad).all())
    # the bf16 eager reference's own error, for scale
    o_bf, _ = ref.block_sparse_attention_reference(q, k, v, c.q2k.long(), layout.slots, layout.slot_valid)
    out["bf16_reference_vs_fp32_rel_l2"] = rel_l2(o_bf.to(torch.bfloat16), o_ref)


def time_shape(shape: Shape, sparsity: float, rows: list[dict], tuning: KernelTuning,
               with_flex: bool = True, rocm_tuning: KernelTuning | None = None) -> None:
    from torch.nn.attention import SDPBackend
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    layout = tile_layout(shape.grid, device="cuda")
    off = layout.tile_offsets.to(torch.int32)
    n = layout.num_tiles
    s = layout.num_tokens
    top_k = ref.top_k_from_sparsity(sparsity, n)
    q, k, v = make_inputs(shape, seed=2)
    dense_flops = 4 * s * s * shape.head_dim * shape.heads
    fine_flops = 4 * n * top_k * 64 * 64 * shape.head_dim * shape.heads  # on the 64x64 blocks computed

    def add(kernel: str, ms: float, kind: str, flops: float | None = None) -> None:
        rows.append({"shape": shape.name, "kernel": kernel, "kind": kind, "ms": ms,
                     "tflops": (flops / ms / 1e9) if flops else None})

    add("SDPA cuDNN", bench(lambda: sdpa(q, k, v, SDPBackend.CUDNN_ATTENTION)), "fwd", dense_flops)
    add("SDPA flash", bench(lambda: sdpa(q, k, v, SDPBackend.FLASH_ATTENTION)), "fwd", dense_flops)
    c = coarse_stage(q, k, off, top_k, tuning=tuning)
    add("VSA coarse stage (pool + scores + top-k)", bench(lambda: coarse_stage(q, k, off, top_k, tuning=tuning)), "fwd")
    add("VSA fine stage (Triton)", bench(lambda: bsa.bsa_fwd(q, k, v, c.q2k, c.q2k_cnt, off, tuning=tuning)), "fwd",
        fine_flops)
    if tuning.pack_partial_tiles:  # the 64x64 blocks the packed loops really compute (full tiles + packs)
        from vsagen.kernels.tile_plan import build_tile_plan

        _, plan_cnt = build_tile_plan(c.q2k, c.q2k_cnt, off)
        blocks = int((plan_cnt[..., 0] + plan_cnt[..., 1]).sum())
        rows[-1]["computed_blocks_fraction"] = blocks / (n * top_k * shape.heads)
        rows[-1]["tflops_on_computed_blocks"] = 4 * blocks * 64 * 64 * shape.head_dim / rows[-1]["ms"] / 1e9
        print(f"  packed: {blocks} of {n * top_k * shape.heads} blocks computed "
              f"({rows[-1]['computed_blocks_fraction']:.3f}), "
              f"{rows[-1]['tflops_on_computed_blocks']:.0f} TFLOP/s on them", flush=True)

    def vsa_fwd(t=tuning):
        cc = coarse_stage(q, k, off, top_k, tuning=t)
        return bsa.bsa_fwd(q, k, v, cc.q2k, cc.q2k_cnt, off, tuning=t)

    add("VSA forward (coarse + fine)", bench(vsa_fwd), "fwd")
    if rocm_tuning is not None:  # `rocm-vsa`: the same kernels with the ROCm profile (tuning.ROCM_VSA_CHANGES)
        add("rocm-vsa forward (coarse + fine)", bench(lambda: vsa_fwd(rocm_tuning)), "fwd")
    # FlexAttention at the same density: the same q2k over the tile layout padded to 64-token blocks
    pad = layout.slots.numel()
    flat = layout.slots.reshape(-1)
    qp, kp, vp = (x[:, flat].transpose(1, 2).contiguous() for x in (q, k, v))  # (B, H, n*64, D)
    valid = layout.slot_valid.reshape(-1)

    def kv_ok(b, h, q_idx, kv_idx):
        return valid[kv_idx]

    flex = torch.compile(flex_attention, dynamic=False)
    try:
        if not with_flex:
            raise RuntimeError("skipped (--no-flex)")
        # from_kv_blocks wants index rows as wide as the number of key blocks: pad q2k's K columns with 0
        idx64 = F.pad(c.q2k, (0, n - top_k))
        bm64 = BlockMask.from_kv_blocks(c.q2k_cnt, idx64, BLOCK_SIZE=64, mask_mod=kv_ok, seq_lengths=(pad, pad))
        # inductor's flex kernel tiles 128x64 by default; 64-token blocks need 64x64 kernel tiles
        opts = {"BLOCK_M": 64, "BLOCK_N": 64}
        add("FlexAttention block-sparse 64x64 (same q2k, padded)",
            bench(lambda: flex(qp, kp, vp, block_mask=bm64, kernel_options=opts)), "fwd", fine_flops)
    except Exception as e:  # noqa: BLE001 - report and go on
        print(f"flex 64 failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", file=sys.stderr)
    try:
        if not with_flex:
            raise RuntimeError("skipped (--no-flex)")
        nb = math.ceil(s / 128)
        kb = max(1, math.ceil((1 - sparsity) * nb))
        g = torch.Generator(device="cuda").manual_seed(3)
        idx = torch.rand(1, shape.heads, nb, nb, device="cuda", generator=g).argsort(-1)[..., :kb]
        idx = F.pad(idx.sort(-1).values.to(torch.int32), (0, nb - kb))
        bm128 = BlockMask.from_kv_blocks(torch.full((1, shape.heads, nb), kb, device="cuda", dtype=torch.int32), idx,
                                         BLOCK_SIZE=128, seq_lengths=(s, s))
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        add(f"FlexAttention block-sparse 128x128 ({kb}/{nb} blocks, random)",
            bench(lambda: flex(qt, kt, vt, block_mask=bm128)), "fwd", 4 * nb * kb * 128 * 128 * shape.head_dim *
            shape.heads)
    except Exception as e:  # noqa: BLE001
        print(f"flex 128 failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", file=sys.stderr)
    del qp, kp, vp
    # forward + backward
    qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    do = torch.randn_like(q)

    def fb_sdpa(backend):
        def run():
            o = sdpa(qg, kg, vg, backend)
            o.backward(do)
        return run

    add("SDPA cuDNN fwd+bwd", bench(fb_sdpa(SDPBackend.CUDNN_ATTENTION)), "fwd+bwd", 3.5 * dense_flops)
    add("SDPA flash fwd+bwd", bench(fb_sdpa(SDPBackend.FLASH_ATTENTION)), "fwd+bwd", 3.5 * dense_flops)

    def fb_vsa(t=tuning):
        cc = coarse_stage(qg, kg, off, top_k, tuning=t)
        o, _ = bsa.block_sparse_attention(qg, kg, vg, cc.q2k, cc.q2k_cnt, off, tuning=t)
        o.backward(do)

    add("VSA fwd+bwd (coarse + fine)", bench(fb_vsa), "fwd+bwd", 3.5 * fine_flops)
    if rocm_tuning is not None:
        add("rocm-vsa fwd+bwd (coarse + fine)", bench(lambda: fb_vsa(rocm_tuning)), "fwd+bwd", 3.5 * fine_flops)


# Size-class launch tables to try, BLOCK_D 128: ((block, num_warps, num_stages), ...) as in KernelTuning.
FWD_SWEEP = (((64, 4, 3),), ((64, 4, 2),), ((64, 4, 4),), ((64, 4, 5),), ((64, 8, 3),), ((32, 4, 3), (64, 4, 3)),
             ((16, 4, 3), (32, 4, 3), (64, 4, 3)))
DQ_SWEEP = (((16, 4, 2), (32, 4, 2), (64, 4, 2)), ((16, 4, 3), (32, 4, 3), (64, 4, 3)), ((64, 4, 2),), ((64, 4, 3),),
            ((16, 4, 2), (32, 4, 2), (64, 4, 3)))
DKDV_SWEEP = (((16, 4, 2), (32, 4, 2), (64, 4, 3)), ((16, 4, 2), (32, 4, 2), (64, 4, 2)),
              ((16, 4, 3), (32, 4, 3), (64, 4, 3)), ((64, 4, 3),), ((64, 4, 2),))


def selected_inputs(shape: Shape, sparsity: float, seed: int, tuning: KernelTuning):
    """Random bf16 q, k, v (tile order) at `shape` and their Triton coarse-stage selection: (tile_offsets int32,
    n_tiles, top_k, (q, k, v), CoarseResult)."""
    layout = tile_layout(shape.grid, device="cuda")
    off = layout.tile_offsets_i32
    n = layout.num_tiles
    top_k = ref.top_k_from_sparsity(sparsity, n)
    q, k, v = make_inputs(shape, seed=seed)
    return off, n, top_k, (q, k, v), coarse_stage(q, k, off, top_k, tuning=tuning)


def _try_bench(label: str, fn) -> float | None:
    try:
        return bench(fn)
    except Exception as e:  # noqa: BLE001 - e.g. out of shared memory or registers: report, go on
        print(f"{label}: {type(e).__name__}: {str(e).splitlines()[0][:160]}", file=sys.stderr)
        return None


def sweep(shape: Shape, sparsity: float, rows: list[dict], tuning: KernelTuning) -> None:
    """Forward launch tables (size classes, each (block, num_warps, num_stages)) of the fine kernel at the shape's
    head dim: `tuning` with each FWD_SWEEP entry as its fwd_launch."""
    off, n, top_k, (q, k, v), c = selected_inputs(shape, sparsity, seed=4, tuning=tuning)
    fine_flops = 4 * n * top_k * 64 * 64 * shape.head_dim * shape.heads
    base, _ = bsa.bsa_fwd(q, k, v, c.q2k, c.q2k_cnt, off, tuning=tuning)
    for cfg in FWD_SWEEP:
        t = dataclasses.replace(tuning, fwd_launch=cfg)
        ms = _try_bench(f"fwd {cfg}", lambda: bsa.bsa_fwd(q, k, v, c.q2k, c.q2k_cnt, off, tuning=t))
        if ms is None:
            continue
        err = rel_l2(bsa.bsa_fwd(q, k, v, c.q2k, c.q2k_cnt, off, tuning=t)[0], base)
        rows.append({"shape": shape.name, "kernel": f"fine fwd classes {cfg}, vs first {err:.1e}",
                     "kind": "sweep", "ms": ms, "tflops": fine_flops / ms / 1e9})


def sweep_bwd(shape: Shape, sparsity: float, rows: list[dict], tuning: KernelTuning) -> None:
    """Backward launch parameters at one shape: build_k2q alone (torch and Triton), then bsa_bwd alone (k2q
    prebuilt) with `tuning`'s bwd_dq_launch or bwd_dkdv_launch replaced by each DQ_SWEEP / DKDV_SWEEP entry."""
    off, n, top_k, (q, k, v), c = selected_inputs(shape, sparsity, seed=5, tuning=tuning)
    o, lse = bsa.bsa_fwd(q, k, v, c.q2k, c.q2k_cnt, off, tuning=tuning)
    do = torch.randn_like(o)
    k2q, k2q_cnt = ref.build_k2q(c.q2k, c.q2k_cnt, n)
    from vsagen.kernels.k2q import build_k2q_triton

    rows.append({"shape": shape.name, "kernel": "build_k2q (torch)", "kind": "sweep-bwd",
                 "ms": bench(lambda: ref.build_k2q(c.q2k, c.q2k_cnt, n)), "tflops": None})
    rows.append({"shape": shape.name, "kernel": "build_k2q_triton (the backward's)", "kind": "sweep-bwd",
                 "ms": bench(lambda: build_k2q_triton(c.q2k, c.q2k_cnt, n)), "tflops": None})
    fine_bwd_flops = 2.5 * 4 * n * top_k * 64 * 64 * shape.head_dim * shape.heads
    base = bsa.bsa_bwd(do, q, k, v, o, lse, c.q2k, c.q2k_cnt, k2q, k2q_cnt, off, tuning=tuning)
    configs = [("dq", cfg) for cfg in DQ_SWEEP] + [("dkdv", cfg) for cfg in DKDV_SWEEP]
    for which, cfg in configs:
        t = dataclasses.replace(tuning, **{"bwd_dq_launch" if which == "dq" else "bwd_dkdv_launch": cfg})
        ms = _try_bench(f"bwd {which} {cfg}",
                        lambda: bsa.bsa_bwd(do, q, k, v, o, lse, c.q2k, c.q2k_cnt, k2q, k2q_cnt, off, tuning=t))
        if ms is None:
            continue
        got = bsa.bsa_bwd(do, q, k, v, o, lse, c.q2k, c.q2k_cnt, k2q, k2q_cnt, off, tuning=t)
        err = max(rel_l2(x, y) for x, y in zip(got, base))
        rows.append({"shape": shape.name, "kernel": f"bwd ({which} classes {cfg}), vs first {err:.1e}",
                     "kind": "sweep-bwd", "ms": ms, "tflops": fine_bwd_flops / ms / 1e9})


def profile_fwd_bwd(shape: Shape, sparsity: float, tuning: KernelTuning) -> None:
    """torch.profiler over a few VSA forward+backward calls: GPU time per kernel against the wall time, to show
    host-side gaps between launches."""
    from torch.profiler import ProfilerActivity, profile

    layout = tile_layout(shape.grid, device="cuda")
    off = layout.tile_offsets_i32
    top_k = ref.top_k_from_sparsity(sparsity, layout.num_tiles)
    qg, kg, vg = make_inputs(shape, seed=6, requires_grad=True)
    do = torch.randn_like(qg)

    def fb_vsa():
        cc = coarse_stage(qg, kg, off, top_k, tuning=tuning)
        o, _ = bsa.block_sparse_attention(qg, kg, vg, cc.q2k, cc.q2k_cnt, off, tuning=tuning)
        o.backward(do)

    for _ in range(3):
        fb_vsa()
    torch.cuda.synchronize()
    reps = 5
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fb_vsa()
        end.record()
        torch.cuda.synchronize()
    wall = start.elapsed_time(end) / reps
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    gpu = sum(e.self_device_time_total for e in events) / 1e3 / reps
    print(f"profile fwd+bwd {shape.name}: {wall:.3f} ms per call (CUDA events), {gpu:.3f} ms of GPU kernel time")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:14]:
        print(f"  {e.self_device_time_total / 1e3 / reps:8.3f} ms  x{e.count // reps:<3d} {e.key[:90]}")


def probe(shape: Shape, sparsity: float, rows: list[dict], tuning: KernelTuning) -> None:
    """What bounds the fine forward: the same grid, q2k walk and K/V tile loads as `_bsa_fwd_kernel`, with
    (a) no math at all (K and V summed elementwise: the time to deliver the selected tiles from L2 / HBM) and
    (b) both block products but no softmax (delivery + tensor cores)."""
    import triton
    import triton.language as tl

    @triton.jit
    def stream_kernel(q_ptr, k_ptr, v_ptr, o_ptr, q2k_ptr, cnt_ptr, off_ptr, stride_s, stride_h, stride_ih,
                      stride_iq, stride_ch, MATH: tl.constexpr, BLOCK_D: tl.constexpr):
        pid_t = tl.program_id(0)
        h = tl.program_id(1)
        offs_m = tl.arange(0, 64)
        offs_d = tl.arange(0, BLOCK_D)
        q_start = tl.load(off_ptr + pid_t)
        q_len = tl.load(off_ptr + pid_t + 1) - q_start
        m_ok = offs_m < q_len
        q = tl.load(q_ptr + h * stride_h + (q_start + offs_m)[:, None] * stride_s + offs_d[None, :],
                    mask=m_ok[:, None], other=0.0)
        acc = tl.zeros([64, BLOCK_D], dtype=tl.float32)
        cnt = tl.load(cnt_ptr + h * stride_ch + pid_t)
        row_ptr = q2k_ptr + h * stride_ih + pid_t * stride_iq
        for i in range(0, cnt):
            kt = tl.load(row_ptr + i)
            k_start = tl.load(off_ptr + kt)
            n_ok = offs_m < tl.load(off_ptr + kt + 1) - k_start
            rows = (k_start + offs_m)[:, None]
            k = tl.load(k_ptr + h * stride_h + rows * stride_s + offs_d[None, :], mask=n_ok[:, None], other=0.0)
            v = tl.load(v_ptr + h * stride_h + rows * stride_s + offs_d[None, :], mask=n_ok[:, None], other=0.0)
            if MATH:
                sc = tl.dot(q, tl.trans(k))
                acc = tl.dot(sc.to(v.dtype), v, acc)
            else:
                acc += k.to(tl.float32) + v.to(tl.float32)
        tl.store(o_ptr + h * stride_h + (q_start + offs_m)[:, None] * stride_s + offs_d[None, :],
                 acc.to(o_ptr.dtype.element_ty), mask=m_ok[:, None])

    off, n, top_k, (q, k, v), c = selected_inputs(shape, sparsity, seed=8, tuning=tuning)
    o = torch.empty_like(q)
    blocks = n * top_k * shape.heads
    kv_bytes = blocks * 2 * 64 * shape.head_dim * 2
    fine_flops = 4 * blocks * 64 * 64 * shape.head_dim
    for math_, name in ((False, "probe: K/V tile delivery only (no math)"), (True, "probe: delivery + 2 dots, no softmax")):
        def run():
            stream_kernel[(n, shape.heads)](q, k, v, o, c.q2k, c.q2k_cnt, off, q.stride(1), q.stride(2),
                                            c.q2k.stride(1), c.q2k.stride(2), c.q2k_cnt.stride(1),
                                            MATH=math_, BLOCK_D=shape.head_dim, num_warps=4, num_stages=3)
        ms = bench(run)
        rows.append({"shape": shape.name, "kernel": f"{name}: {kv_bytes / ms / 1e9:.2f} TB/s of K/V tiles",
                     "kind": "fwd", "ms": ms, "tflops": fine_flops / ms / 1e9 if math_ else None})
    # plain streaming read of a large buffer, for the HBM ceiling
    big = torch.empty(2 * 1024 ** 3 // 2, dtype=torch.bfloat16, device="cuda").normal_()
    ms = bench(lambda: big.sum(dtype=torch.float32))
    rows.append({"shape": shape.name, "kernel": f"probe: torch sum of 2 GiB bf16: {big.numel() * 2 / ms / 1e9:.2f} TB/s",
                 "kind": "fwd", "ms": ms, "tflops": None})
    del big


def sparse_vdit_backend(path: str, remap: bool):
    """`sparse-vdit` with the pattern file `path` (Triton kernels), or None without one.

    Raises:
        BadInput: no such file, or a malformed one (`vsagen.sparsity.files.load_patterns`).
    """
    from vsagen.attention.sparse_vdit import SparseVDiTAttention, SparseVDiTOptions

    return SparseVDiTAttention(SparseVDiTOptions(patterns=Path(path), remap=remap, impl="triton"))


def time_sparse_vdit(shape: Shape, backend, remap: bool) -> list[dict]:
    """`sparse-vdit` rows at `shape` (`time_attention`: SDPA cuDNN and flash, layer 0, the mean over the file's
    layers; fwd and fwd+bwd), as dicts with "block_density" (computed tile pairs / (heads x tiles^2) on the shape's
    tile grid); [] (with a line saying why) where the file does not fit the shape."""
    from vsagen.sparsity.patterns import block_density

    pf = backend.file
    arch = pf.architecture
    if (arch["heads"], arch["head_dim"]) != (shape.heads, shape.head_dim):
        print(f"sparse-vdit skipped at {shape.name}: the file has {arch['heads']} heads of {arch['head_dim']}",
              flush=True)
        return []
    if tuple(pf.grid) != tuple(shape.grid) and not remap:
        print(f"sparse-vdit skipped at {shape.name}: the file's grid is {'x'.join(map(str, pf.grid))} (--remap "
              "compiles its modes on this grid)", flush=True)
        return []
    tiles = tile_layout(shape.grid).tiles_per_dim
    first = pf.layer_modes(None, 0)
    names = [p.name for p in first]
    modes = ", ".join(f"{n} {names.count(n)}" for n in dict.fromkeys(names))
    contexts = timed_layers(backend, [(e, int(arch["layers"])) for e in pf.experts])
    density0 = sum(block_density(p, tiles) for p in first) / len(first)
    labels = {f"sparse-vdit layer 0 ({modes})": density0,
              f"sparse-vdit mean of {len(contexts)} layers": pf.density(tiles)}
    rows = time_attention(shape, [(label, backend, c) for label, c in zip(labels, (LAYER0, contexts))],
                          device="cuda", dtype=torch.bfloat16)
    return [{**r.to_dict(), "block_density": labels.get(r.kernel)} for r in rows]


def print_table(rows: list[dict]) -> None:
    print("| shape | kernel | ms | vs dense cuDNN | TFLOP/s |")
    print("|---|---|---|---|---|")
    base: dict[tuple[str, str], float] = {}
    for r in rows:
        if r["kernel"].startswith("SDPA cuDNN"):
            base[(r["shape"], r["kind"])] = r["ms"]
    for r in rows:
        kind = "fwd" if r["kind"] == "sweep" else r["kind"]
        b = base.get((r["shape"], kind))
        ratio = f"{b / r['ms']:.2f}x faster" if b and r["ms"] < b else (f"{r['ms'] / b:.2f}x slower" if b else "-")
        tf = f"{r['tflops']:.0f}" if r["tflops"] else "-"
        print(f"| {r['shape']} | {r['kernel']} | {r['ms']:.3f} | {ratio} | {tf} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="1.3b,5b,14b")
    ap.add_argument("--sparsity", type=float, default=0.875)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--sweep-bwd", action="store_true", help="backward launch parameters at the 1.3B shape")
    ap.add_argument("--profile", action="store_true", help="torch.profiler of VSA fwd+bwd at the 1.3B shape")
    ap.add_argument("--probe", action="store_true", help="what bounds the fine forward, at the 1.3B shape")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--no-flex", action="store_true", help="skip the FlexAttention rows")
    ap.add_argument("--json", type=str, default=None, help="write all numbers to this file")
    sla = ap.add_mutually_exclusive_group()
    sla.add_argument("--sla-only", action="store_true",
                     help="only the issue-12 rows: cuDNN, vsa, sla-star (both scopes) and SLA (and SLA's check)")
    sla.add_argument("--no-sla", action="store_true", help="skip the issue-12 rows")
    ap.add_argument("--sla-kernel", default=sla_peer.DEFAULT_KERNEL,
                    help="SLA's sparse Triton kernel, the sla_triton.py of the fastvideo-kernel 0.3.5 sdist "
                         "(default: %(default)s, from the repository root); missing: the SLA rows are skipped")
    ap.add_argument("--tile-loads", choices=("auto", "on", "off"), default="auto",
                    help="how the fine-stage loops fetch tiles: TMA descriptors (on), pointer loads (off) or the "
                         "device's default (auto) (KernelTuning.tma_loads)")
    ap.add_argument("--bwd-streams", type=int, choices=(1, 2), default=None,
                    help="backward: dQ on its own stream beside dK/dV (2) or both on one (1); default: the "
                         "device's (KernelTuning.bwd_two_streams)")
    ap.add_argument("--pack", choices=("on", "off"), default=None,
                    help="forward / dQ loops: partial key tiles packed 64 tokens an iteration (on) or one tile an "
                         "iteration (off); default: the device's (KernelTuning.pack_partial_tiles)")
    ap.add_argument("--patterns", default=None, help="a sparse-vdit pattern file: its rows at the shapes it fits")
    ap.add_argument("--remap", action="store_true", help="--patterns: also at shapes of another grid (the same "
                    "modes compiled on that grid)")
    ap.add_argument("--patterns-only", action="store_true", help="only the --patterns rows")
    tile_rows = ap.add_mutually_exclusive_group()
    tile_rows.add_argument("--tiles", action="store_true", help="also the issue-33 rows of benchmarks/tiles.py")
    tile_rows.add_argument("--tiles-only", action="store_true", help="only the issue-33 rows")
    ap.add_argument("--fastvideo-sdist", default=None, help="--tiles: FastVideo 0.2.1's sdist (.tar.gz) for its "
                    "Triton VSA rows; missing: they are skipped with the reason")
    args = ap.parse_args()
    if args.patterns_only and args.patterns is None:
        ap.error("--patterns-only needs --patterns FILE")
    if args.patterns_only and args.tiles_only:
        ap.error("--patterns-only and --tiles-only exclude each other")
    try:
        svd = sparse_vdit_backend(args.patterns, args.remap) if args.patterns is not None else None
    except BadInput as e:
        ap.exit(2, f"error: {e}\n")
    import triton

    def tuning_for(shape: Shape, profile: str = "vsa") -> KernelTuning:
        """The device's default tuning (of `profile`) at the shape's head dim, with the flags' choices replaced."""
        changes = {}
        if args.tile_loads != "auto":
            changes["tma_loads"] = args.tile_loads == "on"
        if args.bwd_streams is not None:
            changes["bwd_two_streams"] = args.bwd_streams == 2
        if args.pack is not None:
            changes["pack_partial_tiles"] = args.pack == "on"
        return dataclasses.replace(kernel_tuning(torch.device("cuda"), shape.head_dim, profile), **changes)

    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__} "
          f"sparsity {args.sparsity}; tuning at the 1.3B shape: {tuning_for(SHAPES['1.3b'])}", flush=True)
    report: dict = {"checks": {}, "rows": [], "sla_rows": [], "sparse_vdit_rows": []}
    kernel = None
    tiles_check = not args.no_check  # the user's choice, before --tiles-only turns the other checks off
    if args.patterns_only or args.tiles_only:
        args.no_check = args.no_sla = args.sla_only = True  # sla_only: no time_shape rows either
    if not args.no_sla:
        kernel, why = sla_peer.load_kernel(args.sla_kernel)
        if kernel is None:
            print(f"SLA rows skipped: {why}", flush=True)
    if not args.no_check:
        if not args.sla_only:
            check(SHAPES["1.3b"], args.sparsity, report["checks"], tuning_for(SHAPES["1.3b"]))
        if kernel is not None:
            report["checks"].update(sla_peer.check(kernel, args.sparsity))
        print(json.dumps(report["checks"], indent=1), flush=True)
    for key in filter(None, args.shapes.split(",")):
        if not args.sla_only:
            time_shape(SHAPES[key], args.sparsity, report["rows"], tuning_for(SHAPES[key]),
                       with_flex=not args.no_flex, rocm_tuning=tuning_for(SHAPES[key], "rocm-vsa"))
            torch.cuda.empty_cache()
        if not args.no_sla:
            report["sla_rows"] += sla_peer.time_sla(SHAPES[key], args.sparsity, tuning_for(SHAPES[key]), kernel)
            torch.cuda.empty_cache()
        if svd is not None:
            report["sparse_vdit_rows"] += time_sparse_vdit(SHAPES[key], svd, args.remap)
            torch.cuda.empty_cache()
    if args.tiles or args.tiles_only:
        report["tiles"] = tiles.run_tiles([k for k in args.shapes.split(",") if k], args.sparsity,
                                          torch.device("cuda"), with_check=tiles_check,
                                          fastvideo_sdist=args.fastvideo_sdist)
    if args.sweep:
        sweep(SHAPES["1.3b"], args.sparsity, report["rows"], tuning_for(SHAPES["1.3b"]))
    if args.sweep_bwd:
        sweep_bwd(SHAPES["1.3b"], args.sparsity, report["rows"], tuning_for(SHAPES["1.3b"]))
    if args.profile:
        profile_fwd_bwd(SHAPES["1.3b"], args.sparsity, tuning_for(SHAPES["1.3b"]))
    if args.probe:
        probe(SHAPES["1.3b"], args.sparsity, report["rows"], tuning_for(SHAPES["1.3b"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if report["rows"]:
        print_table(report["rows"])
    if report["sla_rows"]:
        print()
        print("\n".join(sla_peer.summary(report["sla_rows"])))
    if report["sparse_vdit_rows"]:
        print(f"\nsparse-vdit, pattern file {args.patterns} (ratios against SDPA cuDNN timed in the same call)")
        print("| shape | kernel | pass | ms | block density | vs SDPA cuDNN |")
        print("|---|---|---|---|---|---|")
        for r in report["sparse_vdit_rows"]:
            d = "-" if r["block_density"] is None else f"{100 * r['block_density']:.1f}%"
            print(f"| {r['shape']} | {r['kernel']} | {r['kind']} | {r['ms']:.3f} | {d} | "
                  f"{r['speedup_vs_baseline']:.2f}x |")
    if "tiles" in report:
        print("\nIssue 33: VSA tile volumes, whole backends and the fine stage alone per engine (benchmarks/tiles.py)")
        tiles.print_table(report["tiles"])


if __name__ == "__main__":
    main()
