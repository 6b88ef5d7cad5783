"""Attention kernels and their eager references; installed as `vsagen.kernels` (no diffusers imports here).

Shape vocabulary: B batch, S tokens (T*Hl*Wl latent tokens after patchify, tile order), H heads, D head dim,
(T, Hl, Wl) latent grid, Q_TILES / KV_TILES tile counts, K top-k.

At present this package holds the eager PyTorch reference of VSA (`reference.py`), which is both the CPU
path of the `vsa` backend and the oracle that the Triton kernels will be tested against.
"""

from .reference import (
    block_map_from_q2k,
    block_sparse_attention_reference,
    coarse_attention,
    select_top_k,
    tile_mean_pool,
    tile_scores,
    top_k_from_sparsity,
    vsa_reference,
)

__all__ = [
    "block_map_from_q2k",
    "block_sparse_attention_reference",
    "coarse_attention",
    "select_top_k",
    "tile_mean_pool",
    "tile_scores",
    "top_k_from_sparsity",
    "vsa_reference",
]
