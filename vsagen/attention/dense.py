"""The quality knobs every sparse backend takes: run some attention calls as `full` instead (issue 48).

Three options, declared once here (`DenseKnobs`, a keyword-only dataclass mixin each sparse backend's `Options`
derives from) and checked in each `Options.__post_init__` (`check_knobs`):

* `dense_steps`: the first denoising steps run dense: `N` (an integer, the first N steps), `F` (a fraction in
  (0, 1): the first ceil(F x steps) steps, so any positive fraction runs at least one), or `all` (every step);
  Sparse-VideoGen and Radial Attention run their first steps dense, ComfyUI's sparse-attention node has a start
  percentage;
* `dense_layers`: transformer blocks (0-based) that run dense at every step, `0,1,29` or ranges `0-2,29`;
* `min_tokens`: a call over fewer tokens than this runs dense (small videos, where sparsity buys little).

A dense call is exactly the `full` backend's computation: the processor (`VsagenAttnProcessor`) hands q, k, v to
`DenseCall`, which puts tile-ordered tokens back in raster order, runs `full` and returns tile order, so
`dense_steps=all` gives `--attn full`'s output bit for bit. The step a forward runs at is the one `vsagen.apply`
counts at the scheduler (`ForwardState.step`; the timer's step for a bare transformer); the step count for a
fraction is the scheduler's (`ForwardState.steps`, set when the pipeline sets its timesteps) or `apply`'s `steps`.
The decision per step is taken once per transformer forward, in its pre-hook (`ForwardState.dense`), so a compiled
block sees a bool, not the step. The backend's report then says how many calls ran dense and sparse (`knob_info`).

Like the backend modules, this module imports no torch when it is imported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import BadInput
from .base import AttnContext, Backend
from .shared import KNOBS, counts_of, has_knobs, knob_info, reset_counts  # noqa: F401 - re-exported

if TYPE_CHECKING:
    import torch

@dataclass(frozen=True, kw_only=True)
class DenseKnobs:
    """The options every sparse backend takes (see the module docstring).

    Attributes:
        dense_steps: the first steps that run `full`: "N", a fraction "F" in (0, 1) (the first ceil(F x steps)) or
            "all"; None: none. From Python an int or float works too; it is kept as this text.
        dense_layers: blocks that run `full`, e.g. "0,1,29" or "0-2,29" (sorted, each once); None: none. From
            Python a list of ints works too.
        min_tokens: a call over fewer tokens (the whole sequence) runs `full`; None: none.
    """

    dense_steps: str | None = field(default=None, metadata={
        "values": "N (the first N steps) | a fraction in (0, 1) (the first ceil(F x steps)) | all"})
    dense_layers: str | None = field(default=None, metadata={
        "values": "block indices, e.g. 0,1,29 or 0-2,29"})
    min_tokens: int | None = field(default=None, metadata={
        "values": "an integer (a call over fewer tokens runs full)"})


def check_knobs(options: Any) -> None:
    """Check and normalize `options`' knobs in place (frozen: `object.__setattr__`): `dense_steps` as "N", "F" or
    "all", `dense_layers` as sorted unique indices "0,1,29", `min_tokens` a positive int. Called by every sparse
    backend's `Options.__post_init__`.

    Raises:
        BadInput: a value that is none of those, in one line.
    """
    object.__setattr__(options, "dense_steps", _steps_text(options.dense_steps))
    object.__setattr__(options, "dense_layers", _layers_text(options.dense_layers))
    t = options.min_tokens
    if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 1):
        raise BadInput(f"min_tokens must be a positive integer (a call over fewer tokens runs full), got {t!r}")


def _steps_text(value: Any) -> str | None:
    """`dense_steps` as its canonical text ("3", "0.25", "all"), None for none or 0."""
    bad = BadInput(f"dense_steps must be N (the first N steps), a fraction in (0, 1) or all, got {value!r}")
    if value is None or isinstance(value, bool):
        if value is None:
            return None
        raise bad
    text = str(value).strip().lower()
    if text in ("all", "none"):
        return None if text == "none" else "all"
    try:
        number = int(text) if text.isdigit() else float(text)
    except ValueError:
        raise bad from None
    if isinstance(number, int):
        return None if number == 0 else str(number)
    if not math.isfinite(number) or not 0.0 < number < 1.0:
        raise bad
    return f"{number:g}"


def _layers_text(value: Any) -> str | None:
    """`dense_layers` as sorted unique indices "0,1,29" (ranges "a-b" expanded), None for none."""
    if value is None:
        return None
    items = [str(v) for v in value] if isinstance(value, (list, tuple, set, frozenset)) else str(value).split(",")
    layers: set[int] = set()
    for item in (i.strip() for i in items):
        if item.lower() == "none" and len(items) == 1:
            return None
        first, dash, last = item.partition("-")
        if not (first.isdigit() and (not dash or last.isdigit())) or (dash and int(last) < int(first)):
            raise BadInput(f"dense_layers takes block indices such as 0,1,29 or ranges such as 0-2, got {item!r}")
        layers.update(range(int(first), int(last if dash else first) + 1))
    return ",".join(map(str, sorted(layers))) if layers else None


def layer_set(options: Any) -> frozenset[int]:
    """The blocks `options.dense_layers` names (its checked text)."""
    text = getattr(options, "dense_layers", None)
    return frozenset(int(i) for i in text.split(",")) if text else frozenset()


def dense_step_count(options: Any, steps: int | None) -> int | None:
    """How many first steps run dense: N, ceil(F x steps) for a fraction, `steps` for "all" (None: every step,
    the count unknown), 0 for none.

    Raises:
        BadInput: a fraction while the step count is unknown.
    """
    text = getattr(options, "dense_steps", None)
    if text is None:
        return 0
    if text == "all":
        return steps
    if "." not in text:
        return int(text)
    if steps is None:
        raise BadInput(f"dense_steps={text} is a fraction of the steps, and this run's step count is unknown: give "
                       "N steps instead, or pass steps= to vsagen.apply")
    return math.ceil(float(text) * steps - 1e-9)  # (1e-9: 0.3 x 10 is 3.0000000000000004 in floats)


def step_is_dense(options: Any, step: int, steps: int | None) -> bool:
    """Whether denoising step `step` (from 0) runs dense under `options.dense_steps` (see `dense_step_count`)."""
    count = dense_step_count(options, steps)
    return count is None or step < count


def every_step_dense_note(name: str, options: Any, steps: int) -> str | None:
    """The run note for a `dense_steps` of N (or a fraction) that covers all of a run's `steps`: every call then
    runs `full`, which the backend's name in the title would not say; None otherwise. `dense_steps=all` asks for
    exactly that, and gets no note (the title says every call ran dense in both cases)."""
    text = getattr(options, "dense_steps", None)
    if text in (None, "all") or dense_step_count(options, steps) < steps:
        return None
    return (f"--attn {name}: dense_steps={text} covers all {steps} steps: every step runs full, as --attn full "
            f"(nothing runs sparse; fewer dense steps leave some sparse)")


def every_layer_dense_note(backend: Any, run: Any) -> str | None:
    """The run note for a `dense_layers` list that names every block of the run's transformers (`run.experts`, a
    `RunInfo`'s): every call then runs `full`, as with `every_step_dense_note`; None otherwise (no knob, a block
    left sparse, or the blocks not known). (A verifying trial: `vsa:dense_layers=0,1` on the 2-block tiny model
    said nothing, and `vsagen search --suggest-dense --budget 0` suggests such a list.)"""
    options = getattr(backend, "options", None)
    wanted = layer_set(options) if has_knobs(options) else frozenset()
    blocks = [e.layers for e in getattr(run, "experts", ())]
    if not wanted or not blocks or not set(range(max(blocks))) <= wanted:
        return None
    return (f"--attn {backend.name}: dense_layers={options.dense_layers} names every block of this model "
            f"({max(blocks)}): every call runs full, as --attn full (nothing runs sparse; fewer dense layers leave "
            "some sparse)")


def call_is_dense(options: Any, layer: int, tokens: int, dense_step: bool) -> bool:
    """Whether one attn1 call runs `full`: at a dense step, in a dense layer, or over fewer than `min_tokens`
    tokens (the whole sequence)."""
    floor = getattr(options, "min_tokens", None)
    return dense_step or layer in layer_set(options) or (floor is not None and tokens < floor)


def check_knobs_fit(backend: Any, run: Any, has_scheduler: bool = True) -> None:
    """Refuse knobs a run cannot honour, before it starts (the commands before loading, with the run the request
    predicts; `vsagen.apply` with the loaded transformers): a `dense_layers` index past a transformer's last block
    (`run.experts`, a `RunInfo`'s), a fraction `dense_steps` with neither `run.steps` nor a scheduler to count, a
    device / dtype `full` cannot run on (the dense calls are its).

    Raises:
        BadInput: one line, e.g. "--attn vsa: dense_layers=0,40 names block 40, but this model has 30 blocks
            (0-29)".
    """
    options = getattr(backend, "options", None)
    if not has_knobs(options):
        return
    from .full import FullAttention

    try:  # the dense calls are full's: its refusals apply (fp32 on CUDA)
        FullAttention().check(run.device, run.dtype)
    except BadInput as exc:
        raise BadInput(f"--attn {backend.name}: the calls dense_steps / dense_layers / min_tokens name run full, "
                       f"which refuses this run: {exc}") from None
    wanted = layer_set(options)
    blocks = [e.layers for e in run.experts]
    if wanted and blocks and max(wanted) >= min(blocks):
        n = min(blocks)
        raise BadInput(f"--attn {backend.name}: dense_layers={options.dense_layers} names block {max(wanted)}, but "
                       f"this model has {n} blocks (0-{n - 1})")
    if not has_scheduler:
        try:
            dense_step_count(options, run.steps)
        except BadInput as exc:
            raise BadInput(f"--attn {backend.name}: {exc}") from None


class DenseCall(Backend):
    """A sparse backend's call run dense: exactly `full`'s computation over raster-order tokens (tile-ordered q, k,
    v are put back in raster order first, and the output in tile order after)."""

    name = "full"
    traceable = True

    def __init__(self) -> None:
        from .full import FullAttention

        super().__init__()
        self.full = FullAttention()

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        """q, k, v: (B, S, H, D), tile order when `ctx.layout` is set; returns (B, S, H, D) in the same order."""
        layout = ctx.layout
        if layout is None:
            return self.full(q, k, v, ctx)
        q, k, v = (layout.to_raster(x, dim=1) for x in (q, k, v))
        return layout.to_tiles(self.full(q, k, v, ctx), dim=1)
