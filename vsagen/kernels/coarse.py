"""VSA's coarse stage: tile mean-pooling, tile scores, and the top-k key tiles as a q2k index table (Triton); the
public functions, their input checks and the custom op.

Computes, for q, k (and optionally v) in tile order (VSA paper, arXiv 2505.13389, sec. 2 and appendix B):
    q_c, k_c[, v_c] = mean of each tile's real tokens          one fused pass over q, k[, v]   (`pool_qk`)
    scores = q_c k_c^T / sqrt(D)                                 batched tl.dot GEMM, fp32 out   (`tile_scores_triton`)
    q2k[b, h, i] = the K key tiles of largest scores[b, h, i], ascending; q2k_cnt[b, h, i] = K   (`top_k_tiles`)
which is what `block_sparse_attn.bsa_fwd` consumes; `coarse_stage` runs all three. Oracles: `reference.tile_mean_pool`,
`reference.tile_scores`, `reference.select_top_k`. Under torch.compile `coarse_stage` runs the three kernels as the
`torch.library` custom op `vsagen::coarse_stage` (one graph node, no graph break; no autograd formula). The kernels,
their launchers and launch configuration, the design choices and the cost on the H200 are in `coarse_triton.py`.

Layout contract:
    q, k, v: (B, S, H, D) bf16 / fp16 / fp32, tile order, any strides with unit stride on D, D <= 256, B >= 1
    tile_offsets: (n_tiles + 1,) int32; tile j is rows [tile_offsets[j], tile_offsets[j+1]), any size >= 1
    q_c, k_c, v_c: (B, n_tiles, H, D) fp32 (permuted views of (B, H, n_tiles, D) buffers)
    scores: (B, H, Q_TILES, KV_TILES) fp32, Q_TILES == KV_TILES == n_tiles
    q2k: (B, H, Q_TILES, K) int32, ascending per row; q2k_cnt: (B, H, Q_TILES) int32, all K

Unsupported: float64 inputs (use `reference.tile_mean_pool`), autograd (outputs carry no history: the selection
is discrete and stock checkpoints have no gate; a trainable gate would use the reference functions), different
q and kv tile layouts, NaN scores (a positive NaN ranks as the largest score, a negative one as the smallest),
65,536 tiles or more.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .coarse_triton import pool_launch, scores_launch, top_k_launch
from .tuning import SCORE_PRECISIONS, KernelTuning, default_tuning


def _check_pool_inputs(xs: list[torch.Tensor], tile_offsets: torch.Tensor) -> None:
    x0 = xs[0]
    if x0.dim() != 4 or any(x.shape != x0.shape for x in xs):
        raise ValueError(f"inputs must share one (B, S, H, D) shape, got {[tuple(x.shape) for x in xs]}")
    if x0.dtype not in (torch.bfloat16, torch.float16, torch.float32) or any(x.dtype != x0.dtype for x in xs):
        raise ValueError(f"inputs must share a dtype among bf16, fp16, fp32, got {[x.dtype for x in xs]}")
    if x0.shape[-1] > 256:
        raise ValueError(f"head dim {x0.shape[-1]} > 256 is not supported")
    if any(x.stride(-1) != 1 for x in xs):
        raise ValueError("inputs need unit stride on the head dim")
    if tile_offsets.dim() != 1 or tile_offsets.numel() < 2 or tile_offsets.dtype != torch.int32:
        raise ValueError(f"tile_offsets must be (n_tiles + 1,) int32 with n_tiles >= 1, got "
                         f"{tuple(tile_offsets.shape)} {tile_offsets.dtype}")
    if any(x.device != x0.device for x in xs) or tile_offsets.device != x0.device:
        raise ValueError("inputs and tile_offsets must be on one device")


def _check_top_k(top_k: int, num_kv_tiles: int) -> None:
    if not 1 <= top_k <= num_kv_tiles:
        raise ValueError(f"top_k must be in [1, {num_kv_tiles}], got {top_k}")
    if num_kv_tiles >= 1 << 16:
        raise ValueError(f"{num_kv_tiles} key tiles: at most 65,535 are supported")


# ---------------------------------------------------------------------------------------------- custom op
# `vsagen::coarse_stage` is the whole coarse stage (pooling, scores, top-k) as one `torch.library` custom op, so
# torch.compile records it as one opaque node instead of breaking the graph around the Triton launches (as
# `vsagen::block_sparse_attn` does for the fine stage). Explicit schema, as there. It has no autograd formula:
# `coarse_stage` hands it detached inputs (the selection is discrete; the pooled tiles carry no history).


def _coarse_launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None, tile_offsets: torch.Tensor,
                   top_k: int, precision: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Launch pooling, scores and top-k (inputs validated by `coarse_stage`).

    Returns:
        q2k (B, H, Q_TILES, K) int32, q2k_cnt (B, H, Q_TILES) int32, scores (B, H, Q_TILES, KV_TILES) fp32, and
        [q_c, k_c] or [q_c, k_c, v_c], each (B, n_tiles, H, D) fp32 (permuted views of (B, H, n_tiles, D)
        buffers).
    """
    pooled = pool_launch([q, k] if v is None else [q, k, v], tile_offsets)
    scores = scores_launch(pooled[0], pooled[1], precision)
    q2k, q2k_cnt = top_k_launch(scores, top_k)
    return q2k, q2k_cnt, scores, pooled


@torch.library.custom_op(
    "vsagen::coarse_stage", mutates_args=(),
    schema="(Tensor q, Tensor k, Tensor? v, Tensor tile_offsets, int top_k, str score_precision) "
           "-> (Tensor, Tensor, Tensor, Tensor[])")
def _coarse_op(q, k, v, tile_offsets, top_k, score_precision):
    """Custom op: `_coarse_launch`, after checking the inputs again (host-side only: in a compiled graph they
    come from inductor, whose layouts `coarse_stage` did not see)."""
    _check_pool_inputs([q, k] if v is None else [q, k, v], tile_offsets)
    return _coarse_launch(q, k, v, tile_offsets, top_k, score_precision)


@_coarse_op.register_fake
def _coarse_op_fake(q, k, v, tile_offsets, top_k, score_precision):
    b, _, h, d = q.shape
    n_tiles = tile_offsets.shape[0] - 1
    pooled = [q.new_empty((b, h, n_tiles, d), dtype=torch.float32).permute(0, 2, 1, 3)
              for _ in range(2 if v is None else 3)]
    return (q.new_empty((b, h, n_tiles, top_k), dtype=torch.int32), q.new_empty((b, h, n_tiles), dtype=torch.int32),
            q.new_empty((b, h, n_tiles, n_tiles), dtype=torch.float32), pooled)


# ------------------------------------------------------------------------------------------ public functions


def tile_mean_pool_triton(x: torch.Tensor, tile_offsets: torch.Tensor) -> torch.Tensor:
    """Mean of each tile's real tokens (Triton; oracle `reference.tile_mean_pool`).

    Args:
        x: (B, S, H, D) bf16 / fp16 / fp32, tile order, any strides with unit stride on D, D <= 256.
        tile_offsets: (n_tiles + 1,) int32; tile j is rows [tile_offsets[j], tile_offsets[j+1]) of x.

    Returns:
        (B, n_tiles, H, D) fp32, each tile's sum divided by its true token count.

    Raises:
        ValueError: wrong rank, dtype, head dim, strides, tile_offsets dtype/shape, or devices.
    """
    _check_pool_inputs([x], tile_offsets)
    return pool_launch([x], tile_offsets)[0]


def pool_qk(q: torch.Tensor, k: torch.Tensor, tile_offsets: torch.Tensor,
            v: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """Tile means of q and k (and v), in one fused pass over the inputs (Triton).

    Args:
        q, k: (B, S, H, D) bf16 / fp16 / fp32, tile order, one shape and dtype, unit stride on D, D <= 256.
        tile_offsets: (n_tiles + 1,) int32 tile boundaries (tile order rows).
        v: optional (B, S, H, D) like q, pooled in the same pass (the gate's coarse output needs it).

    Returns:
        (q_c, k_c) or (q_c, k_c, v_c), each (B, n_tiles, H, D) fp32.

    Raises:
        ValueError: as `tile_mean_pool_triton`, or mismatched shapes / dtypes.

    Source: VSA paper sec. 2 (mean pooling of each cube with its true token count).
    """
    xs = [q, k] if v is None else [q, k, v]
    _check_pool_inputs(xs, tile_offsets)
    return tuple(pool_launch(xs, tile_offsets))


def tile_scores_triton(q_c: torch.Tensor, k_c: torch.Tensor, precision: str | None = None) -> torch.Tensor:
    """Tile logits q_c k_c^T / sqrt(D) (Triton; oracle `reference.tile_scores`).

    Args:
        q_c: (B, Q_TILES, H, D) fp32 pooled queries, unit stride on D (the views from `pool_qk` qualify).
        k_c: (B, KV_TILES, H, D) fp32 pooled keys, unit stride on D.
        precision: tl.dot input precision, "tf32", "bf16" (operands rounded to bf16), "tf32x3" (~fp32 accurate on
            tensor cores) or "ieee" (fp32 FMA); fp32 accumulation in all; None: the score_precision of
            `tuning.kernel_tuning(q_c.device, D)`. Under the interpreter all compute in fp32, "bf16" after rounding
            the operands.

    Returns:
        (B, H, Q_TILES, KV_TILES) fp32, contiguous.

    Raises:
        ValueError: shapes that disagree, non-fp32 or non-unit-stride operands, or an unknown precision.
    """
    if precision is not None and precision not in SCORE_PRECISIONS:
        raise ValueError(f"precision must be one of {SCORE_PRECISIONS}, got {precision!r}")
    if (q_c.dim() != 4 or k_c.dim() != 4 or q_c.shape[0] != k_c.shape[0] or q_c.shape[2:] != k_c.shape[2:]
            or q_c.dtype != torch.float32 or k_c.dtype != torch.float32 or q_c.stride(-1) != 1
            or k_c.stride(-1) != 1):
        raise ValueError(f"q_c (B, Q_TILES, H, D) and k_c (B, KV_TILES, H, D) must be fp32 with unit stride on D "
                         f"and agree on B, H, D; got {tuple(q_c.shape)} {q_c.dtype}, {tuple(k_c.shape)} {k_c.dtype}")
    if precision is None:
        precision = default_tuning(q_c.device, q_c.shape[-1]).score_precision
    return scores_launch(q_c, k_c, precision)


def top_k_tiles(scores: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-k key tiles of each query tile, as the index table the fine stage consumes (Triton).

    Args:
        scores: (B, H, Q_TILES, KV_TILES) fp32 tile logits, any strides.
        top_k: K, 1 <= K <= KV_TILES.

    Returns:
        q2k: (B, H, Q_TILES, K) int32, each row ascending; exact ties at the K-th score keep the lowest indices.
        q2k_cnt: (B, H, Q_TILES) int32, all K.

    Raises:
        ValueError: scores not 4-D fp32, K out of range, or 65,536 key tiles or more (the compaction packs two
            16-bit counts into one int32).

    Oracle: `reference.select_top_k` (which returns int64 and breaks ties arbitrarily).
    """
    if scores.dim() != 4 or scores.dtype != torch.float32:
        raise ValueError(f"scores must be (B, H, Q_TILES, KV_TILES) fp32, got {tuple(scores.shape)} {scores.dtype}")
    _check_top_k(top_k, scores.shape[-1])
    return top_k_launch(scores, int(top_k))


@dataclass(frozen=True, eq=False)
class CoarseResult:
    """Outputs of `coarse_stage`.

    Attributes:
        q2k: (B, H, Q_TILES, K) int32 selected key tiles, ascending per row.
        q2k_cnt: (B, H, Q_TILES) int32, all K.
        scores: (B, H, Q_TILES, KV_TILES) fp32 tile logits q_c k_c^T / sqrt(D).
        q_c, k_c: (B, n_tiles, H, D) fp32 tile means of q and k.
        v_c: (B, n_tiles, H, D) fp32 tile means of v, or None when v was not given.
    """

    q2k: torch.Tensor
    q2k_cnt: torch.Tensor
    scores: torch.Tensor
    q_c: torch.Tensor
    k_c: torch.Tensor
    v_c: torch.Tensor | None = None


def coarse_stage(q: torch.Tensor, k: torch.Tensor, tile_offsets: torch.Tensor, top_k: int,
                 v: torch.Tensor | None = None, score_precision: str | None = None,
                 tuning: KernelTuning | None = None) -> CoarseResult:
    """VSA coarse stage: pool tiles, score them, and pick the top-k key tiles of every query tile.

    Args:
        q, k: (B, S, H, D) bf16 / fp16 / fp32, tile order, one shape and dtype, unit stride on D, D <= 256.
        tile_offsets: (n_tiles + 1,) int32 tile boundaries; tile_offsets[-1] must equal S (not checked on the
            host, to avoid a device synchronisation).
        top_k: K key tiles per query tile, 1 <= K <= n_tiles (see `reference.top_k_from_sparsity`).
        v: optional (B, S, H, D) like q; when given, v_c is pooled in the same pass (for the gate's coarse output).
        score_precision: tl.dot precision of the score GEMM, see `tile_scores_triton`; overrides the tuning's.
        tuning: the `tuning.KernelTuning` whose score_precision is used when score_precision is None; None:
            `tuning.kernel_tuning(q.device, D)`.

    Returns:
        CoarseResult with q2k (B, H, Q_TILES, K) int32 ascending, q2k_cnt (B, H, Q_TILES) int32 (all K),
        scores (B, H, Q_TILES, KV_TILES) fp32, q_c / k_c (and v_c) (B, n_tiles, H, D) fp32.
        No autograd history: the kernels see detached inputs, whatever their requires_grad.

    Under torch.compile the three launches are the custom op `vsagen::coarse_stage` (one node, no graph break);
    eagerly they are launched directly.

    Raises:
        ValueError: mismatched shapes or dtypes, float64 inputs, D > 256, non-unit stride on D, tile_offsets not
            (n_tiles + 1,) int32, tensors on different devices, K out of range (or n_tiles >= 65,536), or an
            unknown score_precision.

    Source: VSA paper (arXiv 2505.13389) sec. 2, appendix B pseudocode; oracle `reference.vsa_reference`'s
    pool -> score -> select chain.
    """
    xs = [q, k] if v is None else [q, k, v]
    _check_pool_inputs(xs, tile_offsets)
    _check_top_k(top_k, tile_offsets.numel() - 1)
    if score_precision is not None and score_precision not in SCORE_PRECISIONS:
        raise ValueError(f"score_precision must be one of {SCORE_PRECISIONS}, got {score_precision!r}")
    if score_precision is not None:
        precision = score_precision
    else:
        precision = (default_tuning(q.device, q.shape[-1]) if tuning is None else tuning).score_precision
    # No autograd, on purpose: the selection is discrete and the pooled tiles are documented to carry no history,
    # so the op never sees inputs that require grad (it has no autograd formula).
    q, k, v = q.detach(), k.detach(), None if v is None else v.detach()
    if torch.compiler.is_compiling():  # one opaque node in the graph: no graph break
        q2k, q2k_cnt, scores, pooled = _coarse_op(q, k, v, tile_offsets, int(top_k), precision)
    else:  # eager: the launchers directly, without a dispatcher round trip (host time: `coarse_triton`'s docstring)
        q2k, q2k_cnt, scores, pooled = _coarse_launch(q, k, v, tile_offsets, int(top_k), precision)
    return CoarseResult(q2k=q2k, q2k_cnt=q2k_cnt, scores=scores, q_c=pooled[0], k_c=pooled[1],
                        v_c=pooled[2] if v is not None else None)


def coarse_output(scores: torch.Tensor, v_c: torch.Tensor, token_tile: torch.Tensor | None = None) -> torch.Tensor:
    """Coarse (tile-level) attention output softmax(scores) v_c, optionally broadcast to each tile's tokens.

    Only the gated path needs it (stock checkpoints have no gate). Same math as `reference.coarse_attention`
    with the scores already computed, in eager torch: 0.2 ms on the H200 at the 1.3B shape with token_tile,
    most of it writing the (B, S, H, D) fp32 broadcast.

    Args:
        scores: (B, H, Q_TILES, KV_TILES) fp32 tile logits (from `coarse_stage`).
        v_c: (B, n_tiles, H, D) fp32 tile means of v.
        token_tile: optional (S,) int64 tile index of each token in tile order (`TileLayout.token_tile`).

    Returns:
        (B, n_tiles, H, D) fp32, or (B, S, H, D) fp32 when token_tile is given.

    Raises:
        ValueError: mismatched tile counts.
    """
    if scores.dim() != 4 or v_c.dim() != 4 or scores.shape[-1] != v_c.shape[1] or scores.shape[1] != v_c.shape[2]:
        raise ValueError(f"scores (B, H, Q_TILES, KV_TILES) and v_c (B, KV_TILES, H, D) disagree: "
                         f"{tuple(scores.shape)} vs {tuple(v_c.shape)}")
    probs = torch.softmax(scores.float(), dim=-1)
    out = torch.matmul(probs, v_c.float().permute(0, 2, 1, 3)).permute(0, 2, 1, 3)  # (B, Q_TILES, H, D)
    return out if token_tile is None else out.index_select(1, token_tile)
