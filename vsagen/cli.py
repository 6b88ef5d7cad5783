"""The `vsagen` command line (Typer app only: parse, call the library, render).

Library errors (`VsagenError`) become one line on stderr and exit code 2 (bad input) or 1 (failure while
running); tracebacks appear only with --verbose. Heavy imports (torch, diffusers) happen inside commands.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from .errors import VsagenError

app = typer.Typer(
    name="vsagen",
    help="Generate Wan video with sparse video self-attention, and see where the time went.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _err(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)


def _run_guarded(fn, verbose: bool) -> None:
    """Call fn(); map errors to one line and an exit code."""
    try:
        fn()
    except VsagenError as e:
        if verbose:
            raise
        _err(str(e))
        raise typer.Exit(e.exit_code) from None
    except KeyboardInterrupt:
        _err("interrupted; nothing was written")
        raise typer.Exit(130) from None
    except (typer.Exit, typer.Abort):
        raise
    except Exception as e:  # noqa: BLE001 - the user gets one line; --verbose shows the traceback
        if verbose:
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        _err(f"{type(e).__name__}: {first} (run again with --verbose for the traceback)")
        raise typer.Exit(1) from None


@app.command()
def t2v(
    prompt: Annotated[str, typer.Argument(help="What the video should show.", metavar="PROMPT")],
    model: Annotated[str, typer.Option(help="Preset name (see `vsagen presets`), local diffusers directory, "
                                            "or hub id.")] = "wan2.1-t2v-1.3b",
    attn: Annotated[str, typer.Option(help="Self-attention backend: full, vsa.")] = "full",
    sparsity: Annotated[Optional[float], typer.Option(help="Fraction of key tiles skipped per query tile "
                                                            "(sparse backends; default from the preset).")] = None,
    attn_impl: Annotated[str, typer.Option(help="Backend implementation: auto (vsa: Triton kernels on CUDA, "
                                                "the torch reference elsewhere), triton or torch.")] = "auto",
    height: Annotated[Optional[int], typer.Option(help="Pixels (multiple of the model's spatial stride).")] = None,
    width: Annotated[Optional[int], typer.Option(help="Pixels (multiple of the model's spatial stride).")] = None,
    frames: Annotated[Optional[int], typer.Option(help="Frames, of the form 4k+1.")] = None,
    steps: Annotated[Optional[int], typer.Option(help="Denoising steps.")] = None,
    guidance: Annotated[Optional[float], typer.Option(help="CFG scale (> 1 runs two DiT passes a step).")] = None,
    guidance_2: Annotated[Optional[float], typer.Option(help="CFG scale of the second expert (two-expert models "
                                                             "such as tiny-a14b; default from the preset, else "
                                                             "--guidance).")] = None,
    negative_prompt: Annotated[Optional[str], typer.Option(help="Negative prompt for CFG.")] = None,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    fps: Annotated[Optional[int], typer.Option(help="Frames per second of the mp4.")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Output mp4; the timing JSON goes beside it "
                                                     "(same name, .json).")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace existing output files.")] = False,
    device: Annotated[str, typer.Option(help="auto, cuda or cpu.")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto (bf16 on CUDA, fp32 on CPU), bf16, fp16 or fp32.")] = "auto",
    tile_fit: Annotated[str, typer.Option(help="Grids not multiple of 4: 'partial' edge tiles, or 'crop' "
                                               "(denoise a larger latent, crop before decode).")] = "partial",
    random_weights: Annotated[bool, typer.Option(help="The preset's real architecture with random weights and "
                                                      "random prompt embeddings (timing without a download).")]
    = False,
    allow_pickle: Annotated[bool, typer.Option(help="Also load pickle (.bin/.pt) weights; they can run code.")]
    = False,
    warmup: Annotated[int, typer.Option(help="Untimed warm-up denoising steps before the timed run.")] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout instead of the "
                                                          "table.")] = False,
    verbose: Annotated[bool, typer.Option(help="Show tracebacks.")] = False,
) -> None:
    """Text to video: write an mp4 and a timing breakdown (DiT vs attention)."""

    def run() -> None:
        from .config import resolve

        cfg = resolve(prompt, model=model, attn=attn, sparsity=sparsity, attn_impl=attn_impl, height=height,
                      width=width, frames=frames, steps=steps, guidance=guidance, guidance_2=guidance_2,
                      negative_prompt=negative_prompt,
                      seed=seed, fps=fps, out=out, overwrite=overwrite, device=device, dtype=dtype, tile_fit=tile_fit,
                      random_weights=random_weights, allow_pickle=allow_pickle, warmup=warmup)
        from rich.console import Console

        err = Console(stderr=True)
        from .pipeline import generate

        result = generate(cfg, log=lambda m: err.print(m, markup=False, highlight=False, soft_wrap=True), progress=True)
        if json_out:
            sys.stdout.write(json.dumps(result.summary, allow_nan=False) + "\n")
            return
        con = Console()
        s = result.summary
        title = (f"{s['model']} | attn {s['attn']}"
                 + (f" (sparsity {cfg.sparsity})" if cfg.sparsity is not None else "")
                 + f" | {cfg.frames}x{cfg.height}x{cfg.width} | {cfg.steps} steps | {cfg.device} {cfg.dtype}")
        con.print(result.report.rich_table(title=title))
        con.print(f"attention backend share of DiT time: {100 * result.report.attention_share_of_dit:.1f}%",
                  highlight=False)
        con.print(f"video: {result.video_path}\ntiming: {result.json_path}", highlight=False, markup=False)

    _run_guarded(run, verbose)


@app.command()
def presets() -> None:
    """List the bundled model presets and their defaults."""
    from rich.console import Console
    from rich.table import Table

    from .presets import load_preset, preset_names

    table = Table(title="presets (vsagen t2v --model NAME)", title_justify="left")
    for col in ("name", "size (WxH)", "frames", "steps", "guidance", "flow shift", "fps", "weights"):
        table.add_column(col, justify="left" if col in ("name", "weights") else "right")
    for name in preset_names():
        p = load_preset(name)
        d = p.defaults
        weights = p.hub_id if p.source == "hub" else "built offline (random)"
        table.add_row(name, f"{d.width}x{d.height}", str(d.frames), str(d.steps), f"{d.guidance:g}",
                      f"{d.flow_shift:g}", str(d.fps), weights)
    Console(width=max(120, Console().width)).print(table)


@app.command()
def backends() -> None:
    """List the self-attention backends this build provides."""
    from .attention import backend_names, uses_sparsity

    for name in backend_names():
        typer.echo(f"{name:8s} {'sparse (takes --sparsity)' if uses_sparsity(name) else 'dense'}")


def main() -> None:
    """Console-script entry point: usage errors also become one `error:` line (exit code 2).

    Typer may vendor its own copy of click, so click's exceptions are recognised by their interface
    (`format_message`, `exit_code`) rather than by class.
    """
    try:
        code = app(standalone_mode=False)
    except Exception as e:  # noqa: BLE001 - re-raised below unless it is click's
        name = type(e).__name__
        ctx = getattr(e, "ctx", None)
        if name == "NoArgsIsHelpError" and ctx is not None:
            typer.echo(ctx.get_help())
            code = 0
        elif hasattr(e, "format_message") and hasattr(e, "exit_code"):
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            _err(f"{e.format_message()}{hint}")
            code = e.exit_code
        elif name == "Abort":
            _err("aborted")
            code = 1
        else:
            raise
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
