"""The 8-bit fine stage (SageAttention2's numerics, TurboDiffusion's SageSLA): the quantization of q, k, v and the
float reference of the attention over the quantized operands; torch only (no triton import here).

Formulas, as TurboDiffusion runs SageSLA on sm90 (thu-ml/TurboDiffusion at aaecff5, `turbodiffusion/SLA/core.py`,
which calls SpargeAttn's kernels: thu-ml/SpargeAttn at bfd980b):
* K smoothing: km = mean over the tokens of k per (batch, head), in k's dtype (core.py:197 `k.mean(dim=-2)`), and
  k - km in k's dtype (SpargeAttn `spas_sage_attn/utils.py:125-128`, `x -= x_mean` on the bf16 block). Exact for
  softmax attention: every score of a query row moves by q . km, over whatever keys the row selected.
* int8 Q and K per block of tokens (utils.py:132-145, `get_vanilla_qk_quant` at utils.py:265): in fp32,
  scale = max |x| over the block's tokens and channels / 127 + 1e-7, x_int8 = trunc(x / scale + 0.5 sign(x / scale))
  with sign(0) = +1 (round half away from zero). Blocks: 64 query tokens and 128 key tokens on sm90, 128 / 64
  elsewhere (core.py:200-203; the selection uses the same blocks, core.py:186-189).
* fp8 V per channel (core.py:218-224: `scale_fuse_quant_cuda(..., scale_max=2.25)`; SpargeAttn
  `csrc/fused/fused.cu:81-190`, `MeanScaleKernel<.., sub_mean=false>`): v_scale[d] = max over the tokens of |v[:, d]|
  / 2.25 per (batch, head), v_fp8 = e4m3(v * (2.25 / max |v[:, d]|)), round to nearest even, so |v_fp8| <= 2.25.
* Scores (SpargeAttn `csrc/qattn/qk_int_sv_f8_cuda_sm90.cuh:204, 320-332, 344, 368-375`): the int32 product
  q_int8 . k_int8 (exact), times sm_scale * log2(e) * q_scale * k_scale: base-2 logits.
* Online softmax with an fp8 P (attn_utils.cuh:28 `S_FP8_OFFSET 8.807`, 471-560 `update_mdo<.., exp_offset=true>`,
  582-596 `RS_32_to_8`; sm90.cuh:682-700): per key block, m = max(m, rowmax s), P~ = exp2(s - m + 8.807) in fp32
  (2^8.807 = 448 = e4m3's largest finite value: P~ in [0, 448]), the denominator accumulates P~ unrounded, the
  accumulator acc * exp2(m_old - m) + e4m3(P~) . v_fp8 with fp32 accumulation.
* Output (sm90.cuh:712-740, `normalize_d` then `fuse_v_scale`): o = acc / l * v_scale[d]; 2^8.807 cancels.

vsagen applies these to its own block-sparse fine stage: the query and key blocks are groups of tokens given by
their offsets (VSA: its 64-token kernel tiles, the cubes' tokens; SLA: raster blocks of block_q / block_k tokens, so
`sla:block_q=64,block_k=128,precision=int8` is SageSLA's sm90 geometry), and the softmax walks each query tile's
selected key tiles in list order, one 64-token tile per step. Differences from SpargeAttn's kernels: scales are kept
per token (the block's value repeated), so one kernel serves any block geometry; a V channel that is zero throughout
gets scale 1 (SpargeAttn's would divide 0 by 0); the running max starts at -inf and a row with no selected key
outputs 0 (LSE -inf), as vsagen's bf16 kernel.
"""

from __future__ import annotations

import math

import torch

INT8_MAX = 127.0
QK_SCALE_EPS = 1e-7  # added to max |x| / 127 (SpargeAttn utils.py:139)
V_SCALE_MAX = 2.25  # |v_fp8| <= 2.25 (TurboDiffusion core.py:224)
P_FP8_OFFSET = 8.807  # base-2 offset of P~ (SpargeAttn attn_utils.cuh:28): P~ <= 2^8.807 = 448
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
FP8 = torch.float8_e4m3fn
V_SLOT = 64  # tokens per tile slot of the kernel's V^T (`v_slots`): the kernel's key tile


def check_forward_only(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise ValueError where q, k or v need gradients: the 8-bit fine stage has no backward (a bf16 one would not
    be its derivative), so training takes the bf16 fine stage."""
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        raise ValueError("the 8-bit fine stage (precision=int8) is forward only: it has no backward (the bf16 "
                         "one's would not match it); use precision=bf16 to train or take gradients")


def _acc_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def group_of_tokens(offsets: torch.Tensor) -> torch.Tensor:
    """(S,) int64 group index of each token for group starts `offsets` (G + 1,) (offsets[0] = 0, offsets[-1] = S)."""
    sizes = (offsets[1:] - offsets[:-1]).long()
    return torch.repeat_interleave(torch.arange(sizes.numel(), device=offsets.device), sizes)


def block_offsets(seq: int, block: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(ceil(seq / block) + 1,) int32 starts of raster blocks of `block` tokens (the last one partial)."""
    return torch.cat([torch.arange(0, seq, block, dtype=torch.int32),
                      torch.tensor([seq], dtype=torch.int32)]).to(device)


def smooth_k(k: torch.Tensor) -> torch.Tensor:
    """K smoothing: k - mean over the tokens of k, per (batch, head, channel), both in k's dtype (SageSLA:
    TurboDiffusion core.py:197, SpargeAttn utils.py:125-128). k: (B, S, H, D) float."""
    return k - k.mean(dim=1, keepdim=True)


def quantize_int8(x: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 per group of tokens (SpargeAttn utils.py:132-145), computed in fp32 (fp64 for fp64 input).

    Args:
        x: (B, S, H, D) float (already smoothed for K: `smooth_k`).
        offsets: (G + 1,) integer group starts over S (offsets[0] = 0, offsets[-1] = S; groups of any size >= 1).

    Returns:
        x_int8 (B, S, H, D) int8 in [-127, 127]: trunc(x / scale + 0.5 sign), sign(0) = +1; scale (B, H, S) fp32,
        each token's group value max |x over the group's tokens and channels| / 127 + 1e-7 (per batch and head).
    """
    b, s, h, _ = x.shape
    xf = x.to(_acc_dtype(x))
    group = group_of_tokens(offsets.to(x.device))
    n = int(offsets.numel()) - 1
    amax = torch.zeros(b, n, h, dtype=xf.dtype, device=x.device).scatter_reduce(
        1, group.view(1, s, 1).expand(b, s, h), xf.abs().amax(-1), "amax")
    scale = (amax / INT8_MAX + QK_SCALE_EPS).index_select(1, group)  # (B, S, H)
    y = xf / scale[..., None]
    y = torch.trunc(y + 0.5 * torch.where(y >= 0, 1.0, -1.0))
    return y.clamp(-INT8_MAX, INT8_MAX).to(torch.int8), scale.to(torch.float32).permute(0, 2, 1).contiguous()


def quantize_v_fp8(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 e4m3 V per channel (SpargeAttn fused.cu:81-190 with scale_max 2.25), in fp32.

    Args:
        v: (B, S, H, D) float.

    Returns:
        v_fp8 (B, S, H, D) float8_e4m3fn = e4m3(v * (2.25 / max_t |v[t, d]|)) (round to nearest even; 0 for a
        channel that is zero throughout); v_scale (B, H, D) fp32 = max_t |v[t, d]| / 2.25 (1 for such a channel).
    """
    vf = v.to(torch.float32)
    amax = vf.abs().amax(dim=1)  # (B, H, D)
    amax = torch.where(amax > 0, amax, torch.full_like(amax, V_SCALE_MAX))
    recp = V_SCALE_MAX / amax
    return (vf * recp[:, None]).to(FP8), (amax / V_SCALE_MAX).contiguous()


def quantize_operands(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor,
                      k_offsets: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The 8-bit fine stage's operands: (q_int8, q_scale, k_int8, k_scale, v_fp8, v_scale), q per group of
    `q_offsets`, k smoothed and per group of `k_offsets` (`quantize_int8`), v per channel (`quantize_v_fp8`)."""
    qi, qs = quantize_int8(q, q_offsets)
    ki, ks = quantize_int8(smooth_k(k), k_offsets)
    vf, vs = quantize_v_fp8(v)
    return qi, qs, ki, ks, vf, vs


def v_slots(vf: torch.Tensor, tile_offsets: torch.Tensor) -> torch.Tensor:
    """V in the 8-bit kernel's layout: transposed, one 64-token slot per kernel tile.

    Tile t's tokens tile_offsets[t] .. tile_offsets[t + 1] - 1 lie at slot columns [0, size_t) of out[..., t, :],
    zeros in the rest of the slot; viewed as (B*H*D, T*64) rows every tile's V^T box starts at a multiple of 64
    tokens (64 bytes) whatever the tile sizes, so Hopper's TMA can fetch it (16-byte aligned innermost coordinate)
    and the fp8 wgmma takes it K-major (`bsa_primitives.load_k_vt`). Where every tile is full (S = 64 T) this is
    plain V^T. One read and one write of V, which `sage_attn.quantize_operands_triton` does not pay (its quantizer
    writes these slots directly); for `quantize_operands`' token-major vf (tests, references).

    Args:
        vf: (B, S, H, D) float8_e4m3fn, any layout.
        tile_offsets: (T + 1,) integer tile starts, tiles of 1..64 tokens, tile_offsets[T] = S.

    Returns:
        (B, H, D, T, 64) float8_e4m3fn contiguous.
    """
    idx, valid = _tile_slots(tile_offsets.to(vf.device))  # (T, 64)
    bits = vf.view(torch.uint8).permute(0, 2, 3, 1)[..., idx]  # (B, H, D, T, 64); byte 0 is +0.0 in e4m3
    return torch.where(valid, bits, 0).contiguous().view(FP8)


def v_from_slots(vt: torch.Tensor, tile_offsets: torch.Tensor) -> torch.Tensor:
    """The token-major (B, S, H, D) float8_e4m3fn contiguous V of `v_slots`' (B, H, D, T, 64) vt (the inverse)."""
    _, valid = _tile_slots(tile_offsets.to(vt.device))
    cols = torch.arange(valid.numel(), device=vt.device)[valid.reshape(-1)]  # tokens in order
    return vt.view(torch.uint8).flatten(3)[..., cols].permute(0, 3, 1, 2).contiguous().view(FP8)


def v_slot_columns(tile_offsets: torch.Tensor, s: int) -> torch.Tensor:
    """(S,) int32 on tile_offsets' device: each token's column in `v_slots`' (T*64) rows, 64 t + (token -
    tile_offsets[t]) for the token's tile t (what the kernel's tile plans, which hold token rows, read V^T by)."""
    off = tile_offsets.long()
    tok = torch.arange(s, device=off.device)
    tile = torch.searchsorted(off[1:], tok, right=True)
    return (tile * V_SLOT + tok - off[tile]).to(torch.int32)


def round_fp8(x: torch.Tensor) -> torch.Tensor:
    """x rounded to e4m3 (nearest even, through fp32) and back to x's dtype; x in [0, 448]."""
    return x.to(torch.float32).to(FP8).to(x.dtype)


def _tile_slots(offsets: torch.Tensor, width: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """(T, width) token index of each slot of each tile (clamped) and (T, width) validity."""
    off = offsets.long()
    idx = off[:-1, None] + torch.arange(width, device=off.device)
    valid = idx < off[1:, None]
    return torch.where(valid, idx, off[:-1, None]), valid


def sage_fine_reference(qi: torch.Tensor, qs: torch.Tensor, ki: torch.Tensor, ks: torch.Tensor, vf: torch.Tensor,
                        vs: torch.Tensor, q2k: torch.Tensor, q2k_cnt: torch.Tensor, tile_offsets: torch.Tensor,
                        scale: float | None = None, dtype: torch.dtype = torch.float64,
                        out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8-bit fine stage's attention over quantized operands (module docstring's formulas), in `dtype`.

    Each query tile walks its q2k list in order, one key tile per step, as vsagen's kernel without tile plans
    (`bsa_forward`, PACK off); the fp8 rounding of P~ depends on the running max, so the walk order is part of the
    formula.

    Args:
        qi, ki: (B, S, H, D) int8; qs, ks: (B, H, S) fp32 per-token scales; vf: (B, S, H, D) float8_e4m3fn;
            vs: (B, H, D) fp32 (`quantize_operands`).
        q2k: (B, H, T, K) integer key tiles per query tile; q2k_cnt: (B, H, T) integer, entries past it unread.
        tile_offsets: (T + 1,) integer tile starts, tiles of at most 64 tokens.
        scale: softmax scale, default 1/sqrt(D).
        dtype: the arithmetic's dtype (float64: the reference; float32: the CPU path of the option).
        out_dtype: the output's dtype (default `dtype`).

    Returns:
        out (B, S, H, D) out_dtype, 0 on rows with no selected tile; lse (B, H, S) `dtype` natural log (-inf there).
    """
    b, s, h, d = qi.shape
    dev = qi.device
    c = (d ** -0.5 if scale is None else scale) * LOG2E
    slots, valid = _tile_slots(tile_offsets.to(dev))  # (T, 64)
    t = slots.shape[0]

    def by_tiles(x):  # (B, S, H, D) -> (B, H, T, 64, D) in dtype
        return x.to(dtype).permute(0, 2, 1, 3)[:, :, slots]

    q = by_tiles(qi)
    qsc = qs.to(dtype)[:, :, slots] * c  # (B, H, T, 64)
    kall, vall = ki.to(dtype).permute(0, 2, 1, 3), vf.to(dtype).permute(0, 2, 1, 3)  # (B, H, S, D)
    ksall = ks.to(dtype)
    m = torch.full((b, h, t, 64), -math.inf, dtype=dtype, device=dev)
    lsum = torch.zeros_like(m)
    acc = torch.zeros(b, h, t, 64, d, dtype=dtype, device=dev)
    for i in range(q2k.shape[-1]):
        kt = q2k[..., i].long().clamp(0, t - 1)  # (B, H, T)
        rows = slots[kt].reshape(b, h, t * 64)  # key tokens of each query tile's i-th tile
        kv_ok = valid[kt] & (i < q2k_cnt)[..., None]  # (B, H, T, 64)
        kk = kall.gather(2, rows[..., None].expand(-1, -1, -1, d)).view(b, h, t, 64, d)
        vv = vall.gather(2, rows[..., None].expand(-1, -1, -1, d)).view(b, h, t, 64, d)
        ksc = ksall.gather(2, rows).view(b, h, t, 64)
        sc = torch.einsum("bhtmd,bhtnd->bhtmn", q, kk) * qsc[..., None] * ksc[..., None, :]
        sc = sc.masked_fill(~kv_ok[..., None, :], -math.inf)
        m_new = torch.maximum(m, sc.amax(-1))
        safe = torch.where(torch.isinf(m_new), 0.0, m_new)
        alpha = torch.exp2(m - safe)  # 0 where m was -inf
        p = torch.exp2(sc - safe[..., None] + P_FP8_OFFSET)
        lsum = lsum * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + torch.einsum("bhtmn,bhtnd->bhtmd", round_fp8(p), vv)
        m = m_new
    empty = lsum == 0
    o = acc / torch.where(empty, 1.0, lsum)[..., None] * vs.to(dtype)[:, :, None, None, :]
    lse = torch.where(empty, -math.inf, (m + torch.log2(torch.where(empty, 1.0, lsum)) - P_FP8_OFFSET) * LN2)
    out = torch.zeros(b, h, s, d, dtype=out_dtype or dtype, device=dev)
    lse_out = torch.full((b, h, s), -math.inf, dtype=dtype, device=dev)
    sel = valid.reshape(-1)
    tok = slots.reshape(-1)[sel]
    out[:, :, tok] = o.reshape(b, h, t * 64, d)[:, :, sel].to(out.dtype)
    lse_out[:, :, tok] = lse.reshape(b, h, t * 64)[:, :, sel]
    return out.permute(0, 2, 1, 3), lse_out


def sage_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2k: torch.Tensor,
                             q2k_cnt: torch.Tensor, tile_offsets: torch.Tensor, q_offsets: torch.Tensor,
                             k_offsets: torch.Tensor, scale: float | None = None,
                             dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The whole 8-bit fine stage on float q, k, v (B, S, H, D): `quantize_operands` with query groups `q_offsets`
    and key groups `k_offsets`, then `sage_fine_reference` in `dtype` over q2k / q2k_cnt / tile_offsets (as there).
    Returns out (B, S, H, D) in q's dtype."""
    ops = quantize_operands(q, k, v, q_offsets, k_offsets)
    return sage_fine_reference(*ops, q2k, q2k_cnt, tile_offsets, scale, dtype, out_dtype=q.dtype)[0]
