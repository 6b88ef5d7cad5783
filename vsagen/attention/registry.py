"""The registry: `--attn` names -> backend classes, and the one check that a class or object is a backend.

A backend is one module and one line here: its class's place in `_BACKENDS` ("module:Class", a module of this
package written with a leading dot). `REGISTRY` (`registry_of` the classes, checked) is the one source of names:
every caller reads it when it runs (`backend_names`, `backend_class`), so a backend registered after import (a
test's) is seen by the command line, the presets, the listings and `--attn auto` alike. Everything vsagen knows of a
backend is its class: `name`, `Options`, `tiled`, `weights` (its checkpoint keys, stated there once),
`auto_priority`, the docstring's first paragraph (`vsagen backends`). `BackendName` is a `str` Enum of the names
registered at import, for Python callers that want a type; nothing in vsagen reads it. Only backends that really
work are registered; the CLI lists exactly these (docs/adding-a-backend.md).

A backend module imports neither torch nor the kernels when it is imported (the methods that compute import them),
so importing every backend here costs no torch: `vsagen backends`, `vsagen presets` and bad `--attn` input answer
before torch loads.
"""

from __future__ import annotations

import importlib
from enum import Enum
from pathlib import Path
from typing import Any

from ..errors import BadInput
from .base import PROTOCOL_MEMBERS

# The shipped backends, in the order `vsagen backends` lists them: "module:Class" (a leading dot: this package).
_BACKENDS: tuple[str, ...] = (
    ".full:FullAttention",
    ".vsa:VSAAttention",
    ".rocm_vsa:ROCmVSAAttention",
    ".sla_star:SLAStarAttention",
    ".sla:SLAAttention",
    ".sparse_vdit:SparseVDiTAttention",
)


def backend_at(where: str) -> type:
    """The class at `where`, "module:Class" (a module of this package with a leading dot, `.vsa:VSAAttention`, or
    any importable module, `mypackage.mine:MyAttention`), its module imported.

    Raises:
        ImportError, AttributeError: no such module or class (a programming error of the registration).
    """
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(module, __package__), name)


def summary_of(backend: type) -> str:
    """The one-line description of a backend class: the first paragraph of its docstring, on one line, without the
    final period."""
    return " ".join((backend.__doc__ or "").strip().split("\n\n")[0].split()).rstrip(".")


def missing_members(backend: Any) -> list[str]:
    """The members of the backend protocol (`vsagen.attention.base.AttentionBackend`) that `backend`, a class or an
    object, lacks: the registry's own validation, the one place that probes a backend's attributes (a class built
    on `vsagen.attention.base.Backend` has them all)."""
    return [m for m in PROTOCOL_MEMBERS if not hasattr(backend, m)]


def check_backend_class(cls: type) -> type:
    """`cls`, once it is known to declare every protocol member and a name.

    Raises:
        TypeError: a member is missing, or an `auto_priority` that is not None nor an int or is given without
            `weights` (a programming error of the backend's module, found at import).
    """
    missing = missing_members(cls)
    if missing or not isinstance(getattr(cls, "name", None), str):
        raise TypeError(f"{cls.__name__} is not an attention backend: it lacks {', '.join(missing) or 'a name'} "
                        "(derive it from vsagen.attention.base.Backend)")
    priority = cls.auto_priority
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int) or cls.weights is None):
        raise TypeError(f"{cls.__name__}.auto_priority must be None or an int, and only a backend with weights has "
                        f"one (--attn auto chooses by the checkpoint's weights); got {priority!r}")
    return cls


def held_names(weights: Any) -> str:
    """The tensor names a backend's weights (a `LayerWeights`) are found under, layer written N, for
    messages: the key, then its aliases in parentheses, e.g. "blocks.N.to_gate_compress.* (or
    blocks.N.attn1.to_gate_compress.*)"."""
    key, *aliases = (f"{t.format(layer='N')}.*" for t in (weights.key, *getattr(weights, "aliases", ())))
    return key + (f" (or {', '.join(aliases)})" if aliases else "")


def registry_of(backends: tuple[Any, ...]) -> dict[str, type]:
    """{name: class} of backend classes, or their places ("module:Class", `backend_at`), each checked
    (`check_backend_class`), in their order.

    Raises:
        TypeError: a class is not a backend, or two share a name (e.g. a subclass that kept its parent's).
    """
    out: dict[str, type] = {}
    for backend in backends:
        cls = check_backend_class(backend_at(backend) if isinstance(backend, str) else backend)
        if cls.name in out:
            raise TypeError(f"{cls.__name__} and {out[cls.name].__name__} are both registered as {cls.name!r}")
        out[cls.name] = cls
    return out


REGISTRY: dict[str, type] = registry_of(_BACKENDS)

BackendName = Enum("BackendName", {n.upper().replace("-", "_"): n for n in REGISTRY}, type=str)
BackendName.__doc__ = ("The `--attn` names registered at import (a str Enum); vsagen itself reads `backend_names()`, "
                       "which sees a backend registered later too.")


def backend_names() -> list[str]:
    """Registered `--attn` names, in registry order."""
    return list(REGISTRY)


def backend_class(name: str) -> type:
    """The class registered as `name` (a str or a `BackendName`).

    Raises:
        BadInput: unknown name (the message lists the known ones).
    """
    try:
        return REGISTRY[str(getattr(name, "value", name))]
    except KeyError:
        raise BadInput(f"unknown --attn {name!r}; available: {', '.join(REGISTRY)}") from None


def options_of(name: str) -> type:
    """The `Options` dataclass of backend `name`.

    Raises:
        BadInput: unknown name.
    """
    return backend_class(name).Options


def uses_sparsity(name: str) -> bool:
    """Whether backend `name` takes a sparsity (its Options have a `sparsity` field)."""
    return "sparsity" in options_of(name).__dataclass_fields__


def named_weights_file(backend: Any, options: Any) -> Path | None:
    """The weights file a backend's options name (its `weights.file_option`), or None; `backend` is a backend class
    or object."""
    spec = backend.weights
    if spec is None or spec.file_option is None:
        return None
    named = getattr(options, spec.file_option, None)
    return Path(named) if named is not None else None
