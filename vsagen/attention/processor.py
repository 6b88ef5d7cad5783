"""The diffusers attention processor for Wan's video self-attention, and the tile-order hooks.

`VsagenAttnProcessor` is installed on every block's `attn1` (cross-attention keeps diffusers' own processor).
It forms q, k, v as diffusers' `WanAttnProcessor` (0.42.1) does: projections (fused or not), RMS norm
across heads, split into heads, RoPE on interleaved pairs in float32 tables (on CUDA the norm and RoPE run as
one fused Triton pass, `vsagen.kernels.qk_norm_rope`, see FUSED_PROLOGUE). It then hands (B, S, H, D) to the
backend and times the call. Under torch.compile (`--compile`) all of it is traced into the block's graph when the
backend is `traceable` (the fused prologue then gives way to diffusers' arithmetic, which inductor fuses), and
the timers record nothing inside the graph; other backends run eagerly between graphs (`run_backend_eager`).

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
Each reordering is timed as region "layout" (outside the backend call).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..layout import TileLayout, tile_layout
from ..timing import Timer
from .base import AttentionBackend


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


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs (x[2i], x[2i+1]) of x by the angles in (cos, sin).

    Args:
        x: (B, S, H, D).
        cos, sin: (1, S, 1, D) float32 tables with each angle repeated for both members of a pair (Wan's
            `WanRotaryPosEmbed` output).

    Returns:
        (B, S, H, D) in x's dtype. Same arithmetic as diffusers 0.42.1 `WanAttnProcessor`
        (tests/test_processor.py checks them equal).
    """
    even, odd = x.unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[..., 0::2], sin[..., 1::2]
    return torch.stack((even * c - odd * s, even * s + odd * c), dim=-1).flatten(-2).type_as(x)


# The q/k prologue (RMS norm across heads, then RoPE): "auto" runs the fused Triton kernel
# (`vsagen.kernels.qk_norm_rope`) on CUDA and diffusers' eager arithmetic elsewhere; "on" runs the kernel on any
# device (the tests use it under the Triton interpreter); "off" always runs the eager arithmetic.
FUSED_PROLOGUE = "auto"


def use_fused_prologue(attn: Any, x: torch.Tensor, rotary_emb: Any) -> bool:
    """Whether this attn1 call can take the fused q/k prologue: RoPE tables given, torch.nn.RMSNorm q/k norms
    with weights (Wan's), no autograd through it (the kernel has no backward), not inside torch.compile
    (inductor fuses the eager arithmetic itself), and FUSED_PROLOGUE allows it on x's device."""
    if FUSED_PROLOGUE == "off" or rotary_emb is None or (FUSED_PROLOGUE == "auto" and not x.is_cuda):
        return False
    norms = (getattr(attn, "norm_q", None), getattr(attn, "norm_k", None))
    if not all(isinstance(n, torch.nn.RMSNorm) and n.weight is not None for n in norms):
        return False
    return not (torch.is_grad_enabled() and x.requires_grad) and not torch.compiler.is_compiling()


def _eps(norm: torch.nn.RMSNorm, x: torch.Tensor) -> float:
    """The epsilon torch.nn.RMSNorm uses: its own, else the dtype's machine epsilon."""
    return norm.eps if norm.eps is not None else torch.finfo(x.dtype).eps


def run_backend(backend: AttentionBackend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                layout: TileLayout | None, gate: torch.Tensor | None, timer: Timer) -> torch.Tensor:
    """The backend call, timed as region "self_attention" (and the stages the backend reports).

    Args:
        backend: the self-attention backend.
        q, k, v: (B, S, H, D), tile order for tiled backends (raster otherwise); gate: (B, S, H, D) or None.
        layout: the `TileLayout` of tiled backends, else None.
        timer: receives the regions; they are no-ops while torch.compile traces.

    Returns:
        (B, S, H, D) like q.

    Traced by torch.compile for `traceable` backends (`--compile` then compiles it into the block's one graph,
    where its regions record nothing); `run_backend_eager` keeps the others out of the graph.
    """
    with timer.region("self_attention"):
        return backend(q, k, v, layout, gate=gate, timer=timer)


@torch.compiler.disable
def run_backend_eager(backend: AttentionBackend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      layout: TileLayout | None, gate: torch.Tensor | None, timer: Timer) -> torch.Tensor:
    """`run_backend`, never traced by torch.compile: for backends that are not `traceable`, whose call would
    break the graph anyway. `--compile` then breaks each block's graph around it; the backend runs eagerly
    between the compiled graphs and keeps its timing rows."""
    return run_backend(backend, q, k, v, layout, gate, timer)


class VsagenAttnProcessor:
    """Self-attention processor for Wan `attn1` that delegates the attention itself to a backend.

    Raises (at call time):
        ValueError: used on a cross-attention, or given an attention mask.
        RuntimeError: a tiled backend without tile-ordered RoPE (hooks not installed).
    """

    _attention_backend = None
    _parallel_config = None

    def __init__(self, backend: AttentionBackend, timer: Timer) -> None:
        self.backend = backend
        self.timer = timer

    def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None,
                 rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        if encoder_hidden_states is not None or attention_mask is not None:
            raise ValueError("VsagenAttnProcessor handles self-attention (attn1) without masks only")
        token = self.timer.start("attn1")
        if getattr(attn, "fused_projections", False):
            query, key, value = attn.to_qkv(hidden_states).chunk(3, dim=-1)
        else:
            query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        if use_fused_prologue(attn, query, rotary_emb):
            from ..kernels.qk_norm_rope import rms_norm_rope

            query = rms_norm_rope(query, attn.norm_q.weight, _eps(attn.norm_q, query), *rotary_emb, attn.heads)
            key = rms_norm_rope(key, attn.norm_k.weight, _eps(attn.norm_k, key), *rotary_emb, attn.heads)
        else:
            query = attn.norm_q(query).unflatten(2, (attn.heads, -1))
            key = attn.norm_k(key).unflatten(2, (attn.heads, -1))
            if rotary_emb is not None:
                query = apply_rotary(query, *rotary_emb)
                key = apply_rotary(key, *rotary_emb)
        value = value.unflatten(2, (attn.heads, -1))
        layout = getattr(rotary_emb, "layout", None)
        if self.backend.tiled and layout is None:
            raise RuntimeError(f"--attn {self.backend.name} needs tile order, but the RoPE tables carry no "
                               "tile layout: install the tile-order hooks (patch_transformer)")
        gate = None
        gate_proj = getattr(attn, "to_gate_compress", None)
        if gate_proj is not None and self.backend.supports_gate:
            gate = gate_proj(hidden_states).unflatten(2, (attn.heads, -1))
        call = run_backend if self.backend.traceable else run_backend_eager
        out = call(self.backend, query, key, value, layout, gate, self.timer)
        out = out.flatten(2, 3).type_as(query)
        out = attn.to_out[1](attn.to_out[0](out))
        self.timer.stop(token)
        return out


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

    def remove(self) -> None:
        """Remove the hooks and give every `attn1` back the processor it had before (if it was replaced)."""
        for h in self.handles:
            h.remove()
        for block, proc in zip(self.transformer.blocks, self.original_processors):
            block.attn1.set_processor(proc)
        self.handles.clear()


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
    """
    patch = TransformerPatch(transformer, [])
    patch.handles.extend(_dit_timing_hooks(transformer, timer, expert))
    if fused_blocks:
        from ..blocks import install

        patch.handles.append(install(transformer))
    return patch


def patch_transformer(transformer: Any, backend: AttentionBackend, timer: Timer,
                      expert: str | None = None, fused_blocks: bool = False) -> TransformerPatch:
    """Install the vsagen processor on every `attn1`, the tile-order hooks (tiled backends) and DiT timing, and with
    `fused_blocks` the blocks' compiled elementwise regions (`vsagen.blocks`; eager CUDA runs without offloading).

    Args:
        transformer: a diffusers `WanTransformer3DModel`.
        backend: the self-attention backend.
        timer: receives a "dit" region per transformer forward (tagged with `timer.step`), the processor's
            "attn1" / "self_attention" regions and, for tiled backends, a "layout" region around every
            tile-order reordering (the gathers in the hooks; outside the backend call).
        expert: the pipeline component name ("transformer", "transformer_2"); when given, every forward is
            also recorded as region "dit/<expert>" (per-expert DiT time in two-expert pipelines).

    Returns:
        TransformerPatch, whose `remove()` restores the original processors and removes the hooks.
    """
    patch_size = tuple(transformer.config.patch_size)
    patch = TransformerPatch(transformer, [b.attn1.processor for b in transformer.blocks])
    processor = VsagenAttnProcessor(backend, timer)
    for block in transformer.blocks:
        block.attn1.set_processor(processor)
    patch.handles.extend(_dit_timing_hooks(transformer, timer, expert))
    if fused_blocks:
        from ..blocks import install

        patch.handles.append(install(transformer))
    if not backend.tiled:
        return patch
    state: dict[str, TileLayout | None] = {"layout": None}

    def layout_for(hidden_states: torch.Tensor) -> TileLayout:
        return tile_layout(_grid_of(hidden_states, patch_size), device=hidden_states.device)

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

    patch.handles.append(transformer.register_forward_pre_hook(pre_forward, with_kwargs=True))
    patch.handles.append(transformer.register_forward_hook(post_forward, with_kwargs=True))
    patch.handles.append(transformer.rope.register_forward_hook(rope_hook))
    patch.handles.append(transformer.blocks[0].register_forward_pre_hook(first_block_pre, with_kwargs=True))
    patch.handles.append(transformer.proj_out.register_forward_hook(proj_out_hook))
    return patch
