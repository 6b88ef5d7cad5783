"""Model presets: `presets/*.toml` loaded into frozen dataclasses.

Precedence for every generation setting is implemented once, in `RunConfig` construction
(`vsagen.config.resolve`): CLI flag > preset `[defaults]` > nothing (every preset must give every default).
Unknown keys in a preset are errors, never silently dropped.
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

from .errors import BadInput


@dataclass(frozen=True)
class GenerationDefaults:
    """Per-model generation defaults (pixels, frames, steps, CFG scale, flow shift, fps)."""

    height: int
    width: int
    frames: int
    steps: int
    guidance: float
    flow_shift: float
    fps: int
    negative_prompt: str
    sparsity: float
    max_sequence_length: int
    vae_dtype: str  # "same" (pipeline dtype) | "fp32" | "bf16" | "fp16"


@dataclass(frozen=True)
class Preset:
    """One model: where its weights come from and its architecture.

    `source` is "hub" (weights from `hub_id`, or a local copy) or "tiny" (built offline from the configs
    here). `transformer` / `vae` / `text_encoder` are constructor kwargs of diffusers'
    WanTransformer3DModel / AutoencoderKLWan and transformers' UMT5Config.
    """

    name: str
    description: str
    pipeline: str
    source: str
    hub_id: str
    defaults: GenerationDefaults
    vae_stride_temporal: int
    vae_stride_spatial: int
    transformer: dict[str, Any]
    vae: dict[str, Any]
    text_encoder: dict[str, Any] | None = None

    @property
    def patch_size(self) -> tuple[int, int, int]:
        """Transformer patch size (p_t, p_h, p_w)."""
        p = self.transformer["patch_size"]
        return (p, p, p) if isinstance(p, int) else tuple(p)  # type: ignore[return-value]

    @property
    def pixel_multiple(self) -> int:
        """Height and width must be multiples of this: VAE spatial stride x spatial patch."""
        return self.vae_stride_spatial * self.patch_size[1]


_TOP_KEYS = {"name", "description", "pipeline", "source", "hub_id", "defaults", "vae_stride", "transformer", "vae",
             "text_encoder"}
_SOURCES = {"hub", "tiny"}
_PIPELINES = {"WanPipeline"}


def _preset_dir() -> Path:
    return Path(str(resources.files("vsagen.preset_data")))


def preset_names() -> list[str]:
    """Names of the bundled presets, sorted."""
    return sorted(p.stem for p in _preset_dir().glob("*.toml"))


def _check_keys(where: str, got: dict, allowed: set[str], required: set[str]) -> None:
    unknown = set(got) - allowed
    if unknown:
        raise BadInput(f"preset {where}: unknown key(s) {', '.join(sorted(unknown))}")
    missing = required - set(got)
    if missing:
        raise BadInput(f"preset {where}: missing key(s) {', '.join(sorted(missing))}")


def parse_preset(data: dict[str, Any], where: str) -> Preset:
    """Validate a preset's parsed TOML and build the `Preset`.

    Raises:
        BadInput: unknown or missing keys, an unknown source or pipeline class.
    """
    _check_keys(where, data, _TOP_KEYS, _TOP_KEYS - {"text_encoder"})
    dnames = {f.name for f in fields(GenerationDefaults)}
    _check_keys(f"{where} [defaults]", data["defaults"], dnames, dnames)
    _check_keys(f"{where} [vae_stride]", data["vae_stride"], {"temporal", "spatial"}, {"temporal", "spatial"})
    if data["source"] not in _SOURCES:
        raise BadInput(f"preset {where}: source must be one of {sorted(_SOURCES)}, got {data['source']!r}")
    if data["pipeline"] not in _PIPELINES:
        raise BadInput(f"preset {where}: pipeline must be one of {sorted(_PIPELINES)}, got {data['pipeline']!r}")
    if data["source"] == "tiny" and "text_encoder" not in data:
        raise BadInput(f"preset {where}: source 'tiny' needs a [text_encoder] table")
    return Preset(
        name=data["name"],
        description=data["description"],
        pipeline=data["pipeline"],
        source=data["source"],
        hub_id=data["hub_id"],
        defaults=GenerationDefaults(**data["defaults"]),
        vae_stride_temporal=int(data["vae_stride"]["temporal"]),
        vae_stride_spatial=int(data["vae_stride"]["spatial"]),
        transformer=dict(data["transformer"]),
        vae=dict(data["vae"]),
        text_encoder=dict(data["text_encoder"]) if "text_encoder" in data else None,
    )


@functools.cache
def load_preset(name: str) -> Preset:
    """Load a bundled preset by name.

    Raises:
        BadInput: no such preset (the message lists the known ones), or the file is malformed.
    """
    path = _preset_dir() / f"{name}.toml"
    if not path.is_file():
        raise BadInput(f"unknown preset {name!r}; presets: {', '.join(preset_names())}")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise BadInput(f"preset {path}: {e}") from None
    preset = parse_preset(data, path.name)
    if preset.name != name:
        raise BadInput(f"preset {path.name}: its name field is {preset.name!r}, expected {name!r}")
    return preset


def preset_for_hub_id(hub_id: str) -> Preset | None:
    """The bundled preset whose `hub_id` is `hub_id`, if any."""
    for n in preset_names():
        p = load_preset(n)
        if p.hub_id and p.hub_id == hub_id:
            return p
    return None


_ARCH_KEYS = ("num_layers", "num_attention_heads", "attention_head_dim", "in_channels", "out_channels", "ffn_dim",
              "text_dim")


def preset_for_transformer_config(config: dict[str, Any]) -> Preset | None:
    """The bundled hub preset whose transformer architecture matches a checkpoint's transformer config."""
    for n in preset_names():
        p = load_preset(n)
        if p.source == "hub" and all(config.get(k) == p.transformer.get(k) for k in _ARCH_KEYS):
            return p
    return None
