"""`vsagen.load_pipeline`: the Python API's loader, a diffusers Wan pipeline loaded as the `vsagen` commands load it
(`vsagen.models.loading.load_model`), with the commands' refusals reworded into the function's argument names."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import BadInput
from ..request.resolve import Request
from .loading import load_model


PIPELINE_WHERE = "vsagen.load_pipeline"  # names the caller in BadInput messages
# load_pipeline's arguments by the command-line flags the shared checks name them by (`_as_arguments`)
_ARGUMENTS = {"--model": "model", "--device": "device", "--dtype": "dtype", "--transformer": "transformer",
              "--random-weights": "random_weights=True", "--allow-pickle": "allow_pickle=True"}
_FLAG = re.compile(r"(--[a-z-]+)(?![\w-])(?: (DIR|tiny|auto|cuda|cpu|bf16|fp16|fp32)\b)?")
_TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}  # torch.<name> -> the --dtype value


def _as_arguments(message: str) -> str:
    """A message of the commands' checks in `load_pipeline`'s words: each of its flags as the Python argument
    ("--dtype must be" -> "dtype must be", "try --model tiny" -> "try model='tiny'", "pass --model DIR" -> "pass
    model=DIR", "--random-weights" -> "random_weights=True"); other flags (`hf download --local-dir`) stay."""
    def argument(m: re.Match) -> str:
        flag, value = m.groups()
        if flag not in _ARGUMENTS:
            return m.group(0)
        name = _ARGUMENTS[flag]
        return name if value is None else f"{name}={value}" if value == "DIR" else f"{name}={value!r}"
    return _FLAG.sub(argument, message)


@dataclass(frozen=True, kw_only=True)
class _AsImageToVideo(Request):
    """A `Request` loaded as a WanImageToVideoPipeline: a text-image-to-video model (Wan2.2-TI2V-5B style, saved as
    a WanPipeline) that `load_pipeline(..., image_to_video=True)` asks for as image to video."""

    @property
    def image_to_video(self) -> bool:
        return True


def load_pipeline(model: str | os.PathLike, *, device: str = "auto", dtype: str = "auto", random_weights: bool = False,
                  allow_pickle: bool = False, image_to_video: bool | None = None,
                  transformer: str | os.PathLike | Sequence[str | os.PathLike] | None = None) -> Any:
    """A ready diffusers Wan pipeline, loaded as the `vsagen` commands load it, for `vsagen.apply`.

    The model resolves as `--model` does (`vsagen.models.sources.resolve_model`, then `vsagen.request.resolve.resolve`
    against its preset), and loads through `load_model`: a tiny preset's checkpoint is built offline into the vsagen
    cache on first use ($VSAGEN_CACHE, else ~/.cache/vsagen); only diffusers / transformers components and
    safetensors weights load; the scheduler is UniPC with the preset's flow shift; the VAE gets the preset's dtype
    (`resolve_vae_dtype` of "auto": bf16 where a real text-to-video model only decodes, float32 where the VAE also
    encodes an image, under a bf16 pipeline); the weights are placed on
    `device` (no offloading) and the VAE is not tiled (`pipe.vae.enable_tiling()` turns it on); a preset's lightweight
    VAE decoder (hummingbird-xt's, where the folder holds it) decodes (`vsagen.decode.light_decoder`). torch's global
    random state is as it was before the call. torch's compile caches are pointed into vsagen's cache folder where the
    user has not placed them (`vsagen.models.compile_caches.use_compile_caches`).

    Args:
        model: a preset name ("tiny", "wan2.1-t2v-1.3b", ...; `vsagen presets` lists them), a local diffusers folder or
            a folder holding a transformer in the original Wan key names (`vsagen.models.checkpoint_layouts`; a str or a
            Path) or a hub id (a hub checkpoint, a real preset's included, downloads into the Hugging Face cache on
            first use).
        device: "auto" (CUDA when available, else the CPU), "cuda" or "cpu".
        dtype: "auto" (bf16 on CUDA, fp32 on the CPU), "bf16", "fp16" or "fp32" (or torch.bfloat16, torch.float16,
            torch.float32): the transformers' and text encoder's dtype.
        random_weights: a preset's real architecture with random weights and no text encoder nor tokenizer (no
            download; for timing: call the pipeline with `prompt_embeds`, its frames are noise).
        allow_pickle: also load pickle weights (.bin / .pt), which can run code when loaded.
        image_to_video: None: the model's own pipeline class; True: a WanImageToVideoPipeline (image-to-video
            models, and text-image-to-video ones such as "tiny-ti2v"); False: a WanPipeline (text-to-video models).
        transformer: transformer-only weight files replacing the model's transformer(s) (`--transformer`: a path,
            "A,B" or a sequence, one per expert, high-noise first; .safetensors, or .pth read by torch's weights-only
            loader only; `vsagen.models.transformer_files`); the other components load from `model`.

    Returns:
        A `diffusers.WanPipeline` or `diffusers.WanImageToVideoPipeline` on `device` in eval mode, with stock
        attention processors (`vsagen.apply` patches it). The tiny presets' weights are random: their frames are
        noise (for plumbing and timing).

    Raises:
        BadInput: an unknown model, device or dtype, a model vsagen refuses (pickle-only weights without
            `allow_pickle`, components from other libraries, another pipeline class), `device="cuda"` without
            CUDA, `random_weights` for a model no preset describes, or `image_to_video` the model cannot serve;
            one line, starting "vsagen.load_pipeline:", naming the setting by its argument ("dtype must be one
            of ...", "try model='tiny'"; `_as_arguments`), not by the commands' flag.
        ModelNotFound (a BadInput): the checkpoint cannot be found or loaded (e.g. a hub id that is neither in the
            Hugging Face cache nor downloadable).
        BadInput: also when the tiny checkpoint cannot be written to the vsagen cache (not writable).
    """
    import torch

    from .compile_caches import use_compile_caches

    try:
        model = os.fspath(model) if isinstance(model, os.PathLike) else model
        if not isinstance(model, str):  # (None would fall back to the commands' default model)
            raise BadInput(f"model must be a preset name, a folder or a hub id, got {model!r}")
        dtype = _dtype_text(dtype)
        source, request = _pipeline_request(model, device=device, dtype=dtype, random_weights=random_weights,
                                            allow_pickle=allow_pickle, image_to_video=image_to_video,
                                            transformer=transformer)
        use_compile_caches()  # compiled code (Triton kernels, torch.compile) kept in vsagen's cache folder
        with torch.random.fork_rng(devices=range(torch.cuda.device_count()) if request.device == "cuda" else ()):
            pipe = load_model(request, lambda line: None).pipe
        # the preset's per-backend option defaults ([attention.NAME]: FastWan's vsa sparsity 0.8, the tiny models'
        # sparse-vdit pattern file), for `vsagen.apply` to fill as the commands do
        pipe.vsagen_backend_defaults = {k: dict(v) for k, v in source.preset.defaults.attention.items()}
        return pipe
    except BadInput as e:
        raise type(e)(f"{PIPELINE_WHERE}: {_as_arguments(str(e))}") from None


def _dtype_text(dtype: Any) -> Any:
    """`load_pipeline`'s dtype as the options' text ("bf16" for torch.bfloat16; text passes as given). Raises
    BadInput for a torch dtype other than bfloat16, float16 and float32."""
    import torch

    if isinstance(dtype, torch.dtype):
        name = str(dtype).removeprefix("torch.")
        if name not in _TORCH_DTYPES:
            raise BadInput(f"dtype must be one of auto, bf16, fp16, fp32 or torch.{', torch.'.join(_TORCH_DTYPES)}"
                           f", got {dtype}")
        dtype = _TORCH_DTYPES[name]
    return dtype


def _pipeline_request(model: str, *, device: str, dtype: str, random_weights: bool, allow_pickle: bool,
                      image_to_video: bool | None, transformer: Any) -> tuple[Any, Request]:
    """The model source and validated request of `load_pipeline`'s arguments, resolved as the commands do (no
    backends, VAE untiled; `image_to_video=True` on a text-image-to-video model: an image-to-video request). Raises
    BadInput in the commands' words (`load_pipeline` rewords them): what `resolve` refuses, an `image_to_video` the
    model cannot serve, missing hub files."""
    from ..request.options import request_options
    from ..request.resolve import NONE, request_fields, resolve
    from .sources import check_hub_files, resolve_model

    options = request_options(model=model, device=device, dtype=dtype, random_weights=random_weights,
                              allow_pickle=allow_pickle, vae_tiling="off", transformer=transformer)
    source = resolve_model(options.model.model)
    if image_to_video and not source.takes_image:
        raise BadInput(f"image_to_video=True: {model} is a text-to-video model and takes no image (an "
                       "image-to-video model is e.g. 'tiny-i2v')")
    if image_to_video is False and source.image_to_video:
        raise BadInput(f"image_to_video=False: {model} is an image-to-video model (WanImageToVideoPipeline only)")
    request = resolve(source, options, prompt="", backends=NONE)
    check_hub_files(source, model, random_weights=random_weights, transformer_files=bool(request.transformer_files))
    if image_to_video and not request.image_to_video:
        request = _AsImageToVideo(**request_fields(request))
    return source, request
