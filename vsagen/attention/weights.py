"""The one loader of backend-owned per-layer parameters (`LayerWeights`): safetensors only, shapes checked.

A backend declares what it can load (`AttentionBackend.weights`: a checkpoint key prefix with a `{layer}` field,
the attribute of `attn1` it is attached as, the expected shapes and how to build the Module); this module finds
those tensors in a checkpoint's transformer folder or in one file the user names, checks every shape against the
layer it belongs to, and attaches one Module per layer to that layer's `attn1`, in the transformer's dtype and on
its device, so that `.to()` and diffusers' offloading move it with the model. Pickle files are never read.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..errors import BadInput
from .base import LayerWeights
from .shared import weights_path_option  # noqa: F401 - re-exported: the Options check with it
from .registry import named_weights_file  # noqa: F401 - re-exported: read before torch loads

if TYPE_CHECKING:  # torch is imported by the functions that touch tensors: `--attn auto` and the Options checks
    import torch   # read key names only (safetensors headers), before a bad input is refused


def _files(source: Path) -> list[Path]:
    """The safetensors files of a folder (sorted), or the one file named."""
    if source.is_dir():
        return sorted(source.glob("*.safetensors"))
    if source.suffix != ".safetensors":
        raise BadInput(f"{source}: backend weights are read from .safetensors files only")
    return [source]


def _key_pattern(spec: LayerWeights) -> re.Pattern:
    """A regex matching `<key or alias with the layer number>.<param>`, capturing (layer, param)."""
    alternatives = []
    for template in (spec.key, *spec.aliases):
        prefix, _, suffix = template.partition("{layer}")
        alternatives.append(re.escape(prefix) + r"(\d+)" + re.escape(suffix))
    return re.compile("(?:" + "|".join(alternatives) + r")\.([A-Za-z0-9_]+)$")


def matches_layer_weights(key: str, spec: LayerWeights) -> bool:
    """Whether a checkpoint key is one of `spec`'s tensors (its key or an alias, with a layer number and a parameter
    name, matched from the start)."""
    return _key_pattern(spec).match(key) is not None


def _match(m: re.Match) -> tuple[int, int, str]:
    """(scheme, layer, param) of a `_key_pattern` match: which key template matched (0: the backend's own key,
    then its aliases), the layer number it holds, and the parameter name."""
    groups = m.groups()
    scheme = next(i for i, g in enumerate(groups[:-1]) if g is not None)
    return scheme, int(groups[scheme]), groups[-1]


def read_layer_tensors(source: Path, spec: LayerWeights, keys: dict[int, dict[str, str]] | None = None,
                       strict: bool = False) -> dict[int, dict[str, torch.Tensor]]:
    """The tensors of `spec` in `source` (a folder of safetensors files, or one file), by layer index.

    Args:
        keys: if given, receives the key each tensor was stored under ({layer: {param: key}}), for messages.
        strict: a file the user named: its tensors must use one key scheme throughout, and a key that names the
            backend's module (e.g. `...proj_l.bias`) but matches none of the schemes (a prefix, a typo) is refused
            rather than skipped (a trained bias would otherwise be dropped without a word).

    Returns:
        {layer: {param: tensor}} for every layer that has at least one of the tensors (CPU, as stored).

    Raises:
        BadInput: a named file that is not .safetensors or cannot be read; a tensor stored twice (under two key
            schemes, or in two files); a layer whose tensors mix key schemes (e.g. the weight under vsagen's key,
            the bias under an alias); with `strict`, layers under different schemes or a near-miss key.
    """
    from safetensors import SafetensorError, safe_open

    pattern = _key_pattern(spec)
    module = spec.key.rsplit(".", 1)[-1]  # e.g. "proj_l"
    names = " or ".join(f"{t.format(layer='N')}.*" for t in (spec.key, *spec.aliases))
    found: dict[int, dict[str, torch.Tensor]] = {}
    seen: dict[int, dict[str, str]] = {} if keys is None else keys
    schemes: dict[int, int] = {}
    for f in _files(source):
        try:
            with safe_open(str(f), framework="pt") as sf:
                for key in sf.keys():
                    m = pattern.match(key)
                    if not m:
                        if strict and f".{module}." in f".{key}":
                            raise BadInput(f"{source}: {key} names {module} but is not one of the accepted keys "
                                           f"({names}, matched from the start)")
                        continue
                    scheme, layer, param = _match(m)
                    if param in seen.get(layer, {}):
                        raise BadInput(f"{source}: {key} and {seen[layer][param]} are the same tensor; keep one")
                    if schemes.setdefault(layer, scheme) != scheme:
                        other = next(iter(seen[layer].values()))
                        raise BadInput(f"{source}: layer {layer} mixes key schemes ({other} and {key}); use one")
                    if strict and len(set(schemes.values())) > 1:
                        other = next(iter(next(v for i, v in seen.items() if schemes[i] != scheme).values()))
                        raise BadInput(f"{source}: {key} and {other} use different key schemes; use one for every "
                                       f"layer")
                    seen.setdefault(layer, {})[param] = key
                    found.setdefault(layer, {})[param] = sf.get_tensor(key)
        except (OSError, ValueError, RuntimeError, SafetensorError) as e:  # a bad header is a SafetensorError
            raise BadInput(f"cannot read backend weights from {f}: {str(e).splitlines()[0] if str(e) else e}") \
                from None
    return found


def first_layer_key(folder: Path, spec: LayerWeights | None) -> str | None:
    """The first key of `spec`'s tensors in a checkpoint folder's safetensors files (headers only, no tensor read),
    or None: no such folder, no such tensor, no spec, or unreadable files (the load reports those)."""
    from safetensors import SafetensorError, safe_open

    if spec is None or not folder.is_dir():
        return None
    pattern = _key_pattern(spec)
    for f in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(f), framework="numpy") as sf:
                for key in sf.keys():
                    if pattern.match(key):
                        return key
        except (OSError, ValueError, RuntimeError, SafetensorError):
            continue
    return None


def check_weights_file(path: Path, spec: LayerWeights) -> int:
    """A file the user names for a backend's weights, checked before any model is loaded: a readable safetensors
    file that holds at least one of the backend's tensors (shapes are checked once the model is known).

    Returns:
        How many of its keys are the backend's.

    Raises:
        BadInput: not .safetensors, unreadable, or none of its keys match `spec.key` (e.g. a file whose keys carry
            an extra prefix such as "transformer.").
    """
    from safetensors import SafetensorError, safe_open

    files = _files(path)
    pattern = _key_pattern(spec)
    try:
        with safe_open(str(files[0]), framework="numpy") as sf:
            n = sum(1 for key in sf.keys() if pattern.match(key))
    except (OSError, ValueError, RuntimeError, SafetensorError) as e:
        raise BadInput(f"cannot read backend weights from {path}: {str(e).splitlines()[0] if str(e) else e}") \
            from None
    if not n:
        names = " or ".join(f"{t.format(layer='N')}.*" for t in (spec.key, *spec.aliases))
        raise BadInput(f"{path} holds no {names} tensors (keys are matched from their start)")
    return n


def check_layer_tensors(found: dict[int, dict[str, torch.Tensor]], spec: LayerWeights, attns: list[Any],
                        source: Path, keys: dict[int, dict[str, str]] | None = None,
                        require_all: bool = False) -> None:
    """Check every found tensor against the layer it belongs to.

    Args:
        keys: the key each tensor was stored under (`read_layer_tensors`), so messages name the file's own keys.
        require_all: every layer of the transformer must be present (a file the user names: a file for another
            model size would otherwise attach to some layers and leave the rest without).

    Raises:
        BadInput: one line naming the first mismatch: a layer index past the transformer's blocks, a missing layer
            (`require_all`), a tensor the backend does not take, a missing required tensor, a shape other than
            `spec.shapes(attn)`, a tensor that is not floating point, or one with NaN / Inf values.
    """
    import torch

    keys = keys or {}

    def name_of(layer: int, param: str) -> str:
        """The tensor's key as stored, or for one missing, the key it would have in the scheme its layer uses."""
        stored = keys.get(layer, {})
        if param in stored:
            return stored[param]
        prefix = next(iter(stored.values())).rsplit(".", 1)[0] if stored else spec.key.format(layer=layer)
        return f"{prefix}.{param}"

    for layer in sorted(found):
        tensors = found[layer]
        first = name_of(layer, next(iter(tensors)))
        if layer >= len(attns):
            raise BadInput(f"{source}: {first} is for layer {layer}, but the transformer has {len(attns)} blocks")
        want = spec.shapes(attns[layer])
        for name in tensors:
            if name not in want:
                raise BadInput(f"{source}: {name_of(layer, name)} is not a parameter of this backend "
                               f"({', '.join(want)})")
        for name, shape in want.items():
            if name not in tensors:
                if name in spec.optional:
                    continue
                raise BadInput(f"{source}: {name_of(layer, name)} is missing")
            got = tuple(tensors[name].shape)
            if got != tuple(shape):
                raise BadInput(f"{source}: {name_of(layer, name)} has shape {list(got)}, this model needs "
                               f"{list(shape)}")
            if not tensors[name].is_floating_point():
                raise BadInput(f"{source}: {name_of(layer, name)} is {str(tensors[name].dtype).replace('torch.', '')},"
                               f" not a float tensor")
            if not bool(torch.isfinite(tensors[name]).all()):
                raise BadInput(f"{source}: {name_of(layer, name)} holds NaN or Inf values")
    if require_all:
        missing = [i for i in range(len(attns)) if i not in found]
        if missing:
            raise BadInput(f"{source}: no {spec.key.format(layer=missing[0])}.* tensors (layers {len(found)} of "
                           f"{len(attns)} present): a file named for this model must cover every layer")

def attach_layer_weights(transformer: Any, spec: LayerWeights, source: Path | None,
                         undo: list[Callable[[], None]] | None = None, require_all: bool = False) -> int:
    """Load `spec`'s tensors from `source` and attach one Module per layer as `blocks[i].attn1.<spec.attr>`.

    Args:
        transformer: a diffusers WanTransformer3DModel (its `blocks[i].attn1` modules).
        spec: what the backend loads (`AttentionBackend.weights`).
        source: a checkpoint's transformer folder (its *.safetensors files) or one .safetensors file; None or a
            missing folder means nothing to load.
        undo: if given, receives one function per attached layer that puts back what that layer had before
            (the earlier Module, or none): undoing touches only what this call attached. A layer holding a Module
            this function attached from the same `source` keeps it (and counts): attaching is idempotent, so the
            weights a run attached before the weights were placed (offloading) are not attached twice.
        require_all: refuse a source that does not cover every layer (files the user names).

    Returns:
        How many layers got parameters.

    Raises:
        BadInput: see `read_layer_tensors` and `check_layer_tensors` (nothing is attached then).
    """
    import torch

    if source is None or not source.exists():
        return 0
    keys: dict[int, dict[str, str]] = {}
    found = read_layer_tensors(source, spec, keys, strict=require_all)
    attns = [block.attn1 for block in transformer.blocks]
    check_layer_tensors(found, spec, attns, source, keys, require_all)
    origin = str(source.resolve())
    for layer, tensors in found.items():
        attn = attns[layer]
        if _origin(attn._modules.get(spec.attr)) == origin:
            continue  # attached from this source already (before the weights were placed): kept as it is
        ref = attn.to_q.weight
        module = spec.build(tensors, attn).to(device=ref.device,
                                              dtype=getattr(torch, spec.dtype) if spec.dtype else ref.dtype)
        module.vsagen_weights_origin = origin
        if undo is not None:
            undo.append(_restorer(attn, spec.attr, module))
        setattr(attn, spec.attr, module)
    return len(found)


def _origin(module: torch.nn.Module | None) -> str | None:
    """The resolved path of the file or folder an attached Module was loaded from, or None (none attached, or one
    attached by other means)."""
    return None if module is None else module.__dict__.get("vsagen_weights_origin")


def _restorer(attn: Any, attr: str, attached: torch.nn.Module) -> Callable[[], None]:
    """Undo of one attachment: put back what `attn.<attr>` was before, if `attached` is still there."""
    had = attr in attn._modules
    previous = attn._modules.get(attr)

    def restore() -> None:
        if attn._modules.get(attr) is not attached:
            return  # replaced since: not ours to undo
        if had:
            setattr(attn, attr, previous)
        else:
            delattr(attn, attr)

    return restore


def detach_layer_weights(transformer: Any, spec: LayerWeights) -> int:
    """Remove what `attach_layer_weights` attached (`blocks[i].attn1.<spec.attr>`). Returns how many."""
    n = 0
    for block in transformer.blocks:
        if hasattr(block.attn1, spec.attr):
            delattr(block.attn1, spec.attr)
            n += 1
    return n


def layer_params(attn: Any, spec: LayerWeights | None) -> torch.nn.Module | None:
    """The Module `attach_layer_weights` attached to this `attn1` for `spec`, or None."""
    return None if spec is None else getattr(attn, spec.attr, None)


def attach_backend_weights(transformer: Any, backend: Any, checkpoint_dir: Path | None,
                           undo: list[Callable[[], None]] | None = None) -> int:
    """Attach what `backend` owns (`backend.weights`) to `transformer`'s layers: from the file its Options name
    (`LayerWeights.file_option`) if given, else from the checkpoint's transformer folder `checkpoint_dir`.
    Backends without weights attach nothing.

    Returns:
        How many layers got parameters (`undo`: as in `attach_layer_weights`).

    Raises:
        BadInput: see `attach_layer_weights`.
    """
    spec = backend.weights
    if spec is None:
        return 0
    named = getattr(backend.options, spec.file_option, None) if spec.file_option else None
    if named is not None:
        check_weights_file(Path(named), spec)
        return attach_layer_weights(transformer, spec, Path(named), undo, require_all=True)
    return attach_layer_weights(transformer, spec, checkpoint_dir, undo)
