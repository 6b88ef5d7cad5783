"""The measurement behind `vsagen search --suggest-dense` (issue 48): a sparse backend's attention error against
dense attention per (denoising step, transformer block), and the quality knobs (`dense_steps`, `dense_layers`:
`vsagen.attention.dense`) suggested from it.

Measurement (`ErrorScorer`): the model denoises on dense attention (the scorer returns `full`'s output, so every
step sees the same latents as an `--attn full` run), and in every self-attention call the wrapped sparse backend
also runs on the same q, k, v (its own parameters, e.g. VSA's gate, handed over as in a run of it). Per (step s,
block l) the relative L2 error, pooled over the calls at that step (both CFG passes, every prompt, every expert
running block l then):

    e[s, l] = sqrt( sum ||O_backend - O_full||^2 / sum ||O_full||^2 )

(the measure `vsagen compare` reports per layer; sums in float64). Token order does not change dense attention, so
a tiled backend is compared in tile order. What it does not measure: how an error at one step changes the latents the
next steps see (the run stays on dense attention, as in the pattern search of `sparse_vdit_search`).

Suggestion (`suggest_dense`): a run with `dense_steps=k` and `dense_layers=D` computes every entry (s, l) with
s < k or l in D as `full`, so those entries' error is 0. Of every (k, D), the one that leaves

    sum of e[s, l] over the entries still sparse  <=  budget x sum of e[s, l] over every entry

while running the fewest entries dense (k x L + |D| x (S - k) of the S x L entries; every entry holds the same
number of attention calls, so this is the share of attention run as `full`); ties: the fewer knob values (k + |D|),
then the fewer dense steps. For each k the fewest layers are those of largest error left over steps k..S-1, taken
until the rest fits the budget, so trying every k in 0..S finds the optimum exactly. `budget` is a fraction of the
backend's own summed error (scale-free across models and backends): 0 runs every entry of nonzero error dense, 1 or
more suggests nothing.

Torch is imported when a scorer computes, not when this module is imported (the command checks its request first).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import BadInput
from .base import BackendWrapper
from .shared import has_knobs

DEFAULT_BUDGET = 0.5  # leave at most half of the backend's summed error
SCORE_REGION = "self_attention/score"  # the timer region of the backend's run beside dense attention


class ErrorScorer(BackendWrapper):
    """Wraps a sparse backend (built without quality knobs, so none of its calls runs dense): returns dense attention
    (`full`) and accumulates, per (step, expert, layer), the backend's squared error against it and the squared
    norm of the dense output (module docstring). Every other protocol member is the backend's (`BackendWrapper`);
    its check adds dense attention's.

    Attributes:
        sums: (step, expert, layer) -> a (2,) float64 tensor on the run's device: [sum ||O_backend - O_full||^2,
            sum ||O_full||^2] over that step's calls (read once the run ends: the scorer never synchronizes).
        calls: attention calls scored.

    Raises:
        ValueError: the backend sets a quality knob (its calls would not all be sparse).
    """

    def __init__(self, backend: Any) -> None:
        from .full import FullAttention

        if has_knobs(getattr(backend, "options", None)):
            raise ValueError(f"{backend.name}: measure it without dense_steps / dense_layers / min_tokens")
        super().__init__(backend)
        self.full = FullAttention()
        self.sums: dict[tuple[int, str, int], Any] = {}
        self.calls = 0

    def check(self, device: Any, dtype: Any) -> None:
        """The backend's check, and dense attention's (on CUDA it needs bf16 or fp16).

        Raises:
            BadInput: either cannot run on `device` / `dtype`.
        """
        self.inner.check(device, dtype)
        try:
            self.full.check(device, dtype)
        except BadInput as exc:
            raise BadInput(f"the search denoises on dense attention, which refuses this run: {exc}") from None

    def prepare(self, run: Any) -> tuple[str, ...]:
        """This scorer's `check`, then the backend's preparation (its refusals and notes)."""
        self.check(run.device, run.dtype)
        return self.inner.prepare(run)

    def __call__(self, q: Any, k: Any, v: Any, ctx: Any) -> Any:
        """q, k, v: (B, S, H, D) (tile order for a tiled backend) -> the dense output (B, S, H, D) like q; the
        backend's output on the same q, k, v is scored (timer region SCORE_REGION) and dropped."""
        import torch

        ref = self.full(q, k, v, ctx)
        with ctx.timer.region(SCORE_REGION):
            out = self.inner(q, k, v, ctx)
            acc = torch.float64 if ref.device.type != "mps" else torch.float32  # (MPS has no float64)
            dense = ref.to(acc)
            sums = torch.stack([(out.to(acc) - dense).square().sum(), dense.square().sum()])
        key = (ctx.step, ctx.expert or "transformer", ctx.layer)
        self.sums[key] = sums if key not in self.sums else self.sums[key] + sums
        self.calls += 1
        return ref

    def errors(self) -> dict[tuple[int, str, int], tuple[float, float]]:
        """(step, expert, layer) -> (sum ||O_backend - O_full||^2, sum ||O_full||^2) as floats, sorted."""
        return {key: tuple(float(x) for x in self.sums[key].cpu()) for key in sorted(self.sums)}  # type: ignore


def rel_l2(squared_error: float, squared_norm: float) -> float:
    """sqrt(squared_error / squared_norm); 0 where both are 0 (a zero output computed exactly), inf where only the
    norm is."""
    if squared_norm == 0.0:
        return 0.0 if squared_error == 0.0 else math.inf
    return math.sqrt(squared_error / squared_norm)


def error_matrix(sums: dict[tuple[int, str, int], tuple[float, float]], steps: int, layers: int) -> list[list[float]]:
    """e[s][l] (`rel_l2`) of the (steps, layers) entries from `ErrorScorer.errors()`, the experts that ran block l
    at step s pooled (their sums added); 0 for an entry no call reached.

    Raises:
        ValueError: a key past `steps` or `layers`.
    """
    pooled = [[[0.0, 0.0] for _ in range(layers)] for _ in range(steps)]
    for (s, _, layer), (d, r) in sums.items():
        if not (0 <= s < steps and 0 <= layer < layers):
            raise ValueError(f"an error of step {s}, layer {layer} outside {steps} steps x {layers} layers")
        pooled[s][layer][0] += d
        pooled[s][layer][1] += r
    return [[rel_l2(d, r) for d, r in row] for row in pooled]


@dataclass(frozen=True)
class DenseSuggestion:
    """The knobs `suggest_dense` chose and what they leave.

    Attributes:
        dense_steps: the first steps that run `full` (0: none); dense_layers: blocks that run `full`, sorted.
        budget: the fraction of `total` allowed to stay; total: sum of e over every (step, layer) entry;
        residual: sum of e over the entries left sparse (<= budget x total).
        dense_entries, entries: (step, layer) entries run dense, and all S x L of them.
    """

    dense_steps: int
    dense_layers: tuple[int, ...]
    budget: float
    total: float
    residual: float
    dense_entries: int
    entries: int

    @property
    def dense_fraction(self) -> float:
        """The share of attention calls the knobs run as `full` (0 for an empty run)."""
        return self.dense_entries / self.entries if self.entries else 0.0

    def is_dense(self, step: int, layer: int) -> bool:
        """Whether entry (step, layer) runs `full` under the suggestion."""
        return step < self.dense_steps or layer in self.dense_layers


def suggest_dense(errors: Sequence[Sequence[float]], budget: float = DEFAULT_BUDGET) -> DenseSuggestion:
    """The `dense_steps` and `dense_layers` that keep the summed error within `budget` x the total while running
    the fewest (step, layer) entries dense (module docstring: the rule, exact).

    Args:
        errors: e[s][l] >= 0 for S steps x L layers (`error_matrix`), every row of one length.
        budget: finite, >= 0: the fraction of the summed error that may stay.

    Raises:
        ValueError: a negative or non-finite error or budget, or rows of different lengths.
    """
    if not (math.isfinite(budget) and budget >= 0):
        raise ValueError(f"the budget must be a finite number >= 0, got {budget}")
    steps = len(errors)
    layers = len(errors[0]) if steps else 0
    if any(len(row) != layers for row in errors) or not all(math.isfinite(e) and e >= 0 for r in errors for e in r):
        raise ValueError("the errors must be S rows of L finite numbers >= 0")
    total = math.fsum(e for row in errors for e in row)
    limit = budget * total
    best: tuple[tuple[int, int, int], int, tuple[int, ...], float] | None = None
    for k in range(steps + 1):
        left = [math.fsum(errors[s][layer] for s in range(k, steps)) for layer in range(layers)]
        chosen: list[int] = []
        residual = math.fsum(left)
        for layer in sorted(range(layers), key=lambda i: (-left[i], i)):
            if residual <= limit:
                break
            chosen.append(layer)
            residual = math.fsum(left[i] for i in range(layers) if i not in chosen)
        cost = k * layers + len(chosen) * (steps - k)
        rank = (cost, k + len(chosen), k)
        if best is None or rank < best[0]:
            best = (rank, k, tuple(sorted(chosen)), residual)
    assert best is not None  # k = 0 always ranks
    (cost, _, _), k, chosen_layers, residual = best
    return DenseSuggestion(dense_steps=k, dense_layers=chosen_layers, budget=float(budget), total=total,
                           residual=residual, dense_entries=cost, entries=steps * layers)
