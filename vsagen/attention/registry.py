"""The registry: `--attn` names -> backend classes, and the one check that a class or object is a backend.

`REGISTRY` (built from `_BACKENDS`) is the one source of names: every caller reads it when it runs (`backend_names`,
`backend_class`), so a backend registered after import (a test's) is seen by the command line, the presets, the
listings and `--attn auto` alike. `BackendName` is a `str` Enum of the names registered at import, for Python
callers that want a type; nothing in vsagen reads it. Only backends that really work are registered; the CLI lists
exactly these. Adding a backend: its class in `_BACKENDS` (one line), its module beside this one, tests
(docs/adding-a-backend.md).
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from ..errors import BadInput
from .base import PROTOCOL_MEMBERS
from .full import FullAttention
from .rocm_vsa import ROCmVSAAttention
from .sla_star import SLAStarAttention
from .sparse_vdit import SparseVDiTAttention
from .vsa import VSAAttention


def missing_members(backend: Any) -> list[str]:
    """The members of the backend protocol (`vsagen.attention.base.AttentionBackend`) that `backend`, a class or an
    object, lacks: the registry's own validation, the one place that probes a backend's attributes (a class built
    on `vsagen.attention.base.Backend` has them all)."""
    return [m for m in PROTOCOL_MEMBERS if not hasattr(backend, m)]


def check_backend_class(cls: type) -> type:
    """`cls`, once it is known to declare every protocol member and a name.

    Raises:
        TypeError: a member is missing (a programming error of the backend's module, found at import).
    """
    missing = missing_members(cls)
    if missing or not isinstance(getattr(cls, "name", None), str):
        raise TypeError(f"{cls.__name__} is not an attention backend: it lacks {', '.join(missing) or 'a name'} "
                        "(derive it from vsagen.attention.base.Backend)")
    priority = cls.auto_priority
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int) or cls.weights is None):
        raise TypeError(f"{cls.__name__}.auto_priority must be None or an int, and only a backend with weights has one "
                        f"(--attn auto chooses by the checkpoint's weights); got {priority!r}")
    return cls


def registry_of(classes: tuple[type, ...]) -> dict[str, type]:
    """{name: class} of backend classes, each checked (`check_backend_class`), in their order.

    Raises:
        TypeError: a class is not a backend, or two share a name (e.g. a subclass that kept its parent's).
    """
    out: dict[str, type] = {}
    for cls in classes:
        check_backend_class(cls)
        if cls.name in out:
            raise TypeError(f"{cls.__name__} and {out[cls.name].__name__} are both registered as {cls.name!r}")
        out[cls.name] = cls
    return out


_BACKENDS: tuple[type, ...] = (FullAttention, VSAAttention, ROCmVSAAttention, SLAStarAttention, SparseVDiTAttention)

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


def uses_sparsity(name: str) -> bool:
    """Whether backend `name` takes a sparsity (its Options have a `sparsity` field)."""
    return "sparsity" in backend_class(name).Options.__dataclass_fields__
