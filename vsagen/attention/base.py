"""The attention backend protocol shared by every `--attn` choice, what a backend learns about a run, and the context
each call receives.

A backend is a class with a `name`, a frozen `Options` dataclass it declares (defaults, validation in
`__post_init__`, one docstring line per field), and an instance built from one `Options` value. The processor
calls it as `backend(q, k, v, ctx)` with q, k, v of shape (B, S, H, D) (the layout Wan's processor already holds)
and an `AttnContext`; it returns the attention output of the same shape and dtype. Backends with `tiled = True`
receive the tokens in tile order and `ctx.layout`; the others receive raster order and `ctx.layout = None`.
Backends with `traceable = True` can be traced by torch.compile without a graph break (`--compile` then compiles
the whole transformer block as one graph, attention included); the others run eagerly between compiled graphs.

`AttentionBackend` (a Protocol) declares every member any caller uses; `Backend` is the base class that gives each
optional one its default, so a backend writes only what it changes. A backend meets a run in one method:
`prepare(run)` receives a `RunInfo` (device, dtype, the transformers' architectures, the latent grid and the
step count, as far as they are known) and raises `BadInput` for a run it cannot serve, or returns notes for the
run. `vsagen.apply` calls it with the loaded transformers when it binds the backend to a pipeline; the command
layer calls it before loading with the run the request predicts (the preset's architecture, the planned grid), so
a refusal comes before anything heavy loads: it must be cheap and may be called more than once. What a backend
reports after a run (its description, per-layer rows) comes back through `report(device)`.

A backend may own per-layer parameters (`weights`, a `LayerWeights`: VSA's trained gate `to_gate_compress`), loaded
through `vsagen.attention.weights` from the checkpoint or from a safetensors file the user names; the processor of
layer i hands them over as `ctx.params`. A backend with weights may also take part in `--attn auto`
(`auto_priority`: `vsagen.attention.auto` runs, for a checkpoint holding the weights of several such backends, the
one of highest priority).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Protocol

from ..layout import TILE, TileLayout
from .shared import NoOptions, knob_info, option_names, options_dict  # noqa: F401 - re-exported

if TYPE_CHECKING:
    import torch

    from ..timing import Timer

# Every member of the backend protocol (`AttentionBackend`), for the registry's validation of a backend class or
# object (`vsagen.attention.registry.missing_members`).
PROTOCOL_MEMBERS = ("name", "Options", "tiled", "tile", "traceable", "weights", "per_layer", "bench_params",
                    "auto_priority", "check", "prepare", "describe", "report", "__call__")


@dataclass
class ForwardState:
    """What one patched transformer's current forward knows beyond its blocks' arguments: the denoising timestep (the
    `timestep` argument of the transformer: (B,) or per token (B, S), raster order), set by a forward pre-hook
    before the blocks run (`vsagen.attention.hooks`), and the step index within the current pipeline call (reset
    when the scheduler's timesteps are set, advanced after each scheduler step). Shared by the processors of the
    transformer's layers; read lazily (`AttnContext.timestep`) so torch.compile only guards on it when a backend
    reads it. The pre-hook also decides whether the forward's step runs dense (`dense`, from the step and the step
    count `steps`), so a compiled block guards on that bool rather than on the step."""

    timestep: torch.Tensor | None = None
    step: int | None = None  # denoising step of the current pipeline call, when a scheduler is counted (vsagen.apply)
    steps: int | None = None  # denoising steps of the current call: the scheduler's, else vsagen.apply's `steps`
    dense: bool = False  # this forward's step runs dense (`vsagen.attention.dense`: the `dense_steps` knob)


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
class LayerWeights:
    """Per-layer parameters a backend can load from a checkpoint (or a file the user names).

    Attributes:
        key: the checkpoint key prefix with a `{layer}` field, e.g. "blocks.{layer}.to_gate_compress"; the
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
        dtype: the dtype the Module is kept in, by its torch name (e.g. "float32"; None: the transformer's, as its
            `to_q` weight).
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
    dtype: str | None = None
    missing_note: str | None = None


@dataclass(frozen=True)
class Expert:
    """One transformer a backend runs in: its pipeline component name ("transformer", "transformer_2"; None for a
    bare transformer) and its architecture (`architecture_of`)."""

    name: str | None
    architecture: Mapping[str, Any]  # `vsagen.architecture.architecture_of`

    @property
    def layers(self) -> int:
        """Transformer blocks (one `attn1` each)."""
        return int(self.architecture["layers"])


@dataclass(frozen=True)
class RunInfo:
    """What a backend needs to know about a run (`AttentionBackend.prepare`), as far as it is known.

    Attributes:
        device: where the transformers compute; dtype: their dtype.
        experts: every transformer of the pipeline the backend is bound to, in order (empty: not known yet, e.g. a
            hub checkpoint no preset describes, before it is loaded).
        grid: the post-patch latent grid (T, Hl, Wl) denoised, or None where each forward decides it (a pipeline
            patched by `vsagen.apply` without a grid: the backend sees it in `ctx.layout`).
        steps: denoising steps of one pipeline call, or None (unknown).
        predicted: True when the facts come from the request before loading (the preset's architecture), False
            when `vsagen.apply` binds the backend to loaded transformers.
        model: the model as the user named it (`--model`: a preset name, a folder or a hub id), or None (not known:
            `vsagen.apply`).
    """

    device: torch.device
    dtype: torch.dtype
    experts: tuple[Expert, ...] = ()
    grid: tuple[int, int, int] | None = None
    steps: int | None = None
    predicted: bool = False
    model: str | None = None

    @property
    def expert_names(self) -> tuple[str | None, ...]:
        """The component names of `experts`."""
        return tuple(e.name for e in self.experts)


@dataclass(frozen=True)
class BackendReport:
    """What a backend says after a run (`AttentionBackend.report`).

    Attributes:
        info: JSON-ready name and options, and what ran (`describe(device)`: e.g. VSA's `impl_ran`).
        layers: for backends whose layers run differently (`per_layer`), one JSON-ready row per (expert, layer) of
            the last run, sorted by expert then layer (sparse-vdit: heads, launches, groups, density, sdpa_heads,
            modes); empty for the others.
    """

    info: dict[str, Any]
    layers: tuple[dict[str, Any], ...] = ()


class AttentionBackend(Protocol):
    """What the vsagen processor, `vsagen.apply`, the commands and the benchmarks use of a self-attention (`attn1`)
    backend: every member any caller reads. `Backend` gives the optional ones their defaults."""

    name: ClassVar[str]                      # the --attn name
    Options: ClassVar[type]                  # frozen dataclass of the backend's options
    tiled: ClassVar[bool]                    # wants tile order and a TileLayout
    tile: tuple[int, int, int]               # the (tt, th, tw) cube of that layout (tiled backends; (4, 4, 4) default)
    traceable: ClassVar[bool]                # torch.compile traces the call with no graph break
    weights: ClassVar[LayerWeights | None]   # per-layer parameters it can load, or None
    per_layer: ClassVar[bool]                # its layers run differently (benchmarks time each; `report` rows)
    # bench_params(heads, head_dim, device, seed) -> the per-layer parameters to time it with, or None (the member
    # itself is None for a backend timed without parameters)
    bench_params: ClassVar[Callable[..., Any] | None]
    # `--attn auto` may choose it for a checkpoint holding its `weights` (higher first), or None: never
    auto_priority: ClassVar[int | None]
    options: Any                             # an instance of Options

    def __init__(self, options: Any = None) -> None: ...

    def check(self, device: torch.device, dtype: torch.dtype) -> None:
        """Raise `BadInput` with a reason if this backend cannot run on `device` / `dtype`."""

    def prepare(self, run: RunInfo) -> tuple[str, ...]:
        """Take the run's facts before it starts; raise `BadInput` for a run it cannot serve; return notes for
        the run (empty for none). Cheap and repeatable (see the module docstring)."""

    def describe(self, device: torch.device | None = None) -> dict:
        """JSON-ready name and options; given the run's device, also what runs there (e.g. VSA's `impl_ran`)."""

    def report(self, device: torch.device | None = None) -> BackendReport:
        """What the backend says after a run: `describe(device)` and its per-layer rows."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        """q, k, v: (B, S, H, D); returns (B, S, H, D) like q."""




class Backend:
    """The base class of vsagen's backends: the defaults of the protocol's optional members. A subclass sets
    `name`, `Options`, `tiled`, `traceable` and writes `__call__`; it overrides `check`, `prepare`, `describe` and
    `report` where it has more to say."""

    name: ClassVar[str]
    Options: ClassVar[type] = NoOptions
    tiled: ClassVar[bool] = False
    tile: tuple[int, int, int] = TILE  # VSA's backends read theirs from the `tile` option
    traceable: ClassVar[bool] = False
    weights: ClassVar[LayerWeights | None] = None
    per_layer: ClassVar[bool] = False
    bench_params: ClassVar[Callable[..., Any] | None] = None
    auto_priority: ClassVar[int | None] = None

    def __init__(self, options: Any = None) -> None:
        self.options = self.Options() if options is None else options

    def check(self, device: torch.device, dtype: torch.dtype) -> None:
        """Runs everywhere (no refusal)."""

    def prepare(self, run: RunInfo) -> tuple[str, ...]:
        """`check(run.device, run.dtype)`; no notes."""
        self.check(run.device, run.dtype)
        return ()

    def describe(self, device: torch.device | None = None) -> dict:
        """{"name", **the options set}."""
        return {"name": self.name, **options_dict(self.options)}

    def report(self, device: torch.device | None = None) -> BackendReport:
        """`describe(device)` and the quality knobs' call counts where a knob is set (`shared.knob_info`), no
        per-layer rows."""
        return BackendReport({**self.describe(device), **knob_info(self)})

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} does not implement the attention call")


class BackendWrapper(Backend):
    """A backend around another one (`inner`): every protocol member is the inner backend's unless the wrapper
    overrides it (vsagen compare's attention probe, Ulysses' all-to-all). Class-level members (`name`, `tiled`,
    ...) are copied onto the instance."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.Options = inner.Options
        self.options = inner.options
        self.tiled = inner.tiled
        self.tile = inner.tile
        self.traceable = inner.traceable
        self.weights = inner.weights
        self.per_layer = inner.per_layer
        self.bench_params = inner.bench_params
        self.auto_priority = inner.auto_priority

    def check(self, device: torch.device, dtype: torch.dtype) -> None:
        """The inner backend's."""
        self.inner.check(device, dtype)

    def prepare(self, run: RunInfo) -> tuple[str, ...]:
        """The inner backend's."""
        return self.inner.prepare(run)

    def describe(self, device: torch.device | None = None) -> dict:
        """The inner backend's."""
        return self.inner.describe(device)

    def report(self, device: torch.device | None = None) -> BackendReport:
        """The inner backend's, with this wrapper's `describe` (and the knobs' call counts, `shared.knob_info`)."""
        return BackendReport({**self.describe(device), **knob_info(self)}, self.inner.report(device).layers)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        return self.inner(q, k, v, ctx)
