"""`vsa`: Video Sparse Attention (arXiv 2505.13389, sec. 2).

Coarse stage: mean-pool q, k, v per (4,4,4) tile with true token counts, tile-level scores, top-k key tiles
per query tile with K = ceil((1 - sparsity) * n_tiles). Fine stage: token attention over the selected tiles.
Output = fine + gate * coarse; the gate is zero (pure fine output) unless the checkpoint has trained
`to_gate_compress` weights.

Two implementations of the same function, chosen by `impl`:
* "triton": the kernels in `vsagen.kernels` (fused pooling + top-k into q2k lists, block-sparse flash
  attention forward and backward). The default on CUDA.
* "torch": the eager reference in `vsagen.kernels.reference`, the oracle of the tests. The default elsewhere.
"""

from __future__ import annotations

import torch

from ..errors import BadInput
from ..kernels import reference as ref
from ..layout import TileLayout
from ..timing import Timer

DEFAULT_SPARSITY = 0.875
IMPLS = ("auto", "triton", "torch")


def _interpreting() -> bool:
    from ..kernels.block_sparse_attn import interpreting

    return interpreting()


class VSAAttention:
    """VSA with a fixed sparsity (fraction of key tiles skipped per query tile)."""

    name = "vsa"
    tiled = True
    supports_gate = True
    # Both implementations trace without a graph break: "triton" through the custom ops vsagen::coarse_stage and
    # vsagen::block_sparse_attn, "torch" as plain static-shape torch ops.
    traceable = True

    def __init__(self, sparsity: float = DEFAULT_SPARSITY, impl: str = "auto") -> None:
        if not 0.0 <= sparsity < 1.0:
            raise BadInput(f"--sparsity must be in [0, 1), got {sparsity}")
        if impl not in IMPLS:
            raise BadInput(f"--attn-impl must be one of {', '.join(IMPLS)}, got {impl!r}")
        self.sparsity = float(sparsity)
        self.impl = impl

    def resolved_impl(self, device: torch.device) -> str:
        """'triton' or 'torch' for tensors on `device`."""
        if self.impl != "auto":
            return self.impl
        return "triton" if device.type == "cuda" else "torch"

    def check(self, device: torch.device, dtype: torch.dtype) -> None:
        """Raises BadInput for the Triton kernels on a CPU (unless the Triton interpreter is on)."""
        if self.resolved_impl(device) == "triton" and device.type != "cuda" and not _interpreting():
            raise BadInput("--attn-impl triton needs a CUDA device (or TRITON_INTERPRET=1 for the slow "
                           "interpreter); use --attn-impl torch on CPU")

    def describe(self) -> dict:
        return {"name": self.name, "sparsity": self.sparsity, "impl": self.impl}

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TileLayout | None, *,
                 gate: torch.Tensor | None, timer: Timer) -> torch.Tensor:
        """q, k, v, gate: (B, S, H, D) tile order -> (B, S, H, D) like q. Stages: coarse, fine."""
        if layout is None:
            raise RuntimeError("vsa needs tokens in tile order with a TileLayout (tile-order hooks missing)")
        top_k = ref.top_k_from_sparsity(self.sparsity, layout.num_tiles)
        if self.resolved_impl(q.device) == "triton":
            return self._triton(q, k, v, layout, gate, timer, top_k)
        return self._torch(q, k, v, layout, gate, timer, top_k)

    def _torch(self, q, k, v, layout, gate, timer, top_k):
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

    def _triton(self, q, k, v, layout, gate, timer, top_k):
        from ..kernels.block_sparse_attn import block_sparse_attention
        from ..kernels.coarse import coarse_stage

        with timer.region("self_attention/coarse"):
            c = coarse_stage(q, k, layout.tile_offsets_i32, top_k, v=v if gate is not None else None)
        with timer.region("self_attention/fine"):
            out, _ = block_sparse_attention(q, k, v, c.q2k, c.q2k_cnt, layout.tile_offsets_i32)
        if gate is not None:
            coarse = ref.coarse_attention(c.q_c, c.k_c, c.v_c, c.scores).index_select(1, layout.token_tile)
            out = out + (gate.to(coarse.dtype) * coarse).to(out.dtype)
        return out
