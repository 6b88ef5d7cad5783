"""`sla-star`: VSA plus a linear-attention branch as a source of global context (SLA*, seed 002, after SLA arXiv
2509.24006).

o = o_vsa + proj(o_l). The sparse part is `vsa` (its coarse selection, sparsity and kernels). The linear branch
o_l = phi(q) Sum / (1e-5 + phi(q) . z) (`vsagen.kernels.reference.linear_attention_branch`) runs over every key
(`global` scope: SLA's released code and AMD's SLA*) or over the key tiles the sparse part did not select for the
query's tile (`marginal` scope: the SLA paper; with every tile selected o_l = 0). phi is the same feature map for q
and k, applied after the RMS norm and RoPE: softmax over the head dim (default), elu + 1, or relu.

proj is a Linear(D, D) with bias in float32, one per layer, shared by the heads: the backend owns it (`weights`),
read from the checkpoint (`blocks.{i}.attn1.proj_l.{weight,bias}`; TurboDiffusion's
`blocks.{i}.self_attn.attn_op.local_attn.proj_l.*` and FastVideo's `blocks.{i}.attn1.attn_impl.proj_l.*` are
accepted too) or from the file `proj_weights` names. Without trained weights the projection is zero (SLA's
initialisation) and `sla-star` gives exactly `vsa`'s output: the branch is then not computed at all.

`impl` chooses the implementation as for `vsa`. With Triton (CUDA, or the interpreter) the branch runs in fused
kernels: `global` in `vsagen.kernels.linear_branch` (one pass over K and V for the sums, then phi(Q), the division,
the projection and the add to VSA's output in one kernel), and with gradients VSA's fine stage and that branch as
one op (`vsagen.kernels.sla_star_attn`: the backward adds the branch's dQ / dK / dV into the sparse part's in place,
timed as the `fine` stage); `marginal` in `vsagen.kernels.linear_marginal` (per-tile sums, their sums over each
query tile's unselected tiles as one GEMM over the tile grid, then phi(Q) and the projection per query tile), with
gradients in the same one op. Deterministic backwards, no atomics. With `impl=torch` both scopes run
the PyTorch branch (float32, `reference.linear_attention_branch`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..errors import BadInput
from .base import AttnContext, Backend, LayerWeights
from .dense import DenseKnobs, check_knobs
from .shared import (DEFAULT_SPARSITY, FASTVIDEO_PROJ_KEY, FEATURE_MAPS, TILE_FIELD, TURBODIFFUSION_PROJ_KEY,
                     check_impl_option, kernel_lists, proj_module, proj_shapes, random_proj, weights_path_option)
from .vsa import VSAAttention, VSAOptions

if TYPE_CHECKING:
    import torch

    from ..kernels.tuning import KernelTuning
else:
    KernelTuning = Any  # the real type needs torch; VSAOptions checks a given value against it

SCOPES = ("global", "marginal")  # the branch: over every key, or over the key tiles not selected


@dataclass(frozen=True)
class SLAStarOptions(DenseKnobs):
    """Options of `sla-star`.

    Attributes:
        sparsity: VSA's fraction of key tiles skipped per query tile, in [0, 1) (`--sparsity`).
        impl: "auto" (Triton on CUDA, the torch reference elsewhere), "triton" or "torch" (`--attn-impl`): the
            sparse part's implementation, and the branch's.
        tile: VSA's cube (as `vsa`'s `tile`).
        scope: "global" (the branch over every key) or "marginal" (over the key tiles not selected).
        feature_map: phi, "softmax" (over the head dim), "elu" (elu + 1) or "relu".
        proj_weights: a safetensors file with trained projections (`blocks.{i}.attn1.proj_l.{weight,bias}`, or
            an alias scheme), loaded for every transformer instead of the checkpoint's own; None: the
            checkpoint's, if it has any (else the projection is zero).
        tuning: the Triton kernels' tuning of the sparse part (as `vsa`'s; Python only).

    Raises:
        BadInput: a value out of range (as `VSAOptions`), an unknown scope or feature map, or a proj_weights path
            that is not a file.
    """

    sparsity: float = DEFAULT_SPARSITY
    impl: Literal["auto", "triton", "torch"] = "auto"
    tile: str = field(**TILE_FIELD)  # type: ignore[assignment]
    scope: Literal["global", "marginal"] = "global"
    feature_map: Literal["softmax", "elu", "relu"] = "softmax"
    proj_weights: Path | None = None
    tuning: KernelTuning | None = None

    def __post_init__(self) -> None:
        check_knobs(self)  # dense_steps, dense_layers, min_tokens (`vsagen.attention.dense`)
        check_impl_option(self.impl)  # not fa4: the branch runs on vsagen's kernels
        sparse = VSAOptions(sparsity=self.sparsity, impl=self.impl, tile=self.tile, tuning=self.tuning)  # VSA's checks
        object.__setattr__(self, "sparsity", sparse.sparsity)
        object.__setattr__(self, "tile", sparse.tile)
        if self.scope not in SCOPES:
            raise BadInput(f"scope must be one of {', '.join(SCOPES)}, got {self.scope!r}")
        if self.feature_map not in FEATURE_MAPS:
            raise BadInput(f"feature_map must be one of {', '.join(FEATURE_MAPS)}, got {self.feature_map!r}")
        if self.proj_weights is not None:
            object.__setattr__(self, "proj_weights", weights_path_option(self.proj_weights, "proj_weights"))


class SLAStarAttention(Backend):
    """VSA plus a projected linear-attention branch (global or marginal scope)."""

    name = "sla-star"
    Options = SLAStarOptions
    tiled = True
    traceable = True  # custom ops (VSA's, the fused branch) and torch ops
    weights = LayerWeights(key="blocks.{layer}.attn1.proj_l", attr="sla_proj_l", shapes=proj_shapes,
                           build=proj_module, optional=("bias",), file_option="proj_weights",
                           aliases=(TURBODIFFUSION_PROJ_KEY, FASTVIDEO_PROJ_KEY),
                           dtype="float32",
                           missing_note="sla-star: no trained projection (proj_l) in the checkpoint, so the branch "
                                        "is zero and the output is exactly vsa's (name one with proj_weights=FILE)")
    # `--attn auto` prefers it to vsa (priority 1): a checkpoint trained for sla-star (VSA + a branch) may carry vsa's
    # gates as well, so its branch is the more specific sign
    auto_priority = 2

    def __init__(self, options: SLAStarOptions | None = None) -> None:
        super().__init__(options)
        o = self.options
        self._vsa = VSAAttention(VSAOptions(sparsity=o.sparsity, impl=o.impl, tile=o.tile, tuning=o.tuning))
        self._vsa.auto_fa4 = False  # the branch and its fused kernels are measured with vsagen's fine stage
        self._vsa.ws_forward = False  # ... with its pipelined forward

    @property
    def sparsity(self) -> float:
        """The `sparsity` option."""
        return self.options.sparsity

    @property
    def tile(self) -> tuple[int, int, int]:  # type: ignore[override]
        """VSA's cube (the `tile` option), the layout's."""
        return self._vsa.tile

    def check(self, device: torch.device, dtype: torch.dtype) -> None:
        """As `vsa` (the Triton kernels need CUDA or the interpreter)."""
        self._vsa.check(device, dtype)

    def describe(self, device: torch.device | None = None) -> dict:
        """{"name", "sparsity", "impl", "tile", "scope", "feature_map"} (+ "proj_weights" when named), and given the
        run's device "impl_ran" (the sparse part's and the branch's)."""
        o = self.options
        d = {"name": self.name, "sparsity": o.sparsity, "impl": o.impl, "tile": o.tile, "scope": o.scope,
             "feature_map": o.feature_map}
        if o.proj_weights is not None:
            d["proj_weights"] = str(o.proj_weights)
        if device is not None:
            d["impl_ran"] = self._vsa.resolved_impl(device)
        return d

    def bench_params(self, heads: int, head_dim: int, device: torch.device, seed: int) -> torch.nn.Module:
        """A random projection of trained size (float32 Linear(D, D)) to time the branch with (`vsagen profile
        --kernels`, benchmarks): without one the branch is not computed and `sla-star` times as `vsa`."""
        return random_proj(head_dim, device, seed)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        """q, k, v: (B, S, H, D) tile order -> (B, S, H, D) like q. Stages: coarse, fine (VSA's), linear (the
        branch and its projection; only with a trained projection, `ctx.params`)."""
        import torch

        from ..kernels import reference as ref

        layout = ctx.layout
        if layout is None:
            raise RuntimeError("sla-star needs tokens in tile order with a TileLayout (tile-order hooks missing)")
        proj = ctx.params
        o = self.options
        triton = proj is not None and self._vsa.resolved_impl(q.device) == "triton"
        if triton and torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v, *proj.parameters())):
            return self._fused_with_grad(q, k, v, layout, proj, ctx.timer)
        out, q2k = self._vsa.attend(q, k, v, layout, None, ctx.timer)
        if proj is None:  # zero projection: exactly vsa
            return out
        with ctx.timer.region("self_attention/linear"):
            if triton and o.scope == "global":
                from ..kernels.linear_branch import linear_branch_add

                return linear_branch_add(out, q, k, v, proj.weight, proj.bias, kind=o.feature_map)
            if triton:  # marginal
                from ..kernels.linear_marginal import marginal_branch_add

                cnt = torch.full(q2k.shape[:3], q2k.shape[3], dtype=torch.int32, device=q2k.device)  # all top-k
                lists, counts, offsets = kernel_lists(layout, q2k, cnt)  # the kernels' tiles: 64 tokens at most
                return marginal_branch_add(out, q, k, v, proj.weight, proj.bias, lists, counts, offsets,
                                           kind=o.feature_map)
            block_map = None
            if self.options.scope == "marginal":
                block_map = ref.block_map_from_q2k(q2k.long(), layout.num_tiles)
            o_l = ref.linear_attention_branch(q, k, v, kind=self.options.feature_map, block_map=block_map,
                                              slots=layout.slots, slot_valid=layout.slot_valid)
            branch = torch.nn.functional.linear(o_l.float(), proj.weight.float(), proj.bias.float())
            return out + branch.to(out.dtype)

    def _fused_with_grad(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Any,
                         proj: torch.nn.Module, timer: Any) -> torch.Tensor:
        """Triton with gradients (either scope): VSA's coarse stage, then its fine stage and the branch as one custom
        op (`kernels.sla_star_attn`: the backward adds the branch's dQ / dK / dV into the sparse part's in place),
        timed as the `fine` stage."""
        from ..kernels import reference as ref
        from ..kernels.coarse import coarse_stage
        from ..kernels.sla_star_attn import sla_star_attention

        off, tuning = layout.tile_offsets_i32, self.options.tuning
        with timer.region("self_attention/coarse"):
            c = coarse_stage(q, k, off, ref.top_k_from_sparsity(self.sparsity, layout.num_tiles), tuning=tuning)
            lists, counts, off = kernel_lists(layout, c.q2k, c.q2k_cnt)  # the kernels' tiles: 64 tokens at most
        with timer.region("self_attention/fine"):
            return sla_star_attention(q, k, v, lists, counts, off, proj.weight, proj.bias,
                                      scope=self.options.scope, kind=self.options.feature_map, tuning=tuning)
