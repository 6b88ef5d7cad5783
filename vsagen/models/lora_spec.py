"""`--lora`: a LoRA as a value, parsed once (`LoraSpec.parse`), and its file checked without torch (`lora_format`:
the safetensors header readable, keys in a format diffusers' Wan LoRA loader converts, no more blocks than the
model has). The loading itself (diffusers' `WanLoraLoaderMixin`, fused or not) is `vsagen.models.lora`.

`FILE_OR_HUB_ID[:scale=S][:expert=1|2|both][:fused=false]`: a local `.safetensors` file (or a hub file
`owner/repo/path/file.safetensors`, or a hub repository `owner/repo` holding one `.safetensors` file at its top),
the strength `S` (default 1; 0 leaves the weights as they are), the expert it goes into (1: `transformer`, the
high-noise expert of a two-expert model; 2: `transformer_2`, the low-noise one; both; default every expert the
model has), and whether it is fused into the weights (default) or kept as PEFT layers beside them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BadInput

LORA_METAVAR = "FILE_OR_HUB_ID[:scale=S][:expert=1|2|both][:fused=false]"
MAX_LORA_SCALE = 10.0  # |scale| above it is a typo more often than a wish (the field's LoRAs run at 0.3 - 2)
EXPERTS = ("1", "2", "both")
_OPTION = re.compile(r"\s*(scale|expert|fused|[A-Za-z_]\w*)\s*=(.*)", re.S)
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(/[^:]+\.safetensors)?")
_USAGE = f"give {LORA_METAVAR}, e.g. --lora style.safetensors:scale=0.8"
# the key prefixes of the formats diffusers' Wan loader reads (`WanLoraLoaderMixin.lora_state_dict`)
FORMATS = {"diffusers": "transformer.", "original": "diffusion_model.", "kohya": "lora_unet_"}
KEY_EXAMPLES = ("transformer.blocks.0.attn1.to_q.lora_A.weight (diffusers / PEFT), "
                "diffusion_model.blocks.0.self_attn.q.lora_A.weight or .lora_down.weight (original Wan, ComfyUI, "
                "musubi-tuner converted), lora_unet_blocks_0_self_attn_q.lora_down.weight (kohya / musubi-tuner)")


@dataclass(frozen=True)
class LoraSpec:
    """One `--lora`, parsed.

    Attributes:
        source: an existing local `.safetensors` file (absolute path), or a hub id (`owner/repo` or
            `owner/repo/path/file.safetensors`), fetched when the model loads.
        scale: the LoRA's strength, finite in [-MAX_LORA_SCALE, MAX_LORA_SCALE].
        expert: "1" (`transformer`), "2" (`transformer_2`), "both", or None (not given: every expert of the model,
            `vsagen.request.resolve` fills it in).
        fused: merged into the weights once loaded (no PEFT layer left in the forward), else kept as PEFT layers.
        scales: `scale=S1,S2,...`: one row per scale (`vsagen compare`; `scale` is the first); () for one scale.
    """

    source: str
    scale: float = 1.0
    expert: str | None = None
    fused: bool = True
    scales: tuple[float, ...] = ()

    @property
    def local(self) -> bool:
        """Whether `source` is a local file (else a hub id)."""
        return Path(self.source).is_absolute()

    @property
    def components(self) -> tuple[str, ...]:
        """The pipeline components it goes into ("both" and None: both; the caller drops what the model lacks)."""
        return {"1": ("transformer",), "2": ("transformer_2",)}.get(self.expert or "both",
                                                                     ("transformer", "transformer_2"))

    def text(self) -> str:
        """The value as `--lora` takes it (the options given or resolved spelled out)."""
        expert = f":expert={self.expert}" if self.expert is not None else ""
        scale = ",".join(f"{s:g}" for s in self.scales or (self.scale,))
        return f"{self.source}:scale={scale}{expert}" + ("" if self.fused else ":fused=false")

    @classmethod
    def parse(cls, value: Any, flag: str = "--lora") -> "LoraSpec":
        """`value` (a LoraSpec or its text) as a LoraSpec; a local file must exist (absolute once parsed).

        Raises:
            BadInput: one line naming `flag`: an empty source, an unknown or repeated option, a scale that is no
                finite number in [-MAX_LORA_SCALE, MAX_LORA_SCALE] (or a list of them naming one twice), an expert
                other than 1, 2, both, a fused value other than true / false, a file that is missing, a folder or
                not .safetensors.
        """
        if isinstance(value, cls):
            return value
        text = str(value).strip()
        parts, options = text.split(":"), {}
        while len(parts) > 1 and (m := _OPTION.fullmatch(parts[-1])):
            parts.pop()
            key, arg = m.group(1), m.group(2).strip()
            if key not in ("scale", "expert", "fused"):
                raise BadInput(f"{flag} {text}: unknown option {key!r} (options: scale, expert, fused); {_USAGE}")
            if key in options:
                raise BadInput(f"{flag} {text}: {key} is given twice")
            options[key] = arg
        source = ":".join(parts).strip()
        if not source:
            raise BadInput(f"{flag} {text!r} names no file; {_USAGE}")
        scales = tuple(_scale(arg, flag, text) for arg in options.get("scale", "1").split(","))
        if len(set(scales)) != len(scales):
            raise BadInput(f"{flag} {text}: a scale is listed twice")
        return cls(_source(source, f"{flag} {source}"), scales[0], _expert(options.get("expert"), flag, text),
                   _fused(options.get("fused", "true"), flag, text), scales if len(scales) > 1 else ())


def _scale(arg: str, flag: str, text: str) -> float:
    try:
        scale = float(arg.strip())
    except ValueError:
        scale = math.nan
    if not math.isfinite(scale) or abs(scale) > MAX_LORA_SCALE:
        raise BadInput(f"{flag} {text}: scale must be a number in [{-MAX_LORA_SCALE:g}, {MAX_LORA_SCALE:g}], "
                       f"got {arg!r}")
    return scale


def _expert(arg: str | None, flag: str, text: str) -> str | None:
    if arg is not None and arg not in EXPERTS:
        raise BadInput(f"{flag} {text}: expert must be 1 (the high-noise transformer), 2 (transformer_2) or both, "
                       f"got {arg!r}")
    return arg


def _fused(arg: str, flag: str, text: str) -> bool:
    if arg.lower() not in ("true", "false"):
        raise BadInput(f"{flag} {text}: fused must be true or false, got {arg!r}")
    return arg.lower() == "true"


def _source(source: str, where: str) -> str:
    """A local file as an absolute path, or a hub id as given.

    Raises:
        BadInput: a local file that is missing (and no hub id), a folder, or not .safetensors."""
    from .transformer_files import weights_file

    path = Path(source).expanduser()
    if not path.exists() and _HUB_ID.fullmatch(source) and not source.startswith((".", "~")):
        return source
    return str(weights_file(source, where, "a LoRA", (".safetensors",)))


def parse_loras(value: Any, flag: str = "--lora") -> tuple[LoraSpec, ...]:
    """`--lora` given once or more (a sequence of texts or specs, or one text) as LoraSpecs, in order.

    Raises:
        BadInput: see `LoraSpec.parse`; a value that is no text nor sequence.
    """
    if value is None:
        return ()
    items = [value] if isinstance(value, (str, LoraSpec)) else value
    if not isinstance(items, (list, tuple)):
        raise BadInput(f"{flag} takes {LORA_METAVAR} (repeatable), got {value!r}")
    return tuple(LoraSpec.parse(item, flag) for item in items)


def lora_format(path: Path, where: str, layers: int | None) -> str:
    """The LoRA format of a safetensors file by its header (no tensor read, no torch): "diffusers" (PEFT keys
    under `transformer.`), "original" (the original Wan names under `diffusion_model.`, lora_A / lora_B or
    lora_down / lora_up with alphas: Wan's, ComfyUI's, musubi-tuner's converted files) or "kohya" (`lora_unet_`,
    musubi-tuner's own files); diffusers' `WanLoraLoaderMixin.lora_state_dict` converts the last two.

    Args:
        path: the file; where: the message's start (`--lora FILE`); layers: the model's block count, if known.

    Raises:
        BadInput: one line: the file is damaged or truncated, holds no LoRA of these formats, or names a block the
            model does not have.
    """
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            keys = list(f.keys())
    except (OSError, ValueError, RuntimeError, SafetensorError) as e:
        raise BadInput(f"{where}: cannot read it as safetensors ({str(e).splitlines()[0] if str(e) else e}): the "
                       "file is damaged or truncated") from None
    found = [name for name, prefix in FORMATS.items() if keys and all(k.startswith(prefix) for k in keys)]
    if not found or not any("lora" in k for k in keys):
        example = ", ".join(keys[:2]) + (", ..." if len(keys) > 2 else "") if keys else "none"
        raise BadInput(f"{where} holds no LoRA that diffusers' Wan loader reads (its keys: {example}; a LoRA's "
                       f"are e.g. {KEY_EXAMPLES.split(' (')[0]})")
    blocks = {int(m.group(1)) for k in keys if (m := re.search(r"blocks[._](\d+)[._]", k))}
    if layers is not None and blocks and max(blocks) >= layers:
        raise BadInput(f"{where} adapts block {max(blocks)}, and the model has {layers} blocks: a LoRA for "
                       "another model")
    return found[0]
