"""The 8-bit fine stage on vsagen's Triton block-sparse forward (`bsa_forward`'s SAGE switch): int8 Q.K^T with K
smoothing and per-block scales, fp8 e4m3 P.V, SageSLA's formulas (`sage`'s docstring, with TurboDiffusion's and
SpargeAttn's file:line sources). Forward only: there is no 8-bit backward, and `sage_block_sparse_attention` refuses
inputs that need gradients (ValueError) rather than pair an 8-bit forward with a bf16 backward silently; train with
the bf16 fine stage (`block_sparse_attention`).

The operands are quantized by torch ops (`sage.quantize_operands`: K's mean, per-group int8 q and k, per-channel
fp8 v), then one launch per size class of the block-sparse forward with SAGE on: pointer loads of the 1-byte K / V
tiles (TMA takes bf16 / fp16 here), the q2k lists or tile plans, and the query-group launch, as the bf16 kernel.
"""

from __future__ import annotations

import torch

from . import sage
from .bsa_forward import _launch
from .bsa_primitives import PACK_SEG
from .tuning import KernelTuning, default_tuning

__all__ = ["bsa_fwd_sage", "check_sage_operands", "sage_block_sparse_attention"]


def check_sage_operands(qi: torch.Tensor, qs: torch.Tensor, ki: torch.Tensor, ks: torch.Tensor, vf: torch.Tensor,
                        vs: torch.Tensor) -> None:
    """Raise ValueError unless qi, ki (B, S, H, D) are int8 and vf float8_e4m3fn of that shape with unit stride on
    D, D <= 256, qs, ks (B, H, S) and vs (B, H, D) contiguous fp32, all on one device."""
    if qi.dim() != 4 or ki.shape != qi.shape or vf.shape != qi.shape:
        raise ValueError(f"q, k, v must share one (B, S, H, D) shape, got {tuple(qi.shape)}, {tuple(ki.shape)}, "
                         f"{tuple(vf.shape)}")
    if qi.dtype != torch.int8 or ki.dtype != torch.int8 or vf.dtype != sage.FP8:
        raise ValueError(f"the 8-bit fine stage takes int8 q, k and float8_e4m3fn v, got {qi.dtype}, {ki.dtype}, "
                         f"{vf.dtype}")
    b, s, h, d = qi.shape
    if d > 256 or any(x.stride(-1) != 1 for x in (qi, ki, vf)):
        raise ValueError(f"head dim {d} must be <= 256 with unit stride")
    for name, x, shape in (("q_scale", qs, (b, h, s)), ("k_scale", ks, (b, h, s)), ("v_scale", vs, (b, h, d))):
        if x.shape != shape or x.dtype != torch.float32 or not x.is_contiguous():
            raise ValueError(f"{name} must be a contiguous fp32 {shape}, got {tuple(x.shape)} {x.dtype}")
    if len({x.device for x in (qi, qs, ki, ks, vf, vs)}) != 1:
        raise ValueError("the 8-bit operands must be on one device")


def bsa_fwd_sage(qi: torch.Tensor, qs: torch.Tensor, ki: torch.Tensor, ks: torch.Tensor, vf: torch.Tensor,
                 vs: torch.Tensor, q2k: torch.Tensor, q2k_cnt: torch.Tensor, tile_offsets: torch.Tensor,
                 scale: float | None = None, tuning: KernelTuning | None = None,
                 out_dtype: torch.dtype = torch.bfloat16, groups: torch.Tensor | None = None,
                 group_launch: tuple[int, int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The block-sparse forward with SAGE on (no autograd) over quantized operands.

    Args:
        qi, qs, ki, ks, vf, vs: `sage.quantize_operands`' outputs (checked: `check_sage_operands`).
        q2k, q2k_cnt, tile_offsets, scale, tuning: as `bsa_forward.bsa_fwd` (the warp-specialized forward does not
            run: it has no 8-bit variant).
        out_dtype: the output's dtype.
        groups, group_launch: as `bsa_forward.bsa_fwd_grouped` (query groups of block_m rows), or None.

    Returns:
        out (B, S, H, D) out_dtype contiguous; lse (B, H, S) fp32 natural log of the dequantized scores' row sums
        (-inf where no tile is selected).

    Raises:
        ValueError: operands outside `check_sage_operands`, index tensors not int32 or of the wrong shape.
    """
    check_sage_operands(qi, qs, ki, ks, vf, vs)
    b, s, h, d = qi.shape
    n_tiles = tile_offsets.numel() - 1
    if q2k.dim() != 4 or q2k.shape[:3] != (b, h, n_tiles) or q2k_cnt.shape != (b, h, n_tiles) \
            or {q2k.dtype, q2k_cnt.dtype, tile_offsets.dtype} != {torch.int32}:
        raise ValueError(f"q2k must be int32 (B, H, Q_TILES, K) = ({b}, {h}, {n_tiles}, K), q2k_cnt and "
                         f"tile_offsets int32, got {tuple(q2k.shape)} {q2k.dtype}, {tuple(q2k_cnt.shape)}")
    if groups is not None and (groups.dtype != torch.int32 or groups.dim() != 2 or group_launch is None
                               or groups.shape[1] != 2 + group_launch[0] // PACK_SEG):
        raise ValueError("groups must be an int32 (n, 2 + block_m / 8) table with its group_launch")
    out = torch.empty((b, s, h, d), dtype=out_dtype, device=qi.device)
    if b == 0 or s == 0:
        return out, torch.empty((b, h, s), dtype=torch.float32, device=qi.device)
    tuning = default_tuning(qi.device, d) if tuning is None else tuning
    lse = _launch(qi, ki, vf, q2k, q2k_cnt, tile_offsets, scale, tuning, out, None, groups, group_launch,
                  sage=dict(qs=qs, ks=ks, vs=vs, offset=sage.P_FP8_OFFSET))
    return out, lse


def sage_block_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2k: torch.Tensor,
                                q2k_cnt: torch.Tensor, tile_offsets: torch.Tensor, q_offsets: torch.Tensor,
                                k_offsets: torch.Tensor, scale: float | None = None,
                                tuning: KernelTuning | None = None, groups: torch.Tensor | None = None,
                                group_launch: tuple[int, int, int] | None = None) -> torch.Tensor:
    """The 8-bit fine stage on float q, k, v: quantize (`sage.quantize_operands`), then `bsa_fwd_sage`.

    Args:
        q, k, v: (B, S, H, D) bf16 / fp16 / fp32, tile order, unit stride on D.
        q2k, q2k_cnt, tile_offsets, scale, tuning, groups, group_launch: as `bsa_fwd_sage`.
        q_offsets / k_offsets: (G + 1,) integer starts of the token groups that share a q / k int8 scale (VSA: the
            kernel tiles, `tile_offsets`; SageSLA on sm90: raster blocks of 64 / 128 tokens, `sage.block_offsets`).

    Returns:
        out (B, S, H, D) in q's dtype.

    Raises:
        ValueError: inputs that need gradients (forward only: the backward would be bf16's, so train with
            `block_sparse_attention`), or as `bsa_fwd_sage`.

    Source: SageAttention2 (arXiv 2411.10958) and SageSLA (TurboDiffusion); `sage`'s docstring has the formulas.
    """
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        raise ValueError("the 8-bit fine stage (precision=int8) is forward only: it has no backward (the bf16 "
                         "one's would not match it); use precision=bf16 to train or take gradients")
    ops = sage.quantize_operands(q, k, v, q_offsets, k_offsets)
    return bsa_fwd_sage(*ops, q2k, q2k_cnt, tile_offsets, scale, tuning, q.dtype, groups, group_launch)[0]
