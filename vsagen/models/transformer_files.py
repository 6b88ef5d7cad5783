"""Transformer-only checkpoint files (`--transformer FILE[,FILE]`, a preset's `[transformer_files]`): one file per
expert, read into a diffusers `WanTransformer3DModel` of the model's architecture while the other components (text
encoder, tokenizer, VAE, scheduler) load from the base checkpoint as usual (`vsagen.models.loading`).

What a file may be (TurboDiffusion @aaecff5 publishes `.pth` state dicts, `turbodiffusion/inference/modify_model.py`):

* `.safetensors`, read by safetensors; `.pth` / `.pt` read ONLY by `torch.load(path, map_location="cpu",
  weights_only=True, mmap=True)`: torch's weights-only unpickler builds tensors and plain containers and refuses
  anything else (an object whose unpickling would run code), so no code in the file runs. `--allow-pickle` does not
  apply here. The content must be a flat dict of str -> tensor.
* Keys in the original Wan names (`blocks.N.self_attn.q.weight`, `ffn.0`, `modulation`, `head.head`,
  `patch_embedding`, ...), converted by diffusers' `convert_wan_transformer_to_diffusers`, or diffusers' own names
  (taken as they are), or FastVideo's module names (`blocks.N.to_q`, `ffn.fc_in`, `scale_shift_table`, ...: its
  diffusers conversions of TurboDiffusion's files), read back to the original names first (`fastvideo_to_original`).
  Every tensor must be one the architecture has, shape for shape, and none missing.
* Backend-owned tensors (any registered backend's `LayerWeights` key or alias, e.g. SLA's
  `blocks.N.self_attn.attn_op.local_attn.proj_l.{weight,bias}`) are set aside before the conversion and written to
  a per-process folder `<root>/<expert>/backend_weights.safetensors`, which the backend weights loader reads as it
  reads a diffusers checkpoint's folders (`vsagen.attention.weights`); `--attn auto` sees them
  (`file_keys`).
* `-quant` files (TurboDiffusion's `Int8Linear`, `turbodiffusion/ops/core.py`): a Linear's weight stored as
  `<name>.int8_weight` (int8, [out, in]) and `<name>.scale` (fp32, [ceil(out/128), ceil(in/128)], one per 128x128
  tile; their quantizer writes amax / 128, `ops/quant/quant.hpp`), dequantized at load: w = int8 * scale of its tile
  (partial edge tiles use their tile's scale), computed in float64 and cast once to the run's dtype. With `--quant
  int8` the linears then run the file's int8 values as TurboDiffusion does (`vsagen.quant.int8_linear.Int8Linear`).
* `patch_embedding.weight` stored as a Linear [dim, in_channels * pt * ph * pw] (TurboDiffusion's `WanModel`
  patchifies as `(c kt kh kw)`, the Conv3d weight's own flattening) is reshaped to diffusers' Conv3d weight.
"""

from __future__ import annotations

import atexit
import math
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

from ..errors import BadInput, ModelNotFound
from ..interrupts import remove_on_stop
from .presets import TRANSFORMER_FILE_SUFFIXES, Preset

QUANT_TILE = 128  # TurboDiffusion's Int8Linear: one scale per 128 x 128 tile of the weight
_ORIGINAL_TELLS = ("head.head.weight", "patch_embedding.weight")  # with `.self_attn.`: the original Wan names
BACKEND_FILE = "backend_weights.safetensors"


def where_of(path: Path | str) -> str:
    """The prefix of this module's messages for one file: `--transformer <path>`."""
    return f"--transformer {path}"


def check_transformer_files(files: Sequence[str], preset: Preset, model: str, random_weights: bool) -> tuple[str, ...]:
    """`--transformer` checked before anything loads (no torch): one existing file per expert of the model (the
    high-noise expert first), each ending in .safetensors, .pth or .pt; a .safetensors file's header fits the
    expert's architecture (`check_header`).

    Returns:
        The files as absolute paths.

    Raises:
        BadInput: one line: with --random-weights, a count other than the model's experts, a missing file, a folder,
            another suffix; a .safetensors file of another model, or no transformer (`check_header`).
    """
    if random_weights:
        raise BadInput("--transformer loads trained weights and --random-weights builds random ones; use one")
    if len(files) != preset.experts:
        how = ("one file (--transformer FILE)" if preset.experts == 1 else
               f"{preset.experts} files, the high-noise expert first (--transformer HIGH,LOW)")
        raise BadInput(f"--transformer names {len(files)} file(s) and --model {model} has {preset.experts} "
                       f"transformer(s): give {how}")
    out = [str(weights_file(f, where_of(f), "a transformer checkpoint", TRANSFORMER_FILE_SUFFIXES)) for f in files]
    for f, architecture in zip(out, (preset.transformer, preset.transformer_2)):
        if f.endswith(".safetensors"):  # a .pth's keys need torch: checked as it loads
            check_header(Path(f), dict(architecture or {}), model)
    return tuple(out)


def weights_file(f: str, where: str, what: str, suffixes: tuple[str, ...]) -> Path:
    """A weights file named on the command line, checked without reading it: `f` as an absolute path (`~`
    expanded) of an existing file ending in one of `suffixes` (`--transformer`, `--vae tiny:weights=`).

    Raises:
        BadInput: one line starting with `where`: no such file, a folder (`what` is one file), another suffix.
    """
    path = Path(f).expanduser()
    if not path.exists():
        raise BadInput(f"{where}: no such file")
    if not path.is_file():
        raise BadInput(f"{where}: not a file ({what} is one .safetensors or .pth file)")
    if not path.name.endswith(suffixes):
        raise BadInput(f"{where}: reads {', '.join(suffixes)} files only")
    return path.resolve()


def check_header(path: Path, architecture: dict[str, Any], model: str) -> None:
    """A transformer file's safetensors header (no tensor read, no torch) against the architecture it replaces (a
    preset's [transformer]): Wan transformer key names (the original ones or diffusers'), as many blocks, the
    blocks' width (block 0's query weight, int8 or not) and the patch embedding's input channels. What the load
    checks tensor by tensor (`check_fit`) beyond that still fails there.

    Raises:
        BadInput: one line naming the file: damaged or truncated, or of another model (what differs)."""
    from safetensors import SafetensorError, safe_open

    where = where_of(path)
    try:
        with safe_open(str(path), framework="numpy") as f:
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (OSError, ValueError, RuntimeError, SafetensorError) as e:
        raise BadInput(f"{where}: cannot read it as safetensors ({_first_line(e)}): the file is damaged or "
                       "truncated; download it again") from None
    fastvideo = is_fastvideo_layout(list(shapes))
    original = is_original_layout(list(shapes))
    if not original and not any(".attn1." in k for k in shapes) and "proj_out.weight" not in shapes:
        example = ", ".join(list(shapes)[:2]) + (", ..." if len(shapes) > 2 else "") if shapes else "none"
        raise BadInput(f"{where} holds no Wan transformer tensors (its keys: {example}; a Wan transformer's are "
                       "blocks.N.self_attn.q.weight, or diffusers' blocks.N.attn1.to_q.weight): not a transformer "
                       f"checkpoint for --model {model}")
    blocks = {int(k.split(".")[1]) for k in shapes if k.startswith("blocks.") and k.split(".")[1].isdigit()}
    layers = architecture.get("num_layers")
    if layers is not None and blocks != set(range(layers)):
        raise BadInput(f"{where} holds {len(blocks)} transformer blocks and --model {model} has {layers}: a "
                       "checkpoint of another model (or an incomplete one)")
    dim = architecture.get("num_attention_heads", 0) * architecture.get("attention_head_dim", 0)
    query = "blocks.0.self_attn.q" if original else "blocks.0.to_q" if fastvideo else "blocks.0.attn1.to_q"
    shape = shapes.get(f"{query}.weight", shapes.get(f"{query}.int8_weight"))
    if dim and shape is not None and shape != (dim, dim):
        raise BadInput(f"{where}: its blocks are {shape[0]} wide and --model {model}'s are {dim} ({query} is "
                       f"{shape}): a checkpoint of another model size")
    embedding, channels = shapes.get("patch_embedding.weight"), architecture.get("in_channels")
    if embedding is not None and channels is not None and len(embedding) >= 2:
        p = architecture.get("patch_size", (1, 2, 2))
        per = 1 if len(embedding) == 5 else math.prod((p,) * 3 if isinstance(p, int) else p)  # a Linear: c*pt*ph*pw
        if embedding[1] != channels * per:
            raise BadInput(f"{where} takes {embedding[1] // per} input channels and --model {model} {channels} (an "
                           "image-to-video transformer takes the image's too): a checkpoint of another kind of model")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


# The first bytes of a file torch.save wrote in its legacy (non-zip) format: pickle protocol 2 of torch's magic number
# 0x1950a86a20f9469cfc6c (torch/serialization.py MAGIC_NUMBER), which torch checks first when it reads one.
LEGACY_TORCH_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"


def _unpickler_reason(e: BaseException) -> str:
    """The weights-only unpickler's own reason, short: the line naming what it refused (torch 2.6-2.10: "WeightsUnpickler
    error: Unsupported global: GLOBAL posix.system ..."; 2.13: "Trying to load unsupported GLOBAL posix.system whose
    module posix is blocked."), never torch's advice around it (which suggests turning the check off)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    marker = "WeightsUnpickler error: "
    for line in lines:
        if marker in line:
            return line.split(marker, 1)[1].split(" was not an allowed global")[0]
    for line in lines:
        if "GLOBAL" in line or "nsupported" in line:
            return line.rstrip(".").split(" was not an allowed global")[0]
    return "the weights-only unpickler refused it"


def read_state_dict(path: Path, where: str) -> dict[str, Any]:
    """A weights file's tensors: safetensors by safetensors, `.pth` / `.pt` by `torch.load(map_location="cpu",
    weights_only=True, mmap=True)` only (nothing else is ever unpickled; mmap: tensors are read when used).

    Returns:
        {key: tensor} (CPU, dtypes as stored).

    Raises:
        BadInput: one line starting with `where`: a file the weights-only loader refuses (it holds objects other than
            tensors, whose unpickling could run code), content that is not a flat dict of str -> tensor, or a damaged
            / truncated / not-a-checkpoint file (said as such, not blamed on pickle).
    """
    import pickle

    import torch

    if path.name.endswith(".safetensors"):
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except (OSError, ValueError, RuntimeError, SafetensorError) as e:
            raise BadInput(f"{where}: cannot read it as safetensors ({_first_line(e)}): the file is damaged or "
                           "truncated; download it again") from None
    try:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # torch.save's legacy (non-zip) format cannot be memory-mapped: read it whole
            with open(path, "rb") as f:
                if f.read(len(LEGACY_TORCH_MAGIC)) != LEGACY_TORCH_MAGIC:
                    raise
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise BadInput(f"{where}: refused: it holds objects other than tensors ({_unpickler_reason(e)}), whose "
                       "loading could run code; vsagen reads .pth files with torch's weights-only loader only") \
            from None
    except (OSError, RuntimeError, ValueError, EOFError, KeyError) as e:
        reason = _first_line(e)
        reason = reason if len(reason) <= 120 else reason[:117].rsplit(" ", 1)[0] + " ..."  # whole words
        raise BadInput(f"{where}: cannot read it as a torch.save checkpoint ({reason}): the file is "
                       "damaged, truncated or not a (zip-format) torch.save file; download it again") from None
    if not isinstance(state, dict):
        raise BadInput(f"{where}: holds a {type(state).__name__}, not a state dict of tensors")
    if not state:
        raise BadInput(f"{where}: holds no tensors (an empty state dict)")
    for key, value in state.items():
        if not isinstance(key, str):
            raise BadInput(f"{where}: not a state dict of tensors (key {key!r} is {type(key).__name__}, not "
                           "str)")
        if not isinstance(value, torch.Tensor):
            raise BadInput(f"{where}: not a flat state dict of tensors ({key!r} is a {type(value).__name__})")
    return dict(state)


def file_keys(path: Path, where: str) -> list[str]:
    """A weights file's keys (safetensors: its header; `.pth`: through `read_state_dict`, memory-mapped), which
    checks the file as loading will (`read_state_dict`'s errors); FastVideo's module names as the original ones they
    load as (`fastvideo_to_original`), so an attention backend's tensors show under their own keys."""
    if path.name.endswith(".safetensors"):
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="numpy") as f:
                keys = list(f.keys())
        except (OSError, ValueError, RuntimeError, SafetensorError) as e:
            raise BadInput(f"{where}: cannot read it as safetensors ({_first_line(e)}): the file is damaged or "
                           "truncated; download it again") from None
    else:
        keys = list(read_state_dict(path, where))
    return list(fastvideo_to_original(dict.fromkeys(keys))) if is_fastvideo_layout(keys) else keys


def backend_key(key: str) -> bool:
    """Whether `key` is a tensor some registered attention backend owns (its `LayerWeights` key or an alias)."""
    from ..attention.registry import backend_class, backend_names
    from ..attention.weights import matches_layer_weights

    return any(backend_class(n).weights is not None and matches_layer_weights(key, backend_class(n).weights)
               for n in backend_names())


def dequantize(state: dict[str, Any], dtype: Any, where: str) -> dict[str, tuple[Any, Any]]:
    """Replace every `<name>.int8_weight` + `<name>.scale` pair of `state` by `<name>.weight` = int8 x the scale of
    its 128 x 128 tile (float64, then `dtype`), in place.

    Returns:
        {name: (int8 weight, float32 scales)}: the pairs taken out, as stored (for `--quant int8`, which runs them).

    Raises:
        BadInput: an int8 weight without its scale (or the reverse), not int8 / 2-D, or a scale whose shape is not
            [ceil(out/128), ceil(in/128)].
    """
    import torch

    names = [k[: -len(".int8_weight")] for k in state if k.endswith(".int8_weight")]
    codes = {}
    for name in names:
        q, scale = state.pop(f"{name}.int8_weight"), state.pop(f"{name}.scale", None)
        if scale is None:
            raise BadInput(f"{where}: {name}.int8_weight has no {name}.scale beside it")
        tiles = tuple(-(-n // QUANT_TILE) for n in q.shape)
        if q.dtype != torch.int8 or q.dim() != 2 or tuple(scale.shape) != tiles:
            raise BadInput(f"{where}: {name}.int8_weight {tuple(q.shape)} {q.dtype} with scale {tuple(scale.shape)}: "
                           f"expected a 2-D int8 weight and one scale per {QUANT_TILE}x{QUANT_TILE} tile {tiles}")
        s = scale.to(torch.float64).repeat_interleave(QUANT_TILE, 0).repeat_interleave(QUANT_TILE, 1)
        state[f"{name}.weight"] = (q.to(torch.float64) * s[: q.shape[0], : q.shape[1]]).to(dtype)
        codes[name] = (q, scale.float())
    stray = next((k for k in state if k.endswith(".scale") and f"{k[:-6]}.weight" not in state), None)
    if stray is not None and names:
        raise BadInput(f"{where}: {stray} has no {stray[:-6]}.int8_weight beside it")
    return codes


def patch_embedding_as_conv(state: dict[str, Any], architecture: dict[str, Any]) -> None:
    """A `patch_embedding.weight` stored as a Linear [dim, in * pt * ph * pw] reshaped, in place, to the Conv3d
    weight [dim, in, pt, ph, pw] of `architecture` (same element order); other shapes are left to the fit check."""
    w = state.get("patch_embedding.weight")
    if w is None or w.dim() != 2:
        return
    p = architecture["patch_size"]
    patch = (p, p, p) if isinstance(p, int) else tuple(p)
    shape = (w.shape[0], architecture["in_channels"], *patch)
    if w.numel() == w.shape[0] * shape[1] * patch[0] * patch[1] * patch[2]:
        state["patch_embedding.weight"] = w.reshape(shape)


# FastVideo's diffusers conversions of TurboDiffusion's files (loayrashid/TurboWan2.1-T2V-*-Diffusers,
# loayrashid/TurboWan2.2-I2V-A14B-Diffusers: a Wan diffusers repository whose transformer/ (and, inferred,
# transformer_2/) diffusion_pytorch_model.safetensors was replaced) hold FastVideo's own module names, which its
# scripts/checkpoint_conversion/convert_turbodiffusion_to_diffusers.py:30-65 and
# convert_turbodiffusion_i2v_to_diffusers.py:29-68 (@2f3d407, the same table plus the I2V cross-attention's add_k /
# add_v / norm_add_k / norm_add_q) write from the original ones; they are read back to the original names by this
# table (regex on a FastVideo key -> original key, the first that matches; anything else, e.g. patch_embedding.* and
# blocks.N.norm1.*, is kept).
_FASTVIDEO_TO_ORIGINAL = tuple((re.compile(a), b) for a, b in (
    (r"blocks\.(\d+)\.to_([qkv])\.(.+)", r"blocks.\1.self_attn.\2.\3"),
    (r"blocks\.(\d+)\.to_out\.(.+)", r"blocks.\1.self_attn.o.\2"),
    (r"blocks\.(\d+)\.norm_([qk])\.(.+)", r"blocks.\1.self_attn.norm_\2.\3"),
    (r"blocks\.(\d+)\.attn2\.to_([qkv])\.(.+)", r"blocks.\1.cross_attn.\2.\3"),
    (r"blocks\.(\d+)\.attn2\.to_out\.(.+)", r"blocks.\1.cross_attn.o.\2"),
    (r"blocks\.(\d+)\.attn2\.norm_([qk])\.(.+)", r"blocks.\1.cross_attn.norm_\2.\3"),
    (r"blocks\.(\d+)\.attn2\.add_([kv])_proj\.(.+)", r"blocks.\1.cross_attn.add_\2.\3"),
    (r"blocks\.(\d+)\.attn2\.norm_added_([kq])\.(.+)", r"blocks.\1.cross_attn.norm_add_\2.\3"),
    (r"blocks\.(\d+)\.self_attn_residual_norm\.norm\.(.+)", r"blocks.\1.norm3.\2"),
    (r"blocks\.(\d+)\.norm3\.(.+)", r"blocks.\1.norm2.\2"),
    (r"blocks\.(\d+)\.ffn\.fc_in\.(.+)", r"blocks.\1.ffn.0.\2"),
    (r"blocks\.(\d+)\.ffn\.fc_out\.(.+)", r"blocks.\1.ffn.2.\2"),
    (r"blocks\.(\d+)\.scale_shift_table", r"blocks.\1.modulation"),
    (r"blocks\.(\d+)\.attn1\.attn_impl\.proj_l\.(.+)", r"blocks.\1.self_attn.attn_op.local_attn.proj_l.\2"),
    (r"condition_embedder\.text_embedder\.fc_in\.(.+)", r"text_embedding.0.\1"),
    (r"condition_embedder\.text_embedder\.fc_out\.(.+)", r"text_embedding.2.\1"),
    (r"condition_embedder\.time_embedder\.mlp\.fc_in\.(.+)", r"time_embedding.0.\1"),
    (r"condition_embedder\.time_embedder\.mlp\.fc_out\.(.+)", r"time_embedding.2.\1"),
    (r"condition_embedder\.time_modulation\.linear\.(.+)", r"time_projection.1.\1"),
    (r"proj_out\.(.+)", r"head.head.\1"),
    (r"norm_out\.(.+)", r"head.norm.\1"),
    (r"scale_shift_table", r"head.modulation"),
))
_FASTVIDEO_TELL = re.compile(r"blocks\.\d+\.(to_q|ffn\.fc_in)\.")  # diffusers: blocks.N.attn1.to_q, ffn.net.0.proj


def is_fastvideo_layout(keys: Sequence[str]) -> bool:
    """Whether keys are FastVideo's module names (`blocks.N.to_q.weight`, `blocks.N.ffn.fc_in.weight`: its
    TurboDiffusion conversions), neither diffusers' nor the original Wan ones."""
    return any(_FASTVIDEO_TELL.match(k) for k in keys)


def fastvideo_to_original(state: dict[str, Any]) -> dict[str, Any]:
    """`state` (FastVideo's module names) with its keys in the original Wan names (`_FASTVIDEO_TO_ORIGINAL`), the
    tensors as they are; SLA's proj_l under TurboDiffusion's own key, which the sla backend owns."""
    def original(key: str) -> str:
        for pattern, to in _FASTVIDEO_TO_ORIGINAL:
            if pattern.fullmatch(key):
                return pattern.sub(to, key)
        return key

    return {original(k): v for k, v in state.items()}


def is_original_layout(keys: Sequence[str]) -> bool:
    """Whether keys are in the original Wan names (`head.head.weight`, `blocks.N.self_attn.*`), not diffusers'."""
    return "head.head.weight" in keys or any(".self_attn." in k or ".cross_attn." in k for k in keys)


def empty_transformer(architecture: dict[str, Any]) -> Any:
    """A `WanTransformer3DModel` of `architecture` with its parameters on the meta device (no memory, no init);
    RoPE's computed buffers are real."""
    from accelerate import init_empty_weights
    from diffusers import WanTransformer3DModel

    with init_empty_weights():
        return WanTransformer3DModel(**architecture)


def check_fit(converted: dict[str, Any], want: dict[str, Any], where: str) -> None:
    """Raise BadInput (one line starting with `where`) unless `converted` holds exactly the tensors of `want` (a
    state dict), shape for shape: the first missing, extra or misshapen tensor is named as diffusers names it."""
    missing = [k for k in want if k not in converted]
    if missing:
        raise BadInput(f"{where} lacks {len(missing)} tensor(s) its architecture needs, e.g. {missing[0]} (as "
                       "diffusers names it): the checkpoint is incomplete or of another architecture")
    extra = [k for k in converted if k not in want]
    if extra:
        raise BadInput(f"{where} holds {len(extra)} tensor(s) a Wan transformer of its architecture does not have, "
                       f"e.g. {extra[0]} (as diffusers names it): vsagen does not drop weights silently")
    for k, v in want.items():
        if tuple(converted[k].shape) != tuple(v.shape):
            raise BadInput(f"{where}: {k} has shape {tuple(converted[k].shape)}, its architecture needs "
                           f"{tuple(v.shape)}")


def place_transformer(converted: dict[str, Any], architecture: dict[str, Any], dtype: Any, where: str) -> Any:
    """A `WanTransformer3DModel` of `architecture` holding `converted` (diffusers names), placed as diffusers'
    from_pretrained places a checkpoint's tensors: in `dtype`, but the modules the class keeps in float32
    (`_keep_in_fp32_modules`: norms, modulation, time embedder); CPU, eval mode.

    Raises:
        BadInput: see `check_fit`.
    """
    from diffusers.models.model_loading_utils import load_model_dict_into_meta

    transformer = empty_transformer(architecture)
    check_fit(converted, transformer.state_dict(), where)
    load_model_dict_into_meta(transformer, converted, dtype=dtype,
                              keep_in_fp32_modules=list(type(transformer)._keep_in_fp32_modules or []))
    return transformer.eval()


def load_transformer_file(path: Path, architecture: dict[str, Any], dtype: Any,
                          keep_int8: bool = False) -> tuple[Any, dict[str, Any], str]:
    """One transformer file as a diffusers `WanTransformer3DModel` of `architecture` (a preset's [transformer]) in
    `dtype` (module docstring: formats, names, quantized weights). With `keep_int8` (`--quant int8`), the file's
    int8 weights run as they are stored: each such linear becomes a `vsagen.quant.int8_linear.Int8Linear` holding the
    file's int8 values and scales (TurboDiffusion's W8A8 GEMM) instead of their dequantized weight.

    Returns:
        (transformer, backend tensors {key: tensor} as stored, the run note on what was read).

    Raises:
        BadInput: one line naming the file: see `read_state_dict`, `dequantize`, `check_fit`.
    """
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    where = where_of(path)
    state = read_state_dict(path, where)
    fastvideo = is_fastvideo_layout(list(state))
    if fastvideo:
        state = fastvideo_to_original(state)
    backend = {k: state.pop(k) for k in [k for k in state if backend_key(k)]}
    n = len(state) + len(backend)
    codes = dequantize(state, dtype, where)
    patch_embedding_as_conv(state, architecture)
    original = is_original_layout(list(state))
    converted = convert_wan_transformer_to_diffusers(state) if original else state
    transformer = place_transformer(converted, architecture, dtype, where)
    note = f"transformer from {path.name} ({n} tensors" + (
        ", FastVideo's module names read back to the original Wan ones" if fastvideo else "") + (
        ", original Wan key names converted by diffusers' convert_wan_transformer_to_diffusers" if original else "")
    note += f"; {len(backend)} attention-backend tensors set aside for the backend)" if backend else ")"
    if codes and keep_int8:
        from ..quant.swap import install_int8

        named = {f"{k}.weight": k for k in codes}
        renamed = convert_wan_transformer_to_diffusers(dict(named)) if original else named
        install_int8(transformer, {key[: -len(".weight")]: codes[name] for key, name in renamed.items()})
        note += (f"; {len(codes)} int8 weights (one scale per {QUANT_TILE}x{QUANT_TILE} tile) run as int8 W8A8 GEMMs, "
                 "activations quantized per 128x128 block (TurboDiffusion's Int8Linear)")
    elif codes:
        note += (f"; {len(codes)} int8 weights (one scale per {QUANT_TILE}x{QUANT_TILE} tile) dequantized to "
                 f"{str(dtype).replace('torch.', '')} at load: they run as ordinary weights, not int8 GEMMs")
    return transformer, backend, note


_ROOTS: list[Path] = []


def backend_weights_root(per_expert: dict[str, dict[str, Any]]) -> Path | None:
    """A folder laid out as a checkpoint's backend weights (`<root>/<expert>/backend_weights.safetensors` holding
    each expert's set-aside tensors under their own keys), for `vsagen.attention.weights` to read as it reads a
    diffusers checkpoint; removed when the process exits. None when no expert has any."""
    if not any(per_expert.values()):
        return None
    from safetensors.torch import save_file

    root = Path(tempfile.mkdtemp(prefix="vsagen-backend-weights-"))
    remove_on_stop(root)  # also when a second Ctrl-C ends the process at once (no atexit then)
    if not _ROOTS:
        atexit.register(lambda: [shutil.rmtree(r, ignore_errors=True) for r in _ROOTS])
    _ROOTS.append(root)
    for expert, tensors in per_expert.items():
        if tensors:
            (root / expert).mkdir()
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(root / expert / BACKEND_FILE))
    return root


def hub_files(preset: Preset, model: str, local_only: bool = False) -> list[Path] | None:
    """A `[transformer_files]` preset's files (one per expert), by huggingface_hub's `snapshot_download` of just
    those files into the Hugging Face cache (it fails at once without a network, where `hf_hub_download` retries
    for ~25 s printing each try); with `local_only`: only if already there, else None.

    Raises:
        ModelNotFound: a file that cannot be downloaded (not `local_only`), in one line naming every file.
    """
    from huggingface_hub import snapshot_download

    repo, names = preset.transformer_files or ("", ())
    try:
        root = Path(snapshot_download(repo, allow_patterns=list(names), local_files_only=local_only))
        out = [root / name for name in names]
        missing = [p.name for p in out if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"{repo} has no {', '.join(missing)}")
    except Exception as e:  # noqa: BLE001 - any download failure is the one line below
        if local_only:
            return None
        raise files_not_loadable(repo, names, model, f"not in the local Hugging Face cache and could not be "
                                 f"downloaded ({_first_line(e)[:80]})") from None
    return out


def files_not_loadable(repo: str, names: Sequence[str], model: str, why: str) -> ModelNotFound:
    """The one error line for a `[transformer_files]` preset's files that cannot be had (`why`, in words), with how
    to download them and pass them as `--transformer`."""
    files = " ".join(names)
    given = ",".join(f"DIR/{n}" for n in names)
    return ModelNotFound(f"cannot load model {model!r}: {repo} ({', '.join(names)}) is {why}. Download "
                         f"{'it' if len(names) == 1 else 'them'} with `hf download {repo} {files} --local-dir DIR` and "
                         f"pass --transformer {given} (with --model, the base checkpoint), time the architecture with "
                         "--random-weights, or try --model tiny")


def auto_evidence(files: Sequence[str], preset: Preset,
                  random_weights: bool) -> list[tuple[str, list[str] | None]] | None:
    """What `--attn auto` reads when the transformer comes from files: [(file name, its keys, or None when not
    downloaded yet)] for the `--transformer` files, else a `[transformer_files]` preset's (from the Hugging Face
    cache only); None when the transformer does not come from files (or random weights).

    Raises:
        BadInput: a named file that cannot be read (`file_keys`).
    """
    if random_weights:
        return None
    if files:
        return [(Path(f).name, file_keys(Path(f), where_of(f))) for f in files]
    if preset.transformer_files is None:
        return None
    cached = hub_files(preset, preset.name, local_only=True)
    if cached is None:
        return [(name, None) for name in preset.transformer_files[1]]
    return [(f.name, file_keys(f, where_of(f))) for f in cached]
