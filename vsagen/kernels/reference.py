"""Eager PyTorch references for Video Sparse Attention (VSA); no triton import here.

Follows the VSA paper (arXiv 2505.13389), sec. 2 and appendix B:
* coarse stage: mean-pool q, k, v over each tile with the tile's true token count, tile-level attention
  scores q_c k_c^T / sqrt(D), top-k key tiles per (batch, head, query tile);
* fine stage: token-level attention of each query tile over the tokens of its selected key tiles only;
* output = fine + gate * coarse, where coarse = softmax(q_c k_c^T / sqrt(D)) v_c broadcast to the tile's
  tokens. Stock checkpoints have no learned gate: callers pass gate=None and the output is the fine stage.

Layout contract: q, k, v are (B, S, H, D) in tile order (see `vsagen.layout.TileLayout`); every tile holds
`tile_sizes[j]` real tokens (partial tiles at grid edges). Everything here is differentiable with autograd and
computes the softmax in float32 (or float64 for float64 inputs). These functions are the tests' oracle for
the Triton kernels and the CPU path of the `vsa` backend. `build_k2q` (the transpose of q2k lists) and
`tile_plan_reference` are the torch oracles of `k2q.build_k2q_triton` and `tile_plan.build_tile_plan`.

Unsupported: attention masks other than the tile selection, causal attention, dropout.
"""

from __future__ import annotations

import math

import torch

# Budget for the (B*H, chunk, 64, K*64) fp32 score tensor of the fine stage, in elements:
# 2^26 elements = 256 MiB, small enough for a CPU test and for the full-size GPU run alike.
_FINE_SCORE_ELEMENTS = 1 << 26


def _softmax_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def top_k_from_sparsity(sparsity: float, num_tiles: int) -> int:
    """Number of key tiles each query tile keeps: K = ceil((1 - sparsity) * num_tiles), at least 1.

    Counted over all tiles (partial ones included), as the VSA reference does.

    Raises:
        ValueError: sparsity outside [0, 1).
    """
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity}")
    # The 1e-9 keeps float noise such as (1 - 0.7) * 10 = 3.0000000000000004 from adding a tile.
    return max(1, min(num_tiles, math.ceil((1.0 - sparsity) * num_tiles - 1e-9)))


def top_k_from_tokens(sparsity: float, num_tokens: int, tile_volume: int, num_tiles: int) -> int:
    """Number of key tiles each query tile keeps as FastVideo counted it until its PR #1517 (2026-07-04, commit
    00ec3e738): K = ceil((1 - sparsity) * (num_tokens / tile_volume)), the real (unpadded) tokens over the tile's
    volume (fastvideo/attention/backends/video_sparse_attn.py:269-271 @9f0ce517c, the FastWan release of 2025-08;
    :290-291 just before #1517), the same float expression, clamped to [1, num_tiles]. With partial tiles this
    keeps fewer tiles than `top_k_from_sparsity` (FastWan2.1-1.3B at 480x832x81, sparsity 0.8: 32760 tokens in
    624 tiles, 103 kept instead of 125); on a grid of whole tiles the two agree.

    Raises:
        ValueError: sparsity outside [0, 1), or fewer tiles than num_tokens / tile_volume needs.
    """
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity}")
    if num_tiles * tile_volume < num_tokens:
        raise ValueError(f"{num_tiles} tiles of {tile_volume} tokens cannot hold {num_tokens} tokens")
    return max(1, min(num_tiles, math.ceil((1 - sparsity) * (num_tokens / tile_volume))))


def tile_mean_pool(x: torch.Tensor, token_tile: torch.Tensor, tile_sizes: torch.Tensor) -> torch.Tensor:
    """Mean of each tile's real tokens.

    Args:
        x: (B, S, H, D) any float dtype, tile order.
        token_tile: (S,) int64 tile index of each token.
        tile_sizes: (n_tiles,) int64 true token counts.

    Returns:
        (B, n_tiles, H, D) in the softmax dtype (float32, or float64 for float64 input).
    """
    acc_dtype = _softmax_dtype(x)
    b, _, h, d = x.shape
    n = tile_sizes.numel()
    sums = torch.zeros(b, n, h, d, dtype=acc_dtype, device=x.device).index_add(1, token_tile, x.to(acc_dtype))
    return sums / tile_sizes.to(acc_dtype).view(1, n, 1, 1)


def tile_scores(q_c: torch.Tensor, k_c: torch.Tensor) -> torch.Tensor:
    """Tile-level attention logits q_c k_c^T / sqrt(D).

    Args:
        q_c, k_c: (B, n_tiles, H, D) pooled queries and keys.

    Returns:
        (B, H, Q_TILES, KV_TILES) in q_c's dtype.
    """
    scale = q_c.shape[-1] ** -0.5
    return torch.einsum("bqhd,bkhd->bhqk", q_c, k_c) * scale


def select_top_k(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    """q2k index: the top-k key tiles of each query tile, ascending.

    Args:
        scores: (B, H, Q_TILES, KV_TILES) tile logits.
        top_k: K, 1 <= K <= KV_TILES.

    Returns:
        (B, H, Q_TILES, K) int64, each row sorted ascending.
    """
    idx = torch.topk(scores, top_k, dim=-1, sorted=False).indices
    return torch.sort(idx, dim=-1).values


def block_map_from_q2k(q2k: torch.Tensor, num_kv_tiles: int) -> torch.Tensor:
    """Dense (B, H, Q_TILES, KV_TILES) bool block map of a q2k index (for tests and reports)."""
    bm = torch.zeros(*q2k.shape[:-1], num_kv_tiles, dtype=torch.bool, device=q2k.device)
    return bm.scatter(-1, q2k, True)


def block_sparse_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2k: torch.Tensor,
                                     slots: torch.Tensor, slot_valid: torch.Tensor,
                                     scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level attention of each query tile over its selected key tiles (VSA's fine stage).

    Args:
        q, k, v: (B, S, H, D) float, tile order.
        q2k: (B, H, Q_TILES, K) int64 selected key tiles per query tile (any order, no repeats).
        slots: (n_tiles, V) int64 token index of each slot of a padded tile (V = 64 for (4,4,4) tiles).
        slot_valid: (n_tiles, V) bool, False for the padding slots of partial tiles.
        scale: softmax scale, default 1/sqrt(D).

    Returns:
        out: (B, S, H, D) like q.
        lse: (B, H, S) float32 (float64 for float64 input) natural-log log-sum-exp of each query row.

    Padding slots are masked out as keys; every key tile holds at least one real token, so no row is empty.
    The work is chunked over query tiles to bound memory (see `_FINE_SCORE_ELEMENTS`).
    """
    b, s, h, d = q.shape
    n_tiles, vol = slots.shape
    top_k = q2k.shape[-1]
    scale = d ** -0.5 if scale is None else scale
    acc = _softmax_dtype(q)
    flat_slots = slots.reshape(-1)
    # Padded tiles: (B, H, n_tiles, V, D) in the softmax dtype.
    def padded(x: torch.Tensor) -> torch.Tensor:
        return x.index_select(1, flat_slots).view(b, n_tiles, vol, h, d).permute(0, 3, 1, 2, 4).to(acc)

    qp, kp, vp = padded(q), padded(k), padded(v)
    bh = b * h
    qp, kp, vp = qp.reshape(bh, n_tiles, vol, d), kp.reshape(bh, n_tiles, vol, d), vp.reshape(bh, n_tiles, vol, d)
    q2k_flat = q2k.reshape(bh, n_tiles, top_k)
    rows = torch.arange(bh, device=q.device).view(bh, 1, 1)
    chunk = max(1, _FINE_SCORE_ELEMENTS // max(1, bh * vol * top_k * vol))
    outs, lses = [], []
    for start in range(0, n_tiles, chunk):
        sel = q2k_flat[:, start:start + chunk]                           # (BH, c, K)
        ks = kp[rows, sel].flatten(2, 3)                                  # (BH, c, K*V, D)
        vs = vp[rows, sel].flatten(2, 3)
        key_ok = slot_valid[sel].flatten(2, 3)                            # (BH, c, K*V)
        logits = torch.einsum("bcqd,bckd->bcqk", qp[:, start:start + chunk], ks) * scale
        logits = logits.masked_fill(~key_ok.unsqueeze(2), float("-inf"))
        lse = torch.logsumexp(logits, dim=-1)                            # (BH, c, V)
        p = torch.exp(logits - lse.unsqueeze(-1))
        outs.append(torch.einsum("bcqk,bckd->bcqd", p, vs))
        lses.append(lse)
    out_p = torch.cat(outs, 1).view(b, h, n_tiles * vol, d)
    lse_p = torch.cat(lses, 1).view(b, h, n_tiles * vol)
    # The padded slot of each token, (S,) int64: a scatter of the slot numbers (padding slots land in a spare
    # entry S), not a boolean mask, so that the shapes stay static and torch.compile traces it without a break.
    slot_of = torch.empty(s + 1, dtype=torch.int64, device=q.device).scatter_(
        0, torch.where(slot_valid.reshape(-1), flat_slots, s), torch.arange(n_tiles * vol, device=q.device))[:s]
    out = out_p.index_select(2, slot_of).permute(0, 2, 1, 3).to(q.dtype)  # (B, S, H, D)
    return out, lse_p.index_select(2, slot_of)


def coarse_attention(q_c: torch.Tensor, k_c: torch.Tensor, v_c: torch.Tensor,
                     scores: torch.Tensor | None = None) -> torch.Tensor:
    """Tile-level attention output softmax(q_c k_c^T / sqrt(D)) v_c.

    Args:
        q_c, k_c, v_c: (B, n_tiles, H, D) pooled tiles.
        scores: optional precomputed (B, H, Q_TILES, KV_TILES) logits.

    Returns:
        (B, n_tiles, H, D) in q_c's dtype.
    """
    scores = tile_scores(q_c, k_c) if scores is None else scores
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, dim=-1), v_c)


def vsa_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, token_tile: torch.Tensor,
                  tile_sizes: torch.Tensor, slots: torch.Tensor, slot_valid: torch.Tensor, top_k: int,
                  gate: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Video Sparse Attention, eager reference.

    Args:
        q, k, v: (B, S, H, D) float (bf16 / fp16 / fp32 / fp64), tile order.
        token_tile, tile_sizes, slots, slot_valid: the tile layout (`vsagen.layout.TileLayout` fields).
        top_k: K key tiles per query tile, 1 <= K <= n_tiles.
        gate: optional (B, S, H, D) gate on the coarse output (a checkpoint's `to_gate_compress`); None = 0.

    Returns:
        out: (B, S, H, D) like q.
        q2k: (B, H, Q_TILES, K) int64 selected key tiles, ascending.

    Raises:
        ValueError: mismatched shapes or K out of range.

    Source: VSA paper sec. 2, appendix B pseudocode.
    """
    if q.shape != k.shape or q.shape != v.shape or q.dim() != 4:
        raise ValueError(f"q, k, v must share one (B, S, H, D) shape, got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    n_tiles = tile_sizes.numel()
    if not 1 <= top_k <= n_tiles:
        raise ValueError(f"top_k must be in [1, {n_tiles}], got {top_k}")
    q_c = tile_mean_pool(q, token_tile, tile_sizes)
    k_c = tile_mean_pool(k, token_tile, tile_sizes)
    scores = tile_scores(q_c, k_c)
    q2k = select_top_k(scores.detach(), top_k)
    out, _ = block_sparse_attention_reference(q, k, v, q2k, slots, slot_valid)
    if gate is not None:
        v_c = tile_mean_pool(v, token_tile, tile_sizes)
        coarse = coarse_attention(q_c, k_c, v_c, scores).index_select(1, token_tile)
        out = out + (gate.to(coarse.dtype) * coarse).to(out.dtype)
    return out, q2k


# ------------------------------------------------------------------------------ oracles of index kernels


def build_k2q(q2k: torch.Tensor, q2k_cnt: torch.Tensor, num_kv_tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Transpose the q2k lists: for each key tile, the query tiles that selected it, ascending.

    Exact and deterministic, on q2k's device, with plain torch ops; the oracle of `k2q.build_k2q_triton` (which
    the backward runs). The selection is scattered into a (B, H, Q_TILES, KV_TILES) bool block map (4.7 MB at the
    Wan2.1-1.3B 480p shape), whose transpose is compacted row by row with a cumulative sum: a few elementwise
    passes, where the previous version sorted all B*H*Q_TILES*K selected pairs (0.61 ms on the H200 at that
    shape).

    Args:
        q2k: (B, H, Q_TILES, K) int32 (or int64), the first q2k_cnt entries of each row used, each in
            [0, num_kv_tiles), no repeats within a row (not checked); entries past q2k_cnt are ignored.
        q2k_cnt: (B, H, Q_TILES) int32 in [0, K].
        num_kv_tiles: KV_TILES.

    Returns:
        k2q: (B, H, KV_TILES, Q_TILES) int32; row j lists ascending every query tile i whose first q2k_cnt[i]
            entries contain j, and holds 0 past k2q_cnt[j]. A view of a padded buffer (unit stride on the last
            axis only).
        k2q_cnt: (B, H, KV_TILES) int32.
    """
    b, h, n_q, top_k = q2k.shape
    dev = q2k.device
    # One spare column per row receives what is not kept (unused q2k entries, then unselected pairs).
    out = torch.zeros(b, h, num_kv_tiles, n_q + 1, dtype=torch.int32, device=dev)
    if top_k == 0 or n_q == 0:
        return out[..., :-1], torch.zeros(b, h, num_kv_tiles, dtype=torch.int32, device=dev)
    used = torch.arange(top_k, device=dev) < q2k_cnt.unsqueeze(-1)                      # (B, H, Q, K) bool
    kv = torch.where(used, q2k.long(), num_kv_tiles)                                    # unused -> spare column
    block_map = torch.zeros(b, h, n_q, num_kv_tiles + 1, dtype=torch.bool, device=dev)
    block_map.scatter_(-1, kv, True)
    sel = block_map[..., :num_kv_tiles].transpose(2, 3)                                # (B, H, KV, Q) bool
    k2q_cnt = sel.sum(-1, dtype=torch.int32)
    place = torch.cumsum(sel, dim=-1, dtype=torch.int32) - 1                            # rank within row j
    dest = torch.where(sel, place, n_q).long()                                          # unselected -> spare
    queries = torch.arange(n_q, dtype=torch.int32, device=dev).expand(b, h, num_kv_tiles, n_q)
    out.scatter_(-1, dest, queries)  # only the dropped spare column receives several writes
    return out[..., :-1], k2q_cnt


def tile_plan_reference(idx: torch.Tensor, cnt: torch.Tensor, tile_offsets: torch.Tensor, tile: int = 64,
                        seg: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """`tile_plan.build_tile_plan` in plain torch, row by row (the tests' oracle; slow). Entries the Triton
    version leaves unwritten are -1 here.

    Args:
        idx: (B, H, R, K) int32 / int64 tile lists, the first cnt entries of each row used.
        cnt: (B, H, R) int counts in [0, K].
        tile_offsets: (n_tiles + 1,) int tile start rows.
        tile, seg: tokens of a full tile and of a plan group (`tile_plan.TILE`, `tile_plan.SEG`).

    Returns:
        plan: (B, H, R, (tile // seg) * max(K, 1)) int32 on the CPU, plan_cnt: (B, H, R, 4) int32
        (nf, npk, ng, 0); the layout is in `tile_plan`'s docstring.
    """
    b, h, n_rows, width = idx.shape
    plan = torch.full((b, h, n_rows, (tile // seg) * max(width, 1)), -1, dtype=torch.int32)
    plan_cnt = torch.zeros((b, h, n_rows, 4), dtype=torch.int32)
    off = tile_offsets.cpu().tolist()
    for bi in range(b):
        for hi in range(h):
            for r in range(n_rows):
                ids = idx[bi, hi, r, : int(cnt[bi, hi, r])].tolist()
                full = [off[t] for t in ids if off[t + 1] - off[t] >= tile]
                groups = [((off[t] + i) << 4) | min(seg, off[t + 1] - off[t] - i)
                          for t in ids if off[t + 1] - off[t] < tile for i in range(0, off[t + 1] - off[t], seg)]
                entries = full + groups
                if entries:
                    plan[bi, hi, r, : len(entries)] = torch.tensor(entries, dtype=torch.int32)
                plan_cnt[bi, hi, r] = torch.tensor([len(full), -(-len(groups) * seg // tile), len(groups), 0])
    return plan, plan_cnt


# ---------------------------------------------------------------------------------------------------------------
# SLA*'s linear-attention branch (seed 002, after SLA arXiv 2509.24006; `vsagen.attention.sla_star`)

FEATURE_MAPS = ("softmax", "elu", "relu")
# Budget for the marginal scope's per-chunk (B, H, chunk, D, D) float32 sums, in elements (2^26 = 256 MiB).
_MARGINAL_SUM_ELEMENTS = 1 << 26
LINEAR_EPS = 1e-5  # added to the denominator, as SLA's released code does


def feature_map(x: torch.Tensor, kind: str) -> torch.Tensor:
    """phi(x) over the head dim: "softmax" (softmax over D, SLA's default), "elu" (elu(x) + 1) or "relu".

    Args:
        x: (..., D) float.
        kind: one of FEATURE_MAPS.

    Raises:
        ValueError: an unknown kind.
    """
    if kind == "softmax":
        return torch.softmax(x, dim=-1)
    if kind == "elu":
        return torch.nn.functional.elu(x) + 1.0
    if kind == "relu":
        return torch.relu(x)
    raise ValueError(f"feature map must be one of {FEATURE_MAPS}, got {kind!r}")


def linear_attention_branch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, kind: str = "softmax",
                            block_map: torch.Tensor | None = None, slots: torch.Tensor | None = None,
                            slot_valid: torch.Tensor | None = None, eps: float = LINEAR_EPS) -> torch.Tensor:
    """SLA*'s linear-attention branch: o_l = phi(q) Sum / (eps + phi(q) . z) per token and head.

    `global` scope (block_map None; SLA's released code, AMD's SLA*): Sum = sum_j phi(k_j)^T v_j and
    z = sum_j phi(k_j) over every key token. `marginal` scope (the SLA paper): for a query in tile i, the same sums
    over the tokens of the key tiles tile i did NOT select (`block_map[b, h, i]` False), from per-tile sums
    S_t = phi(K_t)^T V_t and z_t = sum phi(K_t); with every tile selected o_l is exactly 0.

    Args:
        q, k, v: (B, S, H, D) float, tile order for `marginal`.
        kind: the feature map (`feature_map`), the same for q and k.
        block_map: (B, H, Q_TILES, KV_TILES) bool, the sparse branch's selection (`marginal`), or None (`global`).
        slots, slot_valid: the layout's padded tiles ((n_tiles, 64) token index, and False for padding), needed
            for `marginal`.
        eps: added to the denominator.

    Returns:
        (B, S, H, D) float32 (float64 for float64 inputs); differentiable.

    Raises:
        ValueError: `marginal` without slots, or an unknown kind.
    """
    acc = _softmax_dtype(q)
    pq, pk, vv = feature_map(q.to(acc), kind), feature_map(k.to(acc), kind), v.to(acc)
    if block_map is None:
        kv = torch.einsum("bshd,bshe->bhde", pk, vv)
        z = pk.sum(dim=1)  # (B, H, D)
        num = torch.einsum("bshd,bhde->bshe", pq, kv)
        den = torch.einsum("bshd,bhd->bsh", pq, z)
        return num / (eps + den).unsqueeze(-1)
    if slots is None or slot_valid is None:
        raise ValueError("the marginal scope needs the layout's slots and slot_valid")
    b, s, h, d = q.shape
    n_tiles, vol = slots.shape
    flat = slots.reshape(-1)
    valid = slot_valid.reshape(1, n_tiles, vol, 1, 1).to(acc)

    def padded(x: torch.Tensor) -> torch.Tensor:  # (B, n_tiles, V, H, D), padding slots zero
        return x.index_select(1, flat).view(b, n_tiles, vol, h, x.shape[-1]) * valid

    pk_t, v_t = padded(pk), padded(vv)
    del pk, vv
    s_t = torch.einsum("btvhd,btvhe->bhtde", pk_t, v_t)  # (B, H, KV_TILES, D, D) per key tile
    z_t = pk_t.sum(dim=2).permute(0, 2, 1, 3)  # (B, H, KV_TILES, D)
    del pk_t, v_t
    # Query tiles in chunks, so the (B, H, chunk, D, D) sums over the unselected tiles stay within
    # `_MARGINAL_SUM_ELEMENTS` (at the 14B 720p shape all 1,440 query tiles at once would be 3.8 GB in float32).
    chunk = max(1, _MARGINAL_SUM_ELEMENTS // max(1, b * h * d * d))
    outs = []
    for start in range(0, n_tiles, chunk):
        unselected = (~block_map[:, :, start:start + chunk]).to(acc)  # (B, H, c, KV_TILES)
        s_u = torch.einsum("bhqt,bhtde->bhqde", unselected, s_t)
        z_u = torch.einsum("bhqt,bhtd->bhqd", unselected, z_t)
        pq_c = pq.index_select(1, slots[start:start + chunk].reshape(-1)).view(b, -1, vol, h, d)
        num = torch.einsum("bqvhd,bhqde->bqvhe", pq_c, s_u)  # (B, c, V, H, D)
        den = torch.einsum("bqvhd,bhqd->bqvh", pq_c, z_u)
        outs.append((num / (eps + den).unsqueeze(-1)).reshape(b, -1, h, d))
    o_t = torch.cat(outs, 1)  # (B, n_tiles * V, H, D); padding slots hold garbage that no token reads
    # Each token's padded slot, by a scatter (padding slots land in a spare entry S) rather than a boolean mask:
    # static shapes, so torch.compile traces it without a break (as the fine stage's reference does).
    slot_of = torch.empty(s + 1, dtype=torch.int64, device=q.device).scatter_(
        0, torch.where(slot_valid.reshape(-1), flat, s), torch.arange(n_tiles * vol, device=q.device))[:s]
    return o_t.index_select(1, slot_of)
