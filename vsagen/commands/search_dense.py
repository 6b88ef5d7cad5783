"""`vsagen search --suggest-dense --attn SPEC`: measure a sparse backend's attention error against dense attention
per (denoising step, transformer block) and suggest its quality knobs `dense_steps` and `dense_layers` (issue 48).

The model denoises on dense attention over every prompt, as the pattern search does (`vsagen.commands.search`:
`denoise_prompts`, the same session), and in every self-attention call the backend of `--attn` runs beside it on the
same q, k, v (`vsagen.attention.dense_search.ErrorScorer`, its own knobs off so every call is sparse). The
measurement and the rule that picks the knobs (the fewest dense (step, layer) entries leaving at most `--budget` x
the backend's summed error) are that module's docstring. The result: a table per layer and per step, the `--attn`
text to paste (the backend's options as resolved, the suggested knobs in place of any given), and a JSON file of the
measurements and the suggestion, written atomically once the search ends (an interrupted search writes nothing).
"""

from __future__ import annotations

import dataclasses
import math
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..attention.dense_search import DEFAULT_BUDGET, DenseSuggestion
from ..attention.registry import backend_names, options_of
from ..attention.shared import KNOBS, option_names, options_dict
from ..attention.spec import BackendSpec
from ..errors import BadInput, RunFailure
from ..models.loading import reworded_notes
from ..request.options import AttentionOptions, RequestOptions, request_options
from ..request.resolve import ONE, Request, request_fields, resolve
from .search import SEARCHED, denoise_prompts, search_out, search_prompts, search_source, write_at_end

DEFAULT_DENSE_OUT = Path("dense-errors.json")
DIGITS = 6  # significant digits of the errors written to the file


def sparse_backends() -> list[str]:
    """The registered backends that take the quality knobs (the ones `--suggest-dense` measures)."""
    return [n for n in backend_names() if "dense_steps" in option_names(options_of(n))]


def without_knobs(spec: BackendSpec) -> BackendSpec:
    """`spec` with `dense_steps`, `dense_layers` and `min_tokens` unset: every call sparse."""
    return BackendSpec(spec.name, dataclasses.replace(spec.options, **{k: None for k in KNOBS}))


def check_search_mode(suggest_dense: bool, *, attn: str | None, sparsity: float | None, budget: float | None,
                      lam: float | None, eps: float | None, ranges: int | None) -> None:
    """Refuse the flags of one `vsagen search` mode given to the other (None: not given): `--attn`, `--sparsity`
    and `--budget` go with `--suggest-dense`, which needs `--attn`; `--lam`, `--eps` and `--ranges` with the
    pattern search.

    Raises:
        BadInput: one line naming the flags.
    """
    if suggest_dense:
        given = [f for f, v in (("--lam", lam), ("--eps", eps), ("--ranges", ranges)) if v is not None]
        if given:
            raise BadInput(f"{' / '.join(given)} {'tunes' if len(given) == 1 else 'tune'} the Sparse-vDiT pattern "
                           "search; --suggest-dense takes --budget")
        if attn is None:
            raise BadInput("--suggest-dense measures the sparse backend --attn names; give it, e.g. --attn vsa")
        return
    given = [f for f, v in (("--attn", attn), ("--sparsity", sparsity), ("--budget", budget)) if v is not None]
    if given:
        raise BadInput(f"{' / '.join(given)} {'goes' if len(given) == 1 else 'go'} with --suggest-dense (measure a "
                       "backend and suggest its dense_steps / dense_layers); the pattern search scores its own modes")


@dataclass(frozen=True, kw_only=True)
class DenseSearchConfig(Request):
    """A validated `vsagen search --suggest-dense` request (`Request`'s fields; `backends[0]` is the backend as
    `--attn` resolved it, preset tables and flags filled in).

    Attributes:
        prompts: every prompt denoised, in order; budget: the fraction of the summed error the suggestion may
            leave (`suggest_dense`); out: the JSON file to write.
    """

    prompts: tuple[str, ...]
    budget: float
    out: Path

    @property
    def measured(self) -> BackendSpec:
        """The backend measured: `--attn`'s with its knobs unset (`without_knobs`)."""
        return without_knobs(self.backends[0])

    @property
    def denoise_steps(self) -> int:
        """Denoising steps of one prompt's run (a re-noise sampler's sigma list, else `steps`)."""
        return len(self.sampler.sigmas) if self.sampler.renoise else self.steps


def resolve_dense_search_options(options: RequestOptions, *, attn: str, sparsity: float | None = None,
                                 impl: str = "auto", prompt: str | None = None, prompts: Path | None = None,
                                 budget: float = DEFAULT_BUDGET) -> DenseSearchConfig:
    """Validate a `vsagen search --suggest-dense` request: the prompts (`search_prompts`), `budget`, the backend
    (`attn`: one `NAME[:KEY=VALUE...]` entry or `auto`, with `--sparsity` / `--attn-impl` as `sparsity` / `impl`,
    resolved as `vsagen t2v` resolves it) and the JSON file (`options.output.out`, default `dense-errors.json`).

    Raises:
        BadInput: one line naming the flag, before anything loads or is written: no prompt or both, a budget
            negative or not finite, a backend without the knobs (`full`), an image-to-video model, an existing
            `out` without `overwrite`, and every refusal of the shared options and of the backend's options.
    """
    texts, notes = search_prompts(prompt, prompts)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not math.isfinite(budget) or budget < 0:
        raise BadInput(f"--budget must be a finite number >= 0 (the fraction of the summed error left), got {budget}")
    options = dataclasses.replace(options, attention=AttentionOptions(attn=attn, sparsity=sparsity, attn_impl=impl))
    src, options = search_source(options)
    out = search_out(options, DEFAULT_DENSE_OUT, "the measurements file")  # before `--device auto` imports torch
    req = resolve(src, options, prompt=texts[0], backends=ONE)
    spec = req.backends[0]
    if spec.name not in sparse_backends():
        chosen = f" (auto chose {spec.name})" if req.attn_requested != spec.name else ""
        raise BadInput(f"--suggest-dense measures a sparse backend ({', '.join(sparse_backends())}); --attn "
                       f"{req.attn_requested}{chosen} has no dense_steps / dense_layers to suggest")
    return DenseSearchConfig(**{**request_fields(req), "notes": req.notes + notes}, prompts=texts, budget=float(budget),
                             out=out)


def resolve_dense_search(*, attn: str, sparsity: float | None = None, attn_impl: str = "auto",
                         prompt: str | None = None, prompts: Path | None = None, budget: float = DEFAULT_BUDGET,
                         **flags: Any) -> DenseSearchConfig:
    """`resolve_dense_search_options` with the shared options as keyword arguments named as the flags (`model`,
    `steps`, `out`, ...: `vsagen.request.options.FLAGS`), for Python callers.

    Raises:
        BadInput: see `resolve_dense_search_options`.
        TypeError: an unknown keyword.
    """
    return resolve_dense_search_options(request_options(**flags), attn=attn, sparsity=sparsity, impl=attn_impl,
                                        prompt=prompt, prompts=prompts, budget=budget)


def suggested_spec(asked: BackendSpec, suggestion: DenseSuggestion, steps: int) -> BackendSpec:
    """`asked` with the suggestion's knobs in place of its own `dense_steps` / `dense_layers` (`all` where every
    step runs dense; `min_tokens` kept as asked)."""
    k = suggestion.dense_steps
    values = {"dense_steps": None if k == 0 else "all" if k >= steps else str(k),
              "dense_layers": ",".join(map(str, suggestion.dense_layers)) or None}
    return BackendSpec(asked.name, dataclasses.replace(asked.options, **values))


@dataclass
class DenseSearchResult:
    """What `dense_search` produced: the file written and its contents (`data`), the error matrix e[step][layer],
    the suggestion and the spec it gives, the notes, scored attention calls, seconds."""

    path: Path
    data: dict[str, Any]
    errors: list[list[float]]
    suggestion: DenseSuggestion
    spec: BackendSpec
    notes: list[str]
    calls: int
    seconds: float


def _round(x: float) -> float:
    return float(f"{x:.{DIGITS}g}")


def dense_search(cfg: DenseSearchConfig, *, log: Callable[[str], None] = lambda m: None, progress: bool = True,
                 cancelled: Callable[[], bool] = lambda: False) -> DenseSearchResult:
    """Measure `cfg`'s backend against dense attention per (step, layer), suggest its knobs and write the JSON file,
    atomically and only at the end (module docstring).

    Raises:
        KeyboardInterrupt: `cancelled()` said so (after a prompt, or just before the file is written).
        BadInput: the backend or dense attention cannot run here, or `cfg.out` appeared meanwhile.
        ModelNotFound: the checkpoint cannot be loaded.
        RunFailure: out of GPU memory, or NaN / Inf in an attention output (the error is not finite).
    """
    from ..architecture import architecture_of
    from ..architecture import experts as experts_of
    from ..attention.dense_search import ErrorScorer, error_matrix, suggest_dense
    from ..media.video import write_json

    t0 = time.perf_counter()
    scorer = ErrorScorer(cfg.measured.build())
    session, plan = denoise_prompts(cfg, scorer, log=log, progress=progress, cancelled=cancelled)
    layers = min(int(architecture_of(t)["layers"]) for _, t in experts_of(session.pipe))
    sums = scorer.errors()
    if not sums:
        raise BadInput("the search scored no attention call (did the model denoise?)")
    errors = error_matrix(sums, cfg.denoise_steps, layers)
    if not all(math.isfinite(e) for row in errors for e in row):
        raise RunFailure(f"--attn {cfg.measured.name} or dense attention gave NaN or infinite outputs: nothing was "
                         "written; try another --dtype or real weights")
    suggestion = suggest_dense(errors, cfg.budget)
    spec = suggested_spec(cfg.backends[0], suggestion, cfg.denoise_steps)
    notes = list(dict.fromkeys(n for n in (cfg.attn_note, *cfg.notes, *reworded_notes(session.notes, SEARCHED))
                               if n is not None))
    given = [f"{k}={getattr(cfg.backends[0].options, k)}" for k in ("dense_steps", "dense_layers")
             if getattr(cfg.backends[0].options, k) is not None]
    if given:
        notes.append(f"the search measured {cfg.measured.name} with every call sparse; the suggestion replaces "
                     f"{', '.join(given)}")
    preset = cfg.source.preset.defaults.attention  # the knobs' text leaves out what the preset's table sets
    data = {"model": cfg.model, "attn": cfg.measured.command_text(preset),
            "backend": options_dict(cfg.measured.options),
            "height": cfg.height, "width": cfg.width, "frames": cfg.frames, "grid": list(plan.denoise_grid),
            "steps": cfg.denoise_steps, "layers": layers, "prompts": len(cfg.prompts), "sampler": cfg.sampler.name,
            "guidance": cfg.guidance, "seed": cfg.seed, "device": cfg.device, "dtype": cfg.dtype,
            "calls": scorer.calls, "budget": cfg.budget,
            "rel_l2": [[_round(e) for e in row] for row in errors],
            "rel_l2_per_expert": [{"step": s, "expert": e, "layer": layer, "rel_l2": _round(rel)}
                                  for (s, e, layer), rel in _per_expert(sums).items()],
            "total": _round(suggestion.total),
            "suggestion": {"dense_steps": suggestion.dense_steps, "dense_layers": list(suggestion.dense_layers),
                           "residual": _round(suggestion.residual), "dense_fraction": _round(suggestion.dense_fraction),
                           "attn": spec.command_text(preset)}}
    write_at_end(cfg.out, lambda: write_json(data, cfg.out, overwrite=cfg.overwrite), cancelled)
    return DenseSearchResult(cfg.out, data, errors, suggestion, spec, notes, scorer.calls, time.perf_counter() - t0)


def _per_expert(sums: dict[tuple[int, str, int], tuple[float, float]]) -> dict[tuple[int, str, int], float]:
    from ..attention.dense_search import rel_l2

    return {key: rel_l2(d, r) for key, (d, r) in sums.items()}


def _mark(dense: bool) -> str:
    return "full" if dense else "."


def dense_renderables(result: DenseSearchResult) -> list[Any]:
    """Rich renderables of a dense search: a table per layer (mean and largest error over the steps, its share of
    the summed error, whether the suggestion runs it dense), one per step, then the suggestion, the `--attn` text to
    paste, the notes and the file."""
    from rich.table import Table

    errors, sug = result.errors, result.suggestion
    steps, layers = len(errors), len(errors[0]) if errors else 0
    total = sug.total or 1.0
    tables = []
    for what, count, values, dense in (
            ("layer", layers, lambda i: [errors[s][i] for s in range(steps)], lambda i: i in sug.dense_layers),
            ("step", steps, lambda i: errors[i], lambda i: i < sug.dense_steps)):
        over = "steps" if what == "layer" else "layers"
        table = Table(title=f"{result.spec.name} against full attention: relative L2 per {what} (over the {over})",
                      title_justify="left")
        for name in (what, "mean rel L2", "max", "share of sum", "suggested"):
            table.add_column(name, justify="right", overflow="fold")
        for i in range(count):
            row = values(i)
            table.add_row(str(i), f"{sum(row) / max(len(row), 1):.4f}", f"{max(row, default=0.0):.4f}",
                          f"{100 * sum(row) / total:.1f}%", _mark(dense(i)))
        tables.append(table)
    d = result.data
    knobs = ", ".join(f"{k}={getattr(result.spec.options, k)}" for k in ("dense_steps", "dense_layers")
                      if getattr(result.spec.options, k) is not None)
    lines = [f"summed relative L2 over {steps} steps x {layers} layers: {sug.total:.4g} ({result.calls} attention "
             f"calls, {d['prompts']} prompt{'s' if d['prompts'] != 1 else ''}, denoised on full attention)",
             (f"suggested {knobs}: leaves {sug.residual:.4g} ({100 * sug.residual / total:.1f}% of the sum; budget "
              f"{100 * sug.budget:g}%) with {100 * sug.dense_fraction:.1f}% of the attention calls run full"
              if knobs else f"suggested: no dense step or layer (the sum is within the budget, "
                            f"{100 * sug.budget:g}%, with every call sparse)"),
             f"run it with --attn {shlex.quote(d['suggestion']['attn'])}",
             *(f"note: {n}" for n in result.notes),
             f"measurements: {result.path} (in {result.seconds:.1f} s)"]
    return [*tables, *lines]
