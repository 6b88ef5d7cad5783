"""The Hugging Face hub files a preset's run reads (`vsagen download`), worked out from the preset and each
repository's file listing, without a network or torch: the pipeline's `model_index.json` and, for every component
it names, the files directly in that component's folder (configs, tokenizer files, the weights as safetensors; other
weight formats left out where safetensors are there, as diffusers' `from_pretrained` does); a transformer published
alone (`[transformer_files]`) in place of the checkpoint's own; a transformer in the original Wan layout
(`transformer_layout = "wan"`: its folder's config.json and safetensors) with the components of the diffusers
checkpoint it names; the light VAE decoder's folder (`[light_vae]`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .presets import Preset

# weight formats diffusers does not read where a folder holds safetensors
OTHER_WEIGHTS = (".bin", ".pth", ".pt", ".ckpt", ".msgpack", ".h5", ".onnx")
EXPERTS = ("transformer", "transformer_2")


@dataclass(frozen=True)
class HubFile:
    """One file of a hub repository: `repo` (owner/name), `path` inside it, `size` in bytes (None: not listed)."""

    repo: str
    path: str
    size: int | None


Listing = dict[str, int | None]  # a repository's files: path -> size in bytes


def components_of(index: dict[str, Any]) -> list[str]:
    """The component folders a `model_index.json` names (its keys with a [library, class] value that is set)."""
    return [key for key, value in index.items() if not key.startswith("_") and isinstance(value, list)
            and len(value) == 2 and value[0] is not None and value[1] is not None]


def folder_files(repo: str, listing: Listing, folder: str) -> list[HubFile]:
    """The files directly in `folder` (not in folders below it), safetensors preferred: where the folder holds any
    `.safetensors`, the other weight formats (`OTHER_WEIGHTS`) are left out, and where it holds plain ones, the
    variants' (`NAME.fp16.safetensors`: diffusers reads them only with `variant=`)."""
    prefix = f"{folder.strip('/')}/" if folder.strip("/") else ""  # "": the repository's top
    here = sorted(p for p in listing if p.startswith(prefix) and "/" not in p[len(prefix):])
    if any(p.endswith(".safetensors") for p in here):
        here = [p for p in here if not p.endswith(OTHER_WEIGHTS)]
    if any(p.endswith(".safetensors") and not _variant(p) for p in here):
        here = [p for p in here if not _variant(p)]
    return [HubFile(repo, p, listing[p]) for p in here]


def _variant(path: str) -> bool:
    """A weight file of a variant (`NAME.fp16.safetensors`, `NAME.fp16-00001-of-00002.safetensors`, its
    `NAME.safetensors.index.fp16.json`), which diffusers reads only when asked for that variant."""
    name = path.rpartition("/")[2]
    if name.endswith(".safetensors"):
        return "." in name[:-len(".safetensors")]
    return ".safetensors.index." in name and name.endswith(".json") and not name.endswith(".safetensors.index.json")


def pipeline_files(repo: str, listing: Listing, index: dict[str, Any], skip: tuple[str, ...] = ()) -> list[HubFile]:
    """A diffusers pipeline's files in `repo`: `model_index.json` and every component's folder (`folder_files`)
    but those in `skip` (components that come from elsewhere)."""
    files = [HubFile(repo, "model_index.json", listing.get("model_index.json"))]
    for component in components_of(index):
        if component not in skip:
            files += folder_files(repo, listing, component)
    return files


def preset_files(preset: Preset, listing: Callable[[str], Listing],
                 index: Callable[[str], dict[str, Any]]) -> list[HubFile]:
    """Every hub file a run of `preset` reads (with real weights), in download order.

    Args:
        preset: a hub preset (`source = "hub"`).
        listing: repository -> its files and sizes (the hub's metadata; a test's fake).
        index: repository -> its `model_index.json`, parsed.

    Raises:
        ValueError: a tiny preset (built offline: nothing on the hub), or a file the preset names that the
            listing lacks (its message names them).
    """
    if preset.source != "hub":
        raise ValueError(f"preset {preset.name} is built offline by vsagen: nothing to download")
    repo = preset.hub_id
    named: list[HubFile] = []  # files the preset names itself: they must exist
    if preset.transformer_layout == "wan":
        sub = preset.transformer_subfolder.strip("/")
        files = [f for f in folder_files(repo, listing(repo), sub) if f.path.rpartition("/")[2] == "config.json"
                 or f.path.endswith((".safetensors", ".safetensors.index.json"))]
        if not any(f.path.endswith(".safetensors") for f in files):  # named as missing below
            files.append(HubFile(repo, f"{sub}/*.safetensors" if sub else "*.safetensors", None))
        base = preset.components
        files = [*pipeline_files(base, listing(base), index(base), skip=("transformer",)), *files]
    else:
        own = preset.transformer_files
        skip = EXPERTS[:len(own[1])] if own is not None else ()
        files = pipeline_files(repo, listing(repo), index(repo), skip=skip)
        if own is not None:
            files_repo = listing(own[0])
            named = [HubFile(own[0], name, files_repo.get(name)) for name in own[1]]
    if preset.light_vae is not None:
        sub = preset.light_vae.subfolder
        light = [f for f in folder_files(repo, listing(repo), sub)
                 if f.path.endswith((".safetensors", "/config.json"))]
        named += light or [HubFile(repo, f"{sub}/config.json", None)]  # none there: named as missing below
    missing = [f"{f.repo}/{f.path}" for f in (*files, *named) if f.size is None]
    if missing:
        raise ValueError(f"the hub lacks {', '.join(missing)}")
    return [*files, *named]
