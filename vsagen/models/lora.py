"""LoRAs into a Wan pipeline through diffusers' Wan LoRA loader (`WanLoraLoaderMixin`): its `lora_state_dict`
converts the original Wan keys (`diffusion_model.`, lora_A / lora_B or lora_down / lora_up with alphas) and
kohya / musubi-tuner's (`lora_unet_`) to diffusers' PEFT keys. Its `load_lora_weights` hands them to
`transformer.load_lora_adapter` (or, with `load_into_transformer_2`, to `transformer_2`'s); vsagen calls that method
of each expert the LoRA goes into itself (so a bare transformer takes one too; the zero image-projection factors
`load_lora_weights` adds for an image-to-video transformer add nothing and are left out). Each LoRA is checked layer
by layer against the transformer it goes into before anything is changed (`check_fit`, also on an empty meta transformer
before the weights load); then, fused (the default), `fuse_lora` merges every LoRA of a transformer at its scale
into the weights and `unload_lora` takes the PEFT layers away (the forward is the stock one); unfused, the PEFT
layers stay, at their scales (`set_adapters`).

Used by `vsagen.models.loading.load_model` (the commands: after the weights load, before the backend's patch
and `--quant`'s swap) and `vsagen.apply(pipe, ..., lora=...)`.
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

from ..errors import BadInput
from .lora_spec import LoraSpec, lora_format

COMPONENTS = ("transformer", "transformer_2")
_HASHES: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha256: a resident model re-resolves


@dataclass(frozen=True)
class LoraFile:
    """A LoRA ready to load: its spec, the local file (a hub id fetched) and the file's SHA-256 (hex)."""

    spec: LoraSpec
    path: Path
    sha256: str

    def record(self, components: Sequence[str]) -> dict[str, Any]:
        """What the JSON records of it: file, sha256, scale (the list of a compare's row scales), expert (as given
        or resolved), the components it went into, fused."""
        return {"file": self.spec.source if not self.spec.local else str(self.path), "sha256": self.sha256,
                "scale": list(self.spec.scales) if self.spec.scales else self.spec.scale,
                "expert": self.spec.expert or "both", "components": list(components),
                "fused": self.spec.fused}


def require_peft() -> None:
    """Raise BadInput (one line) unless PEFT, which diffusers' LoRA loading runs on, can be imported."""
    try:
        import peft  # noqa: F401
    except ImportError:
        raise BadInput("--lora needs the peft package, which diffusers' LoRA loading runs on: pip install peft") \
            from None


def sha256_of(path: Path) -> str:
    """The file's SHA-256 in hex (remembered per path, size and modification time)."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _HASHES:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
        _HASHES[key] = h.hexdigest()
    return _HASHES[key]


def fetch(spec: LoraSpec, layers: int | None = None) -> LoraFile:
    """The LoRA's local file (a hub id downloaded into the Hugging Face cache), its header checked (`lora_format`)
    and hashed.

    Raises:
        BadInput: peft not installed; a hub id that cannot be fetched or names a repository without exactly one
            top-level .safetensors file; what `lora_format` refuses.
    """
    require_peft()
    where = f"--lora {spec.source}"
    path = Path(spec.source) if spec.local else _hub_file(spec.source, where)
    lora_format(path, where, layers)
    return LoraFile(spec, path, sha256_of(path))


def _hub_file(hub_id: str, where: str) -> Path:
    """A hub LoRA's local file: `owner/repo/path.safetensors`, or the one top-level .safetensors of `owner/repo`.
    A file not in the local Hugging Face cache is fetched only once the hub answered for the repository
    (`vsagen.models.sources.hub_unreachable`, within seconds; not huggingface_hub's retries of half a minute)."""
    from huggingface_hub import hf_hub_download, list_repo_files, try_to_load_from_cache
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    from .sources import hub_unreachable

    parts = hub_id.split("/")
    repo, name = "/".join(parts[:2]), "/".join(parts[2:])
    cached = try_to_load_from_cache(repo, name) if name else None
    if isinstance(cached, str):
        return Path(cached)
    why = hub_unreachable(repo)
    if why is not None:
        raise BadInput(f"{where}: it is not in the local Hugging Face cache, and {why}")
    try:
        if not name:
            names = [n for n in list_repo_files(repo) if "/" not in n and n.endswith(".safetensors")]
            if len(names) != 1:
                raise BadInput(f"{where}: the repository holds {len(names)} top-level .safetensors files "
                               f"({', '.join(names[:4]) or 'none'}); name one: {repo}/FILE.safetensors")
            name = names[0]
        return Path(hf_hub_download(repo, name))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as e:
        raise BadInput(f"{where}: cannot fetch it from the Hugging Face hub ({str(e).splitlines()[0]})") from None
    except Exception as e:
        if not _unreachable(e):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BadInput(f"{where}: it is not in the local Hugging Face cache, and the hub cannot be reached "
                       f"({first[:100]})") from None


def _unreachable(e: Exception) -> bool:
    """Whether `e` is the hub's HTTP client failing to reach it (no connection, a timeout, a proxy's refusal):
    huggingface_hub lets its client's transport errors (httpx's `ConnectError`, `ConnectTimeout`, ...) through."""
    name = type(e).__name__.lower()
    return type(e).__module__.split(".")[0] in ("httpx", "httpx2", "requests", "urllib3") \
        or "connect" in name or "timeout" in name


def state_dict(lora: LoraFile) -> dict[str, Any]:
    """The LoRA's tensors under diffusers' PEFT names (`transformer.blocks.0.attn1.to_q.lora_A.weight`), converted
    by diffusers' `WanLoraLoaderMixin.lora_state_dict` (float as stored, on the CPU).

    Raises:
        BadInput: one line: the converter cannot read it (e.g. musubi-tuner's converter needs every block's
            attention and FFN linears; a key it does not know).
    """
    from diffusers.loaders.lora_pipeline import WanLoraLoaderMixin

    try:
        return WanLoraLoaderMixin.lora_state_dict(str(lora.path), use_safetensors=True)
    except (KeyError, ValueError, RuntimeError, OSError) as e:
        why = f"no {e}" if isinstance(e, KeyError) else (str(e).splitlines() or [type(e).__name__])[0]
        raise BadInput(f"--lora {lora.spec.source}: diffusers' Wan LoRA loader cannot convert it "
                       f"({why[:160]})") from None


def check_fit(state: dict[str, Any], transformer: Any, where: str) -> int:
    """Check every tensor of a converted LoRA against `transformer` (real or on the meta device): each names a
    `torch.nn.Linear` of it (`<module>.lora_A.weight` (r, in), `<module>.lora_B.weight` (out, r), optionally
    `<module>.lora_B.bias` (out,)), both factors of one rank. Returns how many layers it adapts.

    Raises:
        BadInput: one line starting with `where`: a tensor of no linear layer (a LoRA for another model), a shape
            or rank that does not fit, a layer with one factor only, no layer at all.
    """
    import torch

    layers: dict[str, dict[str, Any]] = {}
    for key, value in state.items():
        body = key.removeprefix("transformer.")
        module, sep, part = body.partition(".lora_")
        if body == key or not sep:
            raise BadInput(f"{where}: {key} (as diffusers names it) adapts no layer of a Wan transformer")
        layers.setdefault(module, {})[part] = tuple(value.shape)
    if not layers:
        raise BadInput(f"{where} fits no layer of the model (no LoRA tensor)")
    for module, parts in layers.items():
        try:
            linear = transformer.get_submodule(module)
        except AttributeError:
            linear = None
        if not isinstance(linear, torch.nn.Linear):
            raise BadInput(f"{where}: {module} (as diffusers names it) is no linear layer of the model: a LoRA for "
                           "another model")
        a, b = parts.get("A.weight"), parts.get("B.weight")
        if a is None or b is None:
            raise BadInput(f"{where}: {module} has lora_{'A' if a is None else 'B'}.weight missing")
        want_a, want_b = (a[0], linear.in_features), (linear.out_features, a[0])
        if a != want_a or b != want_b or parts.get("B.bias", (linear.out_features,)) != (linear.out_features,):
            raise BadInput(f"{where}: {module}'s factors are {a} and {b}, and the model's layer is "
                           f"{linear.out_features} x {linear.in_features} (rank {a[0]} needs {want_a} and "
                           f"{want_b}): a LoRA for another model size")
    return len(layers)


def targets_of(pipe: Any) -> dict[str, Any]:
    """{component: transformer} of a pipeline, or {"transformer": pipe} for a bare transformer."""
    if hasattr(pipe, "blocks"):
        return {"transformer": pipe}
    return {n: t for n in COMPONENTS if (t := getattr(pipe, n, None)) is not None}


def check_loras(files: Sequence[LoraFile], targets: dict[str, Any]
                ) -> list[tuple[LoraFile, dict[str, Any], tuple[str, ...]]]:
    """Each LoRA converted (`state_dict`) and checked (`check_fit`) against every transformer of `targets`
    ({component: transformer}, `targets_of`) it goes into; the components it goes into.

    Raises:
        BadInput: expert 2 on a one-expert model; an unfused LoRA and a fused one on one transformer; a
            transformer that holds PEFT adapters already; see `state_dict`, `check_fit`.
    """
    out, modes = [], {}
    for c, t in targets.items():
        if getattr(t, "peft_config", None):
            raise BadInput(f"--lora: the pipeline's {c} holds PEFT adapters already ({', '.join(t.peft_config)}); "
                           "load LoRAs into a transformer without them (unload_lora() first)")
    for lora in files:
        where = f"--lora {lora.spec.source}"
        components = tuple(c for c in lora.spec.components if c in targets)
        if not components:
            raise BadInput(f"{where}: expert={lora.spec.expert} names transformer_2, and the model has one "
                           "transformer")
        state = state_dict(lora)
        for c in components:
            check_fit(state, targets[c], where)
            if modes.setdefault(c, lora.spec.fused) != lora.spec.fused:
                raise BadInput(f"{where}: fused and unfused LoRAs on one transformer ({c}); give :fused=false to "
                               "all of them or none")
        out.append((lora, state, components))
    return out


class LoadedLoras(NamedTuple):
    """What `load_loras` did: one JSON record per LoRA (`LoraFile.record`); `undo()` takes them out again
    (unfused: the PEFT layers unloaded, the weights as they were; fused, loaded `undoable`: each merged product
    subtracted again, the weights as they were up to rounding in their dtype; else nothing); `rescale(s)` sets
    the scale of the LoRA whose spec lists row scales (`vsagen compare`), fused or not (None: no such LoRA)."""

    records: list[dict[str, Any]]
    undo: Callable[[], None]
    rescale: Callable[[float], None] | None = None


def load_loras(pipe: Any, files: Sequence[LoraFile], log: Callable[[str], None] = lambda m: None, *,
               undoable: bool = False) -> LoadedLoras:
    """Load `files` into `pipe` (a Wan pipeline or a bare transformer), each into its expert(s), at its scale;
    fused ones merged into the weights and their PEFT layers unloaded (kept, merged, on a transformer holding a
    LoRA of several row scales, so `rescale` can merge it again), unfused ones left as active PEFT layers.
    Everything is checked before anything changes (`check_loras`).

    Raises:
        BadInput: see `check_loras`; peft not installed.
    """
    if not files:
        return LoadedLoras([], lambda: None)
    require_peft()
    targets = targets_of(pipe)
    checked = check_loras(files, targets)
    names: dict[str, list[tuple[str, float]]] = {c: [] for c in targets}
    fused = {c: lora.spec.fused for lora, _, components in checked for c in components}
    rows = next(((f"vsagen_lora_{i}", components) for i, (lora, _, components) in enumerate(checked)
                 if lora.spec.scales), None)
    with warnings.catch_warnings():  # PEFT warns of a second adapter on one model: vsagen loads them so
        warnings.simplefilter("ignore")
        for i, (lora, state, components) in enumerate(checked):
            log(f"LoRA {lora.path.name} into {', '.join(components)}")
            for c in components:
                name = f"vsagen_lora_{i}"
                targets[c].load_lora_adapter(dict(state), adapter_name=name, prefix="transformer")
                names[c].append((name, lora.spec.scale))
    undos = []
    for c, adapters in names.items():
        if not adapters:
            continue
        t = targets[c]
        t.set_adapters([n for n, _ in adapters], [s for _, s in adapters])
        if fused[c]:
            factors = _merged_factors(t) if undoable else []
            t.fuse_lora(lora_scale=1.0, adapter_names=[n for n, _ in adapters])
            if rows is None or c not in rows[1]:
                t.unload_lora()
                undos.append(lambda t=t, f=factors: _subtract(t, f))
        else:
            undos.append(t.unload_lora)  # (`check_loras`: no adapter of another's on it)
    records = [lora.record(components) for lora, _, components in checked]
    rescale = None if rows is None else (lambda scale: _rescale(targets, names, fused, rows, scale))
    return LoadedLoras(records, lambda: [undo() for undo in reversed(undos)], rescale)


def _rescale(targets: dict[str, Any], names: dict[str, list[tuple[str, float]]], fused: dict[str, bool],
             rows: tuple[str, tuple[str, ...]], scale: float) -> None:
    """Set the row LoRA's (`rows`: its adapter name and components) scale on each of its transformers, the other
    LoRAs at theirs: unmerged first and merged again where fused (PEFT's `unmerge` / `merge`)."""
    name, components = rows
    for c in components:
        t, adapters = targets[c], names[c]
        if fused[c]:
            t.unfuse_lora()
        t.set_adapters([n for n, _ in adapters], [scale if n == name else s for n, s in adapters])
        if fused[c]:
            t.fuse_lora(lora_scale=1.0, adapter_names=[n for n, _ in adapters])


def _merged_factors(transformer: Any) -> list[tuple[str, Any, Any, float, Any]]:
    """[(module name, lora_A weight, lora_B weight, scaling, lora_B bias or None)] of every active adapter of
    `transformer`'s PEFT layers (copies: the factors are small), what fusing adds, to take it out again."""
    from peft.tuners.lora import LoraLayer

    out = []
    for name, module in transformer.named_modules():
        if isinstance(module, LoraLayer):
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    a, b = module.lora_A[adapter], module.lora_B[adapter]
                    out.append((name, a.weight.detach().clone(), b.weight.detach().clone(), module.scaling[adapter],
                                None if b.bias is None else b.bias.detach().clone()))
    return out


def _subtract(transformer: Any, factors: list[tuple[str, Any, Any, float, Any]]) -> None:
    """Take fused products out of the weights again (`_merged_factors`), computed in float32 as PEFT merges."""
    import torch

    with torch.no_grad():
        for name, a, b, scaling, bias in factors:
            linear = transformer.get_submodule(name)
            w = linear.weight
            w.copy_((w.float() - (b.float() @ a.float()) * scaling).to(w.dtype))
            if bias is not None and linear.bias is not None:
                linear.bias.copy_((linear.bias.float() - bias.float() * scaling).to(linear.bias.dtype))


def check_before_load(files: Sequence[LoraFile], configs: Sequence[tuple[str, dict[str, Any]]]) -> None:
    """Check the LoRAs against the model's transformers built empty on the meta device from their configs (no
    weights read): what `check_loras` refuses, before the model loads.

    Raises:
        BadInput: see `check_loras`.
    """
    if not files or not configs:
        return
    from .transformer_files import empty_transformer

    check_loras(files, {name: empty_transformer({k: v for k, v in config.items() if not k.startswith("_")})
                        for name, config in configs})
