"""`vsagen search`: Sparse-vDiT's offline search (seed 003, arXiv 2506.03065) of one pattern per (step range, expert,
layer, head), written as a pattern file (`vsagen.sparsity.files`) for `--attn sparse-vdit:patterns=FILE`.

The model denoises with full attention (diffusers' own loop through `vsagen.pipeline.Session`, no VAE decode), the
scoring backend of `vsagen.attention.sparse_vdit_search` (`ModeScorer`) in every self-attention layer, over every
prompt; each head then gets the mode of lowest relative MSE + lam x block density (`patterns_from_scores`; the method is
in that module's docstring). `--ranges N` gives N equal step ranges their own modes. The file is written only when the
search ends (an interrupted search writes nothing).

Text-to-video models only (an image-to-video search would need input pictures). The prompts, model and output checks
and the denoise loop (`denoise_prompts`, `write_at_end`) also serve `--suggest-dense` (`vsagen.commands.search_dense`:
a sparse backend's error per (step, layer) and the dense steps / layers suggested from it).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ..architecture import architecture_of
from ..errors import BadInput
from ..media.paths import check_folder, check_target
from ..models.loading import reworded_notes
from ..models.sources import resolve_model
from ..request.backends import check_impl
from ..request.options import RequestOptions, VaeTiling, request_options
from ..request.resolve import NONE, Request, request_fields, resolve, sampler_plans
from ..sparsity.files import DEFAULT_EPS, DEFAULT_LAM, IMPLS, PatternFile, save_patterns, step_ranges
from ..sparsity.patterns import Pattern, block_density
from .batch import BatchLine, read_batch
from .generate_config import VIDEO_VALUES

DEFAULT_OUT = Path("patterns.json")

# A search makes no video: what the tiny model's random weights mean for its result (`reworded_notes`).
SEARCHED = "its attention is not a trained model's, so what the search finds means nothing"


@dataclass(frozen=True, kw_only=True)
class SearchConfig(Request):
    """A validated `vsagen search` request (see `Request` for the shared fields; `prompt` is the first prompt).

    Attributes:
        prompts: every prompt denoised (at least one), in order.
        lam, eps: the selection's cost weight and relative-MSE bound (module docstring).
        ranges: how many equal step ranges get their own modes (1 <= ranges <= steps).
        out: the pattern file to write (.json).
        impl: how the modes are computed: "auto" (Triton kernels on CUDA, torch elsewhere), "triton" or "torch".
    """

    prompts: tuple[str, ...]
    lam: float
    eps: float
    ranges: int
    out: Path
    impl: str

    def summary(self) -> dict[str, Any]:
        """JSON-ready settings."""
        return {"model": self.model, "prompts": len(self.prompts), "steps": self.steps, "ranges": self.ranges,
                "lam": self.lam, "eps": self.eps, "height": self.height, "width": self.width, "frames": self.frames,
                "guidance": self.guidance, "seed": self.seed, "device": self.device, "dtype": self.dtype,
                "tile_fit": self.tile_fit, "impl": self.impl, "out": str(self.out)}


def read_prompts(path: Path) -> tuple[str, ...]:
    """The prompts of a `--prompts` file, read as `vsagen t2v --prompts` reads it (`vsagen.commands.batch.read_batch`:
    a prompt as text or a JSON object a line, blank lines and lines starting with # skipped), each line's own values
    left out (`search_prompts` notes them).

    Raises:
        BadInput: a missing, unreadable or non-UTF-8 file, one without a prompt, or a line `read_batch` refuses.
    """
    return tuple(line.prompt for line in read_batch(Path(path).expanduser()))


def ignored_values_note(path: Path, lines: Sequence[BatchLine]) -> str | None:
    """The note of a search on a `--prompts` file whose JSON lines set a video's own values (seed, size, steps,
    guidance, negative prompt: `vsagen t2v --prompts`'s): a search runs every prompt with the command line's
    values, so it says which it leaves out, on which lines. None: no line sets one."""
    where: dict[str, list[int]] = {}
    for line in lines:
        for key in line.values:
            where.setdefault(key, []).append(line.line)
    if not where:
        return None
    keys = [k for k in VIDEO_VALUES if k in where]
    said = ", ".join(f"{k} (line{'s' if len(where[k]) > 1 else ''} {', '.join(map(str, where[k]))})" for k in keys)
    return (f"--prompts {path}: a search takes each line's prompt only; {said} are ignored: every prompt runs with the "
            f"command line's {', '.join('--' + k.replace('_', '-') for k in keys)}")


def search_prompts(prompt: str | None, prompts: Path | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The prompts a search denoises: `prompt`, or those of the file `prompts` (read as `vsagen t2v --prompts`
    reads it: `vsagen.commands.batch.read_batch`), exactly one; and the notes: the values of its JSON lines the
    search leaves out (`ignored_values_note`).

    Raises:
        BadInput: neither or both, an empty prompt, a prompts file `read_batch` refuses.
    """
    if (prompt is None) == (prompts is None):
        raise BadInput("give the prompts to search on: --prompt TEXT or --prompts FILE (one prompt a line), not both"
                       if prompt is not None else "give the prompts to search on: --prompt TEXT or --prompts FILE "
                       "(one prompt a line)")
    if prompt is not None:
        if not prompt.strip():
            raise BadInput("--prompt is empty")
        return (prompt.strip(),), ()
    path = Path(prompts).expanduser()  # type: ignore[arg-type]
    lines = read_batch(path)
    note = ignored_values_note(path, lines)
    return tuple(line.prompt for line in lines), (() if note is None else (note,))


def search_source(options: RequestOptions) -> tuple[Any, RequestOptions]:
    """The model a search runs (`resolve_model`) and `options` as a search runs them: no warm-up, no VAE tiling (it
    decodes nothing).

    Raises:
        BadInput: an image-to-video model (a search would need input pictures), or one `resolve_model` refuses.
    """
    model = options.model.model
    src = resolve_model(model)
    if src.image_to_video:
        raise BadInput(f"--model {model} is an image-to-video model; vsagen search runs text-to-video models "
                       "(searching with input pictures is not supported)")
    return src, dataclasses.replace(options, sampling=dataclasses.replace(options.sampling, warmup=0),
                                    placement=dataclasses.replace(options.placement, vae_tiling=VaeTiling.OFF))


def search_out(options: RequestOptions, default: Path, what: str) -> Path:
    """The JSON file a search writes (`--out`, else `default`), checked: a .json name, absent (or `--overwrite`),
    its folder writable. `what` names the file in the message ("the pattern file"). Called before `resolve`, which
    finds the device (`--device auto` imports torch): a target that cannot be written is refused before that.

    Raises:
        BadInput: any of those, naming --out.
    """
    out = options.output.out if options.output.out is not None else default
    if not out.name or out.name in (".", "..") or out.suffix.lower() != ".json" or out.name.lower() == ".json":
        raise BadInput(f"--out {str(out)!r}: {what} is JSON; give a file name ending in .json")
    check_target(out, options.output.overwrite, "--out")
    check_folder(out.parent)
    return out


def resolve_search_options(options: RequestOptions, *, prompt: str | None = None, prompts: Path | None = None,
                           lam: float = DEFAULT_LAM, eps: float = DEFAULT_EPS, ranges: int = 1,
                           impl: str = "auto") -> SearchConfig:
    """Validate a `vsagen search` request: the shared part (`vsagen.request.resolve.resolve`; no backend option, the
    search runs its own) and its own: the prompts (`prompt`, or `prompts`, a file: `search_prompts`), lam, eps, the
    step ranges, `impl` ("auto", "triton" or "torch", the modes' implementation) and the pattern file to write
    (`options.output.out`, .json, default `patterns.json`).

    Raises:
        BadInput: any invalid setting (one message naming the flag), before anything is loaded or written: no
            prompt or both, an empty prompts file, lam or eps negative or not finite, ranges outside [1, steps],
            an image-to-video model, an existing `out` without `overwrite`, an unwritable folder.
    """
    texts, notes = search_prompts(prompt, prompts)
    for flag, value in (("--lam", lam), ("--eps", eps)):
        if not math.isfinite(value) or value < 0:
            raise BadInput(f"{flag} must be a finite number >= 0, got {value}")
    check_impl(impl, sorted(IMPLS))
    src, options = search_source(options)
    plan = sampler_plans(src, options)[0]  # a distilled preset's few-step sampler decides the steps it searches
    step_ranges(plan.steps, ranges)  # before `resolve`, which finds the device (`--device auto` imports torch)
    out = search_out(options, DEFAULT_OUT, "the pattern file")
    req = resolve(src, options, prompt=texts[0], backends=NONE)
    if impl == "triton" and req.device != "cuda":
        from ..kernels.tuning import interpreting

        if not interpreting():
            raise BadInput("--attn-impl triton needs a CUDA device (or TRITON_INTERPRET=1); use --attn-impl torch")
    return SearchConfig(**{**request_fields(req), "notes": req.notes + notes}, prompts=texts, lam=float(lam),
                        eps=float(eps), ranges=ranges, out=out, impl=impl)


def resolve_search(*, prompt: str | None = None, prompts: Path | None = None, lam: float = DEFAULT_LAM,
                   eps: float = DEFAULT_EPS, ranges: int = 1, attn_impl: str = "auto", **flags: Any) -> SearchConfig:
    """`resolve_search_options` with the shared options as keyword arguments named as the flags
    (`vsagen.request.options.FLAGS`: model, height, steps, device, out, ...), for Python callers.

    Raises:
        BadInput: see `resolve_search_options`.
        TypeError: an unknown keyword.
    """
    return resolve_search_options(request_options(**flags), prompt=prompt, prompts=prompts, lam=lam, eps=eps,
                                  ranges=ranges, impl=attn_impl)


@dataclass
class SearchResult:
    """What a search produced: the file written, its contents, the notes, scored attention calls, seconds, and
    the block density of the searched run under the file's modes (`run_density`)."""

    path: Path
    patterns: PatternFile
    notes: list[str]
    calls: int
    seconds: float
    density: float


def search(cfg: SearchConfig, *, log: Callable[[str], None] = lambda m: None, progress: bool = True,
           modes: Sequence[Pattern] | None = None, cancelled: Callable[[], bool] = lambda: False) -> SearchResult:
    """Run the search of `cfg` (module docstring) and write its pattern file, atomically and only at the end (an
    interrupted search writes nothing).

    Args:
        cfg: the validated request (`resolve_search`).
        log: receives progress lines; progress: show diffusers' progress bar per prompt.
        modes: the catalog (default `patterns.default_catalog()`).
        cancelled: asked after each prompt's run and just before the file is written; True (an interrupt that a
            finalizer swallowed) raises KeyboardInterrupt instead of going on.

    Raises:
        KeyboardInterrupt: `cancelled()` said so.
        BadInput: the model cannot run the search here (device / dtype), or `cfg.out` appeared meanwhile.
        ModelNotFound: the checkpoint cannot be loaded.
        RunFailure: out of GPU memory, or NaN / Inf in the attention outputs (`patterns_from_scores`).
    """
    from ..architecture import experts as experts_of
    from ..attention.sparse_vdit_search import ModeScorer, ScoreOptions, patterns_from_scores, run_density  # torch

    t0 = time.perf_counter()
    scorer = ModeScorer(modes, cfg.steps, cfg.ranges, ScoreOptions(cfg.impl))
    session, plan = denoise_prompts(cfg, scorer, log=log, progress=progress, cancelled=cancelled)
    transformers = experts_of(session.pipe)
    names = [n for n, _ in transformers]
    arch = architecture_of(transformers[0][1])
    patterns, notes = patterns_from_scores(
        scorer, model=cfg.model, experts=names, layers=arch["layers"], heads=arch["heads"], grid=plan.denoise_grid,
        height=cfg.height, width=cfg.width, frames=cfg.frames, lam=cfg.lam, eps=cfg.eps, prompts=len(cfg.prompts))
    write_at_end(cfg.out, lambda: save_patterns(patterns, cfg.out, overwrite=cfg.overwrite), cancelled)
    # the request's notes (a --prompts line's values left out) and the session's (random weights, compile) join the
    # search's in the summary, on one stream, each once
    notes = list(dict.fromkeys([*cfg.notes, *reworded_notes(session.notes, SEARCHED), *notes]))
    return SearchResult(cfg.out, patterns, notes, scorer.calls, time.perf_counter() - t0, run_density(scorer, patterns))


def denoise_prompts(cfg: Any, scorer: Any, *, log: Callable[[str], None] = lambda m: None, progress: bool = True,
                    cancelled: Callable[[], bool] = lambda: False) -> tuple[Any, Any]:
    """Load `cfg`'s model once with the scoring backend `scorer` and denoise every prompt of `cfg.prompts` with it
    (diffusers' own loop, `vsagen.pipeline.Session`; no VAE decode): what each search mode scores.

    Args:
        cfg: a validated search request (a `Request` with `prompts`).
        scorer: the attention backend every self-attention call runs (`ModeScorer`, `ErrorScorer`).
        log, progress, cancelled: as `search`'s.

    Returns:
        (the `Session`, its crop plan).

    Raises:
        KeyboardInterrupt: `cancelled()` said so after a prompt's run.
        BadInput, ModelNotFound, RunFailure: as `Session.load` and `Session.run`.
    """
    from ..estimate import cpu_time_estimate
    from ..pipeline import Session

    session = Session.load(cfg, [scorer], progress=progress, log=log)
    if cfg.device == "cpu":  # hours of work on a real size: said once the model loaded
        warning = cpu_time_estimate(cfg, runs=len(cfg.prompts), runs_of="prompts")
        if warning is not None:
            log(warning)
    plan = session.plan(cfg.tile_fit)
    for i, text in enumerate(cfg.prompts):
        log(f"prompt {i + 1}/{len(cfg.prompts)}: {text}")
        run_on = dataclasses.replace(session, request=dataclasses.replace(cfg, prompt=text), _prompts=None)
        run_on.run(scorer, plan, encode=True, what=f"searching (prompt {i + 1})")
        if cancelled():
            raise KeyboardInterrupt
    return session, plan


def write_at_end(out: Path, write: Callable[[], None], cancelled: Callable[[], bool]) -> None:
    """A search's last step: `write()` its file `out` (atomically, refusing an existing one unless --overwrite),
    unless `cancelled()` says an interrupt came (one a finalizer swallowed).

    Raises:
        KeyboardInterrupt: `cancelled()` said so; nothing is written.
        BadInput: `out` appeared while the search ran (and --overwrite was not given).
    """
    if cancelled():
        raise KeyboardInterrupt
    try:
        write()
    except BadInput:
        raise BadInput(f"{out} appeared during the search; nothing was written (pass --overwrite)") from None


def summary_renderables(result: SearchResult) -> list[Any]:
    """Rich renderables of a search: a table of the modes per layer (head counts per mode, the layer's block
    density), then the overall density, the expected attention speed-up (1 / density) and the file."""
    from rich.table import Table

    pf = result.patterns
    dens = {n: block_density(p, pf.tiles) for n, p in pf.modes.items()}
    table = Table(title=f"{pf.model}: heads per mode in each layer", title_justify="left",
                  caption=f"searched at {pf.frames}x{pf.height}x{pf.width} (grid {'x'.join(map(str, pf.grid))}), "
                          f"{pf.steps} step{'s' if pf.steps != 1 else ''}, "
                          f"{pf.prompts} prompt{'s' if pf.prompts != 1 else ''}, lam {pf.lam:g}, eps {pf.eps:g}",
                  caption_justify="left")
    if len(pf.ranges) > 1:
        table.add_column("steps", overflow="fold")
    if len(pf.experts) > 1:
        table.add_column("expert", overflow="fold")
    table.add_column("layer", justify="right", overflow="fold")
    for n in pf.modes:  # a hyphenated mode's header on two lines (multi-/diagonal), never cut inside a word
        table.add_column(n.replace("-", "-\n"), justify="right", overflow="fold")
    table.add_column("density", justify="right", overflow="fold")
    for r in pf.ranges:
        for e in pf.experts:
            for layer, names in enumerate(r.heads[e]):
                row = ([f"{r.start}-{r.stop - 1}"] if len(pf.ranges) > 1 else []) + \
                      ([e] if len(pf.experts) > 1 else []) + [str(layer)]
                row += [str(names.count(n)) if n in names else "." for n in pf.modes]
                row.append(f"{100 * sum(dens[n] for n in names) / len(names):.1f}%")
                table.add_row(*row)
    density = result.density
    speed = f"{1 / density:.2f}x" if density > 0 else "unbounded (every head skips)"
    counts = ", ".join(f"{n} {c}" for n, c in pf.mode_counts().items() if c)
    lines = [f"heads per mode (all ranges, experts, layers): {counts}",
             f"overall block density {100 * density:.1f}% (over the searched run's attention calls; the file's mean "
             f"over every entry: {100 * pf.density():.1f}%): expected attention speed-up {speed} (1 / density)",
             *(f"note: {n}" for n in result.notes),
             f"patterns: {result.path} ({result.calls} attention calls scored in {result.seconds:.1f} s); run them "
             f"with --attn sparse-vdit:patterns={result.path}"]
    return [table, *lines]
