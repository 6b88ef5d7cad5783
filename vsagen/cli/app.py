"""The `vsagen` command line (Typer app only: parse, call the library, render).

Library errors (`VsagenError`) become one line on stderr and exit code 2 (bad input) or 1 (failure while
running); tracebacks appear only with --verbose (`vsagen.cli.running`). Heavy imports (torch, diffusers) happen inside
commands. Under a torchrun launch (`--ulysses`, `--cfg-parallel`) rank 0 prints; the other ranks print an error only
if rank 0 did not fail too.
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ..interrupts import SignalInterrupt  # noqa: F401 - where tracebacks and older callers name it
from ..interrupts import as_interrupt as _sigterm_as_interrupt
from ..request.options import ImageFit, ReportFormat, RequestOptions, TileFit
from .running import (check_model_available, err, ran_in_workers, report_interrupt, request_command, run_guarded,
                      single_process, torchrun_launch_or_exit)
from .serving import serve
from .shared_options import (COMPARE, GENERATE, IMAGE_PATH, PROFILE, SEARCH, SERVE, CacheList, CompareSamplers,
                             JsonOut, Model, OnceOptionsGroup, ProfileCompile, SearchAttn, SearchAttnImpl,
                             SearchBudget, SearchEps, SearchLam, SearchRanges, SearchTileFit, Sparsity, SuggestDense,
                             Verbose, choice_parser, close_options, complete_attn, complete_model, complete_quant,
                             complete_vae, path_parser, swapped_image_prompt, unquoted_prompt, usage_error)
from .terminal import StdoutClosed, quiet_stdout

app = typer.Typer(
    name="vsagen",
    help="Generate Wan video with sparse video self-attention, and see where the time went.",
    add_completion=True,  # --install-completion / --show-completion; --model and --attn complete (shared_options)
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    cls=OnceOptionsGroup,  # an option given twice is one error line, not the last one silently
    context_settings={"max_content_width": 120},  # help as wide as the terminal, up to 120 columns (click: 80)
)


def _show_version(value: bool) -> None:
    if value:
        from .. import __version__

        typer.echo(f"vsagen {__version__}")
        raise typer.Exit(0)


@app.callback()
def _options(version: Annotated[bool, typer.Option("--version", help="Print vsagen's version and exit.",
                                                   callback=_show_version, is_eager=True)] = False) -> None:
    """Generate Wan video with sparse video self-attention, and see where the time went."""


def _show_result(result: Any, cfg: Any, json_out: bool) -> None:
    """One video's result: its JSON line (`--json`), or its timing table and where its files went."""
    from .terminal import print_table, stdout_console, trimmed, write_stdout

    if json_out:
        write_stdout(json.dumps(result.summary, allow_nan=False) + "\n")
        return
    # the terminal's width (COLUMNS where set), the title broken between fields; to a pipe or a file profile's
    # width (200), the title and the lines of text whole, for grep
    con, wraps = stdout_console()
    s = result.summary
    ran = s["backend"].get("impl_ran")  # the implementation that ran (sparse backends: triton or torch)
    title = (f"{s['model']} | attn {s['attn']}" + (" (auto)" if cfg.attn_requested == "auto" else "")
             + _attn_details(cfg, s["backend"])
             + (" | torch reference (slow: the Triton kernels run on CUDA)" if ran == "torch" else
                f" | {ran} kernels" if ran else "")
             + f" | {cfg.frames}x{cfg.height}x{cfg.width} | {cfg.steps} step{'s' if cfg.steps != 1 else ''}"
             + (f" {cfg.sampler.name} (CFG off)" if cfg.sampler.renoise else "")
             + (f" | cache {cfg.cache.short_text()}" if cfg.cache.enabled else "")
             + f" | {cfg.device} {cfg.dtype}"
             + (f" | offload {cfg.offload}" if cfg.offload != "none" else "")
             + (f" | {cfg.quant} linears" if cfg.quant != "none" else "")
             + (f" | ulysses {cfg.ulysses}" if cfg.ulysses > 1 else "")
             + (" | CFG parallel" if cfg.cfg_parallel else "")
             + (" | VAE tiled" if s["vae_tiling"] else "")
             + (" | light VAE decoder" if s.get("vae_decoder") == "light" else "")
             + (" | tiny VAE decoder" if s.get("vae_decoder") == "tiny" else ""))
    table = result.report.rich_table(title=title, cached=cfg.cache.enabled)  # counts whenever a cache is set
    print_table(con, table, wraps)
    ranks = result.report.ranks_table()
    if ranks is not None:  # (a launch's per-rank table: its title whole to a pipe, no line ending in spaces)
        print_table(con, ranks, wraps)
    share = result.report.attention_share_of_dit
    with trimmed(con):  # (a line Rich wraps, COLUMNS set, is padded: off a terminal no line ends in spaces)
        con.print("attention backend share of DiT time: " + (f"{100 * share:.1f}%" if share is not None else
                  "not timed (compiled into the transformer blocks; `vsagen profile --kernels` times it alone)"),
                  highlight=False, markup=False, soft_wrap=not wraps)
        con.print(f"video: {result.video_path}\ntiming: {result.json_path}" + (f"\nsheet: {cfg.sheet_out}" if
                  cfg.sheet_out is not None else ""), highlight=False, markup=False, soft_wrap=not wraps)


def _attn_details(cfg: Any, backend: dict[str, Any]) -> str:
    """The backend's part of a run's title after its name: " (sparsity 0.875, tile 4x4x8, precision int8)" (the
    sparsity or top-k, a cube other than 4x4x4, a fine-stage precision other than bf16, "every call dense" where
    the knobs (dense_steps, dense_layers, min_tokens) ran no call sparse), "" where none applies."""
    details = ([f"sparsity {cfg.sparsity}"] if cfg.sparsity is not None else
               [f"top-k {backend['topk']:g}"] if "topk" in backend else [])
    details += [f"tile {backend['tile']}"] if cfg.sparsity is not None and backend.get("tile") not in (None, "4x4x4") \
        else []
    details += [f"precision {backend['precision']}"] if backend.get("precision", "bf16") != "bf16" else []
    details += ["every call dense"] if backend.get("dense_calls") and backend.get("sparse_calls") == 0 else []
    return f" ({', '.join(details)})" if details else ""


def _generate_command(prompt: str, options: RequestOptions, *, image: Optional[Path], fit: ImageFit,
                      json_out: bool, verbose: bool, last_image: Optional[Path] = None) -> None:
    """The body of `vsagen t2v` and `vsagen i2v`: resolve, generate, render the table or the JSON."""

    launch = torchrun_launch_or_exit()
    writer = launch is None or launch.writer

    def run() -> None:
        from ..commands.generate_config import resolve_runs
        from ..models.loading import prepare_model_files
        from ..parallel import launch as parallel

        cfgs = resolve_runs(prompt, options, image=image, fit=fit, last_image=last_image)
        cfg = cfgs[0]
        check_model_available(cfg)
        if ran_in_workers(cfg, launch, verbose):
            return
        parallel.check_launch(cfg.ulysses, launch, "i2v" if image is not None else "t2v", cfg.cfg_parallel)
        from ..commands.generate import generate, generate_seeds
        from .terminal import stderr_log

        say = stderr_log("COLUMNS" in os.environ)  # notes wrapped between words on a terminal (or with COLUMNS)
        log = lambda m: writer and say(m)  # noqa: E731

        # the files vsagen builds (the tiny checkpoint) before a process group exists; SIGTERM / SIGHUP as Ctrl-C:
        # the mp4 and JSON or nothing
        with parallel.joined(launch, cfg, lambda: prepare_model_files(cfg)), \
                _sigterm_as_interrupt() as interrupted:
            if len(cfgs) > 1:  # --seeds: each seed's files published, and shown, before the next seed starts
                generate_seeds(cfgs, log=log, cancelled=interrupted,
                               published=lambda c, r: _show_result(r, c, json_out))
                return
            result = generate(cfg, log=log, progress=writer, writer=writer, cancelled=interrupted)
        if result is not None:  # None: a rank other than 0 (rank 0 reports)
            _show_result(result, cfg, json_out)

    run_guarded(run, verbose, rank=0 if launch is None else launch.rank)




Prompt = Annotated[str, typer.Argument(help="What the video should show.", metavar="PROMPT")]


@app.command()
@request_command(GENERATE)
def t2v(
    prompt: Annotated[Optional[str], typer.Argument(help="What the video should show (or --prompts FILE).",
                                                    metavar="PROMPT", show_default=False)] = None,
    prompts: Annotated[Optional[Path], typer.Option(
        help="Several videos from one load: one prompt a line, or a JSON object a line with the video's own seed, "
             "height, width, frames, steps, guidance, negative_prompt; video i goes to --out's NAME-000i.mp4 "
             "(default vsagen-prompts-000i.mp4).", parser=path_parser("a text file, one prompt a line"))] = None,
    json_out: JsonOut = False, verbose: Verbose = False, *, options: RequestOptions,
) -> None:
    """Text to video: write an mp4 and a timing breakdown (DiT vs attention)."""
    if prompts is not None:
        _batch_command(prompt or "", prompts, options, json_out=json_out, verbose=verbose)
        return
    if prompt is None:  # as click says it where PROMPT is required (compare); "" given is "the prompt is empty"
        raise usage_error("Missing argument 'PROMPT': say what the video should show, or give --prompts FILE")
    _generate_command(prompt, options, image=None, fit=ImageFit.CROP, json_out=json_out, verbose=verbose)


def _batch_command(prompt: str, file: Path, options: RequestOptions, *, json_out: bool, verbose: bool) -> None:
    """`vsagen t2v --prompts FILE`: every line's video from one load, each shown as it is published (its table or
    JSON line), then one summary table (not with --json)."""

    def run() -> None:
        from ..commands.batch import generate_batch, resolve_batch
        from ..errors import BadInput
        from ..models.loading import prepare_model_files
        from .terminal import print_table, stderr_log, stdout_console

        if prompt:
            raise BadInput("give PROMPT or --prompts FILE, not both")
        if torchrun_launch_or_exit() is not None:
            raise BadInput("--prompts runs its videos in one process; start one process")
        cfgs = resolve_batch(file, options)
        check_model_available(cfgs[0])
        prepare_model_files(cfgs[0])
        say = stderr_log("COLUMNS" in os.environ)
        with _sigterm_as_interrupt() as interrupted:
            results = generate_batch(cfgs, log=say, cancelled=interrupted,
                                     published=lambda c, r: _show_result(r, c, json_out))
        if not json_out:
            from rich.table import Table

            table = Table(title=f"--prompts {file}: {len(results)} video{'s' * (len(results) != 1)} from one load")
            for column in ("#", "prompt", "seed", "frames x H x W", "steps", "wait s", "video"):
                table.add_column(column, justify="right" if column in ("#", "seed", "steps", "wait s") else "left")
            for i, (cfg, result) in enumerate(zip(cfgs, results), 1):
                wait = result.report.wait_s
                table.add_row(str(i), cfg.prompt, str(cfg.seed), f"{cfg.frames}x{cfg.height}x{cfg.width}",
                              str(cfg.steps), f"{wait:.2f}" if wait is not None else "-", str(result.video_path))
            con, wraps = stdout_console()
            print_table(con, table, wraps)

    run_guarded(run, verbose)


@app.command()
@request_command(GENERATE, model=(Model, "tiny-i2v"))
def i2v(
    image: Annotated[Path, typer.Argument(help="First frame: a PNG, JPEG or WebP image.", metavar="IMAGE",
                                          parser=IMAGE_PATH)],
    prompt: Annotated[str, typer.Argument(help="What the video should show (optional: the image is the content; "
                                               "a prompt steers what moves).", metavar="PROMPT")] = "",
    fit: Annotated[ImageFit, typer.Option(parser=choice_parser(ImageFit), metavar="[crop|resize]",
                                          help="How the image (and --last-image) becomes exactly --height x --width, "
                                               "its aspect kept: 'crop' scales it to cover the size and center-crops "
                                               "the overflow; 'resize' scales it to fit inside and pads the rest with "
                                               "black. Without --height / --width the size is the preset's; "
                                               "TurboWan2.2 I2V's takes the image's aspect at its area, as "
                                               "TurboDiffusion's --adaptive_resolution.")] = ImageFit.CROP,
    last_image: Annotated[Optional[Path], typer.Option(
        help="Last frame (PNG, JPEG or WebP), fitted like IMAGE: the video goes from IMAGE to it. First/last-frame "
             "(FLF2V) models need it; image-to-video models without a CLIP branch (Wan2.2 I2V A14B) take it "
             "optionally; other models refuse it.", parser=IMAGE_PATH)] = None,
    json_out: JsonOut = False, verbose: Verbose = False, *, options: RequestOptions,
) -> None:
    """Image to video: animate IMAGE (the first frame; with --last-image, up to that last frame) into an mp4, with
    the timing breakdown of t2v."""
    if (swapped := swapped_image_prompt(image, prompt)) is not None:
        raise usage_error(swapped)
    _generate_command(prompt, options, image=image, fit=fit, last_image=last_image, json_out=json_out,
                      verbose=verbose)


@app.command()
@request_command(
    PROFILE,
    attn=(Annotated[str, typer.Option(help="Backends to compare, comma-separated (e.g. full,vsa; see `vsagen "
                                           "backends`), each with options as NAME:KEY=VALUE[:KEY=VALUE] (e.g. "
                                           "full,vsa:sparsity=0.85,vsa:sparsity=0.9: two settings of one backend).",
                                      autocompletion=complete_attn)],
          "full,vsa"),
    sparsity=(Annotated[Optional[float], typer.Option(help="Sparsity of the sparse backends in --attn (default from "
                                                           "the preset).")], None),
    attn_impl=(Annotated[str, typer.Option(help="Implementation for the backends that offer it: auto, triton or "
                                                "torch (see t2v).")], "auto"),
    steps=(Annotated[Optional[int], typer.Option(help="Timed denoising steps per configuration (default 2); the DiT "
                                                      "time is also projected to the preset's step count.")], None),
    warmup=(Annotated[Optional[int], typer.Option(help="Untimed warm-up steps before each configuration's timed "
                                                       "steps (default 1).")], None),
    tile_fit=(Annotated[str, typer.Option(help="Tile fits to run, comma-separated: partial, crop, or partial,crop "
                                               "(side by side).")], "partial"),
    out=(Annotated[Optional[Path], typer.Option(help="Write the report (in --format) to this file instead of "
                                                     "stdout.", parser=path_parser(
                                                         "a file name for the report (without --out it goes to "
                                                         "stdout)"))], None),
    compile=(ProfileCompile, False),
    cache=(CacheList, None),
)
def profile(
    fmt: Annotated[ReportFormat, typer.Option("--format", parser=choice_parser(ReportFormat),
                                              metavar="[table|markdown|csv|json]",
                                              help="table, markdown, csv or json.")] = ReportFormat.TABLE,
    plot: Annotated[Optional[Path], typer.Option(help="Also draw the DiT time per backend, split into attention "
                                                      "and the rest, as a .png/.svg/.pdf (needs matplotlib: "
                                                      "pip install 'vsagen[plot]').",
                                                      parser=path_parser("a .png, .svg or .pdf file name"))] = None,
    kernels: Annotated[bool, typer.Option("--kernels", help="Time the self-attention alone at the model's shape "
                                                            "(forward, forward+backward; against dense SDPA) "
                                                            "instead of the DiT. Loads no model.")] = False,
    stock: Annotated[bool, typer.Option(help="Also time the transformer with diffusers' own processors and "
                                             "`full` in tile order: vsagen's own overhead.")] = True,
    prompt: Annotated[str, typer.Option(help="Prompt (real weights; random weights use random "
                                             "embeddings).")] = "a red fox running through fresh snow, cinematic",
    verbose: Verbose = False, *, options: RequestOptions,
) -> None:
    """Compare attention backends on one loaded model: DiT and attention time per step, speed-up vs full.

    The model is loaded once; every backend (and tile fit) then denoises from the same seed and prompt
    embeddings: warm-up steps untimed, then the timed steps (latents only: no VAE decode, no video). Under
    torchrun with --ulysses / --cfg-parallel every configuration is split across the processes; rank 0 reports.
    """
    launch = torchrun_launch_or_exit()
    writer = launch is None or launch.writer

    def run() -> None:
        from ..commands.profile_config import resolve_profile_options
        from ..models.loading import prepare_model_files
        from ..parallel import launch as parallel
        from .terminal import stderr_log

        cfg = resolve_profile_options(options, prompt=prompt, fmt=fmt, plot=plot, stock=stock, kernels=kernels)
        if not cfg.kernels:  # (--kernels loads no model)
            check_model_available(cfg)
        if ran_in_workers(cfg, launch, verbose):
            return
        parallel.check_launch(cfg.ulysses, launch, "profile", cfg.cfg_parallel)
        say = stderr_log("COLUMNS" in os.environ)
        log = lambda m: writer and say(m)  # noqa: E731
        from ..commands.profile import profile_dit, profile_kernels
        from ..commands.profile_render import render, write_plot

        # SIGTERM / SIGHUP as Ctrl-C: no partial report or plot
        with parallel.joined(launch, cfg, lambda: prepare_model_files(cfg)), _sigterm_as_interrupt():
            report = profile_kernels(cfg, log=log) if cfg.kernels else profile_dit(cfg, log=log, writer=writer)
            if report is None:  # a rank other than 0: rank 0 reports
                return
            # notes wrapped for a terminal (or where COLUMNS is set); to a pipe or file one line each, for grep
            text = render(report, cfg.fmt, wrap_notes="COLUMNS" in os.environ or (cfg.out is None and
                                                                              sys.stdout.isatty()))
            if cfg.fmt == "csv":  # a CSV holds the rows only: its notes on stderr, as t2v's
                for note in report.notes:
                    log(f"note: {note}")
            if cfg.plot is not None:
                write_plot(report, cfg.plot, overwrite=cfg.overwrite)
                log(f"plot: {cfg.plot}")
            if cfg.out is not None:
                from ..media.video import write_text

                write_text(text, cfg.out, overwrite=cfg.overwrite)
                log(f"report: {cfg.out}")
        if cfg.out is None:
            from .terminal import write_stdout

            write_stdout(text)

    run_guarded(run, verbose, rank=0 if launch is None else launch.rank)


@app.command()
@request_command(
    COMPARE,
    attn=(Annotated[str, typer.Option(help="Backends, comma-separated, the first the reference (e.g. full,vsa,"
                                           "sla-star; see `vsagen backends`), each with options as "
                                           "NAME:KEY=VALUE[:KEY=VALUE] (e.g. full,vsa:sparsity=0.9).",
                                      autocompletion=complete_attn)], "full,vsa"),
    sparsity=(Annotated[Optional[float], typer.Option(help="Sparsity of the sparse backends in --attn "
                                                           "(default from the preset).")], None),
    out=(Annotated[Optional[Path], typer.Option(help="Output folder (created if missing; default "
                                                     "vsagen-<model>-compare-seed<seed>): an mp4 per backend, "
                                                     "side-by-side.mp4, compare.png, compare.json, compare.csv.",
                                                parser=path_parser("a folder name (created if missing)", folder=True))],
         None),
    warmup=(Annotated[Optional[int], typer.Option(help="Untimed warm-up denoising steps before each run (default "
                                                       "1; a re-noise sampler warms up with one whole pass).")], None),
    sampler=(CompareSamplers, None),
    cache=(CacheList, None),
    vae=(Annotated[str, typer.Option("--vae", metavar="DECODER[,DECODER...]",
                                     help="The decoder(s) of the latents, as t2v's --vae takes one (stock, light, "
                                          "tiny[:weights=FILE|:name=NAME], auto). Several, comma-separated, the "
                                          "first the reference (e.g. stock,tiny): each DiT run's final latents are "
                                          "decoded by each (the DiT runs once per backend, sampler and cache), "
                                          "each decode a run of its own with its seconds and those saved against "
                                          "the reference's; with one --attn, PSNR / SSIM are each decoder's "
                                          "against the reference decoder on the same latents.",
                                     autocompletion=complete_vae)], "auto"),
    quant=(Annotated[str, typer.Option("--quant", metavar="PRECISION[,PRECISION...]",
                                       help="The precision(s) of the transformer blocks' linears, as t2v's --quant "
                                            "takes one (none, fp8, int8, auto). Several, comma-separated, the first "
                                            "the reference (e.g. none,int8): the model loads once, each precision's "
                                            "linears are built once and swapped in for its runs, and every run runs "
                                            "in each.", autocompletion=complete_quant)], "auto"),
)
def compare(
    prompt: Prompt,
    error_steps: Annotated[str, typer.Option(help="Denoising steps (0-based, or first, middle, last; "
                                                  "comma-separated; or none) at which every layer's attention "
                                                  "output is compared with dense attention on the same q, k, v.")]
    = "first,middle,last",
    plot: Annotated[Optional[bool], typer.Option(help="Draw compare.png (needs matplotlib: pip install "
                                                      "'vsagen[plot]'); by default drawn when matplotlib is "
                                                      "installed, else skipped with a note.")] = None,
    json_out: JsonOut = False, verbose: Verbose = False, *, options: RequestOptions,
) -> None:
    """Compare attention backends, samplers, step caches, VAE decoders and --quant precisions against the first run
    on one loaded model: every (sampler, backend, cache) triple in each precision, the same seed, noise and settings
    for each, its latents decoded by each --vae decoder; DiT s/video, s/step and speed-up, decode s and s saved, PSNR / SSIM of the video per frame and
    overall, latent distance, and each layer's attention error against dense attention. Writes every video, a
    labelled side-by-side video, a plot, a JSON and a CSV into --out, once every run has run."""

    def run() -> None:
        from ..commands.compare_config import resolve_compare_options
        from .terminal import print_table, stderr_log, stdout_console, trimmed, write_stdout

        cfg = resolve_compare_options(prompt, options, error_steps=error_steps, plot=plot)  # before torch loads
        check_model_available(cfg)
        from ..commands.compare import compare as run_compare

        say = stderr_log("COLUMNS" in os.environ)
        said: set[str] = set()

        def log(m: str) -> None:
            said.add(m)
            say(m)

        with _sigterm_as_interrupt() as interrupted:
            report = run_compare(cfg, log=log, cancelled=interrupted)
        if json_out:
            write_stdout(json.dumps(report.to_dict(), allow_nan=False) + "\n")
            return
        from ..commands.compare_render import rich_table

        # the terminal's width (COLUMNS where set): cells wrap between words, no digit is cut; to a pipe or a file
        # profile's width (200), the files line whole
        con, wraps = stdout_console()
        print_table(con, rich_table(report), wraps)
        for note in report.notes:  # notes on stderr, as t2v's; each once (the run's own were said as it began)
            if f"note: {note}" not in said:
                log(f"note: {note}")
        with trimmed(con):  # (wrapped with COLUMNS set: no line ending in spaces off a terminal)
            con.print(f"files: {cfg.out}/ (" + ", ".join(Path(p).name for p in report.files.values()) + ")",
                      markup=False, highlight=False, soft_wrap=not wraps)

    run_guarded(single_process(run), verbose)


@app.command()
@request_command(SEARCH, out=(Annotated[Optional[Path], typer.Option(
    help="The JSON file to write: the pattern file (default patterns.json), or with --suggest-dense the "
         "measurements and the suggestion (default dense-errors.json).", parser=path_parser("a .json file name"))],
    None), tile_fit=(SearchTileFit, TileFit.PARTIAL))
def search(
    prompt: Annotated[Optional[str], typer.Option(help="The prompt to search on (or --prompts).")] = None,
    prompts: Annotated[Optional[Path], typer.Option(help="A file of prompts as t2v --prompts reads it: one a line, "
                                                         "as text or a JSON object {\"prompt\": ...} (blank lines "
                                                         "and # comments skipped); the errors are averaged over "
                                                         "all of them. A line's own seed, size, frames, steps, "
                                                         "guidance or negative prompt are ignored, with a note: "
                                                         "every prompt runs with the command line's values.",
                                                    parser=path_parser("a text file of prompts"))] = None,
    lam: SearchLam = None, eps: SearchEps = None, ranges: SearchRanges = None, attn_impl: SearchAttnImpl = "auto",
    suggest_dense: SuggestDense = False, attn: SearchAttn = None, sparsity: Sparsity = None,
    budget: SearchBudget = None, verbose: Verbose = False, *, options: RequestOptions,
) -> None:
    """Search Sparse-vDiT patterns: denoise with full attention and give every (step range, expert, layer, head)
    the attention mode (dense, skip, diagonal, multi-diagonal, vertical-stripe, mixed) of lowest relative MSE +
    lam x block density, scored on the run's own q, k, v; write them as a pattern file for
    --attn sparse-vdit:patterns=FILE. The relative MSE is mean((O_mode - O_full)^2) / mean(O_full^2) per head,
    averaged over steps, CFG passes and prompts (scale-free, unlike the paper's raw MSE). No video is decoded; the
    file is written only when the search ends (an interrupted search writes nothing).

    With --suggest-dense --attn SPEC: run the sparse backend SPEC beside full attention on the same q, k, v in every
    self-attention call, its error sqrt(sum ||O - O_full||^2 / sum ||O_full||^2) per (step, layer) over the CFG
    passes and prompts; of every dense_steps=k, dense_layers=D, suggest the one running the fewest (step, layer)
    entries full that leaves at most --budget x the error summed over all entries (ties: fewer knob values, then
    fewer steps). Prints the error per layer and per step and the --attn text to paste."""
    def run() -> None:
        from ..commands.search import resolve_search_options, search, summary_renderables
        from ..commands.search_dense import (check_search_mode, dense_renderables, dense_search,
                                             resolve_dense_search_options)
        from .terminal import print_table, stderr_log, stdout_console, wrap_line

        check_search_mode(suggest_dense, attn=attn, sparsity=sparsity, budget=budget, lam=lam, eps=eps, ranges=ranges)
        if suggest_dense:
            cfg = resolve_dense_search_options(options, attn=attn, sparsity=sparsity, impl=attn_impl, prompt=prompt,
                                               prompts=prompts, **({} if budget is None else {"budget": budget}))
        else:
            cfg = resolve_search_options(options, prompt=prompt, prompts=prompts, impl=attn_impl,
                                         **{k: v for k, v in (("lam", lam), ("eps", eps), ("ranges", ranges))
                                            if v is not None})
        check_model_available(cfg)
        with _sigterm_as_interrupt() as interrupted:
            if suggest_dense:
                items = dense_renderables(dense_search(cfg, log=stderr_log("COLUMNS" in os.environ),
                                                       cancelled=interrupted))
            else:
                items = summary_renderables(search(cfg, log=stderr_log("COLUMNS" in os.environ),
                                                   cancelled=interrupted))
        # the terminal's width (COLUMNS where set): words wrap whole, no digit is cut; to a pipe or a file profile's
        # width (200), each note and line of text whole, for grep
        con, wraps = stdout_console()
        for item in items:  # the notes with the summary (every one of them: stdout)
            if isinstance(item, str):
                con.print(wrap_line(item, con.width if wraps else None), highlight=False, markup=False,
                          soft_wrap=True)
            else:
                print_table(con, item, wraps)

    run_guarded(single_process(run), verbose)


@app.command()
def presets() -> None:
    """List the bundled model presets and their defaults, sized to the terminal: one table where it fits, else (80
    columns) the defaults and the commands and weights as two tables, else a paragraph per preset; nothing cut."""
    from .listing import print_presets

    print_presets()


@app.command()
def backends() -> None:
    """List the self-attention backends this build provides: which one runs by default, what each is, its
    implementations and its options (set as NAME:KEY=VALUE)."""
    from .listing import print_backends

    print_backends(typer.echo)


@app.command()
def download(
    preset: Annotated[str, typer.Argument(help="A preset (see `vsagen presets`).", metavar="PRESET",
                                          autocompletion=complete_model)],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List the files and their sizes (from the hub's "
                                                            "metadata) without downloading.")] = False,
    verbose: Verbose = False,
) -> None:
    """Download exactly the files PRESET's runs read (every component's config and weights, a transformer the preset
    names, its light VAE decoder) into the Hugging Face cache: their sizes and the total first, then a progress bar
    per file. Later runs find them there, offline too."""

    def run() -> None:
        from ..commands.download import download as fetch
        from ..commands.download import plan_download, plan_lines

        plan = plan_download(preset)
        for line in plan_lines(plan):
            typer.echo(line)
        if not dry_run:
            fetch(plan, log=typer.echo)

    run_guarded(single_process(run), verbose)


app.command()(request_command(SERVE)(serve))  # (the command itself: vsagen.cli.serving)


def main() -> None:
    """Console-script entry point: usage errors also become one `error:` line (exit code 2); no command at all
    prints the help and exits 2.

    Typer may vendor its own copy of click, so click's exceptions are recognised by their interface
    (`format_message`, `exit_code`) rather than by class.
    """
    from ..interrupts import process
    from ..models.compile_caches import use_compile_caches
    from ..parallel.spawn import die_with_agent, record_exit

    use_compile_caches()  # before torch loads: compiled code kept in vsagen's cache, for this command and its workers
    speaks = os.environ.get("RANK", "0") in ("", "0")  # a rank of a torchrun launch other than 0 prints no interrupt
    try:
        # from here Ctrl-C / SIGTERM / SIGHUP end the command with its one line (also while torch imports); once its
        # files are in place, a late one no longer changes its exit. Named `vsagen` however started (`python -m
        # vsagen`, torchrun): the completion script and its variable (_VSAGEN_COMPLETE) are the command's, as the
        # usage lines are
        with process(speaks=speaks) as guard:
            die_with_agent()  # a worker of `--gpus N` ends with the vsagen process that started it
            code = app(standalone_mode=False, prog_name="vsagen")
            if code == 130 and guard is not None and guard.raised:  # Typer's exit for a KeyboardInterrupt outside a
                code = report_interrupt(SignalInterrupt(guard.first(), guard.kept), speaks)  # its report (parsing)
    except KeyboardInterrupt as e:
        code = report_interrupt(e, speaks)
    except StdoutClosed:  # stdout's reader went away (`vsagen presets | head -1`; a command's own: `run_guarded`)
        quiet_stdout()
        code = 0
    except Exception as e:  # noqa: BLE001 - re-raised below unless it is click's
        name = type(e).__name__
        ctx = getattr(e, "ctx", None)
        if name == "Abort" and isinstance(e.__cause__, KeyboardInterrupt):  # click's word for an interrupt
            code = report_interrupt(e.__cause__, speaks)
        elif name == "NoArgsIsHelpError" and ctx is not None:  # no command: the help, as a usage error (exit 2)
            typer.echo(ctx.get_help())
            code = 2
        elif hasattr(e, "format_message") and hasattr(e, "exit_code"):
            if name == "NoSuchOption" and ctx is not None:  # suggest only options close to what was typed
                e.possibilities = close_options(e.option_name, [o for p in ctx.command.params for o in p.opts
                                                                    if o.startswith("-")])
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            err(f"{(unquoted_prompt(e.format_message(), ctx) if ctx is not None else None) or e.format_message()}"
                f"{hint}")
            code = e.exit_code
        elif name == "Abort":
            err("aborted")
            code = 1
        else:
            raise
    code = code if isinstance(code, int) else 0
    record_exit(code)  # a worker of `--gpus N`: for its agent, should a signal stop it (`signalled_status`)
    sys.exit(code)


if __name__ == "__main__":
    main()
