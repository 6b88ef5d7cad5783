"""`vsa`: Video Sparse Attention (arXiv 2505.13389, sec. 2).

Coarse stage: mean-pool q, k, v per (4,4,4) tile with true token counts, tile-level scores, top-k key tiles
per query tile with K = ceil((1 - sparsity) * n_tiles). Fine stage: token attention over the selected tiles.
Output = fine + gate * coarse; the gate is zero (pure fine output) unless the checkpoint has trained
`to_gate_compress` weights. This backend currently runs the eager reference in `vsagen.kernels.reference`
on every device; the Triton kernels will take over on CUDA.
"""

from __future__ import annotations

import torch

from ..errors import BadInput
from ..kernels import reference as ref
from ..layout import TileLayout
from ..timing import Timer

DEFAULT_SPARSITY = 0.875


class VSAAttention:
    """VSA with a fixed sparsity (fraction of key tiles skipped per query tile)."""

    name = "vsa"
    tiled = True
    supports_gate = True

    def __init__(self, sparsity: float = DEFAULT_SPARSITY) -> None:
        if not 0.0 <= sparsity < 1.0:
            raise BadInput(f"--sparsity must be in [0, 1), got {sparsity}")
        self.sparsity = float(sparsity)

    def check(self, device: torch.device, dtype: torch.dtype) -> None:
        """The eager path runs on any device and float dtype."""

    def describe(self) -> dict:
        return {"name": self.name, "sparsity": self.sparsity, "implementation": "torch-reference"}

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TileLayout | None, *,
                 gate: torch.Tensor | None, timer: Timer) -> torch.Tensor:
        """q, k, v, gate: (B, S, H, D) tile order -> (B, S, H, D) like q. Stages: coarse, fine."""
        if layout is None:
            raise RuntimeError("vsa needs tokens in tile order with a TileLayout (tile-order hooks missing)")
        top_k = ref.top_k_from_sparsity(self.sparsity, layout.num_tiles)
        with timer.region("self_attention/coarse"):
            q_c = ref.tile_mean_pool(q, layout.token_tile, layout.tile_sizes)
            k_c = ref.tile_mean_pool(k, layout.token_tile, layout.tile_sizes)
            scores = ref.tile_scores(q_c, k_c)
            q2k = ref.select_top_k(scores.detach(), top_k)
            coarse = None
            if gate is not None:
                v_c = ref.tile_mean_pool(v, layout.token_tile, layout.tile_sizes)
                coarse = ref.coarse_attention(q_c, k_c, v_c, scores).index_select(1, layout.token_tile)
        with timer.region("self_attention/fine"):
            out, _ = ref.block_sparse_attention_reference(q, k, v, q2k, layout.slots, layout.slot_valid)
        if coarse is not None:
            out = out + (gate.to(coarse.dtype) * coarse).to(out.dtype)
        return out
