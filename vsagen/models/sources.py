"""Where a model comes from: `--model` (preset name | local diffusers directory | hub id) -> `ModelSource`.

Resolution reads presets, small JSON configs and the headers of a directory's safetensors files only (no torch, no
diffusers), so bad input (a damaged or incomplete checkpoint included) fails fast.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BadInput, ModelNotFound, close_matches
from .checkpoint_layouts import (PICKLE_SUFFIXES, index_as_stock, original_wan_folder, preset_for_original,
                                 safetensors_problem)
from .presets import (I2V_PIPELINE, Preset, last_image_use, load_preset, preset_for_hub_id,
                      preset_for_transformer_config, preset_names, same_architecture, same_family)

DEFAULT_MODEL = "wan2.1-t2v-1.3b"  # `--model`'s default (a preset name)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# How long the hub is given to answer for a repository that is not in the local Hugging Face cache (seconds).
HUB_PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ModelSource:
    """Where the weights come from: kind "tiny" (built offline), "hub" (hub id) or "dir" (local directory)."""

    kind: str
    location: str  # hub id or directory ("" for tiny)
    preset: Preset
    exact_preset: bool = True  # False: the preset only supplies generation defaults (architecture unknown)
    rope_max_seq_len: int | None = None  # post-patch positions per grid axis the transformer's RoPE covers
    pipeline: str = ""  # diffusers pipeline class (a directory's model_index.json, else the preset's)
    last_image_use: str = ""  # a directory's own (`last_image_use` of its configs); "" for presets: the preset's
    layout: str = "diffusers"  # "wan": the transformer is in the original Wan key names (`checkpoint_layouts`)
    components: str = ""  # layout "wan": the diffusers hub id of the other components ("": the tiny preset's checkpoint)
    index_class: str = ""  # a directory's model_index.json class as written (e.g. FastVideo's WanDMDPipeline)

    @property
    def image_to_video(self) -> bool:
        """True when the model is an image-to-video-only pipeline (run by `vsagen i2v` alone)."""
        return (self.pipeline or self.preset.pipeline) == I2V_PIPELINE

    @property
    def takes_image(self) -> bool:
        """True when `vsagen i2v` can run the model: an image-to-video pipeline, or a text-image-to-video one
        (Wan2.2-TI2V-5B style; a ti2v preset is only matched to checkpoints of its family)."""
        return self.image_to_video or self.preset.ti2v

    @property
    def last_image(self) -> str:
        """How the model uses a last frame (`--last-image`): a `vsagen.models.presets.LAST_IMAGE_*` value, from the
        checkpoint's own configs for a directory, else from the preset."""
        return self.last_image_use or self.preset.last_image



def _read_index(index: Path) -> dict[str, Any]:
    try:
        data = json.loads(index.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelNotFound(f"--model {index.parent}: cannot read {index}: {e}") from None
    return data if isinstance(data, dict) else {}


def _tiny_preset_for(tcfg: dict[str, Any], index: dict[str, Any]) -> Preset | None:
    """The bundled tiny preset whose transformer architecture and pipeline family (second expert or not,
    per-token timesteps or not) a checkpoint directory has, if any."""
    for n in preset_names():
        p = load_preset(n)
        if (p.source == "tiny" and all(tcfg.get(k) == v for k, v in p.transformer.items() if k != "patch_size")
                and same_architecture(tcfg, p.transformer) and same_family(p, index)):
            return p
    return None


def resolve_model(model: str) -> ModelSource:
    """Map `--model` (preset name | local diffusers directory | hub id) to a `ModelSource`.

    Raises:
        BadInput / ModelNotFound: not a preset (the presets' names close to it suggested, else all of them),
            not a usable directory, not of the form org/name; an existing file: "a file, not a folder"; a path (a
            separator in it, or a leading . or ~) that does not exist: "no such folder", without the presets.
    """
    if model in preset_names():
        p = load_preset(model)
        rope = p.transformer.get("rope_max_seq_len")
        return ModelSource("tiny" if p.source == "tiny" else "hub", p.hub_id if p.source == "hub" else "", p,
                           rope_max_seq_len=rope, layout=p.transformer_layout, components=p.components)
    path = Path(model).expanduser()
    if path.is_dir():
        index = path / "model_index.json"
        if not index.is_file():
            return _original_layout_source(path, model)
        cfg_path = path / "transformer" / "config.json"
        try:
            tcfg = json.loads(cfg_path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ModelNotFound(f"--model {model}: cannot read {cfg_path}: {e}") from None
        # a foreign pipeline class or a missing expand_timesteps read as diffusers' stock classes need them; the class
        # as written still picks a published checkpoint's preset that names it (FastVideo's WanDMDPipeline)
        raw = _read_index(index)
        index_data, _ = index_as_stock(raw, tcfg)
        written = raw.get("_class_name") if isinstance(raw.get("_class_name"), str) else ""
        preset = preset_for_transformer_config(tcfg, index_data, path.resolve().name, checkpoint_class=written)
        exact = preset is not None
        if preset is None:
            # An architecture no preset describes (e.g. a test checkpoint): take a tiny preset's settings only
            # if it is that tiny architecture and family (experts, per-token timesteps), else the default
            # model's generation settings.
            preset = _tiny_preset_for(tcfg, index_data) or load_preset(DEFAULT_MODEL)
        check_weight_files(path, model, index_data)
        cls = index_data.get("_class_name")
        takes_image = cls == I2V_PIPELINE or preset.ti2v  # as ModelSource.takes_image
        return ModelSource("dir", str(path.resolve()), preset, exact_preset=exact,
                           rope_max_seq_len=tcfg.get("rope_max_seq_len", preset.transformer.get("rope_max_seq_len")),
                           pipeline=cls if isinstance(cls, str) else "", index_class=written,
                           last_image_use=last_image_use(takes_image, tcfg,
                                                         bool(index_data.get("expand_timesteps", False))))
    if path.exists():  # a file (or a device, a socket): not what --model reads
        raise BadInput(f"--model {model!r} is a file, not a folder: --model takes a checkpoint folder, a preset name "
                       "(`vsagen presets` lists them) or a Hugging Face hub id (org/name)")
    hub_id = _HUB_ID.match(model) and not model.startswith((".", "/", "~"))
    if not hub_id and (model.startswith((".", "~")) or "/" in model or os.sep in model):  # a path, mistyped
        raise BadInput(f"--model {model!r}: no such folder")
    if hub_id:
        preset = preset_for_hub_id(model)
        if preset is not None:
            return ModelSource("hub", model, preset, rope_max_seq_len=preset.transformer.get("rope_max_seq_len"),
                               layout=preset.transformer_layout, components=preset.components)
        owners = [n for n in preset_names() if (load_preset(n).transformer_files or ("",))[0] == model]
        if owners:  # TurboDiffusion's / LightX2V's files, FastVideo's conversions (FastVideo's module names)
            raise BadInput(f"--model {model}: vsagen runs this repository's transformer files beside their base "
                           f"checkpoint through a preset: --model {' or '.join(owners)}")
        return ModelSource("hub", model, load_preset(DEFAULT_MODEL), exact_preset=False)
    close = close_matches(model, preset_names())
    if close:  # a preset's name mistyped: the names it may have meant, not all of them
        raise BadInput(f"unknown --model {model!r}: not a preset; did you mean {' or '.join(close)}? (`vsagen "
                       "presets` lists them all)")
    raise BadInput(f"unknown --model {model!r}: not a preset ({', '.join(preset_names())}), an existing "
                   "directory, or a hub id of the form org/name; try --model tiny")


def _original_layout_source(path: Path, model: str) -> ModelSource:
    """A folder without model_index.json: a transformer in the original Wan key names
    (`vsagen.models.checkpoint_layouts`) gets the preset of its architecture, whose checkpoint supplies the other
    components (a `transformer_layout = "wan"` preset's `components`, a stock preset's hub id, a tiny preset's own
    checkpoint)."""
    folder = original_wan_folder(path, model)
    if folder is None:
        raise ModelNotFound(f"--model {model}: not a diffusers pipeline directory (no model_index.json) nor a "
                            "transformer in the original Wan key names (a config.json with dim, num_heads, ...)")
    p = preset_for_original(folder, model)
    components = p.components or (p.hub_id if p.source == "hub" else "")
    return ModelSource("dir", str(path.resolve()), p, exact_preset=p.source == "hub",
                       rope_max_seq_len=p.transformer.get("rope_max_seq_len"), pipeline=p.pipeline,
                       layout="wan", components=components)


def model_not_loadable(model: str, location: str, why: str, exact_preset: bool) -> ModelNotFound:
    """The one error line for a model (a hub id, a folder) whose pipeline could not be loaded (`why`: the cause, in
    words), with what to do: download it (a preset: `vsagen download PRESET`) or into a folder and pass that, time the
    architecture with random weights (a preset's), or try the tiny model."""
    timing_hint = ", time its architecture with --random-weights" if exact_preset else ""
    preset = load_preset(model) if model in preset_names() else None
    if preset is not None and (preset.transformer_files is not None or preset.transformer_layout != "diffusers"):
        # its transformer is published apart from the rest of the pipeline: a folder of `location` alone would run
        # the stock model (its own transformer, sampler and CFG), so only the preset's own download is offered
        repo = preset.transformer_files[0] if preset.transformer_files is not None else preset.hub_id
        base = preset.components or preset.hub_id
        return ModelNotFound(f"cannot load model {model!r}: {why}. Download it with `vsagen download {model}` (its "
                             f"transformer from {repo}, the rest of the pipeline from {base}) and run the same "
                             f"command again{timing_hint}, or try --model tiny")
    # a preset's files, exactly those it needs, into the Hugging Face cache (`vsagen.commands.download`)
    preset_hint = f"`vsagen download {model}` or " if preset is not None else ""
    return ModelNotFound(f"cannot load model {model!r}: {why}. Download it with {preset_hint}`hf download {location} "
                         f"--local-dir DIR` and pass --model DIR{timing_hint}, or try --model tiny")


def _fastvideo_named(files: list[Path]) -> bool:
    """Whether a transformer folder's safetensors hold FastVideo's module names (headers only; a damaged file is
    `safetensors_problem`'s to name)."""
    from safetensors import SafetensorError, safe_open

    from .transformer_files import is_fastvideo_layout

    for f in (f for f in files if f.name.endswith(".safetensors")):
        try:
            with safe_open(str(f), framework="numpy") as h:
                if is_fastvideo_layout(list(h.keys())):
                    return True
        except (OSError, ValueError, RuntimeError, SafetensorError):
            continue
    return False


def check_weight_files(path: Path, model: str, index: dict[str, Any]) -> None:
    """A checkpoint directory's weights, checked before anything loads: every component of its model_index.json
    whose folder holds a model (a `config.json`) has weight files, every shard its `*.safetensors.index.json`
    names is there, and each safetensors file is whole (`safetensors_problem`: a download cut short, a damaged
    disk). Pickle-only folders are `vsagen.models.loading`'s to refuse or allow (`--allow-pickle`).

    Raises:
        BadInput: one line naming the file or folder, what is wrong, and what to do (download it again).
    """
    for name, spec in index.items():
        sub = path / name
        if name.startswith("_") or not isinstance(spec, list) or not (sub / "config.json").is_file():
            continue
        files = sorted(f for f in sub.iterdir() if f.is_file())
        if not any(f.name.endswith((".safetensors", *PICKLE_SUFFIXES)) for f in files):
            raise BadInput(f"--model {model}: {name}/ holds no weights (no .safetensors file): the checkpoint is "
                           "incomplete; download it again")
        for shards in (f for f in files if f.name.endswith(".safetensors.index.json")):
            try:
                named = sorted(set(json.loads(shards.read_text()).get("weight_map", {}).values()))
            except (OSError, ValueError, AttributeError):
                raise BadInput(f"--model {model}: {name}/{shards.name} is damaged (not a shard index); download "
                               "it again") from None
            missing = [n for n in named if not (sub / n).is_file()]
            if missing:
                raise BadInput(f"--model {model}: {name}/{missing[0]} is missing ({len(missing)} of the "
                               f"{len(named)} files {shards.name} names): the download is incomplete; download it "
                               "again")
        if name in ("transformer", "transformer_2") and _fastvideo_named(files):
            # one file per expert the checkpoint has, the high-noise one (transformer/) first: what --transformer takes
            experts = [e for e in ("transformer", "transformer_2") if isinstance(index.get(e), list)] or [name]
            given = ",".join(f"{path / e}/<file>.safetensors" for e in experts)
            raise BadInput(f"--model {model}: {name}/ holds FastVideo's module names (a FastVideo conversion, e.g. of "
                           f"TurboWan), which diffusers does not load; run the file{'s' if len(experts) > 1 else ''} "
                           f"over its base model: --model <base preset> --transformer {given}")
        for f in (f for f in files if f.name.endswith(".safetensors")):
            problem = safetensors_problem(f)
            if problem is not None:
                raise BadInput(f"--model {model}: {name}/{f.name} is damaged or truncated ({problem}); download "
                               "it again")


def transformer_configs(src: ModelSource, model: str) -> list[tuple[str, dict[str, Any]]]:
    """[(component name, transformer config)] of the model's experts: ("transformer", ...) and, for a two-expert
    (A14B-style) model, ("transformer_2", ...); from its checkpoint directory's `<component>/config.json` (a
    `transformer_2/` folder making it two-expert), or the preset's [transformer] (and transformer_2) tables.

    Raises:
        ModelNotFound: a directory's config cannot be read.
        BadInput: a hub id no preset describes (the architecture is unknown without downloading).
    """
    if src.kind == "dir" and src.layout == "wan":  # built with its preset's architecture (checked to be the folder's)
        return [("transformer", dict(src.preset.transformer))]
    if src.kind == "dir":
        out = []
        for name in ("transformer", "transformer_2"):
            path = Path(src.location) / name / "config.json"
            if name == "transformer_2" and not path.parent.is_dir():
                break
            try:
                out.append((name, json.loads(path.read_text())))
            except (OSError, json.JSONDecodeError) as e:
                raise ModelNotFound(f"--model {model}: cannot read its {name} config: {e}") from None
        return out
    if not src.exact_preset:
        raise BadInput(f"--kernels needs the attention shape of --model {model}, and no preset describes it; "
                       f"use a preset name ({', '.join(preset_names())}) or a local checkpoint directory")
    p = src.preset
    return [("transformer", dict(p.transformer))] + ([("transformer_2", dict(p.transformer_2))]
                                                     if p.transformer_2 is not None else [])


def attention_dims(src: ModelSource, model: str) -> tuple[int, int]:
    """(heads, head_dim) of the model's self-attention, from its checkpoint directory or preset.

    Raises:
        ModelNotFound: the directory's config cannot be read, or has no heads / head dim.
        BadInput: see `transformer_configs`.
    """
    tcfg = transformer_configs(src, model)[0][1]
    try:
        return int(tcfg["num_attention_heads"]), int(tcfg["attention_head_dim"])
    except (KeyError, TypeError, ValueError):
        raise ModelNotFound(f"--model {model}: its transformer config has no num_attention_heads / "
                            "attention_head_dim") from None


def _cached_snapshot(repo: str) -> Path | None:
    """The folder of `repo`'s snapshot in the local Hugging Face cache (its main revision), or None."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo, local_files_only=True))
    except Exception:  # noqa: BLE001 - not in the cache (or no cache at all): nothing there
        return None


def _cached_pipeline(repo: str, model: str, replaced: set[str]) -> bool:
    """Whether the cache holds `repo` as a load reads it: its model_index.json and every component it names (but
    `replaced`, given from elsewhere) with its files, each weight file whole (`check_weight_files`).

    Raises:
        BadInput: a cached weight file is damaged or a shard missing (to download again)."""
    root = _cached_snapshot(repo)
    if root is None or not (root / "model_index.json").is_file():
        return False
    from .hub_files import components_of

    index = {k: v for k, v in _read_index(root / "model_index.json").items() if k not in replaced}
    if any(not (root / name).is_dir() or not any((root / name).iterdir()) for name in components_of(index)):
        return False
    try:
        check_weight_files(root, model, index)
    except BadInput as e:
        if "holds no weights" in str(e) or "is missing" in str(e):  # half downloaded: the load downloads the rest
            return False
        raise
    return True


def hub_unreachable(repo: str) -> str | None:
    """Why the Hugging Face hub cannot give `repo` now (offline mode, no connection, no such repository, gated), in
    words; None when it answered for the repository (a download can go ahead)."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    if constants.HF_HUB_OFFLINE:
        return "the hub is off (HF_HUB_OFFLINE is set)"
    try:
        HfApi().model_info(repo, timeout=HUB_PROBE_TIMEOUT_S)
    except GatedRepoError:
        return "it is gated: accept its terms on huggingface.co and log in with `hf auth login`"
    except RepositoryNotFoundError:
        return "the hub has no such repository (or it is private: log in with `hf auth login`)"
    except Exception as e:  # noqa: BLE001 - no connection, a timeout, a proxy's refusal: the hub cannot be reached
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"the hub cannot be reached ({first[:100]})"
    return None


def check_hub_files(src: ModelSource, model: str, *, random_weights: bool = False,
                    transformer_files: bool = False) -> None:
    """Before anything heavy loads (no torch): every Hugging Face repository a load of `src` reads is in the local
    Hugging Face cache, or the hub answers for it (the load then downloads it); else one line. The repositories: a
    hub model's pipeline (without the transformers that `--transformer` files or a `[transformer_files]` preset's
    files replace), those files, an original-layout preset's transformer folder and components' checkpoint. Nothing
    for random weights, tiny models or local folders of a whole pipeline. Read: the cache's folders and the
    safetensors headers; asked: the hub, once per repository not cached (`HUB_PROBE_TIMEOUT_S`).

    Args:
        src: the resolved `--model`; model: `--model` as given; random_weights: `--random-weights` (nothing read);
        transformer_files: `--transformer` files given (they replace the transformers).

    Raises:
        ModelNotFound: a repository neither cached nor available (offline, no connection, none such, gated): one
            line naming it, why, and how to download it (`model_not_loadable`; a preset's transformer files:
            `vsagen.transformer_files.files_not_loadable`).
        BadInput: a cached weight file damaged.
    """
    if random_weights:
        return
    from .hub_files import EXPERTS

    transformers = set(EXPERTS)
    preset_files = src.preset.transformer_files if src.exact_preset and not transformer_files else None
    if src.kind == "hub" and src.layout != "wan":
        replaced = transformers if transformer_files or preset_files is not None else set()
        if not _cached_pipeline(src.location, model, replaced) and (why := hub_unreachable(src.location)):
            raise model_not_loadable(model, src.location, f"hub id {src.location!r} is not in the local Hugging "
                                     f"Face cache and {why}", src.exact_preset)
    if src.kind == "hub" and src.layout == "wan":  # the transformer in a folder of the repository
        sub = src.preset.transformer_subfolder.strip("/")
        root = _cached_snapshot(src.location)
        cached = root is not None and (root / sub / "config.json").is_file() and any(
            f.name.endswith(".safetensors") for f in (root / sub).iterdir())
        if not cached and (why := hub_unreachable(src.location)):
            raise model_not_loadable(model, src.location, f"hub id {src.location!r} is not in the local Hugging "
                                     f"Face cache and {why}", True)
    if src.layout == "wan" and src.components:
        if not _cached_pipeline(src.components, model, {"transformer"}) and (
                why := hub_unreachable(src.components)):
            raise model_not_loadable(model, src.components, f"its components' checkpoint {src.components!r} is not "
                                     f"in the local Hugging Face cache and {why}", True)
    if preset_files is not None:
        from .transformer_files import files_not_loadable, hub_files

        if hub_files(src.preset, model, local_only=True) is None and (why := hub_unreachable(preset_files[0])):
            raise files_not_loadable(preset_files[0], preset_files[1], model, f"not in the local Hugging Face cache "
                                     f"and {why}")
