"""SLA*'s attention: VSA's fine stage and the linear branch (`global` or `marginal` scope), with gradients as one
custom op, so that the backward adds the branch's dQ / dK / dV into the block-sparse backward's own buffers in place.

As two ops (`block_sparse_attn.block_sparse_attention`, then `linear_branch.linear_branch_add` or
`linear_marginal.marginal_branch_add`) autograd would sum the two parts' gradients of q, k and v in three extra
elementwise passes (each reads two (B, S, H, D) tensors and writes one: about 0.9 GB at the Wan2.1-1.3B 480p
shape). Here the branch's backward kernels read the sparse part's gradient rows and write the sums
(`linear_branch_backward` / `marginal_branch_backward` with `grads=`). Without gradients the two parts run as two
launches of their own (`sla_star_attention` falls back to them), which lets a caller time them apart; with
`LinearLaunch.fused_epilogue` the `global` forward, with gradients or without, is the sums' pass over K and V and
then the block-sparse forward with the branch in its epilogue (`bsa_forward.bsa_fwd_linear`; not yet timed on a
GPU, so off by default).

The custom ops `vsagen::sla_star_attn` / `vsagen::sla_star_attn_bwd` carry the block-sparse kernels' tuning
(`tuning.op_args`) and the branch's `LinearLaunch` as plain arguments, as `block_sparse_attn` does, so
torch.compile traces them without a graph break.
"""

from __future__ import annotations

import dataclasses

import torch

from .block_sparse_attn import block_sparse_attention, check_inputs_and_tiles
from .bsa_backward import bsa_bwd, k2q_lists
from .bsa_forward import bsa_fwd, bsa_fwd_linear
from .bsa_primitives import check_fp32_bwd
from .linear_branch import _forward as linear_forward
from .linear_branch import (_LAUNCH_SCHEMA, DEFAULT_LAUNCH, LINEAR_EPS, LinearLaunch, _check, _operand, kv_sums,
                            linear_branch_add, linear_branch_backward)
from . import linear_marginal as marginal
from .tuning import OP_SCHEMA_ARGS, KernelTuning, default_tuning, op_args

_N_LAUNCH = len(dataclasses.fields(LinearLaunch))


@torch.library.custom_op(
    "vsagen::sla_star_attn", mutates_args=(),
    schema="(Tensor q, Tensor k, Tensor v, Tensor q2k, Tensor q2k_cnt, Tensor tile_offsets, float scale, "
           f"Tensor weight, Tensor bias, str scope, str kind, float eps, {_LAUNCH_SCHEMA}, {OP_SCHEMA_ARGS}) "
           "-> (Tensor, Tensor, Tensor, Tensor, Tensor)")
def _op(q, k, v, q2k, q2k_cnt, tile_offsets, scale, weight, bias, scope, kind, eps, *rest):
    """(out, o_sparse, lse, kv, z) of `_forward` (kv, z: the global branch's sums; empty for `marginal`, whose
    backward recomputes its own)."""
    launch, tuning = LinearLaunch(*rest[:_N_LAUNCH]), KernelTuning.from_op_args(*rest[_N_LAUNCH:])
    return _forward(q, k, v, q2k, q2k_cnt, tile_offsets, scale, weight, bias, scope, kind, eps, launch, tuning, True)


def _forward(q, k, v, q2k, q2k_cnt, tile_offsets, scale, weight, bias, scope, kind, eps, launch, tuning,
             save_sparse):
    """(out, o_sparse, lse, kv, z): the block-sparse forward, then the branch added to its output (`marginal`:
    `linear_marginal`'s forward; `global`: `linear_branch`'s). With `launch.fused_epilogue`, `global` is the sums'
    pass over K and V, then the block-sparse forward with the branch in its epilogue (`bsa_forward.bsa_fwd_linear`),
    and o_sparse is empty unless save_sparse (the backward's input)."""
    if scope == "marginal" or not launch.fused_epilogue:
        o_s, lse = bsa_fwd(q, k, v, q2k, q2k_cnt, tile_offsets, scale, tuning=tuning, checked=True)
        if scope == "marginal":
            out = marginal._forward(o_s, q, k, v, weight, bias, q2k, q2k_cnt, tile_offsets, kind, eps, launch)
            return out, o_s, lse, q.new_empty(0, dtype=torch.float32), q.new_empty(0, dtype=torch.float32)
        out, kv, z = linear_forward(o_s, q, k, v, weight, bias, kind, eps, launch)
        return out, o_s, lse, kv, z
    kv, z = kv_sums(k, v, kind, launch)
    kvw = _operand(kv @ weight.float().t(), q)  # (B*H, D, D): the projection folded into the sums
    out, o_s, lse = bsa_fwd_linear(q, k, v, q2k, q2k_cnt, tile_offsets, kvw, z, bias.float().contiguous(), kind,
                                   eps, scale, tuning=tuning, save_sparse=save_sparse, checked=True)
    return out, o_s, lse, kv, z


@_op.register_fake
def _op_fake(q, k, v, q2k, q2k_cnt, tile_offsets, scale, weight, bias, scope, kind, eps, *rest):
    b, s, h, d = q.shape
    dense = {"memory_format": torch.contiguous_format}
    sums = ((0,), (0,)) if scope == "marginal" else ((b * h, d, d), (b * h, d))
    epilogue = scope == "global" and LinearLaunch(*rest[:_N_LAUNCH]).fused_epilogue  # o_sparse laid out as out
    return (torch.empty_like(q, **dense), torch.empty_like(q, **(dense if epilogue else {})),
            q.new_empty((b, h, s), dtype=torch.float32),
            *(q.new_empty(x, dtype=torch.float32) for x in sums))


@torch.library.custom_op(
    "vsagen::sla_star_attn_bwd", mutates_args=(),
    schema="(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor o_sparse, Tensor lse, Tensor q2k, Tensor q2k_cnt, "
           "Tensor tile_offsets, float scale, Tensor weight, Tensor kv, Tensor z, str scope, str kind, float eps, "
           f"{_LAUNCH_SCHEMA}, {OP_SCHEMA_ARGS}) -> (Tensor, Tensor, Tensor, Tensor, Tensor)")
def _bwd_op(dout, q, k, v, o_s, lse, q2k, q2k_cnt, tile_offsets, scale, weight, kv, z, scope, kind, eps, *rest):
    """(dq, dk, dv, dweight, dbias): the block-sparse backward, then the branch's added in place."""
    launch, tuning = LinearLaunch(*rest[:_N_LAUNCH]), KernelTuning.from_op_args(*rest[_N_LAUNCH:])
    k2q, k2q_cnt, rows = k2q_lists(q2k, q2k_cnt, tile_offsets, q.shape[1], tuning)
    grads = bsa_bwd(dout, q, k, v, o_s, lse, q2k, q2k_cnt, k2q, k2q_cnt, tile_offsets, scale, tuning=tuning,
                    k2q_rows=rows, checked=True)
    if scope == "marginal":
        return marginal.marginal_branch_backward(dout, q, k, v, weight, q2k, q2k_cnt, tile_offsets, kind, eps,
                                                 launch, grads=grads)
    return linear_branch_backward(dout, q, k, v, weight, kv, z, kind, eps, launch, grads=grads)


@_bwd_op.register_fake
def _bwd_op_fake(dout, q, k, v, o_s, lse, q2k, q2k_cnt, tile_offsets, scale, weight, kv, z, scope, kind, eps,
                 *rest):
    d = q.shape[-1]
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            weight.new_empty((d, d), dtype=torch.float32), weight.new_empty((d,), dtype=torch.float32))


def _setup_context(ctx, inputs, output):
    q, k, v, q2k, q2k_cnt, tile_offsets, scale, weight, bias, scope, kind, eps, *rest = inputs
    _, o_s, lse, kv, z = output
    ctx.save_for_backward(q, k, v, o_s, lse, q2k, q2k_cnt, tile_offsets, weight, kv, z)
    ctx.args = (scale, scope, kind, eps, *rest)
    ctx.bias_dtype = bias.dtype


def _backward(ctx, dout, *_unused):
    """Only `out` carries a gradient: o_sparse, lse and the sums are internal outputs (saved, never used)."""
    q, k, v, o_s, lse, q2k, q2k_cnt, tile_offsets, weight, kv, z = ctx.saved_tensors
    scale, scope, kind, eps, *rest = ctx.args
    dq, dk, dv, dweight, dbias = _bwd_op(dout.contiguous(), q, k, v, o_s, lse, q2k, q2k_cnt, tile_offsets, scale,
                                         weight, kv, z, scope, kind, eps, *rest)
    return (dq, dk, dv, None, None, None, None, dweight.to(weight.dtype), dbias.to(ctx.bias_dtype), None, None,
            None) + (None,) * len(rest)


_op.register_autograd(_backward, setup_context=_setup_context)


def sla_star_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2k: torch.Tensor, q2k_cnt: torch.Tensor,
                       tile_offsets: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, *,
                       scope: str = "global", kind: str = "softmax", eps: float = LINEAR_EPS,
                       scale: float | None = None, tuning: KernelTuning | None = None,
                       launch: LinearLaunch = DEFAULT_LAUNCH) -> torch.Tensor:
    """Block-sparse attention over the q2k tiles plus SLA*'s projected linear branch, differentiable.

    Args:
        q, k, v: (B, S, H, D) as `block_sparse_attn.block_sparse_attention` takes them (tile order).
        q2k, q2k_cnt, tile_offsets: VSA's selection and layout, as there.
        weight (D, D), bias (D,): the branch's projection; kind, eps, launch: as `linear_branch.linear_branch_add`.
        scope: "global" (`linear_branch`: every key) or "marginal" (`linear_marginal`: the key tiles a query tile
            did not select, from the first q2k_cnt entries of its q2k row).
        scale, tuning: the block-sparse part's, as `block_sparse_attention`.

    Returns:
        (B, S, H, D) contiguous, q's dtype: o_vsa + proj(o_l). With gradients (q, k, v, weight or bias requiring
        grad) one custom op whose backward sums the two parts' gradients in the branch's kernels; without, the two
        public functions (`global` with `launch.fused_epilogue`: the op's fused forward).

    Raises:
        ValueError: as `block_sparse_attention` and `linear_branch_add`, or an unknown scope.

    Source: seed 002 (AMD's SLA*: VSA + a linear-attention branch); VSA arXiv 2505.13389; SLA arXiv 2509.24006.
    """
    if scope not in ("global", "marginal"):
        raise ValueError(f"scope must be 'global' or 'marginal', got {scope!r}")
    _check(q, q, k, v, weight, bias, kind)  # before any launch, on both paths
    check_inputs_and_tiles(q, k, v, q2k, q2k_cnt, tile_offsets)
    if scope == "marginal":
        marginal.check_selection(q, q2k, q2k_cnt, tile_offsets)
    needs_grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v, weight, bias))
    if not needs_grad and (scope == "marginal" or not launch.fused_epilogue):
        o_s, _ = block_sparse_attention(q, k, v, q2k, q2k_cnt, tile_offsets, scale=scale, tuning=tuning,
                                        checked=True)
        if scope == "global":
            return linear_branch_add(o_s, q, k, v, weight, bias, kind=kind, eps=eps, launch=launch)
        return marginal.marginal_branch_add(o_s, q, k, v, weight, bias, q2k, q2k_cnt, tile_offsets, kind=kind,
                                            eps=eps, launch=launch)
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    tuning = default_tuning(q.device, q.shape[-1]) if tuning is None else tuning
    if not needs_grad and not torch.compiler.is_compiling():  # global, fused epilogue: one forward, nothing saved
        return _forward(q, k, v, q2k.contiguous(), q2k_cnt.contiguous(), tile_offsets, scale, weight.contiguous(),
                        bias.contiguous(), scope, kind, float(eps), launch, tuning, False)[0]
    if needs_grad:
        check_fp32_bwd(q)
    return _op(q, k, v, q2k.contiguous(), q2k_cnt.contiguous(), tile_offsets, scale, weight.contiguous(),
               bias.contiguous(), scope, kind, float(eps), *dataclasses.astuple(launch), *op_args(tuning))[0]

