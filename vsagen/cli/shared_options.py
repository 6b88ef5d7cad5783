"""The command-line options the `vsagen` commands share: one typed declaration (type, default handling, help text)
each, so `t2v`, `i2v`, `profile`, `compare` and `search` describe an option the same way, and `SHARED`: each shared
option's declaration and default by its keyword (`vsagen.request.options.FLAGS`), from which `vsagen.cli.app` adds the
options a command takes to its signature. Choices are the request layer's `str` Enums, parsed with the request's
own message. Nothing heavy is imported here (the command line answers before torch loads)."""

from __future__ import annotations

import os
import re
import shlex
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Callable, Iterable, Optional

import typer
from typer.core import TyperGroup

from ..errors import close_matches
from ..models.lora_spec import LORA_METAVAR
from ..models.sources import DEFAULT_MODEL
from ..request.options import VAE_METAVAR, Choice, Device, Dtype, Offload, Quant, TileFit, VaeDtype, VaeTiling


def choice_parser(enum: type[Choice]) -> Callable[[Any], Choice | str]:
    """Typer's parser of an Enum option: the member, or the text as given for the request to refuse (its group's
    `Choice.parse`: one `error:` line naming the flag and the choices, exit 2, as every other bad value)."""

    def parse(value: Any) -> Choice | str:
        try:
            return enum(value)
        except ValueError:
            return value

    return parse


def path_parser(what: str, folder: bool = False) -> Callable[[Any], Path]:
    """Typer's parser of a path option or argument that takes `what` (e.g. "an mp4 file name, e.g. fox.mp4"): the
    path as typed (`~` kept as given). An empty text is refused (`typer.BadParameter`: one `error:` line, exit 2,
    saying what the option takes): `Path("")` is the current folder, so `--out ""` wrote into it and `i2v "" x`
    said "image . is not a file". Unless it takes a `folder`, a text ending in a separator (`--out newdir/`) names a
    folder and is refused too: `Path` drops the separator, and the run was told "give a path ending in .mp4"."""
    separators = tuple(s for s in (os.sep, os.altsep) if s)

    def parse(value: Any) -> Path:
        if isinstance(value, Path):
            return value
        if not str(value).strip():
            raise typer.BadParameter(f"the path is empty; give {what}")
        if not folder and str(value).endswith(separators):
            raise typer.BadParameter(f"{value} names a folder (it ends in {str(value)[-1]}); give {what}")
        return Path(value)

    return parse


MP4_PATH = path_parser("a video file name (e.g. fox.mp4; .webm, .gif, or .png for PNG frames)")
IMAGE_PATH = path_parser("an image file (PNG, JPEG or WebP)")


# The suffixes of the images i2v reads (PNG, JPEG, WebP), for telling an image path from a prompt.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")


def usage_error(message: str, ctx: Any = None) -> Exception:
    """A usage error of the running command (`ctx`: its click context, default the current one), as click's own:
    `main` prints it as one `error:` line with the `--help` hint, exit 2."""
    try:  # Typer vendors click as typer._click (since 0.2x); before, it used click itself
        from typer._click import exceptions, globals as click_globals
    except ImportError:
        from click import exceptions, globals as click_globals
    return exceptions.UsageError(message, ctx=ctx if ctx is not None else click_globals.get_current_context())


def swapped_image_prompt(image: Path, prompt: str) -> str | None:
    """The line for `vsagen i2v PROMPT IMAGE` (the arguments swapped): IMAGE is no file and PROMPT names an image
    file (by its suffix), with the two in order and `...` for the command's other options (as t2v's unquoted-prompt
    line has them: a verifying trial pasted the line and lost --model); None otherwise (then the image's own checks
    speak)."""
    if image.exists() or not prompt or Path(prompt).suffix.lower() not in IMAGE_SUFFIXES or not Path(prompt).is_file():
        return None
    return (f"the arguments are IMAGE PROMPT, and {prompt} is an image while {str(image)!r} is no file: "
            f"vsagen i2v ... {shlex.quote(prompt)} {shlex.quote(str(image))} (your options where the ... is)")


def _choices(enum: type[Enum]) -> str:
    return "[" + "|".join(str(m.value) for m in enum) + "]"

def complete_model(incomplete: str) -> list[str]:
    """Shell completion of `--model`: the preset names that start with what was typed (none: the shell completes
    a folder name instead). Reads the preset files' names only (no torch, no preset parsed)."""
    from ..models.presets import preset_names

    return [name for name in preset_names() if name.startswith(incomplete)]


def complete_attn(incomplete: str) -> list[str]:
    """Shell completion of `--attn` (a comma-separated list where a command takes several): `auto` and the
    registered backend names that start with the last item typed, the items before it kept; none once the item has
    options (`NAME:...`). Reads the registry's names (no torch)."""
    from ..attention.registry import backend_names

    return _complete_list(incomplete, ("auto", *backend_names()))


def complete_vae(incomplete: str) -> list[str]:
    """Shell completion of `--vae` (a comma-separated list for `vsagen compare`), as `complete_attn`: the decoders
    (`VaeDecoder`) and `tiny:name=NAME` of each published tiny decoder (`vsagen.decode.tiny_files.PUBLISHED`) that
    start with the last item typed; none for `tiny:weights=` (the shell then completes a file name)."""
    from ..decode.tiny_files import PUBLISHED
    from ..request.options import VaeDecoder

    return _complete_list(incomplete, (*(d.value for d in VaeDecoder), *(f"tiny:name={n}" for n in PUBLISHED)))


def complete_quant(incomplete: str) -> list[str]:
    """Shell completion of `--quant` (a comma-separated list for `vsagen compare`), as `complete_attn`: the
    precisions (`Quant`) that start with the last item typed."""
    return _complete_list(incomplete, tuple(q.value for q in Quant))


def complete_sampler(incomplete: str) -> list[str]:
    """Shell completion of `--sampler` (a comma-separated list for `vsagen compare`), as `complete_attn`: the named
    samplers (`vsagen.samplers.sampler_names`, `default` first) that start with the last item typed; none once the
    item has options (`dmd:...`). Reads no torch."""
    from ..samplers import sampler_names

    return _complete_list(incomplete, sampler_names())


def _complete_list(incomplete: str, names: Iterable[str]) -> list[str]:
    """The `names` that start with the last comma-separated item of `incomplete`, the items before it kept; `auto`
    only as the first item (a list names its entries), no name an earlier item is (a list names each once). An item
    with options past what `names` spell (`vsa:`) has none."""
    head, _, last = incomplete.rpartition(",")
    taken = {"auto", *head.split(",")} if head else set()
    return [f"{head},{name}" if head else name for name in names if name.startswith(last) and name not in taken]


Model = Annotated[str, typer.Option(help="Preset name (see `vsagen presets`), local diffusers directory, or hub id.",
                                    autocompletion=complete_model)]
# The backends are not listed here (that would import them, and torch, before `--help` answers): `vsagen backends`
# lists the registry; the examples name backends that exist.
Attn = Annotated[str, typer.Option(help="Self-attention backend: auto (the default: the backend the checkpoint was "
                                        "trained for, else full; the run's notes say which and why) or a name "
                                        "`vsagen backends` lists (full, vsa, sparse-vdit, ...), with options as "
                                        "NAME:KEY=VALUE[:KEY=VALUE], e.g. vsa:sparsity=0.9:impl=torch or "
                                        "sparse-vdit:patterns=FILE.", autocompletion=complete_attn)]
Sparsity = Annotated[Optional[float], typer.Option(help="Fraction of key tiles skipped per query tile "
                                                       "(sparse backends; default from the preset).")]
AttnImpl = Annotated[str, typer.Option(help="Backend implementation: auto (vsa: Triton kernels on CUDA, with "
                                            "FlashAttention-4's fine stage where installed on an sm90 GPU and every "
                                            "cube is whole, 128 or 256 tokens; the torch reference elsewhere), "
                                            "triton, torch, or fa4 (vsa / rocm-vsa "
                                            "with a 128- or 256-token tile: FlashAttention-4's fine stage).")]
Height = Annotated[Optional[int], typer.Option(help="Pixels (multiple of the model's spatial stride).")]
Width = Annotated[Optional[int], typer.Option(help="Pixels (multiple of the model's spatial stride).")]
Frames = Annotated[Optional[int], typer.Option(help="Frames, of the form 4k+1.")]
Steps = Annotated[Optional[int], typer.Option(help="Denoising steps.")]
Guidance = Annotated[Optional[float], typer.Option(help="CFG scale (> 1 runs two DiT passes a step).")]
Guidance2 = Annotated[Optional[float], typer.Option(help="CFG scale of the second expert (two-expert models such "
                                                         "as wan2.2-t2v-a14b / wan2.2-i2v-a14b; default from the "
                                                         "preset, else --guidance).")]
FlowShift = Annotated[Optional[float], typer.Option(help="Flow-matching timestep shift of the scheduler (> 0; larger "
                                                         "spends more steps at high noise; default from the preset).")]
NegativePrompt = Annotated[Optional[str], typer.Option(help="Negative prompt for CFG (no effect with --guidance "
                                                            "<= 1, which turns CFG off; the run's notes say so).")]
Seed = Annotated[Optional[int], typer.Option(help="Random seed (default 0).")]
Seeds = Annotated[Optional[str], typer.Option(
    metavar="N,N,...", help="Several seeds, one video each (not with --seed): the model loads and the prompt is "
    "encoded once, then each seed's video is made exactly as --seed N makes it, with its own JSON (and sheet); "
    "with --out NAME.ext each goes to NAME-seedN.ext. Each seed's files are published as they are done, so "
    "Ctrl-C keeps the videos of the seeds already finished. One process (not with --gpus / --ulysses / "
    "--cfg-parallel); not with --random-weights (drawn from the seed) or a MagCache calibration.")]
SamplerOption = Annotated[Optional[str], typer.Option(
    "--sampler", metavar="NAME[:KEY=VALUE...]",
    help="How the denoising walks: default (the checkpoint's scheduler, --steps steps, CFG as --guidance says); dmd "
         "(FastWan's 3-step DMD: sigma 1, 0.757, 0.522, CFG off); dmd-hummingbird (Hummingbird-XT's: 1, 0.968, "
         "0.909); rcm (TurboDiffusion's, 1-4 steps: rcm:steps=4:sigma_max=80); lightx2v-4step (LightX2V's 4 Euler "
         "steps: 1, 0.9375, 0.833, 0.625); dmd:sigmas=1.0,0.75,0.5 for any "
         "list. A few-step sampler sets its steps and runs without CFG: --steps (but its own count), --guidance > 1 "
         "and --flow-shift are refused with it. Default from the preset.", autocompletion=complete_sampler)]
CacheOption = Annotated[Optional[str], typer.Option(
    "--cache", metavar="NAME[:KEY=VALUE...]",
    help="Reuse DiT work across steps with diffusers' caching hooks, on every expert, with any --attn: none (the "
         "default); first-block (first-block:threshold=0.05: skip the other blocks while the first block's output "
         "barely changes); mag (options threshold=0.06, max_skip_steps=3, retention_ratio=0.2; needs the model's "
         "ratios: run once with mag:calibrate=true, which writes them to file=PATH or the vsagen cache); taylorseer "
         "(options cache_interval=5, disable_cache_before_step=3, max_order=1, lite=true). The timing table and "
         "JSON count the forwards computed and reused. Not with --compile, --offload group or several processes.")]
CacheList = Annotated[Optional[str], typer.Option(
    "--cache", metavar="LIST",
    help="Step caches, comma-separated, each run with every --attn backend (e.g. none,first-block: each backend "
         "uncached and with first-block; entries as t2v's --cache NAME[:KEY=VALUE...]); the rows count the DiT "
         "forwards computed and reused, and speed-ups are against full uncached. Default none. Not with --compile "
         "or several processes; mag needs its calibration file (calibrate with t2v).")]
CompareSamplers = Annotated[Optional[str], typer.Option(
    "--sampler", metavar="LIST",
    help="Comma-separated samplers, each run with every --attn backend (e.g. dmd,default:steps=50:guidance=5); "
         "default from the preset.", autocompletion=complete_sampler)]
Fps = Annotated[Optional[int], typer.Option(help="Frames per second of the mp4.")]
Out = Annotated[Optional[Path], typer.Option(help="The video file to write, its extension the format: .mp4 (H.264), "
                                                 ".webm (VP9), .gif (animated) or .png (PNG frames NAME-0000.png, "
                                                 "...); not a folder; default vsagen-<model>-<attn>-seed<seed>.mp4 "
                                                 "in the current folder. The timing JSON goes beside it (same name, "
                                                 ".json).",
                                             parser=MP4_PATH)]
Overwrite = Annotated[bool, typer.Option(help="Replace existing output files.")]
Sheet = Annotated[bool, typer.Option("--sheet", help="Also write a contact sheet beside each mp4 (same name, "
                                                     ".sheet.png): 8 evenly spaced frames, each labelled with its "
                                                     "index and time, under a title line.")]
Codec = Annotated[Optional[str], typer.Option("--codec", metavar="NAME[:KEY=VALUE...]",
                                             help="How the mp4 is encoded: x264 (libx264, the default: "
                                                  "x264:preset=veryfast:crf=10) or nvenc (NVIDIA's h264_nvenc, "
                                                  "where the GPU has an encoder engine; preset p1-p7); crf 0-51, "
                                                  "lower is better and larger, e.g. x264:crf=18; x264 also takes "
                                                  "threads=T (0: x264 chooses) and segments=S (S ffmpeg processes "
                                                  "each encoding a part, joined without re-encoding).")]
DeviceOption = Annotated[Device, typer.Option("--device", parser=choice_parser(Device), metavar=_choices(Device),
                                              help="auto (CUDA when available), cuda or cpu.")]
DtypeOption = Annotated[Dtype, typer.Option("--dtype", parser=choice_parser(Dtype), metavar=_choices(Dtype),
                                            help="auto (bf16 on CUDA, fp32 on CPU), bf16, fp16 or fp32.")]
TileFitOption = Annotated[TileFit, typer.Option("--tile-fit", parser=choice_parser(TileFit), metavar=_choices(TileFit),
                                                help="Grids that are not whole tiles (4x4x4, or the "
                                                     "backend's tile): 'partial' edge tiles, or 'crop' (denoise a "
                                                     "larger latent, crop before decode).")]
# search decodes nothing: its --tile-fit says what crop does to the attention it scores
SearchTileFit = Annotated[TileFit, typer.Option("--tile-fit", parser=choice_parser(TileFit), metavar=_choices(TileFit),
                                                help="Grids that are not whole tiles (4x4x4, or the backend's tile): "
                                                     "'partial' edge tiles, or 'crop' (denoise a latent rounded up "
                                                     "to whole tiles: the attention scored is that larger grid's).")]
RandomWeights = Annotated[bool, typer.Option(help="The preset's real architecture with random weights and random "
                                                  "prompt embeddings (timing without a download).")]
Transformer = Annotated[Optional[str], typer.Option(
    "--transformer", metavar="FILE[,FILE]",
    help="Transformer-only weights (.safetensors, or .pth read by torch's weights-only loader only) replacing the "
         "model's transformer, one file per expert (high-noise first); the text encoder and VAE come from --model. "
         "Original Wan or diffusers key names; TurboDiffusion's files (proj_l, int8 -quant) included.")]
LoraOption = Annotated[Optional[list[str]], typer.Option(
    "--lora", metavar=LORA_METAVAR,
    help="A LoRA (.safetensors, or a hub id owner/repo[/FILE.safetensors]) loaded into the transformer through "
         "diffusers' Wan LoRA loader: diffusers / PEFT keys, the original Wan keys, kohya / musubi-tuner's "
         "lora_unet_ keys. scale: its strength (default 1); expert: 1 (transformer), 2 (transformer_2) or both "
         "(default: every expert); fused into the weights before --quant (default) or fused=false (PEFT layers "
         "kept). Repeatable.")]
AllowPickle = Annotated[bool, typer.Option(help="Also load pickle (.bin/.pt) weights; they can run code.")]
Warmup = Annotated[int, typer.Option(help="Untimed warm-up denoising steps before the timed run.")]
OffloadOption = Annotated[Offload, typer.Option("--offload", parser=choice_parser(Offload), metavar=_choices(Offload),
                                                help="Keep weights in CPU memory and move them to the GPU as needed "
                                                     "(CUDA only): 'none', 'model' (whole components in turn) or "
                                                     "'group' (one transformer block at a time, prefetched on a CUDA "
                                                     "stream).")]
QuantOption = Annotated[Quant, typer.Option("--quant", parser=choice_parser(Quant), metavar=_choices(Quant),
                                            help="The transformer blocks' linears: 'none' (the run's dtype), 'fp8' "
                                                 "(FP8 e4m3 W8A8, row-wise scales: GPUs of compute capability "
                                                 "8.9+), 'int8' (TurboDiffusion's int8 W8A8, 128x128 block "
                                                 "scales: the CPU or sm80+), or 'auto' (int8 for a -quant preset "
                                                 "where the device runs it, else none).")]
VaeTilingOption = Annotated[VaeTiling, typer.Option("--vae-tiling", parser=choice_parser(VaeTiling),
                                                    metavar=_choices(VaeTiling),
                                                    help="Decode (and, image to video, encode the input image) with "
                                                         "diffusers' spatially tiled VAE: 'on', 'off', or 'auto' "
                                                         "(decode: untiled where its estimated memory peak fits the "
                                                         "free memory, decided when it starts; image encode: on "
                                                         "above 480x832 pixels).")]
VaeOption = Annotated[str, typer.Option("--vae", metavar=f"[{VAE_METAVAR}]",
                                        help="The decoder of the latents: 'stock' (its VAE's own), 'light' (the "
                                             "model's lightweight VAE decoder: Hummingbird-XT's), 'tiny' (TAEHV: "
                                             "taew2_1 for 16-channel latents, taew2_2 for the 48-channel Wan2.2-5B "
                                             "ones, read from the Hugging Face cache; tiny:name=lighttaew2_1 for "
                                             "LightX2V's; tiny:weights=FILE a .safetensors or .pth file) or 'auto' "
                                             "(light where the model has one by default).",
                                        autocompletion=complete_vae)]
VaeDtypeOption = Annotated[VaeDtype, typer.Option("--vae-dtype", parser=choice_parser(VaeDtype),
                                                  metavar=_choices(VaeDtype),
                                                  help="The VAE's dtype: auto (the preset's: bf16 for a text-to-"
                                                       "video decode, fp32 where it also encodes an image; the tiny "
                                                       "models' VAE follows --dtype), fp32, bf16 or fp16.")]
Compile = Annotated[bool, typer.Option("--compile", help="torch.compile the transformer blocks (diffusers' "
                                       "compile_repeated_blocks), each block one graph with the attention backend "
                                       "inside it, so the attention is not timed (graph breaks around it only for "
                                       "a backend that cannot be traced, or with --offload group). The first step "
                                       "pays the compilation: use --warmup 1. The compiled code is kept in the "
                                       "vsagen cache ($VSAGEN_CACHE/compile): a later run at the same sizes "
                                       "reuses it (only Dynamo's tracing is repeated).")]
ProfileCompile = Annotated[bool, typer.Option("--compile", help="torch.compile the transformer blocks (diffusers' "
                                              "compile_repeated_blocks), each block one graph with the attention "
                                              "backend inside it, so the attention columns read '-' (time it with "
                                              "--kernels); every configuration compiles in its warm-up step.")]
JsonOut = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout instead of the table.")]
Verbose = Annotated[bool, typer.Option(help="Show tracebacks.")]
Gpus = Annotated[Optional[int], typer.Option("--gpus", "--nproc", metavar="N", help="Split the run across N "
                                             "processes that vsagen starts (one per GPU on CUDA; gloo processes "
                                             "with --device cpu): --ulysses / --cfg-parallel default from N (CFG "
                                             "parallel on two halves when CFG is on, else Ulysses N). Rank 0 "
                                             "prints and writes the files.")]
Ulysses = Annotated[Optional[int], typer.Option(metavar="N", help="Split the transformer's sequence across N "
                                                "processes (Ulysses sequence parallelism through diffusers' context "
                                                "parallelism; every backend): with --gpus N, or under torchrun "
                                                "--nproc_per_node N -m vsagen ... (default 1; from --gpus).")]
CfgParallel = Annotated[bool, typer.Option("--cfg-parallel", help="Run the conditional and unconditional CFG passes "
                                           "on different processes (needs --guidance > 1): --gpus 2, or 2 x N "
                                           "processes with --ulysses N (or torchrun with as many).")]

# `vsagen search`'s own options: the pattern search's (--lam, --eps, --ranges; None: not given, so that
# --suggest-dense can refuse them) and those of --suggest-dense (`vsagen.commands.search_dense`).
SearchLam = Annotated[Optional[float], typer.Option(help="Cost weight: each head gets the mode of lowest relative MSE "
                                                         "+ lam x block density (dense 1, skip 0). Default 0.5.")]
SearchEps = Annotated[Optional[float], typer.Option(help="Largest relative MSE (MSE / mean square of the full output, "
                                                         "per head; skip's is 1) a sparse mode may have; a head where "
                                                         "every sparse mode exceeds it stays dense (1: only no worse "
                                                         "than a zero output). Default 1.0.")]
SearchRanges = Annotated[Optional[int], typer.Option(help="Split the steps into this many equal ranges, each with "
                                                          "its own modes (1 <= ranges <= steps). Default 1.")]
SearchAttnImpl = Annotated[str, typer.Option(help="How the modes are computed: auto (Triton block-sparse kernels on "
                                                  "CUDA, torch masked attention elsewhere), triton or torch; with "
                                                  "--suggest-dense, the measured backend's implementation (as t2v's "
                                                  "--attn-impl).")]
SuggestDense = Annotated[bool, typer.Option("--suggest-dense", help="Instead of Sparse-vDiT patterns: measure the "
                                            "--attn backend's relative L2 error against full attention per (step, "
                                            "layer) while denoising on full attention, and suggest the dense_steps "
                                            "and dense_layers that run the fewest (step, layer) entries full while "
                                            "leaving at most --budget of the summed error; prints the --attn text to "
                                            "paste and writes the measurements (.json).")]
SearchAttn = Annotated[Optional[str], typer.Option(help="With --suggest-dense: the sparse backend to measure, "
                                                        "NAME[:KEY=VALUE...] as t2v's --attn (vsa, "
                                                        "vsa:sparsity=0.9, sla-star, ...).",
                                                   autocompletion=complete_attn)]
SearchBudget = Annotated[Optional[float], typer.Option(help="With --suggest-dense: the error the suggestion may "
                                                            "leave, as a fraction of the backend's relative L2 "
                                                            "summed over every (step, layer): 0 runs every entry "
                                                            "that errs full, 1 or more suggests nothing. Default "
                                                            "0.5.")]

# Every shared option by its keyword (`vsagen.request.options.FLAGS`): (declaration, default). A command takes a
# subset; it may declare one of them itself (another help text or default), and the value still goes to its group.
SHARED: dict[str, tuple[Any, Any]] = {
    "model": (Model, DEFAULT_MODEL), "attn": (Attn, "auto"), "sparsity": (Sparsity, None),
    "attn_impl": (AttnImpl, "auto"), "height": (Height, None), "width": (Width, None), "frames": (Frames, None),
    "steps": (Steps, None), "guidance": (Guidance, None), "guidance_2": (Guidance2, None),
    "flow_shift": (FlowShift, None), "negative_prompt": (NegativePrompt, None), "seed": (Seed, None),
    "seeds": (Seeds, None),
    "sampler": (SamplerOption, None), "cache": (CacheOption, None),
    "fps": (Fps, None), "out": (Out, None), "overwrite": (Overwrite, False), "sheet": (Sheet, False),
    "codec": (Codec, None),
    "device": (DeviceOption, Device.AUTO),
    "dtype": (DtypeOption, Dtype.AUTO), "tile_fit": (TileFitOption, TileFit.PARTIAL),
    "random_weights": (RandomWeights, False), "allow_pickle": (AllowPickle, False),
    "transformer": (Transformer, None), "lora": (LoraOption, None), "warmup": (Warmup, 0),
    "offload": (OffloadOption, Offload.NONE), "quant": (QuantOption, Quant.AUTO),
    "vae_tiling": (VaeTilingOption, VaeTiling.AUTO),
    "vae": (VaeOption, "auto"), "vae_dtype": (VaeDtypeOption, VaeDtype.AUTO),
    "compile": (Compile, False), "ulysses": (Ulysses, None), "cfg_parallel": (CfgParallel, False),
    "gpus": (Gpus, None),
}
# What each command takes of them (t2v and i2v: all but fused_blocks, which the environment sets)
GENERATE = ("model", "attn", "sparsity", "attn_impl", "height", "width", "frames", "steps", "sampler", "cache",
            "guidance",
            "guidance_2",
            "flow_shift", "negative_prompt", "seed", "seeds", "fps", "out", "overwrite", "sheet", "codec", "device",
            "dtype", "tile_fit", "random_weights", "allow_pickle", "transformer", "lora", "warmup", "offload",
            "vae_tiling", "vae", "vae_dtype",
            "compile", "quant", "gpus",
            "ulysses",
            "cfg_parallel")
PROFILE = ("model", "attn", "sparsity", "attn_impl", "height", "width", "frames", "steps", "sampler", "cache",
           "warmup",
           "tile_fit",
           "out", "guidance", "guidance_2", "negative_prompt", "seed", "overwrite", "device", "dtype",
           "random_weights", "allow_pickle", "transformer", "lora", "compile", "quant", "gpus", "ulysses",
           "cfg_parallel")
COMPARE = ("model", "attn", "sparsity", "attn_impl", "height", "width", "frames", "steps", "sampler", "cache",
           "guidance",
           "guidance_2",
           "flow_shift", "negative_prompt", "seed", "fps", "out", "overwrite", "sheet", "codec", "device", "dtype",
           "tile_fit", "random_weights", "allow_pickle", "transformer", "lora", "warmup", "vae_tiling", "vae",
           "vae_dtype", "quant")
SEARCH = ("model", "steps", "sampler", "height", "width", "frames", "out", "overwrite", "guidance", "guidance_2",
          "flow_shift",
          "negative_prompt", "seed", "device", "dtype", "tile_fit", "random_weights", "allow_pickle", "transformer")
# `vsagen serve`: t2v's options but those of one run's files and processes (each video's files are the job's)
SERVE = tuple(k for k in GENERATE if k not in ("seeds", "out", "overwrite", "sheet", "gpus", "ulysses", "cfg_parallel"))



def command_line(ctx: Any = None) -> list[str]:
    """The command being run as arguments for `vsagen` again (`[name, options..., "--", arguments...]`): what was
    given on the command line (or in the environment) of the current Typer command, each value as its text
    (Enums as their value, paths as given), its defaults left out; so that workers run the same command
    (`vsagen.parallel.spawn`). `ctx`: the command's click context (default: the current one)."""
    if ctx is None:
        try:  # Typer vendors click as typer._click (since 0.2x); before, it used click itself
            from typer._click.globals import get_current_context
        except ImportError:
            from click import get_current_context
        ctx = get_current_context()
    options: list[str] = []
    arguments: list[str] = []
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name)
        value = ctx.params.get(param.name)
        if source is None or source.name in ("DEFAULT", "DEFAULT_MAP") or value is None:
            continue
        if param.param_type_name == "argument":
            arguments.append(str(value))
        elif getattr(param, "is_flag", False) and isinstance(value, bool):
            names = param.opts if value else param.secondary_opts
            options += names[:1]
        else:
            options += [param.opts[0], str(value)]
    return [ctx.info_name, *options, "--", *arguments]


def close_options(typed: str, options: Iterable[str]) -> list[str]:
    """The options among `options` (e.g. `--height`, `-h`) that `typed`, an option no command has, may have meant:
    difflib's close matches of the names without their dashes (ratio >= 0.7, at most 3, closest first); [] when
    none is close. Click's own suggestion compares the dashes too, so `--bogus` was offered `--out, --verbose`."""
    names = {o.lstrip("-"): o for o in options}
    return [names[n] for n in close_matches(typed.lstrip("-"), names)]


_EXTRA_ARGUMENTS = re.compile(r"^Got unexpected extra arguments?(?:\(s\))? \((.*)\)$")


def unquoted_prompt(message: str, ctx: Any) -> str | None:
    """The usage error of a prompt typed without quotes (`vsagen t2v --model tiny a red fox`: click's "Got unexpected
    extra argument(s) (red fox)"), said as what to do: quote the prompt, shown whole. None for another message, or
    a command without a prompt. `ctx`: the command's click context (its parameters parsed so far)."""
    extra = _EXTRA_ARGUMENTS.match(message)
    prompt = next((p for p in ctx.command.params if p.name == "prompt"), None)
    given = ctx.params.get("prompt")
    if extra is None or prompt is None or not isinstance(given, str):
        return None
    whole = shlex.quote(f"{given} {extra.group(1)}")
    if prompt.param_type_name == "argument":
        return (f"the prompt is one argument, and {extra.group(1)!r} came after it: quote the whole prompt, e.g. "
                f"{ctx.command_path} ... {whole}")
    return f"--prompt takes one value, and {extra.group(1)!r} came after it: quote it, e.g. --prompt {whole}"


def repeated_option(command: Any, args: list[str]) -> list[str] | None:
    """The spellings of the first single-valued option that `args` give more than once (e.g. ['--attn', '--attn'],
    ['--overwrite', '--no-overwrite']), or None. `command`: a click command (its `params`); `args`: its arguments as
    typed, before parsing. An option's value is skipped (so `--negative-prompt --steps` counts `--negative-prompt`
    once), `--opt=value` counts as `--opt`, and nothing after `--` is read. Options that take several values
    (`multiple`, `count`) are not counted."""
    by_spelling = {}
    for param in command.params:
        if param.param_type_name != "option" or getattr(param, "multiple", False) or getattr(param, "count", False):
            continue
        for spelling in (*param.opts, *param.secondary_opts):
            by_spelling[spelling] = param
    seen: dict[str, list[str]] = {}
    i = 0
    while i < len(args) and args[i] != "--":
        spelling, eq, _ = args[i].partition("=")
        param = by_spelling.get(spelling)
        if param is not None:
            seen.setdefault(param.name, []).append(spelling)
            if not eq and not getattr(param, "is_flag", False):
                i += 1  # its value
        i += 1
    return next((spellings for spellings in seen.values() if len(spellings) > 1), None)


class OnceOptionsGroup(TyperGroup):
    """The `vsagen` command group: a command given one of its single-valued options twice (`--attn vsa --attn
    full`, `--overwrite --no-overwrite`) is refused as a usage error (one `error:` line, exit 2) instead of click's
    silent last-one-wins; a value given twice inside one `--attn` entry was already refused the same way."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        name, command, rest = super().resolve_command(ctx, args)
        options = rest[:rest.index("--")] if "--" in rest else rest
        asks_help = any(a in ctx.help_option_names for a in options)  # --help still prints the help
        twice = None if command is None or asks_help else repeated_option(command, rest)
        if twice is not None:
            sub = type(ctx)(command, info_name=name, parent=ctx)  # for the `--help` hint: `vsagen t2v --help`
            both = f" ({' '.join(twice)})" if len(set(twice)) > 1 else ""
            raise usage_error(f"{twice[0]} given {len(twice)} times{both}; give it once", ctx=sub)
        return name, command, rest
