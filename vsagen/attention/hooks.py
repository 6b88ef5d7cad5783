"""Hooks vsagen installs on a Wan transformer: the tile-order reorderings, the DiT timing, and the patch that
installs one `VsagenAttnProcessor` per layer.

Tile order once per transformer forward (DESIGN.md): every per-token operation in a Wan block (norms, FFN,
cross-attention, modulation) is order-independent, so tokens are put in tile order once and restored once:
* a pre-hook on the transformer reads the latent grid from `hidden_states` (B, C, F, H, W), builds the
  `TileLayout` and reorders a per-token (B, S) timestep (Wan2.2-5B), so `temb` and `timestep_proj` come
  out in tile order;
* a forward hook on `transformer.rope` reorders (cos, sin) and returns them as a `TiledRope`, a tuple that
  also carries the layout. The layout travels in the blocks' own arguments, so gradient checkpointing, which
  re-runs blocks after the forward returned, still sees it;
* a pre-hook on `blocks[0]` reorders the hidden states;
* a forward hook on `proj_out` restores raster order before diffusers' unpatchify.
Each reordering is timed as region "layout" (outside the backend call). Sequence parallelism will shard and gather
at exactly these hooks.

DiT timing: a "dit" region (and "dit/<expert>") around every transformer forward. A pre-hook also records the
forward's timestep in the transformer's `ForwardState`, which every layer's `AttnContext` can read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import BadInput
from ..layout import TileLayout, tile_layout
from ..timing import Timer
from .base import AttentionBackend, ForwardState
from .dense import step_is_dense
from .processor import PROLOGUE_MODES, VsagenAttnProcessor


class TiledRope(tuple):
    """(cos, sin) RoPE tables in tile order, each (1, S, 1, D) float32, carrying their `TileLayout`.

    It has a `to()` so that code which moves a block's arguments between devices keeps it whole: diffusers'
    group offloading (`--offload group`) runs accelerate's `send_to_device` on every block's arguments, which
    calls `.to()` on anything that has one and would otherwise rebuild a tuple subclass from a generator
    (losing the layout, or failing in `__new__`).
    """

    layout: TileLayout

    def __new__(cls, cos: torch.Tensor, sin: torch.Tensor, layout: TileLayout) -> "TiledRope":
        obj = super().__new__(cls, (cos, sin))
        obj.layout = layout
        return obj

    def to(self, *args: Any, **kwargs: Any) -> "TiledRope":
        """`Tensor.to` on cos and sin (same arguments); the layout travels along unchanged (its index tensors
        follow the data's device where they are used)."""
        cos, sin = self
        return TiledRope(cos.to(*args, **kwargs), sin.to(*args, **kwargs), self.layout)


def _grid_of(hidden_states: torch.Tensor, patch_size: tuple[int, int, int]) -> tuple[int, int, int]:
    _, _, f, h, w = hidden_states.shape
    pt, ph, pw = patch_size
    return (f // pt, h // ph, w // pw)


@dataclass
class TransformerPatch:
    """What `patch_transformer` / `time_transformer` installed on one transformer; `remove()` undoes it."""

    transformer: Any
    original_processors: list[Any]
    handles: list[Any] = field(default_factory=list)
    forward_state: ForwardState = field(default_factory=ForwardState)

    def remove(self) -> None:
        """Remove the hooks and give every `attn1` back the processor it had before (if it was replaced)."""
        for h in self.handles:
            h.remove()
        for block, proc in zip(self.transformer.blocks, self.original_processors):
            block.attn1.set_processor(proc)
        self.handles.clear()
        if getattr(self.transformer, PATCHED_MARK, None) is self:
            delattr(self.transformer, PATCHED_MARK)


# The attribute a patched transformer carries (its TransformerPatch) until the patch is removed: a second patch on
# top of the first would reorder the tokens twice while the layout describes one reordering.
PATCHED_MARK = "_vsagen_patch"


def is_patched(transformer: Any) -> bool:
    """Whether vsagen's hooks are on `transformer` (a patch not removed)."""
    return getattr(transformer, PATCHED_MARK, None) is not None


def _mark(transformer: Any, patch: "TransformerPatch") -> None:
    """Record `patch` on `transformer`, refusing a transformer vsagen has patched already.

    Raises:
        BadInput: the transformer carries a vsagen patch that was not removed.
    """
    if getattr(transformer, PATCHED_MARK, None) is not None:
        raise BadInput("this transformer is already patched by vsagen: remove() the earlier patch (the handle "
                       "vsagen.apply returned) first")
    object.__setattr__(transformer, PATCHED_MARK, patch)


def _dit_timing_hooks(transformer: Any, timer: Timer, expert: str | None) -> list[Any]:
    """Register the hooks that record a "dit" region (and "dit/<expert>") around every transformer forward.
    Registered before any other transformer hook, so the region also covers the tile-order pre-hook."""
    tokens: dict[str, int | None] = {}

    def pre_forward(module, args, kwargs):
        tokens["dit"] = timer.start("dit")
        tokens["expert"] = timer.start(f"dit/{expert}") if expert is not None else None

    def post_forward(module, args, kwargs, output):
        timer.stop(tokens.pop("expert", None))
        timer.stop(tokens.pop("dit", None))

    return [transformer.register_forward_pre_hook(pre_forward, with_kwargs=True),
            transformer.register_forward_hook(post_forward, with_kwargs=True)]


def time_transformer(transformer: Any, timer: Timer, expert: str | None = None,
                     fused_blocks: bool = False) -> TransformerPatch:
    """Only the DiT timing of `patch_transformer` (and, with `fused_blocks`, the same compiled block regions): the
    transformer keeps its own (e.g. diffusers' stock) processors and raster order. `vsagen profile` times stock
    diffusers with it.

    Args:
        transformer: a diffusers `WanTransformer3DModel`.
        timer: receives a "dit" region per forward (and "dit/<expert>" when `expert` is given).
        expert: the pipeline component name, as in `patch_transformer`.
        fused_blocks: as in `patch_transformer`.

    Returns:
        TransformerPatch, whose `remove()` removes the hooks and the block regions (processors are untouched).

    Raises:
        BadInput: the transformer is already patched by vsagen (not removed).
    """
    patch = TransformerPatch(transformer, [])
    _mark(transformer, patch)
    try:  # a failure half-way leaves the transformer as it was, unmarked
        patch.handles.extend(_dit_timing_hooks(transformer, timer, expert))
        if fused_blocks:
            from ..blocks import install

            patch.handles.append(install(transformer))
    except BaseException:
        patch.remove()
        raise
    return patch


def _forward_state_hook(transformer: Any, state: ForwardState, options: Any = None,
                        timer: Timer | None = None) -> Any:
    """A pre-hook that records each forward's `timestep` argument in `state` (read by `AttnContext.timestep`) and
    whether its step runs dense under the backend's `dense_steps` (`options`; the step is `state.step`, else the
    timer's)."""

    def pre_forward(module, args, kwargs):
        state.timestep = kwargs["timestep"] if "timestep" in kwargs else (args[1] if len(args) > 1 else None)
        if getattr(options, "dense_steps", None) is not None:
            step = state.step if state.step is not None else (timer.step if timer is not None else 0)
            state.dense = step_is_dense(options, step, state.steps)

    return transformer.register_forward_pre_hook(pre_forward, with_kwargs=True)


def patch_transformer(transformer: Any, backend: AttentionBackend, timer: Timer,
                      expert: str | None = None, fused_blocks: bool = False,
                      fused_prologue: str = "auto") -> TransformerPatch:
    """Install a vsagen processor on every `attn1` (one per layer), the tile-order hooks (tiled backends) and DiT
    timing, and with `fused_blocks` the blocks' compiled elementwise regions (`vsagen.blocks`; eager CUDA runs
    without offloading).

    Args:
        transformer: a diffusers `WanTransformer3DModel`.
        backend: the self-attention backend.
        timer: receives a "dit" region per transformer forward (tagged with `timer.step`), the processor's
            "attn1" / "self_attention" regions and, for tiled backends, a "layout" region around every
            tile-order reordering (the gathers in the hooks; outside the backend call).
        expert: the pipeline component name ("transformer", "transformer_2"); when given, every forward is
            also recorded as region "dit/<expert>" (per-expert DiT time in two-expert pipelines).
        fused_blocks: install `vsagen.blocks`' compiled elementwise regions.
        fused_prologue: the processors' q/k prologue mode ("auto", "on", "off"; see `use_fused_prologue`).

    Returns:
        TransformerPatch, whose `remove()` restores the original processors and removes the hooks.

    Raises:
        BadInput: the transformer is already patched by vsagen (not removed).
    """
    if fused_prologue not in PROLOGUE_MODES:
        raise ValueError(f"fused_prologue must be one of {PROLOGUE_MODES}, got {fused_prologue!r}")
    patch = TransformerPatch(transformer, [b.attn1.processor for b in transformer.blocks])
    _mark(transformer, patch)
    try:  # a failure half-way leaves the transformer as it was, unmarked
        patch.handles.extend(_dit_timing_hooks(transformer, timer, expert))
        patch.handles.append(_forward_state_hook(transformer, patch.forward_state, backend.options, timer))
        for i, block in enumerate(transformer.blocks):
            block.attn1.set_processor(VsagenAttnProcessor(backend, timer, layer=i, expert=expert,
                                                          forward=patch.forward_state, fused_prologue=fused_prologue))
        if fused_blocks:
            from ..blocks import install

            patch.handles.append(install(transformer))
        if backend.tiled:
            _tile_order_hooks(transformer, timer, patch.handles, tuple(backend.tile))
    except BaseException:
        patch.remove()
        raise
    return patch


def _tile_order_hooks(transformer: Any, timer: Timer, handles: list[Any], tile: tuple[int, int, int]) -> None:
    """Register the tile-order hooks (module docstring) on `transformer` for cubes of `tile` (the backend's), each
    handle into `handles` as soon as it exists (so a failure half-way leaves nothing unremovable)."""
    patch_size = tuple(transformer.config.patch_size)
    state: dict[str, TileLayout | None] = {"layout": None}

    def layout_for(hidden_states: torch.Tensor) -> TileLayout:
        return tile_layout(_grid_of(hidden_states, patch_size), tile, device=hidden_states.device)

    def pre_forward(module, args, kwargs):
        hs = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        state["layout"] = layout = layout_for(hs)
        if "timestep" in kwargs:
            ts = kwargs["timestep"]
            if ts.ndim == 2:  # per-token timestep (Wan2.2-5B): (B, S) raster -> tile order
                with timer.region("layout"):
                    kwargs = {**kwargs, "timestep": layout.to_tiles(ts, dim=1)}
        elif len(args) > 1 and args[1].ndim == 2:
            with timer.region("layout"):
                args = (args[0], layout.to_tiles(args[1], dim=1), *args[2:])
        return args, kwargs

    def post_forward(module, args, kwargs, output):
        state["layout"] = None

    def rope_hook(module, args, output):
        with timer.region("layout"):
            layout = layout_for(args[0])
            cos, sin = output
            return TiledRope(layout.to_tiles(cos, dim=1), layout.to_tiles(sin, dim=1), layout)

    def first_block_pre(module, args, kwargs):
        rope = kwargs.get("rotary_emb", args[3] if len(args) > 3 else None)
        layout = getattr(rope, "layout", None)
        if layout is None:
            raise RuntimeError("tile-order hooks: blocks[0] got RoPE tables without a tile layout")
        with timer.region("layout"):
            if "hidden_states" in kwargs:
                return args, {**kwargs, "hidden_states": layout.to_tiles(kwargs["hidden_states"], dim=1)}
            return (layout.to_tiles(args[0], dim=1), *args[1:]), kwargs

    def proj_out_hook(module, args, output):
        layout = state["layout"]
        if layout is None:
            raise RuntimeError("tile-order hooks: proj_out ran outside a transformer forward")
        with timer.region("layout"):
            return layout.to_raster(output, dim=1)

    handles.append(transformer.register_forward_pre_hook(pre_forward, with_kwargs=True))
    handles.append(transformer.register_forward_hook(post_forward, with_kwargs=True))
    handles.append(transformer.rope.register_forward_hook(rope_hook))
    handles.append(transformer.blocks[0].register_forward_pre_hook(first_block_pre, with_kwargs=True))
    handles.append(transformer.proj_out.register_forward_hook(proj_out_hook))
