"""The embedded tiny models (presets with source "tiny"): Wan-style T2V pipelines with random weights, built
offline.

* `tiny`: Wan2.1-style (one transformer, 16-channel VAE, 8x spatial).
* `tiny-ti2v`: Wan2.2-TI2V-5B-style (48-channel VAE, 16x spatial, per-token timesteps: `expand_timesteps`).
* `tiny-a14b`: Wan2.2-A14B-style (two experts, `transformer_2` and `boundary_ratio`).
* `tiny-i2v`: Wan2.1-I2V-style image to video (`WanImageToVideoPipeline`: 36-channel transformer input, a tiny
  CLIPVisionModel image encoder and its CLIPImageProcessor).
* `tiny-flf2v`: Wan2.1-FLF2V-style first/last-frame to video (`tiny-i2v` plus the transformer's
  `pos_embed_seq_len`: the CLIP tokens of two images).
* `tiny-i2v-a14b`: Wan2.2-I2V-A14B-style image to video (two 36-channel experts, no CLIP image encoder).

Each is built deterministically from its preset's configs (seed 0; the second expert seed 1), saved once in the
diffusers layout (safetensors) under the vsagen cache directory as `<preset>-pipeline/`, and loaded back through
the same `from_pretrained` path that real checkpoints take. Their pictures are noise: they exist for plumbing,
tests and timing. A saved checkpoint whose weight files are damaged (truncated, overwritten) is built again; a
cache folder that cannot be written is bad input, found before anything loads (`check_tiny_cache`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from ..errors import BadInput
from ..interrupts import remove_on_stop
from ..media.paths import why_unwritable
from .presets import Preset

TINY_SEED = 0
TINY_SEED_2 = 1  # the second expert of two-expert presets: same architecture, other weights
_MARKER = ".vsagen-complete"


def cache_dir() -> Path:
    """Root of vsagen's cache: $VSAGEN_CACHE, else $XDG_CACHE_HOME/vsagen, else ~/.cache/vsagen."""
    if os.environ.get("VSAGEN_CACHE"):
        return Path(os.environ["VSAGEN_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "vsagen"


def tiny_checkpoint_problem(target: Path) -> str | None:
    """Why the saved tiny checkpoint `target` cannot be used, or None: not saved completely (no marker), or a weight
    file damaged since (`vsagen.models.sources.check_weight_files`: headers only)."""
    import json

    from .sources import check_weight_files

    if not (target / _MARKER).is_file():
        return "not built"
    try:
        index = json.loads((target / "model_index.json").read_text())
        check_weight_files(target, str(target), index if isinstance(index, dict) else {})
    except (OSError, ValueError) as e:
        return f"model_index.json unreadable: {e}"
    except BadInput as e:
        return str(e).split(": ", 1)[-1]
    return None


def unwritable_cache(e: OSError, root: Path | None = None, probed: bool = False) -> BadInput:
    """The one line for a vsagen cache (`root`, default `cache_dir()`) the tiny model cannot be written to: which
    folder, why (and the path that failed, where it is another), what to do. `probed`: `e` is `write_problem`'s, a
    folder that exists and refused a new one, said as "<folder> cannot be written (<why>)" (the errno text misleads
    there: /proc answers "No such file or directory"; a user trial)."""
    root = cache_dir() if root is None else root
    where = getattr(e, "filename", None)
    if probed and not isinstance(e, NotADirectoryError):
        why = f"{where or root} cannot be written ({why_unwritable(e)})"
    else:
        why = (e.strerror or str(e)) + (f": {where}" if where and str(where) != str(root) else "")
    return BadInput(f"cannot write the tiny model to the vsagen cache {root} ({why}); set VSAGEN_CACHE (or "
                    "XDG_CACHE_HOME) to a writable folder")


def check_tiny_cache(preset: Preset, root: Path | None = None) -> None:
    """Before anything loads: the tiny checkpoint of `preset` is saved whole in the cache, or the cache folder can
    be written (created where missing) to build it.

    Raises:
        BadInput: the cache path is a file, or its nearest existing folder is not writable (`unwritable_cache`: a
            folder made there and removed at once fails).
    """
    root = cache_dir() if root is None else root
    target = root / f"{preset.name}-pipeline"
    if target.is_dir() and tiny_checkpoint_problem(target) is None:
        return
    if (problem := write_problem(root)) is not None:
        raise unwritable_cache(problem, root, probed=True)


def write_problem(root: Path) -> OSError | None:
    """Why folder `root` (made where missing) cannot be written, or None: its nearest existing folder is a file, or a
    folder made there and removed at once fails (the one test of writing there that holds: a root user, /proc, ...).
    Leaves nothing behind. The OSError names the existing path that failed."""
    existing = root
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        return NotADirectoryError(20, "not a folder", str(existing))
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".vsagen-probe-", dir=existing))
    except OSError as e:
        return OSError(e.errno, e.strerror, str(existing))
    return None


def tiny_image_encoder(config: dict):
    """A CLIPVisionModel from CLIPVisionConfig kwargs (random weights from the current torch seed) and the
    CLIPImageProcessor for its `image_size` (resize the short side, center-crop a square)."""
    from transformers import CLIPVisionConfig, CLIPVisionModel

    try:  # the PIL backend (what CLIPImageProcessor falls back to without torchvision), named to skip a warning
        from transformers import CLIPImageProcessorPil as CLIPImageProcessor
    except ImportError:
        from transformers import CLIPImageProcessor
    encoder = CLIPVisionModel(CLIPVisionConfig(**config)).eval()
    size = int(encoder.config.image_size)
    processor = CLIPImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
    return encoder, processor


def build_tiny_pipeline(preset: Preset):
    """Build the tiny WanPipeline from `preset`'s configs with seeded random weights (float32, CPU).

    Two-expert presets get `transformer_2` (seeded with TINY_SEED_2) and `boundary_ratio`; presets with
    `expand_timesteps` get a pipeline that passes per-token timesteps. Image-to-video presets get a
    WanImageToVideoPipeline, with a tiny CLIP image encoder (built after the transformers, same seed stream) where
    the preset has an `[image_encoder]`.

    Returns:
        diffusers.WanPipeline or diffusers.WanImageToVideoPipeline.
    """
    import torch
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import ByT5Tokenizer, UMT5Config, UMT5EncoderModel

    assert preset.text_encoder is not None
    torch.manual_seed(TINY_SEED)
    text_encoder = UMT5EncoderModel(UMT5Config(**preset.text_encoder)).eval()
    vae = AutoencoderKLWan(**preset.vae).eval()
    transformer = WanTransformer3DModel(**preset.transformer).eval()
    transformer_2 = None
    if preset.transformer_2 is not None:
        torch.manual_seed(TINY_SEED_2)
        transformer_2 = WanTransformer3DModel(**preset.transformer_2).eval()
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                        flow_shift=preset.defaults.flow_shift)
    if preset.image_to_video:
        from diffusers import WanImageToVideoPipeline

        encoder = processor = None
        if preset.image_encoder is not None:
            encoder, processor = tiny_image_encoder(preset.image_encoder)
        return WanImageToVideoPipeline(tokenizer=ByT5Tokenizer(), text_encoder=text_encoder, vae=vae,
                                       scheduler=scheduler, image_processor=processor, image_encoder=encoder,
                                       transformer=transformer, transformer_2=transformer_2,
                                       boundary_ratio=preset.boundary_ratio, expand_timesteps=preset.expand_timesteps)
    return WanPipeline(tokenizer=ByT5Tokenizer(), text_encoder=text_encoder, vae=vae, scheduler=scheduler,
                       transformer=transformer, transformer_2=transformer_2, boundary_ratio=preset.boundary_ratio,
                       expand_timesteps=preset.expand_timesteps)


def ensure_tiny_checkpoint(preset: Preset, root: Path | None = None) -> Path:
    """Return the directory of the saved tiny pipeline, building and saving it first if needed.

    The save goes to a temporary directory that is renamed into place, so concurrent runs and interrupted
    saves never leave a half-written checkpoint; a checkpoint another process renamed into place first is used.

    A checkpoint whose weight files were damaged since it was saved (`tiny_checkpoint_problem`) is built again.

    Raises:
        RuntimeError: called while a torch.distributed process group is initialized (transformers' save_pretrained
            then writes the text encoder on rank 0 only, and the other ranks' checkpoints lack it).
        OSError: the cache folder is not writable.
    """
    root = cache_dir() if root is None else root
    target = root / f"{preset.name}-pipeline"
    if tiny_checkpoint_problem(target) is None:
        return target
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():  # transformers would save the text encoder on rank 0 only
        raise RuntimeError("build the tiny checkpoint before torch.distributed's process group starts "
                           "(vsagen.models.loading.prepare_model_files)")
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{preset.name}-", dir=root))
    forget = remove_on_stop(tmp)  # a second Ctrl-C ends the process at once: the half-built folder goes too
    try:
        build_tiny_pipeline(preset).save_pretrained(tmp, safe_serialization=True)
        (tmp / _MARKER).write_text(f"built by vsagen from presets/{preset.name}.toml\n")
        if tiny_checkpoint_problem(target) is None:  # another process (a rank of the same launch) finished first
            return target
        if target.exists():  # a folder without the marker (an interrupted save) or a damaged one: moved aside in
            # one rename, so a complete checkpoint another process renames into place meanwhile is never deleted
            stale = Path(tempfile.mkdtemp(prefix=f".{preset.name}-stale-", dir=root))
            with contextlib.suppress(OSError):
                os.replace(target, stale / "old")
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:
            if tiny_checkpoint_problem(target) is not None:  # lost a race with nobody finishing: give up
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        forget()
    return target
