"""Where `--vae tiny` finds its weights (the TAEHV family's decoder, `vsagen.decode.tiny_decoder`), and its checks.

The published files, on the Hugging Face hub (`PUBLISHED`):

* madebyollin's own (madebyollin/taehv, MIT): `taew2_1` (Wan2.1 VAE latents: Wan2.1 all, Wan2.2 A14B, which keeps that
  VAE; 16 channels, patch 1) and `taew2_2` (Wan2.2-5B latents: 48 channels, patch 2), the `.pth` files at the top of
  the repository as on GitHub (its `safetensors/` folder holds the same tensors). They take the DiT's latents as
  they are.
* LightX2V's distilled ones (lightx2v/Autoencoders): `lighttaew2_1.safetensors`, `lighttaew2_2.safetensors`, the
  same architecture and keys (LightX2V loads them with its copy of the TAEHV class), taking un-normalised latents
  (z * std + mean): LightX2V un-normalises for any file whose name holds `lighttae` (`lightx2v/pipeline.py`
  `enable_lightvae`), and so does vsagen for a `--vae tiny:weights=FILE` of such a name (`raw_latents_file`).

Without `weights=FILE`, a run reads the file from the Hugging Face cache, downloading it there when it is not
(`hub_file`). Before anything heavy loads: a published decoder or a weights file (a safetensors header, a `.pth`
memory-mapped) of another latent width than the model's VAE, a damaged or refused one or one holding no TAEHV
decoder, is refused in one line (`check_tiny_request`), and so is an uncached published file with the hub out of
reach (`check_tiny_vae`). The tiny models hold a tiny one of their latent width in their folder
(`tiny_model_file`), written with seeded random weights on first use, as their other components are.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BadInput, ModelNotFound

WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt")
TINY_MODEL_WIDTHS = (16, 8, 8, 8)  # a tiny model's TAEHV decoder: the published one's layers, narrower
TINY_MODEL_FOLDER = "vae/tiny"  # under a tiny model's checkpoint folder


@dataclass(frozen=True)
class TinyVaeFile:
    """A published TAEHV decoder: `name`, hub `repo` and `filename`, the latents it decodes (`latent_channels`,
    `patch_size` of the VAE's output) and whether it takes them un-normalised (`raw_latents`)."""

    name: str
    repo: str
    filename: str
    latent_channels: int
    patch_size: int
    raw_latents: bool

    @property
    def hub_text(self) -> str:
        """"<repo>/<filename>", as the run's JSON records it."""
        return f"{self.repo}/{self.filename}"


PUBLISHED: dict[str, TinyVaeFile] = {f.name: f for f in (
    TinyVaeFile("taew2_1", "madebyollin/taehv", "taew2_1.pth", 16, 1, False),
    TinyVaeFile("taew2_2", "madebyollin/taehv", "taew2_2.pth", 48, 2, False),
    TinyVaeFile("lighttaew2_1", "lightx2v/Autoencoders", "lighttaew2_1.safetensors", 16, 1, True),
    TinyVaeFile("lighttaew2_2", "lightx2v/Autoencoders", "lighttaew2_2.safetensors", 48, 2, True),
)}


def published_for(latent_channels: int, name: str | None = None) -> TinyVaeFile:
    """The published decoder `name`, else madebyollin's for the latent width: `taew2_2` for 48 channels, `taew2_1`
    otherwise (a width neither fits is refused when the decoder is attached)."""
    if name is not None:
        return PUBLISHED[name]
    return PUBLISHED["taew2_2" if latent_channels == 48 else "taew2_1"]


def raw_latents_file(path: Path | str) -> bool:
    """Whether a weights file takes un-normalised latents: LightX2V's rule, its name holds `lighttae`."""
    return "lighttae" in Path(path).name.lower()


def hub_file(entry: TinyVaeFile, local_only: bool) -> Path | None:
    """The file in the Hugging Face cache, else (unless `local_only`) downloaded there: huggingface_hub's
    `snapshot_download` of that one file (it fails at once without a network, where `hf_hub_download` retries); None
    when it cannot be had. A cached file is used without asking the hub."""
    from huggingface_hub import snapshot_download

    for local in (True,) if local_only else (True, False):
        try:
            path = Path(snapshot_download(entry.repo, allow_patterns=[entry.filename], local_files_only=local))
        except Exception:  # noqa: BLE001 - not cached, no network, no such file: the caller says so
            continue
        if (path / entry.filename).is_file():
            return path / entry.filename
    return None


def not_loadable(entry: TinyVaeFile, why: str) -> ModelNotFound:
    """The one line for a published decoder that cannot be had (`why`), with what to do."""
    return ModelNotFound(f"--vae tiny: {entry.hub_text} is {why}. Download it with `hf download {entry.repo} "
                         f"{entry.filename} --local-dir DIR` and pass --vae tiny:weights=DIR/{entry.filename}, or use "
                         "--vae stock")


def download(entry: TinyVaeFile) -> Path:
    """The published decoder's file in the Hugging Face cache, downloaded there when it is not.

    Raises:
        ModelNotFound: it could not be (one line, `not_loadable`)."""
    path = hub_file(entry, local_only=False)
    if path is None:
        raise not_loadable(entry, "not in the local Hugging Face cache and could not be downloaded")
    return path


def check_tiny_vae(spec: Any, source: Any, random_weights: bool) -> None:
    """Before anything heavy loads (no torch): a `--vae tiny` that reads a published decoder (no `weights=FILE`, real
    weights, a model not built by vsagen) finds it in the Hugging Face cache or the hub answers for its repository.
    The width is the preset's VAE's (`z_dim`; the load checks it against the VAE's own).

    Args:
        spec: the request's `--vae` (`vsagen.request.options.VaeSpec`); source: the resolved model
            (`vsagen.models.sources.ModelSource`); random_weights: `--random-weights` (random decoder weights too).

    Raises:
        ModelNotFound: neither cached nor reachable (offline, no connection): one line naming the file and what to do.
    """
    if spec.kind != "tiny" or spec.weights is not None or random_weights or source.kind == "tiny":
        return
    entry = published_for(int(source.preset.vae.get("z_dim", 16)), spec.name)
    if hub_file(entry, local_only=True) is not None:
        return
    from ..models.sources import hub_unreachable

    why = hub_unreachable(entry.repo)
    if why is not None:
        raise not_loadable(entry, f"not in the local Hugging Face cache and {why}")


def check_tiny_request(spec: Any, source: Any, model: str) -> None:
    """What `--vae tiny` asks, checked against the model before anything loads: a `name=` decoder decodes the latent
    width of the model's VAE; a `weights=` file is whole, holds a TAEHV decoder (`_file_width`: a safetensors
    header's keys, shapes and dtypes; a `.pth`'s tensors memory-mapped, their data not read) and its first conv
    takes that width. The width is known for presets and tiny models (`z_dim` of their `[vae]`), else not checked
    here (the load checks it against the VAE's own).

    Raises:
        BadInput: one line naming the file or name, the widths and what fits.
    """
    if spec.kind != "tiny":
        return
    theirs = int(source.preset.vae.get("z_dim", 16)) if source.exact_preset or source.kind == "tiny" else None
    fits = ", ".join(n for n, f in PUBLISHED.items() if f.latent_channels == theirs) or "none published"
    width = PUBLISHED[spec.name].latent_channels if spec.name is not None else None
    if spec.weights is not None:
        width = _file_width(spec.weights, f"--vae {spec.text()}")
    if theirs is not None and width is not None and width != theirs:
        raise BadInput(f"--vae {spec.text()} decodes {width}-channel latents and --model {model}'s VAE makes "
                       f"{theirs}-channel ones; its published decoders are {fits}")


def check_distinct_decoders(specs: Any, source: Any, model: str) -> None:
    """`vsagen compare --vae A,B,...`: no two entries decode with the same tiny decoder. Without `weights=FILE` a
    tiny entry reads the published decoder of the model's latent width (`published_for`), so `tiny` and
    `tiny:name=taew2_1` are one decoder for a 16-channel VAE (two identical rows). Checked where the width is known
    (presets and tiny models, as `check_tiny_request`); entries written the same way are `VaeList.several`'s.

    Args:
        specs: the `--vae` entries (`vsagen.request.options.VaeSpec`), in order; source: the resolved model; model:
            `--model` as given (for the message).

    Raises:
        BadInput: one line naming both entries and the decoder they share.
    """
    if not (source.exact_preset or source.kind == "tiny"):
        return
    width = int(source.preset.vae.get("z_dim", 16))
    seen: dict[str, Any] = {}
    for spec in specs:
        if spec.kind != "tiny" or spec.weights is not None:
            continue
        name = published_for(width, spec.name).name
        if name in seen:
            raise BadInput(f"--vae: {seen[name].short_text()} and {spec.short_text()} are the same decoder for "
                           f"--model {model} ({name}, for its {width}-channel latents); list it once")
        seen[name] = spec


def _file_width(path: Path, where: str) -> int:
    """The latent channels a TAEHV decoder file takes (its first conv's input), after what loading it checks
    (`vsagen.decode.tiny_decoder.check_state`: every tensor there with its shape, floating point), no tensor data
    read: a `.safetensors` file's header (meta tensors of its shapes), a `.pth` / `.pt` through torch's weights-only
    loader memory-mapped (`vsagen.models.transformer_files.read_state_dict`).

    Raises:
        BadInput: the file is damaged or truncated, refused (a pickle that could run code), or holds no TAEHV decoder
            (one line starting with `where`)."""
    import torch
    from safetensors import safe_open

    from ..models.checkpoint_layouts import safetensors_problem
    from ..models.transformer_files import read_state_dict
    from .tiny_decoder import check_state

    if not path.name.endswith(".safetensors"):
        return check_state(read_state_dict(path, where), where).latent_channels
    problem = safetensors_problem(path)
    if problem is not None:
        raise BadInput(f"{where}: the file is damaged or truncated ({problem}); download it again")
    with safe_open(str(path), framework="numpy") as f:
        slices = {k: f.get_slice(k) for k in f.keys() if k.startswith("decoder.")}
        state = {k: torch.empty(s.get_shape(), device="meta",
                                dtype=torch.float32 if s.get_dtype().startswith(("F", "BF")) else torch.int8)
                 for k, s in slices.items()}
    return check_state(state, where).latent_channels


def tiny_model_file(checkpoint: Path, entry: TinyVaeFile) -> Path:
    """Where a tiny model (its checkpoint folder `checkpoint`) keeps its TAEHV decoder of `entry`'s kind."""
    return checkpoint / TINY_MODEL_FOLDER / f"{entry.name}.safetensors"
