"""Model presets: `vsagen/preset_data/*.toml` loaded into frozen dataclasses.

Precedence for every generation setting is implemented once, in `RunConfig` construction
(`vsagen.request.resolve.resolve`): CLI flag > preset `[defaults]` > nothing (every preset must give every default).
Unknown keys in a preset are errors, never silently dropped.

Model families a preset can describe (text to video: diffusers' `WanPipeline`):
* Wan2.1-style: one transformer, scalar timesteps (no optional keys).
* Wan2.2-TI2V-5B-style: `expand_timesteps = true` (per-token (B, S) timesteps), a 48-channel VAE with 16x
  spatial compression (`[vae]` with z_dim 48, is_residual, scale_factor_spatial 16; `[vae_stride] spatial = 16`).
* Wan2.2-A14B-style: two experts. `transformer_2` is `true` (the second expert has the same architecture as
  `[transformer]`; for source "tiny" it gets other random weights) or a table of its own constructor kwargs;
  `boundary_ratio` (in (0, 1)) is then required: `transformer` denoises t >= boundary_ratio * 1000,
  `transformer_2` the rest. `[defaults] guidance_2` (optional) is the second expert's CFG scale
  (diffusers' `guidance_scale_2`); absent, the second expert uses `guidance`.
* Wan2.2-TI2V-5B-style text-image-to-video: `ti2v = true` on a `WanPipeline` preset says the same components
  also animate an image through diffusers' `WanImageToVideoPipeline` (the image's latent replaces the first
  latent frame, whose tokens get timestep 0): the model runs under both `vsagen t2v` and `vsagen i2v`.
* Wan2.1-I2V-style (image to video): `pipeline = "WanImageToVideoPipeline"`, a transformer with 36 input
  channels (16 noise + 20 condition: 4 mask + 16 image latent) and, for the CLIP image branch, `image_dim` /
  `added_kv_proj_dim`; source "tiny" then needs an `[image_encoder]` table (transformers' CLIPVisionConfig
  kwargs; the CLIPImageProcessor is sized to its `image_size`).
* Wan2.1-FLF2V-style (first/last-frame to video): a Wan2.1-I2V-style preset whose transformer also has
  `pos_embed_seq_len`, the CLIP tokens of *two* images (first and last frame; 2 x 257 = 514 for CLIP ViT-H/14 at
  224 px): its image embedder reshapes the two images' CLIP tokens into one sequence and adds a learned position
  embedding, so it needs a last image (`vsagen i2v --last-image`). With an `[image_encoder]` table,
  `pos_embed_seq_len` must be twice that encoder's token count ((image_size / patch_size)^2 + 1).
* Wan2.2-I2V-A14B-style image to video: a 36-channel transformer without the CLIP branch (no `image_dim`; two
  experts): a last image is optional (diffusers' condition then marks the last frame too).

Which of these take a last image is `Preset.last_image` (`last_image_use`).

Published sparse / distilled checkpoints (FastVideo's FastWan and VSA fine-tunes, AMD's Hummingbird-XT) are presets
of one of these architectures that also say how their authors run them: `[defaults] sampler` (e.g. "dmd", a
few-step re-noise list with CFG off; `vsagen.samplers`), `[defaults] attn` (the attention backend they were trained
for, which `--attn auto` runs when the weights cannot tell: random weights, a hub id not downloaded yet) with its
options in `[attention.<backend>]`, and `checkpoint_class`, the pipeline class their model_index.json names when
it is not a diffusers class (FastVideo's `WanDMDPipeline`), and for image to video `[defaults] image_size`:
"adaptive" sizes the video by the input image (its aspect at the area of height x width, TurboDiffusion's
`--adaptive_resolution`; `vsagen.media.image.adaptive_size`; "adaptive-floor": the sides rounded down, LightX2V's
sizing), "fixed" (the default) at height x width. Such a
preset describes a local folder only by its checkpoint class or its folder name, never as the fallback for a plain
Wan checkpoint of the same architecture.

A hub preset whose repository stores the transformer in the original Wan key names (a VideoX-Fun "civitai" folder:
config.json with `dim`, `num_heads`, ... and safetensors beside it) says `transformer_layout = "wan"` and names the
stock diffusers checkpoint of its architecture that supplies the other components, `components = "<hub id>"`
(`transformer_subfolder`, optional: the folder inside the repository holding them; `vsagen.models.checkpoint_layouts`).

A preset whose authors ship a lightweight VAE decoder (Hummingbird-XT's `AutoencoderKLTurboVAED`: a config.json +
safetensors folder; `vsagen.decode.light_decoder`) says where it lives in a `[light_vae]` table: `subfolder` (inside the
model's folder or hub repository), `default` (decode with it unless `--vae stock`; false: only with `--vae light`),
`tile_frames` / `tile_stride` (its authors' temporal windows, 0: none) and `[light_vae.config]` (the decoder's config,
for `--random-weights` and tiny builds; a real folder's config.json is what loads).

A preset whose authors publish the transformer alone as single files (TurboDiffusion's `.pth` state dicts) names them
in a `[transformer_files]` table: `repo` (the hub repository) and `files` (one per expert, the high-noise expert
first); `hub_id` is then the stock diffusers checkpoint of its architecture that supplies the other components
(`vsagen.models.transformer_files`). Such a preset never describes a checkpoint of that architecture by itself.
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import BadInput, close_matches
from ..samplers import NAMED as NAMED_SAMPLERS


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
    max_sequence_length: int
    vae_dtype: str  # "same" (pipeline dtype) | "fp32" | "bf16" | "fp16"
    # The VAE's dtype for a run where it only decodes (text to video), chosen by measurement: bf16 holds the Wan2.1
    # and Wan2.2 VAEs' frames 47-50 dB from float32 at real size and decodes 1.3-1.5x faster (BENCHMARKS.md,
    # 2026-12-05); None: `vae_dtype`. An image-to-video run (the VAE also encodes the image) keeps `vae_dtype`.
    decode_dtype: str | None = None
    guidance_2: float | None = None  # CFG scale of the second expert (two-expert presets only; None: `guidance`)
    # The sampler its authors run (`vsagen.samplers`: "default", the checkpoint's scheduler for `steps` steps with
    # CFG `guidance`; "dmd" etc.: a few-step re-noise list, CFG off), below `--sampler`
    sampler: str = "default"
    # How `vsagen i2v` sizes the video without --height / --width: "fixed" (height x width) or "adaptive" (the input
    # image's aspect at the area height x width, `vsagen.media.image.adaptive_size`: TurboDiffusion's
    # --adaptive_resolution, which its Wan2.2 I2V script passes), or "adaptive-floor" (the same with the sides
    # rounded down: LightX2V's Wan I2V sizing)
    image_size: str = "fixed"
    attn: str | None = None  # the attention backend its authors run (published sparse checkpoints), for --attn auto
    # Per-backend option defaults, from the preset's `[attention.<backend>]` tables, e.g. {"vsa": {"sparsity":
    # 0.875}}: below a flag or a `NAME:KEY=VALUE` option, above the backend's own default (vsagen.attention.spec).
    attention: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def sparsity(self) -> float | None:
        """The sparsity the preset gives its sparse backends (the first `sparsity` in its [attention.*] tables),
        None when no table sets one."""
        return next((t["sparsity"] for t in self.attention.values() if "sparsity" in t), None)


@dataclass(frozen=True)
class LightVae:
    """A preset's `[light_vae]`: where its lightweight VAE decoder lives and how its authors run it."""

    subfolder: str  # inside the model's folder / hub repository: config.json + diffusion_pytorch_model.safetensors
    default: bool  # decode with it unless `--vae stock` (false: only with `--vae light`)
    tile_frames: int  # temporal windows of this many frames (0: the whole video at once)
    tile_stride: int  # ... every this many frames
    config: dict[str, Any]  # its config.json keys, for random weights and tiny builds


@dataclass(frozen=True)
class Preset:
    """One model: where its weights come from and its architecture.

    `source` is "hub" (weights from `hub_id`, or a local copy) or "tiny" (built offline from the configs
    here). `transformer` / `vae` / `text_encoder` are constructor kwargs of diffusers'
    WanTransformer3DModel / AutoencoderKLWan and transformers' UMT5Config. `transformer_2` (two-expert
    presets) holds the second expert's constructor kwargs, `boundary_ratio` where the pipeline switches to it;
    `expand_timesteps` makes the pipeline pass per-token timesteps (Wan2.2-TI2V-5B).
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
    expand_timesteps: bool = False
    boundary_ratio: float | None = None
    transformer_2: dict[str, Any] | None = None
    image_encoder: dict[str, Any] | None = None
    ti2v: bool = False
    checkpoint_class: str | None = None  # a published checkpoint's own model_index class (FastVideo: WanDMDPipeline)
    transformer_layout: str = "diffusers"  # "wan": the hub repository's transformer is in the original Wan key names
    components: str = ""  # transformer_layout "wan": the diffusers hub id of the text encoder, tokenizer, VAE, scheduler
    transformer_subfolder: str = ""  # transformer_layout "wan": where in the repository the transformer is
    # the hub files of a transformer published alone (`[transformer_files]`): (repository, (file per expert, ...))
    transformer_files: tuple[str, tuple[str, ...]] | None = None
    light_vae: LightVae | None = None  # `[light_vae]`: a lightweight VAE decoder beside the stock VAE

    @property
    def image_to_video(self) -> bool:
        """True for image-to-video-only presets (run by `vsagen i2v` alone)."""
        return self.pipeline == I2V_PIPELINE

    @property
    def takes_image(self) -> bool:
        """True when `vsagen i2v` can run the model: image-to-video presets and text-image-to-video (ti2v) ones."""
        return self.image_to_video or self.ti2v

    @property
    def last_image(self) -> str:
        """How the model uses a last frame (`vsagen i2v --last-image`): one of the `LAST_IMAGE_*` values
        (see `last_image_use`)."""
        return last_image_use(self.takes_image, self.transformer, self.expand_timesteps)

    @property
    def published(self) -> bool:
        """A published sparse / distilled checkpoint's preset (its own model_index class, attention backend or
        sampler): it describes a local folder only by that class or the folder's name, never as the architecture's
        fallback."""
        d = self.defaults
        return self.checkpoint_class is not None or d.attn is not None or d.sampler != "default"

    @property
    def experts(self) -> int:
        """How many transformers (experts) the pipeline has: 1, or 2 for A14B-style presets."""
        return 2 if self.transformer_2 is not None else 1

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
             "text_encoder", "expand_timesteps", "boundary_ratio", "transformer_2", "image_encoder", "ti2v",
             "attention", "checkpoint_class", "transformer_layout", "components", "transformer_subfolder",
             "transformer_files", "light_vae"}
_OPTIONAL_TOP_KEYS = {"light_vae", "text_encoder", "expand_timesteps", "boundary_ratio", "transformer_2", "image_encoder", "ti2v",
                      "attention", "checkpoint_class", "transformer_layout", "components", "transformer_subfolder",
                      "transformer_files"}
TRANSFORMER_FILE_SUFFIXES = (".safetensors", ".pth", ".pt")  # what `--transformer` / [transformer_files] read
_OPTIONAL_DEFAULTS = {"guidance_2", "sampler", "attn", "decode_dtype", "image_size"}
IMAGE_SIZES = ("fixed", "adaptive", "adaptive-floor")  # [defaults] image_size
_VAE_DTYPES = ("same", "fp32", "bf16", "fp16")
_NOT_IN_DEFAULTS_TABLE = {"attention"}  # GenerationDefaults fields filled from other tables
_SOURCES = {"hub", "tiny"}
T2V_PIPELINE = "WanPipeline"
I2V_PIPELINE = "WanImageToVideoPipeline"
_PIPELINES = {T2V_PIPELINE, I2V_PIPELINE}


# How an image-taking model uses a last frame (`vsagen i2v IMAGE PROMPT --last-image PATH`), i.e. what diffusers'
# WanImageToVideoPipeline does with `last_image` for it:
LAST_IMAGE_REQUIRED = "required"  # FLF2V: CLIP branch with `pos_embed_seq_len`, built for two images
LAST_IMAGE_OPTIONAL = "optional"  # no CLIP branch (Wan2.2-I2V-A14B): the condition video and mask get the last frame
LAST_IMAGE_ONE_IMAGE = "one-image"  # Wan2.1 I2V: the CLIP branch (no position embedding) takes one image only
LAST_IMAGE_IGNORED = "ignored"  # per-token timesteps (Wan2.2-TI2V-5B): diffusers silently ignores `last_image`
LAST_IMAGE_NONE = "none"  # text to video only: takes no image at all


def last_image_use(takes_image: bool, transformer: dict[str, Any], expand_timesteps: bool) -> str:
    """How a model uses a last frame, from what diffusers' `WanImageToVideoPipeline` does with `last_image`.

    Args:
        takes_image: whether `vsagen i2v` can run the model at all (image to video, or text-image to video).
        transformer: the transformer's config (a preset's `[transformer]` or a checkpoint's transformer/config.json).
        expand_timesteps: per-token timesteps (Wan2.2-TI2V-5B family), for which diffusers ignores `last_image`.

    Returns:
        One of `LAST_IMAGE_REQUIRED` (FLF2V: `image_dim` and `pos_embed_seq_len`), `LAST_IMAGE_ONE_IMAGE`
        (`image_dim` alone: the CLIP branch cannot take two images), `LAST_IMAGE_OPTIONAL` (no CLIP branch),
        `LAST_IMAGE_IGNORED` (`expand_timesteps`), `LAST_IMAGE_NONE` (text to video).
    """
    if not takes_image:
        return LAST_IMAGE_NONE
    if expand_timesteps:
        return LAST_IMAGE_IGNORED
    if transformer.get("image_dim") is None:
        return LAST_IMAGE_OPTIONAL
    if transformer.get("pos_embed_seq_len") is None:
        return LAST_IMAGE_ONE_IMAGE
    return LAST_IMAGE_REQUIRED


def clip_tokens(image_encoder: dict[str, Any]) -> int:
    """Tokens per image of a CLIP vision encoder (CLIPVisionConfig kwargs): patches plus the class token."""
    return (int(image_encoder["image_size"]) // int(image_encoder["patch_size"])) ** 2 + 1


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


def _attention_tables(tables: Any, where: str) -> dict[str, dict[str, Any]]:
    """Check the `[attention.<backend>]` tables: each names a registered backend, and its keys and values are
    options that backend takes (validated by its Options dataclass)."""
    from ..attention.spec import make_options

    if not isinstance(tables, dict) or not all(isinstance(t, dict) for t in tables.values()):
        raise BadInput(f"preset {where}: [attention] holds one table per backend, e.g. [attention.vsa]")
    out = {}
    for name, table in tables.items():
        table = _preset_paths(name, dict(table)) if isinstance(name, str) else table
        make_options(name, table, where=f"preset {where} [attention]")  # "preset x.toml [attention] vsa: ..."
        out[name] = table
    return out


def _preset_paths(backend: str, table: dict[str, Any]) -> dict[str, Any]:
    """Option values of Path-typed options that are relative paths, resolved against the presets folder (a
    preset's `[attention.sparse-vdit] patterns = "patterns/tiny.json"` names a file shipped beside it)."""
    import typing

    from ..attention.registry import REGISTRY

    facts = REGISTRY.get(backend)  # the class: its Options
    if facts is None:
        return table
    hints = typing.get_type_hints(facts.Options)
    for key, value in table.items():
        hint = hints.get(key)
        if isinstance(value, str) and hint is not None and Path in (hint, *typing.get_args(hint)) \
                and not Path(value).expanduser().is_absolute():
            table[key] = _preset_dir() / value
    return table


def parse_preset(data: dict[str, Any], where: str) -> Preset:
    """Validate a preset's parsed TOML and build the `Preset`.

    Raises:
        BadInput: unknown or missing keys, an unknown source or pipeline class, or inconsistent family keys
            (`transformer_2` without `boundary_ratio` or the reverse, `guidance_2` without `transformer_2`,
            a value of the wrong type or out of range).
    """
    _check_keys(where, data, _TOP_KEYS, _TOP_KEYS - _OPTIONAL_TOP_KEYS)
    dnames = {f.name for f in fields(GenerationDefaults)} - _NOT_IN_DEFAULTS_TABLE
    _check_keys(f"{where} [defaults]", data["defaults"], dnames, dnames - _OPTIONAL_DEFAULTS)
    _check_keys(f"{where} [vae_stride]", data["vae_stride"], {"temporal", "spatial"}, {"temporal", "spatial"})
    image_encoder = _check_components(data, where)
    expand, ti2v = _flags(data, where)
    transformer_2, ratio = _experts(data, where)
    checkpoint_class = data.get("checkpoint_class")
    if checkpoint_class is not None and (not isinstance(checkpoint_class, str) or not checkpoint_class.strip()):
        raise BadInput(f"preset {where}: checkpoint_class must be a pipeline class name, got {checkpoint_class!r}")
    _check_defaults(data["defaults"], where, transformer_2)
    layout = _layout_keys(data, where, transformer_2)
    hub_files = _transformer_files(data, where, 1 if transformer_2 is None else 2, layout["transformer_layout"])
    return Preset(
        name=data["name"],
        description=data["description"],
        pipeline=data["pipeline"],
        source=data["source"],
        hub_id=data["hub_id"],
        defaults=GenerationDefaults(**data["defaults"], attention=_attention_tables(data.get("attention", {}), where)),
        vae_stride_temporal=int(data["vae_stride"]["temporal"]),
        vae_stride_spatial=int(data["vae_stride"]["spatial"]),
        transformer=dict(data["transformer"]),
        vae=dict(data["vae"]),
        text_encoder=dict(data["text_encoder"]) if "text_encoder" in data else None,
        expand_timesteps=expand,
        boundary_ratio=ratio,
        transformer_2=transformer_2,
        image_encoder=dict(image_encoder) if image_encoder is not None else None,
        ti2v=ti2v,
        checkpoint_class=checkpoint_class,
        transformer_files=hub_files,
        light_vae=_light_vae(data.get("light_vae"), where),
        **layout,
    )


def _check_components(data: dict[str, Any], where: str) -> Any:
    """Check a preset's source, pipeline class and the component tables they need (text encoder, image encoder,
    first/last-frame CLIP tokens); returns the [image_encoder] table or None.

    Raises:
        BadInput: an unknown source or pipeline, or a component table missing or out of place.
    """
    if data["source"] not in _SOURCES:
        raise BadInput(f"preset {where}: source must be one of {sorted(_SOURCES)}, got {data['source']!r}")
    if data["pipeline"] not in _PIPELINES:
        raise BadInput(f"preset {where}: pipeline must be one of {sorted(_PIPELINES)}, got {data['pipeline']!r}")
    if data["source"] == "tiny" and "text_encoder" not in data:
        raise BadInput(f"preset {where}: source 'tiny' needs a [text_encoder] table")
    image_encoder = data.get("image_encoder")
    if image_encoder is not None and data["pipeline"] != I2V_PIPELINE:
        raise BadInput(f"preset {where}: [image_encoder] is for pipeline {I2V_PIPELINE!r} only")
    if (data["pipeline"] == I2V_PIPELINE and data["source"] == "tiny"
            and data["transformer"].get("image_dim") is not None and image_encoder is None):
        raise BadInput(f"preset {where}: source 'tiny' with a transformer image_dim needs an [image_encoder] table")
    pos_len = data["transformer"].get("pos_embed_seq_len")
    if pos_len is not None:
        if data["pipeline"] != I2V_PIPELINE or data["transformer"].get("image_dim") is None:
            raise BadInput(f"preset {where} [transformer]: pos_embed_seq_len (first/last-frame CLIP tokens) needs "
                           f"pipeline {I2V_PIPELINE!r} and a transformer image_dim")
        if image_encoder is not None and pos_len != 2 * clip_tokens(image_encoder):
            raise BadInput(f"preset {where} [transformer]: pos_embed_seq_len must be 2 x the [image_encoder]'s "
                           f"{clip_tokens(image_encoder)} tokens per image = {2 * clip_tokens(image_encoder)}, "
                           f"got {pos_len!r}")
    return image_encoder


def _flags(data: dict[str, Any], where: str) -> tuple[bool, bool]:
    """A preset's `expand_timesteps` and `ti2v` switches, checked (BadInput: not a bool, ti2v off a T2V pipeline)."""
    expand = data.get("expand_timesteps", False)
    if not isinstance(expand, bool):
        raise BadInput(f"preset {where}: expand_timesteps must be true or false, got {expand!r}")
    ti2v = data.get("ti2v", False)
    if not isinstance(ti2v, bool):
        raise BadInput(f"preset {where}: ti2v must be true or false, got {ti2v!r}")
    if ti2v and data["pipeline"] != T2V_PIPELINE:
        raise BadInput(f"preset {where}: ti2v (text and image to video) is for pipeline {T2V_PIPELINE!r} presets")
    return expand, ti2v


def _experts(data: dict[str, Any], where: str) -> tuple[dict[str, Any] | None, float | None]:
    """The second expert's transformer settings and the boundary ratio of a two-expert preset, or (None, None).

    Raises:
        BadInput: transformer_2 of the wrong type, a ratio outside (0, 1), or one given without the other.
    """
    t2 = data.get("transformer_2")
    if t2 is not None and not isinstance(t2, (bool, dict)):
        raise BadInput(f"preset {where}: transformer_2 must be true/false or a table of transformer settings, "
                       f"got {t2!r}")
    transformer_2 = dict(data["transformer"]) if t2 is True else (dict(t2) if isinstance(t2, dict) else None)
    ratio = data.get("boundary_ratio")
    if ratio is not None:
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 < ratio < 1.0:
            raise BadInput(f"preset {where}: boundary_ratio must be a number in (0, 1), got {ratio!r}")
        ratio = float(ratio)
    if (transformer_2 is None) != (ratio is None):
        raise BadInput(f"preset {where}: transformer_2 and boundary_ratio go together (a two-expert pipeline "
                       "needs both; a one-expert pipeline neither)")
    return transformer_2, ratio


def _check_defaults(defaults: dict[str, Any], where: str, transformer_2: dict[str, Any] | None) -> None:
    """Check the values of a preset's [defaults] table that name things: the attention backend, the VAE / decode
    dtypes, the sampler, the image sizing, and guidance_2 (which needs a second expert).

    Raises:
        BadInput: an unknown backend, dtype, sampler or image_size name, or a guidance_2 that cannot apply.
    """
    from ..attention.registry import REGISTRY

    attn = defaults.get("attn")
    if attn is not None and (not isinstance(attn, str) or REGISTRY.get(attn) is None):
        raise BadInput(f"preset {where} [defaults]: attn must name a backend ({', '.join(REGISTRY)}), got {attn!r}")
    for key in ("vae_dtype", "decode_dtype"):
        value = defaults.get(key, "same")
        if value not in _VAE_DTYPES:
            raise BadInput(f"preset {where} [defaults]: {key} must be one of {', '.join(_VAE_DTYPES)}, got {value!r}")
    sampler = defaults.get("sampler", "default")  # options (e.g. "rcm:sigma_max=200") are checked when run
    if not isinstance(sampler, str) or sampler.split(":", 1)[0].strip() not in NAMED_SAMPLERS:
        raise BadInput(f"preset {where} [defaults]: sampler must be one of {', '.join(NAMED_SAMPLERS)} (with options), "
                       f"got {sampler!r}")
    if defaults.get("image_size", "fixed") not in IMAGE_SIZES:
        raise BadInput(f"preset {where} [defaults]: image_size must be one of {', '.join(IMAGE_SIZES)}, got "
                       f"{defaults['image_size']!r}")
    g2 = defaults.get("guidance_2")
    if g2 is not None:
        if transformer_2 is None:
            raise BadInput(f"preset {where} [defaults]: guidance_2 needs a second expert (transformer_2)")
        if isinstance(g2, bool) or not isinstance(g2, (int, float)):
            raise BadInput(f"preset {where} [defaults]: guidance_2 must be a number, got {g2!r}")


def _light_vae(table: Any, where: str) -> LightVae | None:
    """The `[light_vae]` table, checked: `subfolder` a relative path, `default` a bool, `tile_frames` /
    `tile_stride` integers >= 0 (stride at most frames), `config` a table."""
    if table is None:
        return None
    keys = {"subfolder", "default", "tile_frames", "tile_stride", "config"}
    if not isinstance(table, dict):
        raise BadInput(f"preset {where}: light_vae must be a table, got {table!r}")
    _check_keys(f"{where} [light_vae]", table, keys, keys)
    sub, default, frames, stride = table["subfolder"], table["default"], table["tile_frames"], table["tile_stride"]
    if not isinstance(sub, str) or not sub.strip("/") or Path(sub).is_absolute() or ".." in Path(sub).parts:
        raise BadInput(f"preset {where} [light_vae]: subfolder must be a relative folder, got {sub!r}")
    if not isinstance(default, bool) or not isinstance(table["config"], dict):
        raise BadInput(f"preset {where} [light_vae]: default is true or false and config a table")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (frames, stride)) \
            or stride > frames:
        raise BadInput(f"preset {where} [light_vae]: tile_frames and tile_stride are integers >= 0, stride <= frames")
    return LightVae(subfolder=sub.strip("/"), default=default, tile_frames=frames, tile_stride=stride,
                    config=dict(table["config"]))


def _transformer_files(data: dict[str, Any], where: str, experts: int,
                       layout: str) -> tuple[str, tuple[str, ...]] | None:
    """The `[transformer_files]` table, checked: `repo` a hub id, `files` one file name per expert (high-noise expert
    first) ending in .safetensors, .pth or .pt; for hub presets of the diffusers layout (whose `hub_id` supplies the
    other components)."""
    table = data.get("transformer_files")
    if table is None:
        return None
    if not isinstance(table, dict) or set(table) != {"repo", "files"}:
        raise BadInput(f"preset {where}: [transformer_files] takes repo = '<org/name>' and files = [...]")
    repo, files = table["repo"], table["files"]
    if not isinstance(repo, str) or repo.count("/") != 1:
        raise BadInput(f"preset {where} [transformer_files]: repo must be a hub id '<org/name>', got {repo!r}")
    if (not isinstance(files, list) or len(files) != experts
            or not all(isinstance(f, str) and f.endswith(TRANSFORMER_FILE_SUFFIXES) for f in files)):
        raise BadInput(f"preset {where} [transformer_files]: files must list {experts} file name(s) ending in "
                       f"{', '.join(TRANSFORMER_FILE_SUFFIXES)} (one per expert, high-noise first), got {files!r}")
    if data["source"] != "hub" or layout != "diffusers":
        raise BadInput(f"preset {where}: [transformer_files] is for hub presets whose hub_id is the diffusers "
                       "checkpoint of the other components")
    return repo, tuple(files)


def _layout_keys(data: dict[str, Any], where: str, transformer_2: Any) -> dict[str, str]:
    """`transformer_layout`, `components`, `transformer_subfolder`, checked: layout "diffusers" (default) or "wan";
    "wan" is for one-expert hub presets and needs `components` (a hub id); the other two keys go with "wan" only."""
    layout = data.get("transformer_layout", "diffusers")
    out = {"transformer_layout": layout, "components": data.get("components", ""),
           "transformer_subfolder": data.get("transformer_subfolder", "")}
    if layout not in ("diffusers", "wan"):
        raise BadInput(f"preset {where}: transformer_layout must be 'diffusers' or 'wan', got {layout!r}")
    if not all(isinstance(v, str) for v in out.values()):
        raise BadInput(f"preset {where}: transformer_layout, components and transformer_subfolder are strings")
    if layout == "diffusers" and (out["components"] or out["transformer_subfolder"]):
        raise BadInput(f"preset {where}: components and transformer_subfolder go with transformer_layout = 'wan'")
    if layout == "wan" and (data["source"] != "hub" or transformer_2 is not None or "/" not in out["components"]):
        raise BadInput(f"preset {where}: transformer_layout = 'wan' is for one-expert hub presets and needs "
                       "components = '<org/name>', the diffusers checkpoint of its architecture")
    return out


@functools.cache
def load_preset(name: str) -> Preset:
    """Load a bundled preset by name.

    Raises:
        BadInput: no such preset (the message names the close ones, else lists them all), or the file is malformed.
    """
    path = _preset_dir() / f"{name}.toml"
    if not path.is_file():
        close = close_matches(name, preset_names())
        if close:  # mistyped: the names it may have meant, as --model says
            raise BadInput(f"unknown preset {name!r}; did you mean {' or '.join(close)}? (`vsagen presets` lists "
                           "them all)")
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
        if p.hub_id and p.hub_id == hub_id and p.transformer_files is None:  # (a files preset: its base's id)
            return p
    return None


def same_family(preset: Preset, index: dict[str, Any]) -> bool:
    """Whether a checkpoint's model_index.json has the preset's pipeline family: a second expert
    (`transformer_2`) or not, per-token timesteps (`expand_timesteps`) or not."""
    t2 = index.get("transformer_2")
    has_t2 = isinstance(t2, list) and bool(t2) and t2[0] is not None
    return has_t2 == (preset.transformer_2 is not None) and \
        bool(index.get("expand_timesteps", False)) == preset.expand_timesteps


# `pos_embed_seq_len` tells an FLF2V transformer (first/last frame) from the I2V one it shares everything else with.
_ARCH_KEYS = ("num_layers", "num_attention_heads", "attention_head_dim", "in_channels", "out_channels", "ffn_dim",
              "text_dim", "image_dim", "pos_embed_seq_len")


def same_architecture(config: dict[str, Any], transformer: dict[str, Any]) -> bool:
    """Whether a checkpoint's transformer/config.json has a preset's `[transformer]` architecture (`_ARCH_KEYS`:
    sizes, channels, the CLIP image branch, and FLF2V's `pos_embed_seq_len`; absent and None are the same)."""
    return all(config.get(k) == transformer.get(k) for k in _ARCH_KEYS)


def preset_for_transformer_config(config: dict[str, Any], index: dict[str, Any] | None = None,
                                  dirname: str = "", checkpoint_class: str = "") -> Preset | None:
    """The bundled hub preset (of the diffusers layout) that describes a local checkpoint: same transformer
    architecture (`_ARCH_KEYS` of its transformer/config.json) and, when its model_index.json is given, the same
    family (pipeline class, a second expert or not, per-token timesteps or not).

    Several presets can share one architecture (Wan2.1 I2V 480p / 720p; a Wan release and its FastWan distill): a
    checkpoint whose model_index names a preset's own `checkpoint_class` (FastVideo's `WanDMDPipeline`; given as
    `checkpoint_class` when `index` holds the stock class it is built as) gets that preset; else the one whose hub repository name is part of the directory's name wins (a download into
    `Wan2.1-I2V-14B-720P-Diffusers/` gets the 720p defaults), else the first by name among the presets that are not
    `published` (a published checkpoint's preset never stands in for a plain checkpoint).
    """
    matches = []
    named = index.get("_class_name") if index is not None else None
    written = checkpoint_class or named
    for n in preset_names():
        p = load_preset(n)
        if (p.source != "hub" or p.transformer_layout != "diffusers" or p.transformer_files is not None
                or not same_architecture(config, p.transformer)):
            continue
        if index is not None and (named not in (None, p.pipeline, p.checkpoint_class) or not same_family(p, index)):
            continue
        matches.append(p)
    own = [p for p in matches if p.checkpoint_class is not None and p.checkpoint_class == written]
    folder = dirname.lower()
    for p in own + matches:
        if folder and p.hub_id.split("/")[-1].lower().removesuffix("-diffusers") in folder:
            return p
    plain = [p for p in matches if not p.published]
    return (own or plain or [None])[0]
