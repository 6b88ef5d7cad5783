"""VSA's fine stage on FlashAttention-4's block-sparse forward and backward (tile volumes 128 and 256).

FlashAttention-4 (pip `flash-attn-4`, module `flash_attn.cute`, CuTe DSL; an optional dependency: `pip install
'vsagen[fa4]'`) runs block-sparse attention over blocks of 128 key tokens, listed per query block the way
FlexAttention lists them: "full" blocks need no mask, "mask" blocks run a `mask_mod` on each (query, key) pair.
This module turns VSA's cube-level selection into that form:

* the sequence is padded to whole cubes: cube c (tile order, `sizes[c]` real tokens) occupies the padded slots
  [c * V, (c + 1) * V), its real tokens first, zeros after (`pad_to_cubes` / `unpad_from_cubes`);
* each cube is V / 128 key blocks of 128 slots: a block of 128 real tokens is "full", one with some real tokens is
  "mask" (the `mask_mod` keeps the key slots that hold real tokens), one with none is dropped;
* each query block inherits its cube's key list (`fa4_block_sparse_index`; where every cube is whole there are
  no mask blocks and `whole_cube_index` builds the lists from the cube lists without dense maps).

FA4 facts this relies on (flash-attn-4 4.0.0b36, `flash_attn/cute/`): `block_sparsity.BlockSparseTensorsTorch(
mask_block_cnt (B, H, M) int32, mask_block_idx (B, H, M, N') int32, full_block_cnt, full_block_idx, block_size=(q,
kv))` with the indices of each row packed left, only the first `cnt` read, and N' <= the key block count allowed
(`_check_and_expand_block`); the backward takes the transposed lists (per key block, the query blocks: shapes
(B, H, N) / (B, H, N, M'), `normalize_block_sparse_config_bwd`) as `block_sparse_tensors_bwd`, and without them
it runs unsparsified; `interface.flash_attn_func(q, k, v, softmax_scale=, mask_mod=, aux_tensors=,
block_sparse_tensors=, block_sparse_tensors_bwd=)` -> (out, lse) through its autograd `FlashAttnFunc`; a
`mask_mod(batch, head, q_idx, kv_idx, seqlen_info, aux_tensors)` gets (1,)-shaped Int32 SSA values with absolute
token positions (`mask.call_mask_mod`). Query blocks: on sm90 128 rows (`_tile_size_fwd_sm90`); on sm100 the
forward pairs two 128-row tiles (`q_stage = 2` in `_get_fwd_config`), so its sparse query block must be 256, which
fits a 256-token cube but would merge two 128-token cubes' lists (refused: `fa4_unavailable`). Key blocks: 128
(on sm90 64-token key blocks give wrong output: REFERENCE.md).

torch only at import; `flash_attn` and `cutlass` are imported inside the functions that need them.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass

import torch

FA4_BLOCK = 128
"""Tokens in one FA4 key block (and one sm90 query block)."""

FA4_REQUIREMENT = "flash-attn-4==4.0.0b36"


def fa4_version() -> str | None:
    """The installed flash-attn-4 distribution's version (package metadata: nothing imported), or None."""
    import importlib.metadata

    try:
        return importlib.metadata.version("flash-attn-4")
    except importlib.metadata.PackageNotFoundError:
        return None


def fa4_is_pinned_version() -> bool:
    """Whether the installed flash-attn-4 is the version this adapter follows and was measured with
    (`FA4_REQUIREMENT`): its block-sparse tensors' layout and `flash_attn_func`'s arguments change between
    releases. `impl=auto` runs FA4 only then; an explicit `impl=fa4` tries any installed version."""
    return fa4_version() == FA4_REQUIREMENT.partition("==")[2]


def fa4_query_block(capability_major: int, tile_volume: int) -> int:
    """Rows of FA4's sparse query block on a GPU of compute capability `capability_major`.x.

    128 on sm90; 256 on sm100 (its forward runs two 128-row query tiles per block). Raises ValueError where the
    tile volume is not a multiple of that block (a query block would span two cubes with different key lists).
    """
    q_block = 256 if capability_major == 10 else FA4_BLOCK
    if tile_volume % q_block:
        raise ValueError(f"tile volume {tile_volume} is not a multiple of FA4's {q_block}-row query block "
                         f"on compute capability {capability_major}.x")
    return q_block


def _fa4_installed() -> bool:
    # find_spec of the top-level name imports nothing; flash_attn may be FA2's package (no cute/) or a namespace.
    spec = importlib.util.find_spec("flash_attn")
    if spec is None or importlib.util.find_spec("cutlass") is None:
        return False
    return any(os.path.isfile(os.path.join(loc, "cute", "interface.py"))
               for loc in (spec.submodule_search_locations or ()))


def fa4_unavailable(device: torch.device | str, tile_volume: int) -> str | None:
    """Why FA4's block-sparse attention cannot run here, in one line, or None when it can.

    Args:
        device: where q, k, v live.
        tile_volume: tokens in a full cube (64, 128 or 256).

    Returns:
        None, or the reason: tile volume not a multiple of 128 (FA4's sm90 sparse path needs 128-token key blocks),
        device not CUDA, compute capability other than 9.x / 10.x, 128-token cubes on 10.x (see
        `fa4_query_block`), the package not installed (`pip install 'vsagen[fa4]'`). Nothing is imported from
        `flash_attn` (the package check is `importlib.util.find_spec`).
    """
    if tile_volume % FA4_BLOCK:
        return (f"FA4 needs tiles of a multiple of {FA4_BLOCK} tokens (its sm90 block-sparse path needs 128-token "
                f"key blocks); got tile volume {tile_volume}: use tile=4x4x8 or tile=4x8x8")
    device = torch.device(device)
    if device.type != "cuda" or getattr(torch.version, "hip", None):
        return f"FA4 runs on NVIDIA CUDA GPUs only; this run is on {device}"
    if not torch.cuda.is_available():
        return f"FA4 runs on NVIDIA CUDA GPUs; {device} was asked for but CUDA is not available"
    major, minor = torch.cuda.get_device_capability(device)
    if major not in (9, 10):
        return f"FA4's block-sparse attention needs compute capability 9.x or 10.x; this GPU is {major}.{minor}"
    try:
        fa4_query_block(major, tile_volume)
    except ValueError as exc:
        return f"FA4: {exc}; use tile=4x8x8"
    if not _fa4_installed():
        return f"FA4 is not installed: pip install 'vsagen[fa4]' ({FA4_REQUIREMENT})"
    return None


# ----------------------------------------------------------------------------------------------- padding

def pad_to_cubes(x: torch.Tensor, slots: torch.Tensor, slot_valid: torch.Tensor) -> torch.Tensor:
    """(B, S, H, D) tile order -> (B, n_tiles * V, H, D): cube c in rows [c * V, (c + 1) * V), zeros in padding.

    Args:
        x: (B, S, H, D) any dtype, tile order.
        slots: (n_tiles, V) int64 token index of each padded slot (`TileLayout.slots`).
        slot_valid: (n_tiles, V) bool, False for padding slots (`TileLayout.slot_valid`).

    Returns a new contiguous tensor, differentiable with respect to x.
    """
    flat = slots.reshape(-1).to(device=x.device, dtype=torch.int64)
    valid = slot_valid.reshape(1, -1, 1, 1).to(x.device)
    return torch.where(valid, x.index_select(1, flat), x.new_zeros(()))


def unpad_from_cubes(xp: torch.Tensor, slots: torch.Tensor, slot_valid: torch.Tensor,
                     num_tokens: int) -> torch.Tensor:
    """(B, n_tiles * V, H, D) padded -> (B, S, H, D) tile order, S = `num_tokens`: the inverse of `pad_to_cubes`.

    Args:
        xp: (B, n_tiles * V, H, D).
        slots, slot_valid: as for `pad_to_cubes`.
        num_tokens: S, the real tokens (slot_valid.sum()).
    """
    flat = slots.reshape(-1).to(device=xp.device, dtype=torch.int64)
    valid = slot_valid.reshape(-1).to(xp.device)
    # The padded slot of each token: padding slots scatter into a spare entry S (no data-dependent shape).
    slot_of = torch.empty(num_tokens + 1, dtype=torch.int64, device=xp.device).scatter_(
        0, torch.where(valid, flat, num_tokens), torch.arange(flat.numel(), device=xp.device))[:num_tokens]
    return xp.index_select(1, slot_of)


# ------------------------------------------------------------------------------------ index conversion

def cube_map(q2k: torch.Tensor, q2k_cnt: torch.Tensor, num_cubes: int) -> torch.Tensor:
    """Dense (B, H, nC, nC) bool map of the used q2k entries (entries past q2k_cnt may hold anything).

    Args:
        q2k: (B, H, nC, K) int key cubes per query cube; only the first q2k_cnt[b, h, c] are read.
        q2k_cnt: (B, H, nC) int.
        num_cubes: nC.
    """
    used = torch.arange(q2k.shape[-1], device=q2k.device) < q2k_cnt.unsqueeze(-1)
    cols = torch.where(used, q2k.long(), num_cubes)
    out = torch.zeros(*q2k.shape[:-1], num_cubes + 1, dtype=torch.bool, device=q2k.device)
    return out.scatter_(-1, cols, True)[..., :num_cubes]


def key_block_tokens(sizes: torch.Tensor, tile_volume: int) -> torch.Tensor:
    """(nC * V / 128,) int64 real tokens in each 128-slot key block of the padded sequence (0..128).

    Args:
        sizes: (nC,) int real tokens of each cube (real tokens fill a cube's first slots).
        tile_volume: V, a multiple of 128.
    """
    per_cube = tile_volume // FA4_BLOCK
    start = torch.arange(per_cube, device=sizes.device) * FA4_BLOCK
    return (sizes.long().view(-1, 1) - start).clamp(0, FA4_BLOCK).reshape(-1)


def fa4_block_maps(q2k: torch.Tensor, q2k_cnt: torch.Tensor, sizes: torch.Tensor, tile_volume: int,
                   q_block: int = FA4_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense (B, H, M, N) bool maps of FA4's full and mask blocks, M = nC * V / q_block, N = nC * V / 128.

    A key block of a selected cube is full with 128 real tokens, mask with 1..127, absent with none. Query block
    m belongs to cube m // (V / q_block) and takes its list. Raises ValueError for V not a multiple of 128 or of
    q_block.
    """
    if tile_volume % FA4_BLOCK or tile_volume % q_block:
        raise ValueError(f"tile volume {tile_volume} must be a multiple of 128 and of the query block {q_block}")
    n_cubes = sizes.numel()
    selected = cube_map(q2k, q2k_cnt, n_cubes)
    selected = selected.repeat_interleave(tile_volume // FA4_BLOCK, -1).repeat_interleave(tile_volume // q_block, -2)
    tokens = key_block_tokens(sizes.to(q2k.device), tile_volume)
    return selected & (tokens == FA4_BLOCK), selected & (tokens > 0) & (tokens < FA4_BLOCK)


def map_to_lists(block_map: torch.Tensor, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(…, R, C) bool map -> (cnt (…, R) int32, idx (…, R, width) int32): each row's True columns ascending,
    packed left; entries past cnt are other columns (FA4 reads only the first cnt). width: default C.

    idx always has stride 1 in its last dimension, also where width is 1 and the map is a transposed view: FA4
    checks that stride literally, while torch calls a (…, R, 1) tensor with any last stride contiguous (a transposed
    map once gave stride R there and FA4's backward refused: "Expected strides[leading_dim] == 1")."""
    idx = torch.sort((~block_map.contiguous()).to(torch.uint8), dim=-1, stable=True).indices
    width = block_map.shape[-1] if width is None else max(1, min(width, block_map.shape[-1]))
    return (block_map.sum(-1, dtype=torch.int32),
            idx[..., :width].to(torch.int32).clone(memory_format=torch.contiguous_format))


@dataclass(frozen=True)
class Fa4SparseIndex:
    """FA4's block-sparse lists of one call (plain torch tensors; `BlockSparseTensorsTorch` is built from them).

    fwd / bwd: (mask_block_cnt, mask_block_idx, full_block_cnt, full_block_idx), int32. Forward: per query block,
    (B, H, M) and (B, H, M, W) key blocks ascending. Backward (None when not asked): per key block, (B, H, N) and
    (B, H, N, W') query blocks ascending. block_size: (q_block, 128).
    """

    fwd: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
    bwd: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None
    block_size: tuple[int, int]


def fa4_block_sparse_index(q2k: torch.Tensor, q2k_cnt: torch.Tensor, sizes: torch.Tensor, tile_volume: int, *,
                           q_block: int = FA4_BLOCK, backward: bool = True) -> Fa4SparseIndex:
    """Cube-level top-k lists -> FA4's forward (and backward) block lists over the cube-padded sequence.

    Args:
        q2k: (B, H, nC, K) int (int32 or int64) key cubes per query cube, ascending; the first q2k_cnt used.
        q2k_cnt: (B, H, nC) int.
        sizes: (nC,) int real tokens per cube.
        tile_volume: V, 128 or 256 (any multiple of 128 and of q_block).
        q_block: FA4's sparse query block (`fa4_query_block`).
        backward: also build the transposed lists the backward needs (their widths are the longest lists: one
            device sync for both).

    Returns:
        Fa4SparseIndex on q2k's device. Forward lists are K * V / 128 wide (at most N).

    Raises:
        ValueError: V not a multiple of 128 or of q_block.
    """
    full, mask = fa4_block_maps(q2k, q2k_cnt, sizes, tile_volume, q_block)
    width = q2k.shape[-1] * (tile_volume // FA4_BLOCK)
    m_cnt, m_idx = map_to_lists(mask, width)
    f_cnt, f_idx = map_to_lists(full, width)
    bwd = None
    if backward:
        full_t, mask_t = full.transpose(-1, -2), mask.transpose(-1, -2)
        bm_cnt, bf_cnt = mask_t.sum(-1, dtype=torch.int32), full_t.sum(-1, dtype=torch.int32)
        widths = torch.stack([bm_cnt.amax(), bf_cnt.amax()]).tolist() if bm_cnt.numel() else [1, 1]  # one sync
        bm_cnt, bm_idx = map_to_lists(mask_t, widths[0])
        bf_cnt, bf_idx = map_to_lists(full_t, widths[1])
        bwd = (bm_cnt, bm_idx, bf_cnt, bf_idx)
    return Fa4SparseIndex(fwd=(m_cnt, m_idx, f_cnt, f_idx), bwd=bwd, block_size=(q_block, FA4_BLOCK))


def _packed(t: torch.Tensor) -> torch.Tensor:
    """t itself when contiguous with stride 1 in its last dimension, else a packed copy (see `map_to_lists`)."""
    return t if t.is_contiguous() and t.stride(-1) == 1 else t.clone(memory_format=torch.contiguous_format)


def whole_cube_index(q2k: torch.Tensor, q2k_cnt: torch.Tensor, num_cubes: int, tile_volume: int, *,
                     q_block: int = FA4_BLOCK, backward: bool = True) -> Fa4SparseIndex:
    """FA4's block lists where every cube is whole (`every_cube_full`), built from the cube lists directly.

    With every key block full there are no mask blocks, so the dense (B, H, M, N) maps and the sort of
    `fa4_block_sparse_index` are not needed (0.245 ms forward, 0.50 ms forward + backward on an H100 at the Wan
    1.3B shape). With r = V / 128 key blocks and qb = V / q_block query blocks per cube: query block m (cube c =
    m // qb) lists the full key blocks q2k[c, j] * r + t (j < q2k_cnt[c], t < r), ascending since q2k rows
    ascend; key block n (cube c = n // r) lists the query blocks i * qb + u (u < qb) of every query cube i that
    selected c, ascending, from the cube-level transpose (`k2q.build_k2q_triton` on CUDA and under the Triton
    interpreter, `reference.build_k2q` elsewhere). Same lists as `fa4_block_sparse_index` on such a layout.

    Args:
        q2k: (B, H, nC, K) int32 or int64 key cubes per query cube, ascending; only the first q2k_cnt read.
        q2k_cnt: (B, H, nC) int32 or int64, in [0, K].
        num_cubes: nC (all of them whole).
        tile_volume: V, 128 or 256 (any multiple of 128 and of q_block).
        q_block: FA4's sparse query block (`fa4_query_block`).
        backward: also build the transposed lists (their width is the longest list: one device sync).

    Returns:
        Fa4SparseIndex on q2k's device, every tensor int32, contiguous, stride 1 in its last dimension (also at
        width 1). Forward: full (B, H, M) counts q2k_cnt * r and (B, H, M, max(K, 1) * r) indices (entries past
        the count hold block indices of cube 0). Backward: full (B, H, N) counts and (B, H, N, max(1, longest
        k2q list) * qb) indices, 0 past the count. Mask counts are all 0, mask indices zeros (forward: as wide as
        the full ones; backward: (…, 1)).

    Raises:
        ValueError: V not a multiple of 128 or of q_block, or q2k / q2k_cnt not (B, H, nC, K) / (B, H, nC).

    Source: FA4's block lists (module docstring); the transpose is VSA's k2q (arXiv 2505.13389, sec. 2).
    """
    if tile_volume % FA4_BLOCK or tile_volume % q_block:
        raise ValueError(f"tile volume {tile_volume} must be a multiple of 128 and of the query block {q_block}")
    if q2k.dim() != 4 or q2k.shape[2] != num_cubes or q2k_cnt.shape != q2k.shape[:3]:
        raise ValueError(f"q2k must be (B, H, {num_cubes}, K) and q2k_cnt (B, H, {num_cubes}); got "
                         f"{tuple(q2k.shape)} and {tuple(q2k_cnt.shape)}")
    r, qb = tile_volume // FA4_BLOCK, tile_volume // q_block
    b, h, n, top_k = q2k.shape
    dev = q2k.device
    cnt = q2k_cnt.to(torch.int32)
    used = torch.arange(max(top_k, 1), device=dev) < cnt.unsqueeze(-1)
    cubes = torch.where(used, q2k.to(torch.int32), 0) if top_k else torch.zeros(b, h, n, 1, dtype=torch.int32,
                                                                                   device=dev)
    blocks = (cubes.unsqueeze(-1) * r + torch.arange(r, dtype=torch.int32, device=dev)).reshape(b, h, n, -1)
    f_idx = blocks.unsqueeze(3).expand(b, h, n, qb, blocks.shape[-1]).reshape(b, h, n * qb, -1)
    f_cnt = (cnt * r).unsqueeze(-1).expand(b, h, n, qb).reshape(b, h, n * qb)
    # forward mask lists as wide as the full ones, as the dense-map path gives them (the shapes FA4 ran with)
    fwd = (torch.zeros(b, h, n * qb, dtype=torch.int32, device=dev),
           torch.zeros(b, h, n * qb, f_idx.shape[-1], dtype=torch.int32, device=dev), _packed(f_cnt), _packed(f_idx))
    bwd = None
    if backward:
        from .tuning import interpreting
        if dev.type == "cuda" or interpreting():
            from .k2q import build_k2q_triton as build_k2q
        else:
            from .reference import build_k2q
        k2q, k2q_cnt = build_k2q(q2k, q2k_cnt, n)  # (B, H, nC, nC), 0 past the count; (B, H, nC)
        width = max(1, int(k2q_cnt.amax())) if k2q_cnt.numel() else 1  # the one sync
        width = min(width, k2q.shape[-1])
        rows = (k2q[..., :width].unsqueeze(-1) * qb + torch.arange(qb, dtype=torch.int32, device=dev))
        rows = rows.reshape(b, h, n, -1)
        bf_idx = rows.unsqueeze(3).expand(b, h, n, r, rows.shape[-1]).reshape(b, h, n * r, -1)
        bf_cnt = (k2q_cnt * qb).unsqueeze(-1).expand(b, h, n, r).reshape(b, h, n * r)
        bwd = (torch.zeros(b, h, n * r, dtype=torch.int32, device=dev),
               torch.zeros(b, h, n * r, 1, dtype=torch.int32, device=dev), _packed(bf_cnt), _packed(bf_idx))
    return Fa4SparseIndex(fwd=fwd, bwd=bwd, block_size=(q_block, FA4_BLOCK))


# ------------------------------------------------------------------------------------------- the FA4 call

def every_cube_full(num_cubes: int, tile_volume: int, num_tokens: int) -> bool:
    """Whether all `num_cubes` cubes hold `tile_volume` real tokens (a grid the tile divides, e.g. `--tile-fit
    crop`): then the tile-order sequence of `num_tokens` tokens is its own cube padding and FA4 needs no mask blocks.
    Plain integers: no device sync."""
    return num_cubes * tile_volume == num_tokens


@functools.cache
def key_valid_mask_mod():
    """FA4 `mask_mod` (CuTe DSL, built on first use): key position n is kept iff aux_tensors[0][n] != 0.

    aux_tensors[0] is the (nC * V,) int32 flag of each padded key slot (`slot_valid` flattened). FA4 calls it only
    in mask blocks. Cached: FA4 keys its compile cache on the callable.
    """
    import cutlass
    import cutlass.cute as cute
    from flash_attn.cute import utils

    @cute.jit
    def key_slot_valid(batch, head, q_idx, kv_idx, seqlen_info, aux_tensors):
        flag = utils.scalar_to_ssa(aux_tensors[0][kv_idx[0]], cutlass.Int32)
        return flag > utils.scalar_to_ssa(0, cutlass.Int32)

    return key_slot_valid


def fa4_block_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2k: torch.Tensor,
                               q2k_cnt: torch.Tensor, sizes: torch.Tensor, slots: torch.Tensor,
                               slot_valid: torch.Tensor, tile_volume: int, scale: float | None = None) -> torch.Tensor:
    """VSA's fine stage through FA4: each query cube attends the real tokens of its first q2k_cnt key cubes.

    Args:
        q, k, v: (B, S, H, D) bf16 / fp16 CUDA, tile order (D as FA4 takes it, e.g. 64 or 128).
        q2k: (B, H, nC, K) int key cubes per query cube (ascending); q2k_cnt: (B, H, nC) int, each >= 1.
        sizes: (nC,) int real tokens per cube (`TileLayout.tile_sizes`).
        slots, slot_valid: (nC, V) `TileLayout.slots` / `slot_valid`.
        tile_volume: V, 128 or 256.
        scale: softmax scale, default D ** -0.5.

    Returns:
        (B, S, H, D) like q; differentiable through FA4's own autograd function (backward on sm90 / sm100). Where
        every cube is full (`every_cube_full`) q, k, v go to FA4 as they are, without padding or `mask_mod`;
        otherwise they are padded to whole cubes and the partial key blocks run `key_valid_mask_mod`.

    Raises:
        RuntimeError: `fa4_unavailable`'s reason.
    Source: FA4 `flash_attn/cute/interface.py` `flash_attn_func`, `block_sparsity.py` (module docstring).
    """
    reason = fa4_unavailable(q.device, tile_volume)
    if reason:
        raise RuntimeError(reason)
    from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch
    from flash_attn.cute.interface import flash_attn_func

    q_block = fa4_query_block(torch.cuda.get_device_capability(q.device)[0], tile_volume)
    need_bwd = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    whole = every_cube_full(sizes.numel(), tile_volume, q.shape[1])
    if whole:  # no mask blocks: the lists come from the cube lists directly, without dense maps
        index = whole_cube_index(q2k, q2k_cnt, sizes.numel(), tile_volume, q_block=q_block, backward=need_bwd)
    else:
        index = fa4_block_sparse_index(q2k, q2k_cnt, sizes, tile_volume, q_block=q_block, backward=need_bwd)

    def tensors(lists):
        m_cnt, m_idx, f_cnt, f_idx = lists
        return BlockSparseTensorsTorch(mask_block_cnt=m_cnt, mask_block_idx=m_idx, full_block_cnt=f_cnt,
                                       full_block_idx=f_idx, block_size=index.block_size)

    bwd = tensors(index.bwd) if index.bwd is not None else None
    if whole:
        # The tile order is already the padded sequence and every key block is full: no copies, no mask_mod.
        out, _ = flash_attn_func(*(x.contiguous() for x in (q, k, v)), softmax_scale=scale,
                                 block_sparse_tensors=tensors(index.fwd), block_sparse_tensors_bwd=bwd)
        return out
    key_valid = slot_valid.reshape(-1).to(device=q.device, dtype=torch.int32).contiguous()
    qp, kp, vp = (pad_to_cubes(x, slots, slot_valid) for x in (q, k, v))
    out, _ = flash_attn_func(qp, kp, vp, softmax_scale=scale, mask_mod=key_valid_mask_mod(),
                             aux_tensors=[key_valid], block_sparse_tensors=tensors(index.fwd),
                             block_sparse_tensors_bwd=bwd)
    return unpad_from_cubes(out, slots, slot_valid, q.shape[1])
