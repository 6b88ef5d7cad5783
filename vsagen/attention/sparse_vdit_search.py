"""Sparse-vDiT's offline search (seed 003, arXiv 2506.03065), beside the `sparse-vdit` backend it runs
(`vsagen.attention.sparse_vdit`): a scoring backend that returns full attention and measures every mode of a catalog
against it, per (step range, expert, layer, head), and the choice of one mode per head from those measurements
(`vsagen search` runs it on a loaded model and writes the pattern file, `vsagen.sparsity.files`).

The scoring backend (`ModeScorer`) takes every self-attention call's q, k, v (tile order), returns the full output
O_full (torch SDPA, as `full`) and scores each mode of the catalog (`patterns.default_catalog`) on that call, for all
heads at once, by the same code the `sparse-vdit` backend runs (`SparseVDiTAttention.attend`: the block-sparse
kernels on CUDA, token-level masked attention in torch elsewhere):

    err[mode, h] = mean((O_mode - O_full)^2) / mean(O_full^2)   over the batch, tokens and head dim of head h

a relative MSE: 0 for a mode that equals dense attention, exactly 1 for `skip` (zero output), scale-free across
layers, heads and models (the paper writes a raw MSE; a raw MSE depends on the scale of each layer's v, so one
threshold could not serve every layer). A mode that computes every key tile on this tile grid counts as dense
(err 0, not computed); one that computes none as skip (err 1). Errors are averaged over every call a (step range,
expert, layer) receives: all its denoising steps, both CFG passes and every prompt, each call weighted alike.

Choice per (step range, expert, layer, head), with cost(mode) = its block density on the tile grid
(`patterns.block_density`: dense 1, skip 0):

    admissible = dense, and every mode with err <= eps
    mode       = argmin over admissible of err + lam * cost   (ties: the lower cost, then catalog order)

so with eps below every sparse mode's error the head stays dense, a larger lam trades error for sparsity, and
with the defaults lam = 0.5, eps = 1.0 a sparse mode of density d replaces dense where err < 0.5 * (1 - d) (skip
needs lam > 1: err 1 against dense's lam). Step ranges (`step_ranges`) split the steps into N equal ranges (range i
covers steps [i * steps // N, (i + 1) * steps // N)), each with its own modes; an expert that never ran in a range
(the second expert of Wan2.2-A14B runs only the low-noise steps) gets there the modes of all the steps it ran, and
an expert that never ran at all gets dense. The file's scores are the mean errors over all steps.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from ..errors import BadInput, RunFailure
from ..sparsity.files import (DEFAULT_EPS, DEFAULT_LAM, IMPLS, PatternFile, StepRange,  # noqa: F401 - re-exported
                              parse_patterns, step_ranges)
from ..sparsity.patterns import Pattern, block_density, default_catalog, q2k_table
from .base import Backend, RunInfo

SCORE_DIGITS = 6  # significant digits of the scores written to the file


def mode_errors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o_full: torch.Tensor,
                modes: Sequence[Pattern], layout: Any,
                attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, tuple[Pattern, ...], Any], torch.Tensor]
                ) -> torch.Tensor:
    """Every mode's relative MSE against the full output, per head (module docstring).

    Args:
        q, k, v: (B, S, H, D), tile order of `layout`.
        o_full: (B, S, H, D) the full attention output of q, k, v.
        modes: the M patterns to score.
        layout: the tokens' `TileLayout`.
        attend: runs one layer's attention with head h under modes[h] (`SparseVDiTAttention.attend`).

    Returns:
        (M, H) float64 on q's device: mean((O_mode - O_full)^2) / mean(O_full^2) over (B, S, D); 0 for a mode
        that computes every key tile (it is dense), 1 for one that computes none (a zero output).
    """
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    heads, n = q.shape[2], layout.num_tiles
    ref = o_full.to(acc)
    ms = ref.square().mean(dim=(0, 1, 3)).to(torch.float64)  # (H,)
    out = torch.empty(len(modes), heads, dtype=torch.float64, device=q.device)
    for i, p in enumerate(modes):
        cnt = q2k_table(p, layout.tiles_per_dim)[1]
        if int(cnt.min()) == n:
            out[i] = 0.0
            continue
        if int(cnt.max()) == 0:
            out[i] = ms
        else:
            o = attend(q, k, v, (p,) * heads, layout)
            out[i] = (o.to(acc) - ref).square().mean(dim=(0, 1, 3)).to(torch.float64)
        out[i] /= ms.clamp_min(torch.finfo(torch.float64).tiny)
    return out


def choose_mode(modes: Sequence[Pattern], errors: Sequence[float], costs: Sequence[float], lam: float,
                eps: float) -> int:
    """The index of the mode one head gets: the lowest err + lam * cost among dense and the modes with
    err <= eps (ties: the lower cost, then the earlier mode).

    Raises:
        ValueError: no dense mode in `modes`.
    """
    dense = [i for i, p in enumerate(modes) if p.kind == "dense"]
    if not dense:
        raise ValueError("the mode catalog needs a dense mode (the fallback)")
    allowed = [i for i, p in enumerate(modes) if p.kind == "dense" or errors[i] <= eps]
    return min(allowed, key=lambda i: (errors[i] + lam * costs[i], costs[i], i))


@dataclass(frozen=True)
class ScoreOptions:
    """Options of the scoring backend: `impl` as `--attn-impl` ("auto", "triton", "torch")."""

    impl: str = "auto"

    def __post_init__(self) -> None:
        if self.impl not in IMPLS:
            raise BadInput(f"impl must be one of {', '.join(IMPLS)}, got {self.impl!r}")


class ModeScorer(Backend):
    """The search's attention backend (not registered: `vsagen search` builds it): returns full attention and
    accumulates every mode's relative MSE per (step range, expert, layer, head).

    Args:
        modes: the catalog (at least one dense mode; default `patterns.default_catalog()`).
        steps: denoising steps of one pipeline call; ranges: how many equal step ranges (`step_ranges`).
        options: `ScoreOptions`.
    """

    name = "sparse-vdit-search"
    Options = ScoreOptions
    tiled = True  # the modes are compiled on the tile grid
    traceable = False

    def __init__(self, modes: Sequence[Pattern] | None = None, steps: int = 1, ranges: int = 1,
                 options: ScoreOptions | None = None) -> None:
        from .full import FullAttention
        from .sparse_vdit import SparseVDiTAttention, SparseVDiTOptions

        super().__init__(options)
        self.modes = tuple(default_catalog() if modes is None else modes)
        if len({p.name for p in self.modes}) != len(self.modes):
            raise ValueError("the mode catalog has two modes of one name")
        choose_mode(self.modes, [0.0] * len(self.modes), [1.0] * len(self.modes), 0.0, 0.0)  # has a dense mode
        self.steps = steps
        self.ranges = step_ranges(steps, ranges)
        self._full = FullAttention()
        self._sparse = SparseVDiTAttention(SparseVDiTOptions(impl=self.options.impl))  # its `attend`, no file
        self.sums: dict[tuple[int, str, int], torch.Tensor] = {}  # (range, expert, layer) -> (M, H) float64
        self.counts: dict[tuple[int, str, int], int] = {}
        self.architectures: dict[str, dict[str, Any]] = {}
        self.grids: set[tuple[int, int, int]] = set()
        self.calls = 0

    def check(self, device: torch.device, dtype: torch.dtype) -> None:
        """Raises BadInput where full attention (`full`: bf16 / fp16 on CUDA) or the chosen impl cannot run."""
        from ..kernels.tuning import interpreting

        self._full.check(device, dtype)
        if self._sparse.resolved_impl(device) == "triton" and device.type != "cuda" and not interpreting():
            raise BadInput("--attn-impl triton needs a CUDA device (or TRITON_INTERPRET=1); use --attn-impl torch")

    def describe(self, device: torch.device | None = None) -> dict:
        """{"name", "impl", "modes"} (and "impl_ran" given the device)."""
        d: dict[str, Any] = {"name": self.name, "impl": self.options.impl, "modes": [p.name for p in self.modes]}
        if device is not None:
            d["impl_ran"] = self._sparse.resolved_impl(device)
        return d

    def prepare(self, run: RunInfo) -> tuple[str, ...]:
        """`check` the run's device and dtype; once bound to loaded transformers (`vsagen.apply`), record each one's
        architecture and the latent grid the run denoises."""
        self.check(run.device, run.dtype)
        if not run.predicted:
            for expert in run.experts:
                self.architectures[expert.name or "transformer"] = dict(expert.architecture)
            if run.grid is not None:
                self.grids.add(tuple(run.grid))
        return ()

    def range_of(self, step: int) -> int:
        """The index of the step range holding denoising step `step` (steps past the last: the last range)."""
        return min(bisect.bisect_right([a for a, _ in self.ranges], step) - 1, len(self.ranges) - 1)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: Any) -> torch.Tensor:
        """q, k, v: (B, S, H, D) tile order -> the full attention output (B, S, H, D) like q; stage
        "self_attention/score" for the modes."""
        if ctx.layout is None:
            raise RuntimeError("the search needs tokens in tile order with a TileLayout (tile-order hooks missing)")
        out = self._full(q, k, v, ctx)
        with ctx.timer.region("self_attention/score"):
            errors = mode_errors(q, k, v, out, self.modes, ctx.layout, self._sparse.attend)
        key = (self.range_of(ctx.step), ctx.expert or "transformer", ctx.layer)
        if key in self.sums:
            self.sums[key] += errors
            self.counts[key] += 1
        else:
            self.sums[key], self.counts[key] = errors, 1
        self.calls += 1
        return out

    def mean_errors(self, expert: str, layer: int, rng: int | None = None) -> torch.Tensor | None:
        """(M, H) float64 CPU mean errors of one layer, in step range `rng` (None: every range), or None if
        the layer never ran there."""
        keys = [k for k in self.sums if k[1:] == (expert, layer) and (rng is None or k[0] == rng)]
        if not keys:
            return None
        total = sum(self.sums[k].cpu() for k in keys)
        return total / sum(self.counts[k] for k in keys)


def patterns_from_scores(scorer: ModeScorer, *, model: str, experts: Sequence[str], layers: int, heads: int,
                         grid: tuple[int, int, int], height: int, width: int, frames: int, lam: float, eps: float,
                         prompts: int) -> tuple[PatternFile, list[str]]:
    """The pattern file of a finished search (each head's mode by `choose_mode` on its range's mean errors) and the
    notes on experts that never ran in a range or at all.

    Raises:
        BadInput: the experts have different architectures (no file can cover both), or no call was scored.
        RunFailure: an error that is not finite (NaN or Inf in an attention output).
    """
    if scorer.calls == 0 or not scorer.architectures:
        raise BadInput("the search scored no attention call (did the model denoise?)")
    archs = [scorer.architectures[e] for e in experts if e in scorer.architectures]
    if any(a != archs[0] for a in archs):
        raise BadInput(f"the experts {', '.join(experts)} have different architectures; a pattern file covers one")
    tiles = tuple(math.ceil(g / 4) for g in grid)
    costs = [block_density(p, tiles) for p in scorer.modes]
    notes: list[str] = []
    ranges = []
    for r, (start, stop) in enumerate(scorer.ranges):
        table = {}
        for e in experts:
            rows = []
            for layer in range(layers):
                err = scorer.mean_errors(e, layer, r)
                if err is None:
                    err = scorer.mean_errors(e, layer)
                    if err is not None and layer == 0:
                        notes.append(f"{e} did not run in steps {start}-{stop - 1}: its modes there are those of "
                                     "all the steps it ran")
                if err is None:
                    if layer == 0 and r == 0:
                        notes.append(f"{e} never ran (too few steps?): dense everywhere")
                    rows.append(tuple(p.name for p in scorer.modes if p.kind == "dense")[:1] * heads)
                    continue
                rows.append(tuple(scorer.modes[choose_mode(scorer.modes, err[:, h].tolist(), costs, lam, eps)].name
                                  for h in range(heads)))
            table[e] = tuple(rows)
        ranges.append(StepRange(start, stop, table))
    scores = {}
    for e in experts:
        for layer in range(layers):
            err = scorer.mean_errors(e, layer)
            if err is not None and not bool(torch.isfinite(err).all()):
                raise RunFailure(f"the attention of {e} layer {layer} gave NaN or infinite errors (its full output "
                                 "holds NaN or Inf?): nothing was written; try another --dtype or real weights")
            for h in range(heads if err is not None else 0):
                scores[f"{e}/{layer}/{h}"] = {p.name: float(f"{float(err[i, h]):.{SCORE_DIGITS}g}")
                                              for i, p in enumerate(scorer.modes)}
    pf = PatternFile(model=model, architecture=archs[0], experts=tuple(experts), height=height, width=width,
                     frames=frames, grid=tuple(grid), steps=scorer.steps, lam=lam, eps=eps, prompts=prompts,
                     modes={p.name: p for p in scorer.modes}, ranges=tuple(ranges), scores=scores)
    return parse_patterns(pf.to_json(), "the searched patterns"), notes  # what is written is what loads


def run_density(scorer: ModeScorer, patterns: PatternFile) -> float:
    """The block density the file's modes give the attention calls the search ran (each (step range, expert,
    layer) weighted by its calls): what a run like the searched one computes of dense attention."""
    dens = {n: block_density(p, patterns.tiles) for n, p in patterns.modes.items()}
    total = sum(scorer.counts.values())
    return sum(c * sum(dens[n] for n in patterns.ranges[r].heads[e][layer]) / patterns.architecture["heads"]
               for (r, e, layer), c in scorer.counts.items()) / max(total, 1)
