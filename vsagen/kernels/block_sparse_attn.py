"""Block-sparse flash attention over video tiles (VSA's fine stage), Triton forward and backward.

Computes, for each (batch, head, query tile), softmax attention of the tile's query tokens over the tokens of
the key tiles listed in its q2k row (VSA paper, arXiv 2505.13389, sec. 2; online softmax as in
FlashAttention-2). Tokens are in tile order (`vsagen.layout.TileLayout`): tile j occupies rows
[tile_offsets[j], tile_offsets[j+1]) and holds at most BLOCK = 64 tokens, fewer at grid edges (partial tiles);
rows past a tile's end are masked exactly (scores set to -inf, outputs not stored).

The backward follows FlashAttention-2 (Dao, arXiv 2307.08691, alg. 2) with the forward's LSE: a preprocess
computes delta = rowsum(dO * O) (minus the LSE's incoming gradient), one kernel walks each query tile's q2k
list for dQ, another walks each key tile's k2q list (the transposed lists, `build_k2q`) for dK and dV. Every
gradient row is written by exactly one program: no atomics, bitwise deterministic.

Layout contract:
    q, k, v: (B, S, H, D) bf16 / fp16 / fp32, tile order, any strides with unit stride on D, D <= 256
    q2k: (B, H, Q_TILES, K) int32, the first q2k_cnt entries of each row used (ascending by convention,
         no repeats, each in [0, KV_TILES)); entries past q2k_cnt are never read
    q2k_cnt: (B, H, Q_TILES) int32 in [0, K]
    k2q: (B, H, KV_TILES, Q_TILES) int32, the transpose of q2k (`build_k2q`); k2q_cnt: (B, H, KV_TILES) int32
    tile_offsets: (n_tiles + 1,) int32, tile_offsets[0] = 0 and tile_offsets[-1] = S; Q_TILES = KV_TILES = n_tiles
    returns: out (B, S, H, D) like q; lse (B, H, S) fp32, natural-log log-sum-exp of each query row
             (-inf for a row with no selected tile, whose output is 0 and whose gradients are 0)

On layouts with partial tiles the forward and dQ loops walk a tile plan of each q2k row
(`tile_plan.build_tile_plan`, one small launch per call) rather than the row itself: first the full tiles, one per
iteration and unmasked, then the partial tiles' tokens packed 64 to an iteration (gathered rows, masked), so a
partial tile no longer costs a whole 64-column block (`KernelTuning.pack_partial_tiles`). The dK/dV loop still
takes one query tile of its k2q row per iteration, except in `block_sparse_attention_grouped`'s backward, which walks
tile plans of the k2q rows too (partial query tiles packed; `bsa_bwd(pack_dkdv=True)`), and whose forward and dQ run
over query groups (`query_groups`: tiles with equal key lists share a program).

The loops fetch their 64-token tiles (K / V in the forward and dQ kernels, Q / dO in the dK/dV kernel) by TMA
where the tuning asks for it (`KernelTuning.tma_loads`: Hopper and datacenter Blackwell by default) and the
layout allows it (`use_tma`): whole (64, D) boxes of the (B*S, H*D) tensor, so a partial
tile's box also covers the next tile's first rows; those are masked in the scores exactly as pointer loads'
zero rows are (the results are bitwise equal, tested under the interpreter). Elsewhere, pointer loads.

Where things are: `bsa_primitives` (shared jit helpers, input checks, TMA helpers), `bsa_forward` (`bsa_fwd`),
`bsa_backward` (`bsa_bwd`), `tuning` (`KernelTuning`, `kernel_tuning`: every switch and launch table), and here
the `torch.library` custom ops `vsagen::block_sparse_attn` / `vsagen::block_sparse_attn_bwd` with their autograd
formula and the public `block_sparse_attention`, so that autograd and torch.compile (no graph break) see through
the kernels. The tuning crosses the ops as plain bool / str / int[] arguments (`tuning.op_args`). This
module re-exports `bsa_fwd`, `bsa_bwd`, `use_tma`, `interpreting`, `BLOCK` and `build_k2q` (now in `reference`).

Unsupported: tiles of more than 64 tokens, causal masks, dropout, different q / kv tile layouts, gradients
with respect to the index tensors (they are integers), the fp32 backward with D > 128 on a GPU (shared memory),
double backward.
"""

from __future__ import annotations

import torch

from .bsa_backward import bsa_bwd, k2q_lists
from .bsa_forward import bsa_fwd, bsa_fwd_grouped
from .bsa_primitives import BLOCK, check_fp32_bwd, check_inputs, interpreting, use_tma
from .k2q import build_k2q_triton
from .reference import build_k2q
from .tuning import OP_SCHEMA_ARGS, KernelTuning, default_tuning, op_args

__all__ = ["BLOCK", "block_sparse_attention", "block_sparse_attention_grouped", "bsa_bwd", "bsa_fwd", "build_k2q", "interpreting", "use_tma"]


# --------------------------------------------------------------------------------------- custom ops, autograd
# Explicit schemas: the kernels' Python signatures use postponed annotations, which schema inference across
# torch versions does not always resolve.


@torch.library.custom_op(
    "vsagen::block_sparse_attn", mutates_args=(),
    schema="(Tensor q, Tensor k, Tensor v, Tensor q2k, Tensor q2k_cnt, Tensor tile_offsets, float scale, "
           f"{OP_SCHEMA_ARGS}) -> (Tensor, Tensor)")
def _bsa_op(q, k, v, q2k, q2k_cnt, tile_offsets, scale, *tuning):
    """Forward custom op: `bsa_fwd` (inputs checked by `block_sparse_attention`, not again); `tuning` is
    `tuning.op_args`."""
    return bsa_fwd(q, k, v, q2k, q2k_cnt, tile_offsets, scale, tuning=KernelTuning.from_op_args(*tuning),
                   checked=True)


@_bsa_op.register_fake
def _bsa_op_fake(q, k, v, q2k, q2k_cnt, tile_offsets, scale, *tuning):
    b, s, h, _ = q.shape
    return torch.empty_like(q), q.new_empty((b, h, s), dtype=torch.float32)


@torch.library.custom_op(
    "vsagen::block_sparse_attn_bwd", mutates_args=(),
    schema="(Tensor dout, Tensor? dlse, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor q2k, "
           f"Tensor q2k_cnt, Tensor tile_offsets, float scale, {OP_SCHEMA_ARGS}) -> (Tensor, Tensor, Tensor)")
def _bsa_bwd_op(dout, dlse, q, k, v, out, lse, q2k, q2k_cnt, tile_offsets, scale, *tuning):
    """Backward custom op: k2q lists from `k2q.build_k2q_triton` (two Triton launches, 23 us on the H200 at the
    1.3B shape against 260 us for the torch `reference.build_k2q`, which stays as its oracle), then `bsa_bwd`."""
    tuning = KernelTuning.from_op_args(*tuning)
    k2q, k2q_cnt, rows = k2q_lists(q2k, q2k_cnt, tile_offsets, q.shape[1], tuning)
    return bsa_bwd(dout, q, k, v, out, lse, q2k, q2k_cnt, k2q, k2q_cnt, tile_offsets, scale, dlse=dlse,
                   tuning=tuning, k2q_rows=rows, checked=True)


@_bsa_bwd_op.register_fake
def _bsa_bwd_op_fake(dout, dlse, q, k, v, out, lse, q2k, q2k_cnt, tile_offsets, scale, *tuning):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _bsa_setup_context(ctx, inputs, output):
    q, k, v, q2k, q2k_cnt, tile_offsets, scale, *tuning = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, q2k, q2k_cnt, tile_offsets)
    ctx.scale = scale
    ctx.tuning = tuning


def _bsa_backward(ctx, dout, dlse):
    q, k, v, out, lse, q2k, q2k_cnt, tile_offsets = ctx.saved_tensors
    dq, dk, dv = _bsa_bwd_op(dout, dlse, q, k, v, out, lse, q2k, q2k_cnt, tile_offsets, ctx.scale, *ctx.tuning)
    return (dq, dk, dv) + (None,) * (4 + len(ctx.tuning))


_bsa_op.register_autograd(_bsa_backward, setup_context=_bsa_setup_context)


@torch.library.custom_op(
    "vsagen::block_sparse_attn_grouped", mutates_args=(),
    schema="(Tensor q, Tensor k, Tensor v, Tensor q2k, Tensor q2k_cnt, Tensor tile_offsets, Tensor groups, "
           f"int[] group_launch, float scale, {OP_SCHEMA_ARGS}) -> (Tensor, Tensor)")
def _bsa_grouped_op(q, k, v, q2k, q2k_cnt, tile_offsets, groups, group_launch, scale, *tuning):
    """Forward custom op over query groups: `bsa_fwd_grouped` (group_launch[:3] = its (block_m, num_warps,
    num_stages); group_launch[3:6] the backward's dQ launch over the same groups)."""
    return bsa_fwd_grouped(q, k, v, q2k, q2k_cnt, tile_offsets, groups, *group_launch[:3], scale,
                           tuning=KernelTuning.from_op_args(*tuning), checked=True)


@_bsa_grouped_op.register_fake
def _bsa_grouped_op_fake(q, k, v, q2k, q2k_cnt, tile_offsets, groups, group_launch, scale, *tuning):
    b, s, h, _ = q.shape
    return torch.empty_like(q), q.new_empty((b, h, s), dtype=torch.float32)


@torch.library.custom_op(
    "vsagen::block_sparse_attn_grouped_bwd", mutates_args=(),
    schema="(Tensor dout, Tensor? dlse, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor q2k, "
           "Tensor q2k_cnt, Tensor tile_offsets, Tensor groups, int[] group_launch, float scale, "
           f"{OP_SCHEMA_ARGS}) -> (Tensor, Tensor, Tensor)")
def _bsa_grouped_bwd_op(dout, dlse, q, k, v, out, lse, q2k, q2k_cnt, tile_offsets, groups, group_launch, scale,
                        *tuning):
    """Backward custom op of the grouped forward: `bsa_bwd` with dQ over the query groups (group_launch[3:6]) and
    the dK/dV loop over tile plans of k2q lists of tile ids (partial query tiles packed, `pack_dkdv`)."""
    tuning = KernelTuning.from_op_args(*tuning)
    k2q, k2q_cnt = build_k2q_triton(q2k, q2k_cnt, tile_offsets.numel() - 1)
    return bsa_bwd(dout, q, k, v, out, lse, q2k, q2k_cnt, k2q, k2q_cnt, tile_offsets, scale, dlse=dlse,
                   tuning=tuning, k2q_rows=False, groups=groups, group_launch=tuple(group_launch[3:6]),
                   pack_dkdv=True, checked=True)


@_bsa_grouped_bwd_op.register_fake
def _bsa_grouped_bwd_op_fake(dout, dlse, q, k, v, out, lse, q2k, q2k_cnt, tile_offsets, groups, group_launch, scale,
                             *tuning):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _grouped_setup_context(ctx, inputs, output):
    q, k, v, q2k, q2k_cnt, tile_offsets, groups, group_launch, scale, *tuning = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, q2k, q2k_cnt, tile_offsets, groups)
    ctx.scale = scale
    ctx.group_launch = list(group_launch)
    ctx.tuning = tuning


def _grouped_backward(ctx, dout, dlse):
    q, k, v, out, lse, q2k, q2k_cnt, tile_offsets, groups = ctx.saved_tensors
    dq, dk, dv = _bsa_grouped_bwd_op(dout, dlse, q, k, v, out, lse, q2k, q2k_cnt, tile_offsets, groups,
                                     ctx.group_launch, ctx.scale, *ctx.tuning)
    return (dq, dk, dv) + (None,) * (6 + len(ctx.tuning))


_bsa_grouped_op.register_autograd(_grouped_backward, setup_context=_grouped_setup_context)


# ----------------------------------------------------------------------------------------- public function


def check_inputs_and_tiles(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2k: torch.Tensor,
                           q2k_cnt: torch.Tensor, tile_offsets: torch.Tensor) -> None:
    """`block_sparse_attention`'s input checks: `check_inputs`, one device, and enough tiles for S (ValueError)."""
    check_inputs(q, k, v, q2k, q2k_cnt, tile_offsets)
    devices = {x.device for x in (q, k, v, q2k, q2k_cnt, tile_offsets)}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(str(d) for d in devices)}")
    if tile_offsets.dim() != 1 or (tile_offsets.numel() - 1) * BLOCK < q.shape[1]:
        raise ValueError(f"tile_offsets must be (n_tiles + 1,) with n_tiles * {BLOCK} >= S = {q.shape[1]}, "
                         f"got {tuple(tile_offsets.shape)}")


def block_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2k: torch.Tensor,
                           q2k_cnt: torch.Tensor, tile_offsets: torch.Tensor,
                           scale: float | None = None, tuning: KernelTuning | None = None, *,
                           checked: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-sparse attention over tiles (VSA's fine stage), differentiable in q, k, v (and through lse).

    Args:
        q, k, v: (B, S, H, D) bf16 / fp16 / fp32 (one dtype), tile order (`vsagen.layout.TileLayout`), any
            strides with unit stride on D, D <= 256.
        q2k: (B, H, Q_TILES, K) int32 key tiles of each query tile, ascending, no repeats, each in
            [0, KV_TILES); only the first q2k_cnt entries of a row are read.
        q2k_cnt: (B, H, Q_TILES) int32 in [0, K]; 0 leaves the tile's rows empty (output 0, lse -inf, zero
            gradients).
        tile_offsets: (n_tiles + 1,) int32 tile starts in tile order, tile_offsets[0] = 0,
            tile_offsets[-1] = S, at most 64 tokens per tile; Q_TILES = KV_TILES = n_tiles.
        scale: softmax scale, default 1/sqrt(D).
        tuning: how the kernels load tiles, loop and launch (`tuning.KernelTuning`); None:
            `tuning.kernel_tuning(q.device, D)`, the defaults of the device's architecture. Under torch.compile the
            default is resolved once while tracing; the tuning reaches the custom ops as plain arguments.
        checked: the caller made `check_inputs_and_tiles` on these tensors already (`sla_star_attention` does):
            not made again. Either way each launch checks its inputs once (the launchers below are told so).

    Returns:
        out: (B, S, H, D) like q (q's strides when q is dense, else contiguous).
        lse: (B, H, S) fp32 natural-log log-sum-exp of each query row's selected scores (-inf when empty).

    Raises:
        ValueError: mismatched shapes, dtypes or devices, D > 256, a head dim without unit stride, index
            tensors that are not int32, fewer than ceil(S / 64) tiles, or fp32 inputs with D > 128 that need
            gradients on a GPU (shared memory; the forward alone is fine). Index values are not checked (that
            would synchronize the device): out-of-range entries read out of bounds.

    Memory: on layouts with partial tiles each call (and the backward's dQ) first builds a tile plan of the q2k
    rows (`tile_plan.build_tile_plan`): a transient int32 (B, H, Q_TILES, 8 K) tensor, 8x q2k (19 MB at the
    Wan2.1-1.3B 480p shape, 330 MB at 14B 720p, both at 87.5% sparsity).

    Gradients: dq, dk, dv by the FlashAttention-2 backward recomputing P from lse (deterministic, no atomics);
    none for the index tensors. Without grad (or under torch.no_grad) the forward kernel runs directly.

    Source: VSA paper (arXiv 2505.13389) sec. 2, fine stage; FlashAttention-2 (arXiv 2307.08691) alg. 1 and 2.
    """
    if not checked:
        check_inputs_and_tiles(q, k, v, q2k, q2k_cnt, tile_offsets)
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    tuning = default_tuning(q.device, q.shape[-1]) if tuning is None else tuning
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if needs_grad:
        check_fp32_bwd(q)
    if not needs_grad and not torch.compiler.is_compiling():
        # fast path: no dispatcher, nothing saved
        return bsa_fwd(q, k, v, q2k, q2k_cnt, tile_offsets, scale, tuning=tuning, checked=True)
    return _bsa_op(q, k, v, q2k, q2k_cnt, tile_offsets, scale, *op_args(tuning))


def block_sparse_attention_grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2k: torch.Tensor,
                                   q2k_cnt: torch.Tensor, tile_offsets: torch.Tensor, groups: torch.Tensor,
                                   group_launch: tuple[int, int, int], scale: float | None = None,
                                   tuning: KernelTuning | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`block_sparse_attention` with the forward and the backward's dQ over query groups
    (`query_groups.build_query_groups`): tiles whose q2k rows are equal share a program of `group_launch[0]` rows;
    dK / dV as `block_sparse_attention`'s backward.

    Args:
        q, k, v, q2k, q2k_cnt, tile_offsets, scale, tuning: as `block_sparse_attention` (q2k the same for every
            batch entry, e.g. expanded).
        groups: the int32 table of `build_query_groups(q2k[0], q2k_cnt[0], tile_offsets, block_m)`, contiguous, on
            q's device.
        group_launch: (block_m, num_warps, num_stages) of the forward, then the same three of the backward's dQ
            kernel over the same groups (block_m equal).

    Returns:
        out (B, S, H, D), lse (B, H, S) fp32, as `block_sparse_attention`.

    Raises:
        ValueError: as `block_sparse_attention`, or a groups table that does not fit block_m.

    Source: VSA paper (arXiv 2505.13389) sec. 2 (the fine stage); Sparse-vDiT (arXiv 2506.03065: static patterns,
    fused heads); FlashAttention-2 (arXiv 2307.08691) alg. 1 and 2.
    """
    check_inputs_and_tiles(q, k, v, q2k, q2k_cnt, tile_offsets)
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    tuning = default_tuning(q.device, q.shape[-1]) if tuning is None else tuning
    launch = [int(x) for x in group_launch]
    if len(launch) != 6 or launch[0] != launch[3]:
        raise ValueError(f"group_launch is (block_m, warps, stages) of the forward and of dQ with one block_m, "
                         f"got {tuple(group_launch)}")
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if needs_grad:
        check_fp32_bwd(q)
    if not needs_grad and not torch.compiler.is_compiling():
        return bsa_fwd_grouped(q, k, v, q2k, q2k_cnt, tile_offsets, groups, *launch[:3], scale, tuning=tuning,
                               checked=True)
    return _bsa_grouped_op(q, k, v, q2k, q2k_cnt, tile_offsets, groups, launch, scale, *op_args(tuning))
