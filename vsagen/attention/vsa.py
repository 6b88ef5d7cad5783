"""`vsa`: Video Sparse Attention (arXiv 2505.13389, sec. 2).

Coarse stage: mean-pool q, k, v per (4,4,4) tile with true token counts, tile-level scores, top-k key tiles
per query tile with K = ceil((1 - sparsity) * n_tiles). Fine stage: token attention over the selected tiles.
Output = fine + gate * coarse, where coarse is the tile-level attention of the pooled tiles broadcast to each tile's
tokens and gate = Linear(dim, dim)(the attn1 input), unflattened per head, no sigmoid (FastVideo's
WanTransformerBlock_VSA; the attn1 input is the modulated norm1 output its q, k, v are projected from). The gate is zero
(pure fine output) unless trained `to_gate_compress` weights are loaded: the checkpoint's
`blocks.{i}.to_gate_compress.{weight,bias}` (the canonical key, at the block level as FastVideo's published VSA
checkpoints store it; `blocks.{i}.attn1.to_gate_compress.*` is accepted as an alias, one scheme per layer), or the
file named by the `gate_weights` option. The backend owns them (`weights`, attached as `attn1.to_gate_compress`),
and each layer's processor hands its gate projection over as `ctx.params`.

Two implementations of the same function, chosen by the `impl` option:
* "triton": the kernels in `vsagen.kernels` (fused pooling + top-k into q2k lists, block-sparse flash
  attention forward and backward). The default on CUDA.
* "torch": the eager reference in `vsagen.kernels.reference`, the oracle of the tests. The default elsewhere.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import BadInput
from ..kernels import reference as ref
from .base import AttnContext, Backend, LayerWeights
from .backend_options import DEFAULT_SPARSITY, IMPLS, VSAOptions  # noqa: F401 - re-exported: vsa's options live there


# The trained gate's checkpoint keys: FastVideo's published block-level name (canonical) and the name under `attn1`
# (an alias) that vsagen read before; the registry's entry (`registry._VSA_GATE`) states the same two.
GATE_KEY = "blocks.{layer}.to_gate_compress"
GATE_ALIASES = ("blocks.{layer}.attn1.to_gate_compress",)


def _interpreting() -> bool:
    from ..kernels.tuning import interpreting

    return interpreting()


def _gate_shapes(attn: Any) -> dict[str, tuple[int, ...]]:
    """The gate projection maps the attn1 input (dim) to one gate value per head channel (heads x head dim),
    as `to_q` does."""
    out_features, in_features = attn.to_q.weight.shape if hasattr(attn, "to_q") else (attn.inner_dim, attn.query_dim)
    return {"weight": (out_features, in_features), "bias": (out_features,)}


def _gate_module(tensors: dict[str, torch.Tensor], attn: Any) -> torch.nn.Module:
    """A Linear holding the trained gate, in the stored dtype (the loader then casts it to the transformer's: built
    in float32 first, a float64 gate would lose its precision on the way)."""
    w = tensors["weight"]
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias="bias" in tensors, dtype=w.dtype)
    lin.load_state_dict(tensors)
    return lin


class VSAAttention(Backend):
    """VSA with a fixed sparsity (fraction of key tiles skipped per query tile)."""

    name = "vsa"
    Options = VSAOptions
    tiled = True
    # Both implementations trace without a graph break: "triton" through the custom ops vsagen::coarse_stage and
    # vsagen::block_sparse_attn, "torch" as plain static-shape torch ops.
    traceable = True
    weights = LayerWeights(key=GATE_KEY, attr="to_gate_compress", shapes=_gate_shapes, build=_gate_module,
                           optional=("bias",), file_option="gate_weights", aliases=GATE_ALIASES)
    auto_priority = 1  # `--attn auto` runs vsa for a checkpoint holding trained gates (after sla-star: auto.py)

    kernel_profile = "vsa"  # `kernels.tuning.kernel_tuning`'s profile of the Triton kernels' default tuning

    def tuning(self, q: torch.Tensor):
        """The Triton kernels' tuning for q (B, S, H, D): the `tuning` option, else the device's default of this
        backend's kernel profile (`kernels.tuning.default_tuning`)."""
        from ..kernels.tuning import default_tuning

        t = self.options.tuning
        return default_tuning(q.device, q.shape[-1], self.kernel_profile) if t is None else t

    @property
    def sparsity(self) -> float:
        """The `sparsity` option."""
        return self.options.sparsity

    @property
    def impl(self) -> str:
        """The `impl` option, as asked ("auto" included)."""
        return self.options.impl

    def resolved_impl(self, device: torch.device) -> str:
        """'triton' or 'torch' for tensors on `device`."""
        if self.impl != "auto":
            return self.impl
        return "triton" if device.type == "cuda" else "torch"

    def check(self, device: torch.device, dtype: torch.dtype) -> None:
        """Raises BadInput for the Triton kernels on a CPU (unless the Triton interpreter is on)."""
        if self.resolved_impl(device) == "triton" and device.type != "cuda" and not _interpreting():
            raise BadInput(f"impl triton (--attn-impl triton or {self.name}:impl=triton) needs a CUDA device (or "
                           "TRITON_INTERPRET=1 for the slow interpreter); use impl torch on CPU")

    def describe(self, device: torch.device | None = None) -> dict:
        """{"name", "sparsity", "impl"} and, given the run's device, "impl_ran" ("triton" | "torch")."""
        d = {"name": self.name, "sparsity": self.sparsity, "impl": self.impl}
        if self.options.gate_weights is not None:
            d["gate_weights"] = str(self.options.gate_weights)
        if device is not None:
            d["impl_ran"] = self.resolved_impl(device)
        return d

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        """q, k, v: (B, S, H, D) tile order -> (B, S, H, D) like q. Stages: coarse, fine. With a trained gate
        (`ctx.params`, a Linear on `ctx.hidden_states`) the coarse output is added, gated."""
        layout = ctx.layout
        if layout is None:
            raise RuntimeError("vsa needs tokens in tile order with a TileLayout (tile-order hooks missing)")
        gate = None
        if ctx.params is not None:
            gate = ctx.params(ctx.hidden_states).unflatten(2, (q.shape[2], -1))
        return self.attend(q, k, v, layout, gate, ctx.timer)[0]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Any, gate: torch.Tensor | None,
               timer: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """VSA on tile-ordered q, k, v (B, S, H, D) with an optional gate (B, S, H, D).

        Returns:
            out: (B, S, H, D) like q.
            q2k: (B, H, Q_TILES, K) integer, the key tiles each query tile selected (for backends built on VSA's
                selection, e.g. `sla-star`'s marginal scope).
        """
        top_k = ref.top_k_from_sparsity(self.sparsity, layout.num_tiles)
        if self.resolved_impl(q.device) == "triton":
            return self._triton(q, k, v, layout, gate, timer, top_k)
        return self._torch(q, k, v, layout, gate, timer, top_k)

    def _torch(self, q, k, v, layout, gate, timer, top_k):
        """The eager reference: (out, q2k) as `attend`."""
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
        return out, q2k

    def _triton(self, q, k, v, layout, gate, timer, top_k):
        """The Triton kernels: (out, q2k) as `attend`."""
        from ..kernels.block_sparse_attn import block_sparse_attention
        from ..kernels.coarse import coarse_stage

        tuning = self.tuning(q)
        with timer.region("self_attention/coarse"):
            c = coarse_stage(q, k, layout.tile_offsets_i32, top_k, v=v if gate is not None else None, tuning=tuning)
        with timer.region("self_attention/fine"):
            out, _ = block_sparse_attention(q, k, v, c.q2k, c.q2k_cnt, layout.tile_offsets_i32, tuning=tuning)
        if gate is not None:
            coarse = ref.coarse_attention(c.q_c, c.k_c, c.v_c, c.scores).index_select(1, layout.token_tile)
            out = out + (gate.to(coarse.dtype) * coarse).to(out.dtype)
        return out, c.q2k
