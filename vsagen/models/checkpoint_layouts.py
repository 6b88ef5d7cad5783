"""Checkpoint layouts other than a stock diffusers Wan pipeline, read as one:

* **A foreign pipeline class**: a diffusers-format folder (or hub id) whose model_index.json names a pipeline class
  diffusers does not have (FastVideo's `WanDMDPipeline`) but whose transformer is diffusers' `WanTransformer3DModel`
  is built as the stock Wan class its transformer calls for (`stock_pipeline_class`); a Wan2.2-TI2V-5B-architecture
  transformer gets per-token timesteps (`expand_timesteps`) where the model_index lacks the key
  (`index_as_stock`).
* **The original Wan key names** (`blocks.0.self_attn.q.weight`, `head.head.weight`, ...): a VideoX-Fun "civitai"
  folder (AMD's Hummingbird-XT) holds the transformer's original config.json (`dim`, `num_heads`, `in_dim`, ...)
  and its safetensors; `original_wan_folder` recognises one from its files alone (no torch), and
  `load_original_transformer` converts it through diffusers' own single-file conversion
  (`convert_wan_transformer_to_diffusers`) into a `WanTransformer3DModel` of a preset's architecture. The text
  encoder, tokenizer, VAE and scheduler come from the stock diffusers checkpoint of that architecture
  (`vsagen.models.loading`). Reading, checking and placing the tensors is `vsagen.models.transformer_files`'
  (shared with `--transformer FILE`).

Everything here but `load_original_transformer` reads JSON and safetensors headers only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BadInput
from .presets import I2V_PIPELINE, T2V_PIPELINE, load_preset, preset_names, same_architecture

STOCK_PIPELINES = (T2V_PIPELINE, I2V_PIPELINE)
WAN_TRANSFORMER = ["diffusers", "WanTransformer3DModel"]
# Who publishes a foreign class, for the run note (a class not listed is named without its origin).
KNOWN_FOREIGN = {"WanDMDPipeline": "FastVideo's class"}

# The original Wan config's keys that make one (Wan's `WanModel` config.json), and the defaults of those it may omit
# (Wan's own `WanModel.__init__` defaults).
ORIGINAL_KEYS = ("dim", "ffn_dim", "num_heads", "num_layers", "in_dim", "out_dim")
_ORIGINAL_DEFAULTS = {"freq_dim": 256, "text_dim": 4096, "eps": 1e-6, "patch_size": [1, 2, 2], "model_type": "t2v"}
# CLIP ViT-H/14 tokens per image in Wan's image branch (257), and its width
_CLIP_TOKENS, _CLIP_DIM = 257, 1280
# Keys every original-layout Wan transformer holds (the tell-tale of the layout, checked in the safetensors headers)
_ORIGINAL_MARKERS = ("head.head.weight", "blocks.0.self_attn.q.weight")
WEIGHTS_PREFIX = "diffusion_pytorch_model"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")  # weights diffusers / transformers may save as pickle
_NOT_TRANSFORMER = ("t5", "vae", "clip", "umt5")  # the civitai folder's other .pth files (text encoder, VAE)


def safetensors_problem(file: Path) -> str | None:
    """What is wrong with a safetensors file, from its header alone (safetensors' own reader, no tensor read, no
    framework imported): None when its header reads and the file's size is what the header says (every tensor's
    bytes present); else the reader's reason, e.g. "incomplete metadata, file not fully covered" (truncated)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), framework="numpy"):
            return None
    except (OSError, SafetensorError) as e:
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return text.removeprefix("Error while deserializing header: ")


def takes_image_input(transformer: dict[str, Any]) -> bool:
    """Whether a diffusers transformer config conditions on an image: a CLIP branch (`image_dim`) or more input
    than output channels (the condition latent and mask, Wan2.2-I2V-A14B)."""
    return transformer.get("image_dim") is not None or transformer.get("in_channels") != transformer.get("out_channels")


def stock_pipeline_class(index: dict[str, Any], transformer: dict[str, Any]) -> str | None:
    """The stock diffusers Wan class to build a checkpoint as, when its model_index.json names a class vsagen does not
    run: `WanImageToVideoPipeline` where the transformer takes an image (`takes_image_input`), else `WanPipeline`;
    None when the class is already a stock one, or the transformer is not diffusers' `WanTransformer3DModel` (then
    the checkpoint is refused as before). Whether diffusers has the named class is `vsagen.models.loading`'s check."""
    cls = index.get("_class_name")
    if (not isinstance(cls, str) or not cls.strip().isidentifier() or cls in STOCK_PIPELINES
            or list(index.get("transformer") or []) != WAN_TRANSFORMER):
        return None  # a missing, empty or malformed class name is refused as any foreign class is
    return I2V_PIPELINE if takes_image_input(transformer) else T2V_PIPELINE


def per_token_architecture(transformer: dict[str, Any]) -> bool:
    """Whether a transformer config has the architecture of a preset with per-token timesteps (Wan2.2-TI2V-5B,
    `tiny-ti2v`): such a transformer was trained with them."""
    return any(load_preset(n).expand_timesteps and same_architecture(transformer, load_preset(n).transformer)
               for n in preset_names())


def index_as_stock(index: dict[str, Any], transformer: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A model_index.json as diffusers' stock Wan pipelines would have it, and the run notes on what changed: a
    foreign `_class_name` replaced by `stock_pipeline_class`'s, and `expand_timesteps` true where the key is absent
    and the transformer has a per-token-timestep architecture (`per_token_architecture`: diffusers' from_pretrained
    would default it to false and run the model with scalar timesteps). An index needing neither comes back as is."""
    out, notes = dict(index), []
    stock = stock_pipeline_class(index, transformer)
    if stock is not None:
        cls = index.get("_class_name")
        origin = KNOWN_FOREIGN.get(cls, "a class")
        out["_class_name"] = stock
        notes.append(f"model_index.json names {cls} ({origin}, not in diffusers): built as {stock} from its "
                     "components")
    if "expand_timesteps" not in index and per_token_architecture(transformer):
        out["expand_timesteps"] = True
        notes.append("model_index.json lacks expand_timesteps: set to true (per-token timesteps), as its "
                     "Wan2.2-TI2V-5B-architecture transformer was trained with them")
    return out, notes


# ---------------------------------------------------------------------------------------------------------- original Wan


@dataclass(frozen=True)
class OriginalFolder:
    """A transformer in the original Wan key names: its folder, its original config, the diffusers config of the same
    architecture (`diffusers_config`), and its weight files (safetensors, or pickle files where it has none)."""

    path: Path
    config: dict[str, Any]
    transformer: dict[str, Any]
    files: tuple[Path, ...]
    pickle: bool


def is_original_config(config: Any) -> bool:
    """Whether a parsed config.json is an original Wan transformer's (`ORIGINAL_KEYS`, no diffusers names)."""
    return isinstance(config, dict) and all(k in config for k in ORIGINAL_KEYS) and "num_attention_heads" not in config


def diffusers_config(config: dict[str, Any], where: str) -> dict[str, Any]:
    """The diffusers `WanTransformer3DModel` config of an original Wan config (its architecture keys; the preset of
    that architecture supplies the rest).

    Raises:
        BadInput: a size that is not a positive integer, or `dim` not a multiple of `num_heads`.
    """
    c = {**_ORIGINAL_DEFAULTS, **config}
    for k in (*ORIGINAL_KEYS, "freq_dim", "text_dim"):
        if isinstance(c[k], bool) or not isinstance(c[k], int) or c[k] <= 0:
            raise BadInput(f"{where}: {k} must be a positive integer, got {c[k]!r}")
    if c["dim"] % c["num_heads"]:
        raise BadInput(f"{where}: dim {c['dim']} is not a multiple of num_heads {c['num_heads']}")
    out = {"patch_size": list(c["patch_size"]), "num_attention_heads": c["num_heads"],
           "attention_head_dim": c["dim"] // c["num_heads"], "in_channels": c["in_dim"], "out_channels": c["out_dim"],
           "text_dim": c["text_dim"], "freq_dim": c["freq_dim"], "ffn_dim": c["ffn_dim"], "num_layers": c["num_layers"],
           "eps": c["eps"]}
    if c["model_type"] in ("i2v", "flf2v"):  # Wan's CLIP image branch
        out["image_dim"] = _CLIP_DIM
    if c["model_type"] == "flf2v":
        out["pos_embed_seq_len"] = 2 * _CLIP_TOKENS
    return out


def _weight_files(path: Path) -> tuple[tuple[Path, ...], bool]:
    files = sorted(f for f in path.iterdir() if f.is_file())
    safe = [f for f in files if f.name.endswith(".safetensors")]
    own = [f for f in safe if f.name.startswith(WEIGHTS_PREFIX)]
    if own or safe:
        return tuple(own or safe), False
    pickled = [f for f in files if f.name.endswith(PICKLE_SUFFIXES) and not any(t in f.name.lower() for t in _NOT_TRANSFORMER)]
    return tuple(pickled), True


def original_wan_folder(path: Path, model: str) -> OriginalFolder | None:
    """The original-layout Wan transformer folder at `path` (no model_index.json; a config.json with the original
    keys), its weights checked from their headers: whole, and in the original key names. None when `path` has no
    such config (not this layout).

    Raises:
        BadInput: one line: an unreadable config, no weight files, a damaged safetensors file, or safetensors whose
            keys are not the original Wan names (e.g. a diffusers transformer folder).
    """
    cfg_path = path / "config.json"
    if (path / "model_index.json").exists() or not cfg_path.is_file():
        return None
    try:
        config = json.loads(cfg_path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not is_original_config(config):
        return None
    where = f"--model {model}"
    transformer = diffusers_config(config, f"{where}: config.json")
    files, pickle = _weight_files(path)
    if not files:
        raise BadInput(f"{where}: a transformer config in the original Wan key names, but no weights beside it (no "
                       f"{WEIGHTS_PREFIX}*.safetensors); the checkpoint is incomplete: download it again")
    for shards in path.glob("*.safetensors.index.json"):
        try:
            named = sorted(set(json.loads(shards.read_text()).get("weight_map", {}).values()))
        except (OSError, ValueError, AttributeError):
            raise BadInput(f"{where}: {shards.name} is damaged (not a shard index); download it again") from None
        missing = [n for n in named if not (path / n).is_file()]
        if missing:
            raise BadInput(f"{where}: {missing[0]} is missing ({len(missing)} of the {len(named)} files "
                           f"{shards.name} names): the download is incomplete; download it again")
    if not pickle:
        from safetensors import safe_open

        keys: set[str] = set()
        for f in files:
            problem = safetensors_problem(f)
            if problem is not None:
                raise BadInput(f"{where}: {f.name} is damaged or truncated ({problem}); download it again")
            with safe_open(str(f), framework="numpy") as st:
                keys |= set(st.keys())
        if not any(k in keys for k in _ORIGINAL_MARKERS):
            raise BadInput(f"{where}: config.json is an original Wan transformer's, but {files[0].name} does not "
                           f"hold the original Wan key names (none of {', '.join(_ORIGINAL_MARKERS)})")
    return OriginalFolder(path, config, transformer, files, pickle)


def preset_for_original(folder: OriginalFolder, model: str):
    """The bundled preset of an original-layout transformer's architecture (one expert, its per-token timesteps or
    not, image input or not): a preset with `transformer_layout = "wan"` whose hub repository name is part of the
    folder's name, else the stock (diffusers-layout) hub preset, else a tiny preset.

    Raises:
        BadInput: no preset has the architecture (its text encoder and VAE would be unknown).
    """
    t = folder.transformer
    expand = folder.config.get("model_type") == "ti2v" or per_token_architecture(t)
    pipeline = I2V_PIPELINE if takes_image_input(t) else T2V_PIPELINE
    fits = [p for p in (load_preset(n) for n in preset_names())
            if same_architecture(t, p.transformer) and p.transformer_2 is None and p.pipeline == pipeline
            and p.expand_timesteps == expand and p.transformer_files is None]
    name = folder.path.resolve().name.lower()
    for p in fits:
        if p.transformer_layout == "wan" and p.hub_id and p.hub_id.split("/")[-1].lower() in name:
            return p
    for p in sorted(fits, key=lambda p: p.source != "hub"):
        if p.transformer_layout == "diffusers":
            return p
    raise BadInput(f"--model {model}: a transformer in the original Wan key names ({t['num_layers']} layers, "
                   f"{t['num_attention_heads']} heads x {t['attention_head_dim']}, {t['in_channels']} channels) of an "
                   "architecture no preset describes: vsagen takes its text encoder and VAE from that preset's "
                   "checkpoint; `vsagen presets` lists them")


def _read_weights(folder: OriginalFolder, allow_pickle: bool, model: str) -> dict[str, Any]:
    """The folder's tensors: safetensors, or pickle files (with `allow_pickle`) through the weights-only reader
    (`vsagen.models.transformer_files.read_state_dict`)."""
    from .transformer_files import read_state_dict

    if folder.pickle and not allow_pickle:
        raise BadInput(f"--model {model}: the transformer has only pickle weights ({folder.files[0].name}); pickle "
                       "files can run code when loaded, so vsagen loads safetensors only; pass --allow-pickle if "
                       "you trust them")
    state: dict[str, Any] = {}
    for f in folder.files:
        state.update(read_state_dict(f, f"--model {model}: {f.name}"))
    return state


def check_original_transformer(folder: OriginalFolder, architecture: dict[str, Any], model: str) -> None:
    """Before any tensor is read: the folder's safetensors, their names converted by diffusers'
    `convert_wan_transformer_to_diffusers` (applied to meta tensors of the shapes their headers give), are exactly
    the tensors of a `WanTransformer3DModel` of `architecture`, shape for shape. Pickle folders are checked as
    `load_original_transformer` reads them.

    Raises:
        BadInput: one line naming the first tensor missing, extra, or of another shape.
    """
    if folder.pickle:
        return
    import torch
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers
    from safetensors import safe_open

    from .transformer_files import check_fit, empty_transformer

    shapes: dict[str, Any] = {}
    for f in folder.files:
        with safe_open(str(f), framework="pt") as st:
            shapes |= {k: torch.empty(st.get_slice(k).get_shape(), device="meta") for k in st.keys()}
    check_fit(convert_wan_transformer_to_diffusers(shapes), empty_transformer(architecture).state_dict(),
              f"--model {model}: the original-layout transformer")


def load_original_transformer(folder: OriginalFolder, architecture: dict[str, Any], dtype: Any, allow_pickle: bool,
                              model: str) -> tuple[Any, str]:
    """The folder's transformer as a diffusers `WanTransformer3DModel` of `architecture` (constructor kwargs, a
    preset's [transformer]) in `dtype` as diffusers' from_pretrained would load it (CPU, eval), converted by diffusers' `convert_wan_transformer_to_diffusers`,
    and the run note saying what was converted. Pickle weights only with `allow_pickle`, through
    `torch.load(weights_only=True)`.

    Raises:
        BadInput: one line, before anything runs: pickle weights without `allow_pickle`, a tensor the architecture
            lacks or lacks a tensor of, or a shape that does not fit (naming the first; `check_original_transformer`
            finds the same from the headers alone).
    """
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    from .transformer_files import place_transformer

    state = _read_weights(folder, allow_pickle, model)
    n = len(state)
    transformer = place_transformer(convert_wan_transformer_to_diffusers(state), architecture, dtype,
                                    f"--model {model}: the original-layout transformer")
    files = ", ".join(f.name for f in folder.files[:2]) + (", ..." if len(folder.files) > 2 else "")
    return transformer, (f"transformer converted from the original Wan key names ({n} tensors in {files}) by "
                         "diffusers' convert_wan_transformer_to_diffusers")
