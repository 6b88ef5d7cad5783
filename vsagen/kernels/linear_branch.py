"""SLA*'s linear-attention branch over every key (`global` scope), fused in Triton, forward and backward.

    out = o + proj(o_l),  o_l = phi(q) KV / (eps + phi(q) . z),  KV = sum_j phi(k_j)^T v_j,  z = sum_j phi(k_j)

per batch and head, with phi the same feature map for q and k over the head dim (softmax, elu + 1 or relu) and
proj = Linear(D, D) with bias, one per layer, shared by the heads (seed 002's SLA*, after SLA arXiv 2509.24006;
TurboDiffusion's released branch). `o` is the sparse part's output (VSA's fine stage), to which the projected
branch is added in the same pass.

Kernels (tokens in any order: the branch sees every key). The projection is folded into the sums:
y = o_l W^T = phi(q) (KV W^T) / den, so the forward needs one (D, D) GEMM operand KVW = KV W^T per batch-head
(a tiny torch matmul), and with A = sum_tokens (dO / den)^T phi(q) the backward's weight gradients are
dKV = A^T W and dW = sum_bh A KV (tiny torch matmuls too).
* `_kv_sums_kernel`, grid (chunks, B*H): one pass over a chunk of K and V, phi(K_c)^T V_c (D, D) and
  sum phi(K_c) (D,) in fp32, written per chunk and summed in a fixed order by torch. The chunk count fills the GPU
  (`LinearLaunch.programs_per_sm`) whatever B*H is.
* `_apply_kernel`, grid (chunks, B*H): per block of query rows, phi(Q), the denominator, phi(Q) KVW, the bias and
  the add to `o`; nothing is saved for the backward but the (D, D) sums.
* `_bwd_q_kernel`, grid (chunks, B*H): per block of query rows, dQ through the division and phi (added to another
  part's dQ in place when asked), and per chunk A, dz = sum d den * phi(Q) and db = sum dO.
* `_bwd_kv_kernel`, grid (chunks, B*H): dK and dV of every key from dKV and dz (added in place when asked).
No atomics: every gradient row is written by one program and every cross-program sum is a torch reduction over
a fixed chunking, so the backward is bitwise deterministic on a given device.

Precision: phi and the divisions in fp32; the GEMMs take bf16 operands with fp32 accumulation for bf16 / fp16
inputs (as SLA's own branch under bf16 autocast), fp32 operands (TF32 on CUDA, IEEE under the interpreter)
for fp32 inputs. Rows past S and head-dim padding columns are zeroed after phi (softmax of a zero row is 1/D,
elu + 1 of zero is 1: both would leak into the sums).

`linear_branch_add` is the public function; the custom ops `vsagen::sla_linear` / `vsagen::sla_linear_bwd` make
it visible to autograd and torch.compile (no graph break). The eager oracle is
`reference.linear_attention_branch`.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from .reference import FEATURE_MAPS, LINEAR_EPS
from .tuning import block_d, interpreting


@dataclasses.dataclass(frozen=True)
class LinearLaunch:
    """Launch parameters of the linear-branch kernels (a value passed down; `DEFAULT_LAUNCH` unless a caller
    times variants).

    Attributes:
        block: query / key rows per block of every kernel (a power of two, 16-128; 128 overflows the H200's
            shared memory in the dQ kernel at D = 128).
        fwd_warps: warps of the forward kernels (`_kv_sums_kernel`, `_apply_kernel`; the marginal scope's
            `_tile_sums_kernel`, which its backward runs too, and `_apply_kernel`).
        bwd_warps: warps of the backward kernels (`_bwd_q_kernel`, `_bwd_kv_kernel`).
        programs_per_sm: the kernels that sum over their chunk (`_kv_sums_kernel`, `_bwd_q_kernel`) aim at this
            many programs per SM (chunks per batch-head = ceil(programs_per_sm * SMs / (B*H)), at most one per
            block): fewer chunks, fewer partial sums to add.
        stream_programs_per_sm: the same for the kernels that only stream rows (`_apply_kernel`,
            `_bwd_kv_kernel`), which load their (D, D) operands once a chunk.
        num_stages: software-pipelining depth of every kernel's row loop (>= 1).
        fused_epilogue: `global` scope beside VSA's fine stage (`sla_star_attn`): add the branch in the
            block-sparse forward's epilogue (`bsa_forward.bsa_fwd_linear`, one launch) instead of this module's
            apply kernel after it (which reads q and the sparse output again and writes the sum once more: about
            0.3 GB at the Wan 1.3B shape). Off by default: on the H200 (1.3B shape) the forward took 2.317 ms
            against 2.254 ms for the two launches, output equal (BENCHMARKS.md, "sla-star marginal scope");
            compiled for sm_90 it holds 255 registers, up to 72 bytes of spills with packed tile plans.

    The defaults: from the offline sm_90 compile (triton 3.8 ptxas, D = 128): 64-row blocks take 255 registers
    and spill in every kernel at 4 or 8 warps; 32-row blocks at 8 warps fit in 149-188 registers without spills
    (the dQ kernel: 255 and 32 bytes); num_stages changed nothing there. Timed on the H200 in BENCHMARKS.md
    (2026-12-01, benchmarks/linear_branch.py).
    """

    block: int = 32
    fwd_warps: int = 8
    bwd_warps: int = 8
    programs_per_sm: int = 4
    stream_programs_per_sm: int = 8
    num_stages: int = 2
    fused_epilogue: bool = False

    def __post_init__(self) -> None:
        if self.block not in (16, 32, 64, 128):
            raise ValueError(f"LinearLaunch.block must be 16, 32, 64 or 128, got {self.block}")
        for name in ("fwd_warps", "bwd_warps"):
            if getattr(self, name) not in (1, 2, 4, 8, 16):
                raise ValueError(f"LinearLaunch.{name} must be a power of two in [1, 16], got {getattr(self, name)}")
        for name in ("programs_per_sm", "stream_programs_per_sm", "num_stages"):
            if getattr(self, name) < 1:
                raise ValueError(f"LinearLaunch.{name} must be >= 1, got {getattr(self, name)}")


DEFAULT_LAUNCH = LinearLaunch()
_KIND = {name: i for i, name in enumerate(FEATURE_MAPS)}  # softmax 0, elu 1, relu 2 (the kernels' KIND)


# --------------------------------------------------------------------------------------------- jit helpers


@triton.jit
def _phi(x, r_ok, d_ok, KIND: tl.constexpr):
    """phi(x) of (R, BLOCK_D) fp32 rows over the head dim; rows not r_ok and columns not d_ok are 0."""
    if KIND == 0:
        xm = tl.where(d_ok[None, :], x, float("-inf"))
        e = tl.exp(xm - tl.max(xm, 1)[:, None])
        p = e * (1.0 / tl.sum(e, 1))[:, None]
    elif KIND == 1:
        p = tl.where(x > 0, x + 1.0, tl.exp(tl.minimum(x, 0.0)))
    else:
        p = tl.maximum(x, 0.0)
    return tl.where(r_ok[:, None] & d_ok[None, :], p, 0.0)


@triton.jit
def _phi_bwd(x, p, dp, KIND: tl.constexpr):
    """d phi(x) / dx applied to dp (p = phi(x), masked entries of p are 0 and stay 0 for softmax)."""
    if KIND == 0:
        dx = p * (dp - tl.sum(dp * p, 1)[:, None])
    elif KIND == 1:
        dx = tl.where(x > 0, dp, dp * p)
    else:
        dx = tl.where(x > 0, dp, 0.0)
    return dx


@triton.jit
def _mm(a, b, LOWP: tl.constexpr, IEEE: tl.constexpr):
    """a @ b with fp32 accumulation: bf16 operands when LOWP, else fp32 (IEEE products when IEEE, else TF32)."""
    if LOWP:
        c = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    elif IEEE:
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        c = tl.dot(a.to(tl.float32), b.to(tl.float32))
    return c


@triton.jit
def _load_rows(base, rows, r_ok, stride_s, offs_d, d_ok):
    """(R, BLOCK_D) rows of one (S, D) head slice in its own dtype, zero outside r_ok x d_ok (GEMM operands stay
    in it: fp32 copies of (64, 128) tiles cost 64 registers a thread at 4 warps)."""
    return tl.load(base + rows[:, None] * stride_s + offs_d[None, :], mask=r_ok[:, None] & d_ok[None, :], other=0.0)


@triton.jit
def _load_rows_f32(base, rows, r_ok, stride_s, offs_d, d_ok):
    """`_load_rows` in fp32 (the inputs of phi and of elementwise sums)."""
    return _load_rows(base, rows, r_ok, stride_s, offs_d, d_ok).to(tl.float32)


@triton.jit
def _weighted_row_sum(w, x, LOWP: tl.constexpr, IEEE: tl.constexpr):
    """(16, BLOCK_D) whose row 0 is sum_r w[r] x[r, :] and the other rows 0, by one small GEMM (w (R,) fp32,
    x (R, BLOCK_D)): accumulated over a loop and summed over rows once at the end, it replaces a cross-warp
    reduction per iteration and a (R, BLOCK_D) fp32 accumulator."""
    return _mm(tl.where((tl.arange(0, 16) == 0)[:, None], w[None, :], 0.0), x, LOWP, IEEE)


@triton.jit
def _load_square(ptr, offs_d, d_ok, D):
    """A (BLOCK_D, BLOCK_D) tile of a contiguous row-major (D, D) matrix (its dtype: the GEMM operand's)."""
    return tl.load(ptr + offs_d[:, None] * D + offs_d[None, :], mask=d_ok[:, None] & d_ok[None, :], other=0.0)


@triton.jit
def _load_head_squares(ptr, ptr_t, bh, offs_d, d_ok, D):
    """Batch-head bh's (D, D) operand and its transpose, each stored contiguous as (B*H, D, D)."""
    off = bh.to(tl.int64) * D * D
    return _load_square(ptr + off, offs_d, d_ok, D), _load_square(ptr_t + off, offs_d, d_ok, D)


@triton.jit
def _program_ids(H, D: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
    """This program's (axis-0 index, bh, b, h, row offsets (BLOCK,), head-dim offsets (BLOCK_D,), d_ok) on a
    (*, B*H) grid."""
    bh = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    return tl.program_id(0), bh, (bh // H).to(tl.int64), bh % H, tl.arange(0, BLOCK), offs_d, offs_d < D


# ------------------------------------------------------------------------------------------------- kernels


@triton.jit
def _kv_sums_kernel(k_ptr, v_ptr, w_ptr, kv_ptr, z_ptr, S, H, CHUNK, D: tl.constexpr,
                    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                    BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, KIND: tl.constexpr, LOWP: tl.constexpr,
                    IEEE: tl.constexpr, ROW_W: tl.constexpr):
    """Chunk c of (b, h): kv[bh, c] = phi(K_c)^T V_c (D, D) and z[bh, c] = sum phi(K_c) (D,), fp32; with ROW_W
    z sums w * phi(K_c) instead, w the (B*H, S) fp32 row weights at w_ptr."""
    c, bh, b, h, offs_n, offs_d, d_ok = _program_ids(H, D, BLOCK, BLOCK_D)
    n_chunks = tl.num_programs(0)
    k_base = k_ptr + b * stride_kb + h * stride_kh
    v_base = v_ptr + b * stride_vb + h * stride_vh
    acc = tl.zeros((BLOCK_D, BLOCK_D), dtype=tl.float32)
    zacc = tl.zeros((16, BLOCK_D), dtype=tl.float32)  # row 0: the running z (`_weighted_row_sum`)
    end = tl.minimum((c + 1) * CHUNK, S)
    for s0 in range(c * CHUNK, end, BLOCK):
        rows = s0 + offs_n
        r_ok = rows < end
        pk = _phi(_load_rows_f32(k_base, rows, r_ok, stride_ks, offs_d, d_ok), r_ok, d_ok, KIND)
        vx = _load_rows(v_base, rows, r_ok, stride_vs, offs_d, d_ok)
        if ROW_W:
            zacc += _weighted_row_sum(tl.load(w_ptr + bh.to(tl.int64) * S + rows, mask=r_ok, other=0.0), pk,
                                      LOWP, IEEE)
        else:
            zacc += _weighted_row_sum(tl.full((BLOCK,), 1.0, tl.float32), pk, LOWP, IEEE)
        acc += _mm(tl.trans(pk), vx, LOWP, IEEE)
    out = (bh * n_chunks + c).to(tl.int64) * D
    tl.store(kv_ptr + out * D + offs_d[:, None] * D + offs_d[None, :], acc, mask=d_ok[:, None] & d_ok[None, :])
    tl.store(z_ptr + out + offs_d, tl.sum(zacc, 0), mask=d_ok)


@triton.jit
def _apply_kernel(q_ptr, o_ptr, out_ptr, kvw_ptr, z_ptr, bias_ptr, S, H, CHUNK, D: tl.constexpr, eps,
                  stride_qb, stride_qs, stride_qh, stride_ob, stride_os, stride_oh, stride_rb, stride_rs, stride_rh,
                  BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, KIND: tl.constexpr, LOWP: tl.constexpr,
                  IEEE: tl.constexpr):
    """Chunk c of (b, h), block by block: out = o + phi(q) KVW / (eps + phi(q) . z) + bias, KVW = KV W^T (the
    projection folded into the sums: one GEMM a block; KVW loaded once a chunk)."""
    c, bh, b, h, offs_n, offs_d, d_ok = _program_ids(H, D, BLOCK, BLOCK_D)
    q_base = q_ptr + b * stride_qb + h * stride_qh
    o_base = o_ptr + b * stride_ob + h * stride_oh
    r_base = out_ptr + b * stride_rb + h * stride_rh
    kvw = _load_square(kvw_ptr + bh.to(tl.int64) * D * D, offs_d, d_ok, D)
    z = tl.load(z_ptr + bh * D + offs_d, mask=d_ok, other=0.0)
    bias = tl.load(bias_ptr + offs_d, mask=d_ok, other=0.0)
    end = tl.minimum((c + 1) * CHUNK, S)
    for s0 in range(c * CHUNK, end, BLOCK):
        rows = s0 + offs_n
        r_ok = rows < end
        pq = _phi(_load_rows_f32(q_base, rows, r_ok, stride_qs, offs_d, d_ok), r_ok, d_ok, KIND)
        inv = 1.0 / (eps + tl.sum(pq * z[None, :], 1))
        y = _mm(pq, kvw, LOWP, IEEE) * inv[:, None] + bias[None, :]
        y += _load_rows_f32(o_base, rows, r_ok, stride_os, offs_d, d_ok)
        tl.store(r_base + rows[:, None] * stride_rs + offs_d[None, :], y.to(out_ptr.dtype.element_ty),
                 mask=r_ok[:, None] & d_ok[None, :])


@triton.jit
def _store_grad(ptr, g, mask, ACC: tl.constexpr):
    """Store a gradient block, or add it to what `ptr` holds (ACC: another part's gradient of the same input)."""
    if ACC:
        g += tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptr, g.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_q_kernel(q_ptr, do_ptr, dq_ptr, kvw_ptr, kvw_t_ptr, z_ptr, a_ptr, dz_ptr, db_ptr, S, H, CHUNK, D: tl.constexpr, eps,
                  stride_qb, stride_qs, stride_qh, stride_gb, stride_gs, stride_gh, stride_xb, stride_xs, stride_xh,
                  BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, KIND: tl.constexpr, LOWP: tl.constexpr,
                  IEEE: tl.constexpr, ACC: tl.constexpr):
    """Chunk c of (b, h): dQ of its rows (dO strides `stride_g*`, dQ `stride_x*`) and, summed over the chunk,
    a[bh, c] = sum (dO / den)^T phi(q) (D, D), dz[bh, c] = sum d den * phi(q), db[bh, c] = sum dO."""
    c, bh, b, h, offs_n, offs_d, d_ok = _program_ids(H, D, BLOCK, BLOCK_D)
    n_chunks = tl.num_programs(0)
    q_base = q_ptr + b * stride_qb + h * stride_qh
    do_base = do_ptr + b * stride_gb + h * stride_gh
    dq_base = dq_ptr + b * stride_xb + h * stride_xh
    kvw, kvw_t = _load_head_squares(kvw_ptr, kvw_t_ptr, bh, offs_d, d_ok, D)
    z = tl.load(z_ptr + bh * D + offs_d, mask=d_ok, other=0.0)
    a = tl.zeros((BLOCK_D, BLOCK_D), dtype=tl.float32)
    dz = tl.zeros((16, BLOCK_D), dtype=tl.float32)  # row 0: the running sums (`_weighted_row_sum`)
    db = tl.zeros((16, BLOCK_D), dtype=tl.float32)
    end = tl.minimum((c + 1) * CHUNK, S)
    for s0 in range(c * CHUNK, end, BLOCK):
        rows = s0 + offs_n
        r_ok = rows < end
        mask = r_ok[:, None] & d_ok[None, :]
        qx = _load_rows_f32(q_base, rows, r_ok, stride_qs, offs_d, d_ok)
        dout = _load_rows(do_base, rows, r_ok, stride_gs, offs_d, d_ok)
        pq = _phi(qx, r_ok, d_ok, KIND)
        inv = 1.0 / (eps + tl.sum(pq * z[None, :], 1))
        g = _mm(pq, kvw, LOWP, IEEE)  # phi(q) KV W^T: the projected numerator
        d_den = -tl.sum(dout * g, 1) * inv * inv
        d_pq = _mm(dout, kvw_t, LOWP, IEEE) * inv[:, None] + d_den[:, None] * z[None, :]
        dq = tl.where(mask, _phi_bwd(qx, pq, d_pq, KIND), 0.0)
        _store_grad(dq_base + rows[:, None] * stride_xs + offs_d[None, :], dq, mask, ACC)
        a += _mm(tl.trans(dout * inv[:, None]), pq, LOWP, IEEE)
        dz += _weighted_row_sum(d_den, pq, LOWP, IEEE)
        db += _weighted_row_sum(tl.full((BLOCK,), 1.0, tl.float32), dout, LOWP, IEEE)
    out = (bh * n_chunks + c).to(tl.int64) * D
    tl.store(a_ptr + out * D + offs_d[:, None] * D + offs_d[None, :], a, mask=d_ok[:, None] & d_ok[None, :])
    tl.store(dz_ptr + out + offs_d, tl.sum(dz, 0), mask=d_ok)
    tl.store(db_ptr + out + offs_d, tl.sum(db, 0), mask=d_ok)


@triton.jit
def _bwd_kv_kernel(k_ptr, v_ptr, dk_ptr, dv_ptr, dkv_ptr, dkv_t_ptr, dz_ptr, S, H, CHUNK, D: tl.constexpr,
                   stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_gb, stride_gs, stride_gh,
                   stride_wb, stride_ws, stride_wh,
                   BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, KIND: tl.constexpr, LOWP: tl.constexpr,
                   IEEE: tl.constexpr, ACC: tl.constexpr):
    """Chunk c of (b, h), block by block: dV = phi(K) dKV and dK = phi'(K) (V dKV^T + dz) (dk strides `stride_g*`,
    dv `stride_w*`; dKV loaded once a chunk)."""
    c, bh, b, h, offs_n, offs_d, d_ok = _program_ids(H, D, BLOCK, BLOCK_D)
    k_base = k_ptr + b * stride_kb + h * stride_kh
    v_base = v_ptr + b * stride_vb + h * stride_vh
    dk_base = dk_ptr + b * stride_gb + h * stride_gh
    dv_base = dv_ptr + b * stride_wb + h * stride_wh
    dkv, dkv_t = _load_head_squares(dkv_ptr, dkv_t_ptr, bh, offs_d, d_ok, D)
    dz = tl.load(dz_ptr + bh * D + offs_d, mask=d_ok, other=0.0)
    end = tl.minimum((c + 1) * CHUNK, S)
    for s0 in range(c * CHUNK, end, BLOCK):
        rows = s0 + offs_n
        r_ok = rows < end
        kx = _load_rows_f32(k_base, rows, r_ok, stride_ks, offs_d, d_ok)
        pk = _phi(kx, r_ok, d_ok, KIND)
        vx = _load_rows(v_base, rows, r_ok, stride_vs, offs_d, d_ok)
        mask = r_ok[:, None] & d_ok[None, :]
        d_pk = _mm(vx, dkv_t, LOWP, IEEE) + dz[None, :]
        dv = _mm(pk, dkv, LOWP, IEEE)
        dk = tl.where(mask, _phi_bwd(kx, pk, d_pk, KIND), 0.0)
        _store_grad(dk_base + rows[:, None] * stride_gs + offs_d[None, :], dk, mask, ACC)
        _store_grad(dv_base + rows[:, None] * stride_ws + offs_d[None, :], dv, mask, ACC)


# ------------------------------------------------------------------------------------------------ launchers


def _flags(x: torch.Tensor) -> dict:
    """The kernels' shared constexprs for inputs like x."""
    lowp = x.dtype in (torch.bfloat16, torch.float16) and not interpreting()
    return {"BLOCK_D": block_d(x.shape[-1]), "LOWP": lowp, "IEEE": interpreting()}


def _operand(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A small fp32 (.., D, D) matrix as the kernels' GEMM operand: bf16 for half inputs (off the interpreter),
    fp32 otherwise; contiguous."""
    return x.to(torch.bfloat16 if _flags(like)["LOWP"] else torch.float32).contiguous()


def _chunking(x: torch.Tensor, launch: LinearLaunch, stream: bool = False) -> tuple[int, int]:
    """(chunk rows, chunks per batch-head) for x (B, S, H, D): of the summing kernels, or of the streaming ones."""
    b, s, h, _ = x.shape
    blocks = triton.cdiv(s, launch.block)
    sms = 4 if interpreting() else torch.cuda.get_device_properties(x.device).multi_processor_count
    per_sm = launch.stream_programs_per_sm if stream else launch.programs_per_sm
    per_bh = max(1, min(blocks, triton.cdiv(per_sm * sms, b * h)))
    chunk = triton.cdiv(blocks, per_bh) * launch.block
    return chunk, triton.cdiv(s, chunk)


def kv_sums(k: torch.Tensor, v: torch.Tensor, kind: str, launch: LinearLaunch = DEFAULT_LAUNCH,
            row_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """KV = sum_j phi(k_j)^T v_j and z = sum_j phi(k_j) over every token, per batch and head.

    Args:
        k, v: (B, S, H, D) bf16 / fp16 / fp32, unit stride on D.
        kind: the feature map (`reference.FEATURE_MAPS`).
        row_weights: (B*H, S) fp32 contiguous, or None: z = sum_j w_j phi(k_j) instead (the marginal backward's
            dz = sum d den phi(q)).

    Returns:
        kv: (B*H, D, D) fp32, z: (B*H, D) fp32.
    """
    b, s, h, d = k.shape
    chunk, n_chunks = _chunking(k, launch)
    kv = torch.empty((b * h, n_chunks, d, d), device=k.device, dtype=torch.float32)
    z = torch.empty((b * h, n_chunks, d), device=k.device, dtype=torch.float32)
    w = z if row_weights is None else row_weights
    _kv_sums_kernel[(n_chunks, b * h)](k, v, w, kv, z, s, h, chunk, d, k.stride(0), k.stride(1), k.stride(2),
                                       v.stride(0), v.stride(1), v.stride(2), ROW_W=row_weights is not None,
                                       BLOCK=launch.block,
                                       KIND=_KIND[kind], num_warps=launch.fwd_warps, num_stages=launch.num_stages, **_flags(k))
    return kv.sum(1), z.sum(1)


def _forward(o: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, weight: torch.Tensor,
             bias: torch.Tensor, kind: str, eps: float, launch: LinearLaunch
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, kv, z): the fused forward (`linear_branch_add`), with the fp32 sums the backward reuses."""
    b, s, h, d = q.shape
    kv, z = kv_sums(k, v, kind, launch)
    kvw = _operand(kv @ weight.float().t(), q)  # (B*H, D, D): the projection folded into the sums
    out = torch.empty_like(o, memory_format=torch.contiguous_format)
    chunk, n_chunks = _chunking(q, launch, stream=True)
    _apply_kernel[(n_chunks, b * h)](
        q, o, out, kvw, z, bias.float(), s, h, chunk, d, eps, q.stride(0), q.stride(1), q.stride(2), o.stride(0),
        o.stride(1), o.stride(2), out.stride(0), out.stride(1), out.stride(2), BLOCK=launch.block,
        KIND=_KIND[kind], num_warps=launch.fwd_warps, num_stages=launch.num_stages, **_flags(q))
    return out, kv, z


def linear_branch_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           weight: torch.Tensor, kv: torch.Tensor, z: torch.Tensor, kind: str, eps: float,
                           launch: LinearLaunch = DEFAULT_LAUNCH, grads: tuple[torch.Tensor, ...] | None = None
                           ) -> tuple[torch.Tensor, ...]:
    """The branch's backward: (dq, dk, dv, dweight, dbias); the gradient of `o` is dout itself.

    With y = o_l W^T + bias and A = sum_tokens (dO / den)^T phi(q) per batch-head (one (D, D) accumulator, from the
    dQ pass): dKV = A^T W, dW = sum_bh A KV, and the dK / dV pass needs only dKV and dz.

    Args:
        dout: (B, S, H, D) the gradient of the output; q, k, v as in the forward; weight (D, D);
            kv (B*H, D, D), z (B*H, D): the forward's fp32 sums.
        grads: (dq, dk, dv), tensors like q holding another part's gradients (VSA's): the branch's are added to
            them in place and they are returned; None: new tensors.

    Returns:
        dq, dk, dv like q; dweight (D, D) and dbias (D,) fp32.
    """
    b, s, h, d = q.shape
    dout = dout if dout.stride(-1) == 1 else dout.contiguous()  # e.g. the expanded ones of out.sum()
    flags = _flags(q)
    acc = grads is not None
    dq, dk, dv = grads if acc else (torch.empty_like(q, memory_format=torch.contiguous_format) for _ in range(3))
    w32 = weight.float()
    kvw = kv @ w32.t()
    chunk, n_chunks = _chunking(q, launch)
    part = torch.empty((3, b * h, n_chunks, d), device=q.device, dtype=torch.float32)  # dz, db, spare
    a = torch.empty((b * h, n_chunks, d, d), device=q.device, dtype=torch.float32)
    _bwd_q_kernel[(n_chunks, b * h)](
        q, dout, dq, _operand(kvw, q), _operand(kvw.transpose(1, 2), q), z, a, part[0], part[1], s, h, chunk, d,
        eps, q.stride(0), q.stride(1), q.stride(2), dout.stride(0), dout.stride(1), dout.stride(2), dq.stride(0),
        dq.stride(1), dq.stride(2), BLOCK=launch.block, KIND=_KIND[kind], num_warps=launch.bwd_warps, num_stages=launch.num_stages, ACC=acc,
        **flags)
    a, dz, db = a.sum(1), part[0].sum(1), part[1].sum(1)
    dkv = a.transpose(1, 2) @ w32  # (B*H, D, D)
    chunk, n_chunks = _chunking(q, launch, stream=True)
    _bwd_kv_kernel[(n_chunks, b * h)](
        k, v, dk, dv, _operand(dkv, q), _operand(dkv.transpose(1, 2), q), dz, s, h, chunk, d, k.stride(0), k.stride(1),
        k.stride(2), v.stride(0), v.stride(1), v.stride(2), dk.stride(0), dk.stride(1), dk.stride(2),
        dv.stride(0), dv.stride(1), dv.stride(2),
        BLOCK=launch.block, KIND=_KIND[kind], num_warps=launch.bwd_warps, num_stages=launch.num_stages, ACC=acc, **flags)
    dweight = torch.einsum("nij,njk->ik", a, kv)
    return dq, dk, dv, dweight, db.sum(0)


# --------------------------------------------------------------------------------------- custom ops, autograd

_LAUNCH_SCHEMA = ("int block, int fwd_warps, int bwd_warps, int programs_per_sm, int stream_programs_per_sm, "
                  "int num_stages, bool fused_epilogue")


@torch.library.custom_op(
    "vsagen::sla_linear", mutates_args=(),
    schema="(Tensor o, Tensor q, Tensor k, Tensor v, Tensor weight, Tensor bias, str kind, float eps, "
           f"{_LAUNCH_SCHEMA}) -> (Tensor, Tensor, Tensor)")
def _linear_op(o, q, k, v, weight, bias, kind, eps, *launch):
    """Forward custom op: (out, kv, z) of `_forward`."""
    return _forward(o, q, k, v, weight, bias, kind, eps, LinearLaunch(*launch))


@_linear_op.register_fake
def _linear_op_fake(o, q, k, v, weight, bias, kind, eps, *launch):
    b, _, h, d = q.shape
    return (torch.empty_like(o, memory_format=torch.contiguous_format),
            q.new_empty((b * h, d, d), dtype=torch.float32), q.new_empty((b * h, d), dtype=torch.float32))


@torch.library.custom_op(
    "vsagen::sla_linear_bwd", mutates_args=(),
    schema="(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor weight, Tensor kv, Tensor z, str kind, float eps, "
           f"{_LAUNCH_SCHEMA}) -> (Tensor, Tensor, Tensor, Tensor, Tensor)")
def _linear_bwd_op(dout, q, k, v, weight, kv, z, kind, eps, *launch):
    """Backward custom op: `linear_branch_backward`."""
    return linear_branch_backward(dout, q, k, v, weight, kv, z, kind, eps, LinearLaunch(*launch))


@_linear_bwd_op.register_fake
def _linear_bwd_op_fake(dout, q, k, v, weight, kv, z, kind, eps, *launch):
    d = q.shape[-1]
    dense = {"memory_format": torch.contiguous_format}
    return (torch.empty_like(q, **dense), torch.empty_like(q, **dense), torch.empty_like(q, **dense),
            weight.new_empty((d, d), dtype=torch.float32), weight.new_empty((d,), dtype=torch.float32))


def _setup_context(ctx, inputs, output):
    o, q, k, v, weight, bias, kind, eps, *launch = inputs
    _, kv, z = output
    ctx.save_for_backward(q, k, v, weight, kv, z)
    ctx.args = (kind, eps, *launch)


def _linear_backward(ctx, dout, _dkv, _dz):
    q, k, v, weight, kv, z = ctx.saved_tensors
    dq, dk, dv, dweight, dbias = _linear_bwd_op(dout, q, k, v, weight, kv, z, *ctx.args)
    return (dout, dq, dk, dv, dweight.to(weight.dtype), dbias.to(weight.dtype)) + (None,) * len(ctx.args)


_linear_op.register_autograd(_linear_backward, setup_context=_setup_context)


# ----------------------------------------------------------------------------------------- public function


def linear_branch_add(o: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, weight: torch.Tensor,
                      bias: torch.Tensor, *, kind: str = "softmax", eps: float = LINEAR_EPS,
                      launch: LinearLaunch = DEFAULT_LAUNCH) -> torch.Tensor:
    """o + proj(o_l) with SLA*'s global linear-attention branch o_l (see the module docstring), fused in Triton.

    Args:
        o: (B, S, H, D) the sparse part's output, q's dtype.
        q, k, v: (B, S, H, D) bf16 / fp16 / fp32 (one dtype), any strides with unit stride on D, D <= 256, any
            token order (the same for q, k, v and o).
        weight: (D, D) the projection's weight (out, in), bias: (D,); float32 in `sla-star` (any float dtype).
        kind: the feature map, one of `reference.FEATURE_MAPS`.
        eps: added to the denominator (SLA's 1e-5).
        launch: the kernels' launch parameters (`LinearLaunch`).

    Returns:
        (B, S, H, D) like o, contiguous; differentiable in o, q, k, v, weight and bias (custom ops, so
        torch.compile traces it without a graph break). The backward is deterministic (no atomics).

    Raises:
        ValueError: mismatched shapes, dtypes or devices, an empty input (B, S, H or D of 0), D > 256, no unit
            stride on D, an unknown kind, or a device other than CUDA without the Triton interpreter.

    Source: seed 002 (AMD's SLA*), SLA arXiv 2509.24006 sec. 3-4 and its released torch branch (REFERENCE.md).
    """
    _check(o, q, k, v, weight, bias, kind)
    weight = weight.contiguous()
    bias = bias.contiguous()
    args = (o, q, k, v, weight, bias, kind, float(eps), *dataclasses.astuple(launch))
    grads = torch.is_grad_enabled() and any(x.requires_grad for x in (o, q, k, v, weight, bias))
    if not grads and not torch.compiler.is_compiling():
        return _forward(o, q, k, v, weight, bias, kind, float(eps), launch)[0]  # nothing saved
    return _linear_op(*args)[0]


def _check(o, q, k, v, weight, bias, kind) -> None:
    if kind not in _KIND:
        raise ValueError(f"feature map must be one of {FEATURE_MAPS}, got {kind!r}")
    if q.dim() != 4 or any(x.shape != q.shape for x in (k, v, o)):
        raise ValueError(f"o, q, k, v must share one (B, S, H, D) shape, got {tuple(o.shape)}, {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.dtype not in (torch.bfloat16, torch.float16, torch.float32) or any(x.dtype != q.dtype for x in (k, v, o)):
        raise ValueError(f"o, q, k, v must share a dtype among bf16, fp16, fp32, got {o.dtype}, {q.dtype}, "
                         f"{k.dtype}, {v.dtype}")
    if q.numel() == 0:
        raise ValueError(f"o, q, k, v must not be empty, got shape {tuple(q.shape)}")
    d = q.shape[-1]
    if d > 256:
        raise ValueError(f"head dim {d} > 256 is not supported")
    if any(x.stride(-1) != 1 for x in (o, q, k, v)):
        raise ValueError("o, q, k, v need unit stride on the head dim")
    if weight.shape != (d, d) or bias.shape != (d,):
        raise ValueError(f"weight must be ({d}, {d}) and bias ({d},), got {tuple(weight.shape)} and "
                         f"{tuple(bias.shape)}")
    devices = {x.device for x in (o, q, k, v, weight, bias)}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(str(x) for x in devices)}")
    if q.device.type != "cuda" and not interpreting():
        raise ValueError(f"the Triton linear branch needs CUDA or TRITON_INTERPRET=1, got {q.device}")
