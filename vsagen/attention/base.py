"""The attention backend protocol shared by every `--attn` choice, and the context each call receives.

A backend is a class with a `name`, a frozen `Options` dataclass it declares (defaults, validation in
`__post_init__`, one docstring line per field), and an instance built from one `Options` value. The processor
calls it as `backend(q, k, v, ctx)` with q, k, v of shape (B, S, H, D) (the layout Wan's processor already holds)
and an `AttnContext`; it returns the attention output of the same shape and dtype. Backends with `tiled = True`
receive the tokens in tile order and `ctx.layout`; the others receive raster order and `ctx.layout = None`.
Backends with `traceable = True` can be traced by torch.compile without a graph break (`--compile` then compiles
the whole transformer block as one graph, attention included); the others run eagerly between compiled graphs.

Two optional methods tie a backend to what it runs on: `bind(transformer, expert, experts=...)`, called by
`vsagen.apply` for every transformer before it is patched (`experts`: the component names of every transformer of
the pipeline), raises `BadInput` for a transformer the backend cannot serve (sparse-vdit: a pattern file searched
on another architecture, or for another set of experts); `check_grid(grid)`, called by the pipeline with the post-patch
latent grid before a run denoises, raises `BadInput` for a grid it cannot serve (a file searched at another size).

A backend may own per-layer parameters (`weights`, a `LayerWeights`: VSA's trained gate `to_gate_compress`), loaded
through `vsagen.attention.weights` from the checkpoint or from a safetensors file the user names; the processor of
layer i hands them over as `ctx.params`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable, ClassVar, Protocol

import torch

from ..layout import TileLayout
from ..timing import Timer


@dataclass
class ForwardState:
    """What one patched transformer's current forward knows beyond its blocks' arguments: the denoising timestep (the
    `timestep` argument of the transformer: (B,) or per token (B, S), raster order), set by a forward pre-hook
    before the blocks run (`vsagen.attention.hooks`), and the step index within the current pipeline call (reset
    when the scheduler's timesteps are set, advanced after each scheduler step). Shared by the processors of the
    transformer's layers; read lazily (`AttnContext.timestep`) so torch.compile only guards on it when a backend
    reads it."""

    timestep: torch.Tensor | None = None
    step: int | None = None  # denoising step of the current pipeline call, when a scheduler is counted (vsagen.apply)


@dataclass(frozen=True)
class AttnContext:
    """Everything a backend call may need besides q, k, v.

    Attributes:
        layout: the `TileLayout` of the tokens (tiled backends), else None.
        layer: index of the transformer block (0-based) whose `attn1` calls.
        expert: the pipeline component that owns the layer ("transformer", "transformer_2"), or None.
        timer: receives the backend's regions (its stages: e.g. "self_attention/coarse").
        hidden_states: (B, S, C) the attn1 input, in the same token order as q (for per-layer parameters that
            act on it, e.g. VSA's gate projection).
        params: this layer's backend-owned parameters (a torch Module, see `LayerWeights`), or None.
        forward: the transformer forward's `ForwardState` (timestep), or None outside a patched transformer.
        head_start: the index, among the layer's heads, of the first head in q, k, v: 0 unless the heads are split
            across ranks (`vsagen.parallel.ulysses`), for backends whose heads differ (sparse-vdit's modes).
    """

    layout: TileLayout | None
    layer: int
    expert: str | None
    timer: Timer
    hidden_states: torch.Tensor | None = None
    params: Any = None
    forward: ForwardState | None = field(default=None, compare=False)
    head_start: int = 0

    @property
    def step(self) -> int:
        """The denoising step index of the current pipeline call (from 0), counted at the pipeline's scheduler
        (`vsagen.apply`); without one (a bare transformer), the timer's step (`timer.step`, set by the caller)."""
        if self.forward is not None and self.forward.step is not None:
            return self.forward.step
        return self.timer.step

    @property
    def timestep(self) -> torch.Tensor | None:
        """The transformer's timestep argument of this forward ((B,) or (B, S) raster order), or None."""
        return None if self.forward is None else self.forward.timestep


@dataclass(frozen=True)
class NoOptions:
    """A backend without options."""


@dataclass(frozen=True)
class LayerWeights:
    """Per-layer parameters a backend can load from a checkpoint (or a file the user names).

    Attributes:
        key: the checkpoint key prefix with a `{layer}` field, e.g. "blocks.{layer}.attn1.to_gate_compress"; the
            tensors are `<prefix>.<param>` for each name in `shapes(attn)`.
        attr: the attribute of the layer's `attn1` module the loaded Module is attached as (so it moves with the
            model: `.to()`, offloading), and read back from by the processor.
        shapes: the expected shape of each tensor given the layer's `attn1` module, e.g. {"weight": (C_out, C_in),
            "bias": (C_out,)}; a tensor named here may be absent only if `optional` lists it.
        build: turns the checked tensors of one layer (and its attn1 module) into the Module to attach.
        optional: tensor names that may be absent.
        file_option: the backend's Options field that names a user's safetensors file to load instead of the
            checkpoint's own tensors (None: the checkpoint only).
        aliases: other key prefixes (each with a `{layer}` field) accepted for the same tensors, e.g. the names
            other projects' checkpoints use.
        dtype: the dtype the Module is kept in (None: the transformer's, as its `to_q` weight).
        missing_note: the run note when no layer got the tensors (e.g. sla-star: its output is then vsa's), or None
            when running without them needs no word.
    """

    key: str
    attr: str
    shapes: Callable[[Any], dict[str, tuple[int, ...]]]
    build: Callable[[dict[str, torch.Tensor], Any], torch.nn.Module]
    optional: tuple[str, ...] = ()
    file_option: str | None = None
    aliases: tuple[str, ...] = ()
    dtype: torch.dtype | None = None
    missing_note: str | None = None


class AttentionBackend(Protocol):
    """What the vsagen processor calls for the video self-attention (`attn1`)."""

    name: ClassVar[str]
    Options: ClassVar[type]                  # frozen dataclass of the backend's options
    tiled: ClassVar[bool]                    # wants tile order and a TileLayout
    traceable: ClassVar[bool]                # torch.compile traces the call with no graph break
    weights: ClassVar[LayerWeights | None]   # per-layer parameters it can load, or None
    options: Any                             # an instance of Options

    def __init__(self, options: Any) -> None: ...

    def check(self, device: torch.device, dtype: torch.dtype) -> None:
        """Raise `BadInput` with a reason if this backend cannot run on `device` / `dtype`."""

    def describe(self, device: torch.device | None = None) -> dict:
        """JSON-ready name and options; given the run's device, also what runs there (e.g. VSA's `impl_ran`)."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        """q, k, v: (B, S, H, D); returns (B, S, H, D) like q."""


def option_names(options_cls: type) -> list[str]:
    """The field names of an Options dataclass, in declaration order."""
    return [f.name for f in fields(options_cls)]


def options_dict(options: Any) -> dict[str, Any]:
    """JSON-ready {field: value} of an Options instance; fields that are None (unset optional inputs such as a
    weights file) are left out, values that are not JSON scalars become strings."""
    out = {}
    for f in fields(options):
        v = getattr(options, f.name)
        if v is not None:
            out[f.name] = v if isinstance(v, (bool, int, float, str)) else str(v)
    return out
