"""Attention backends for the video self-attention, and the registry that maps `--attn` names to them.

The registry maps names to backend classes and nothing else; `BackendName` (a `str` Enum built from it) is the one
source of names. Only backends that really work are registered; the CLI lists exactly these. Adding a backend:
one module here declaring the class (name, Options, tiled, traceable, weights, check, describe, __call__), one
line in `_BACKENDS`, and tests (README: "Adding a backend").
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from ..errors import BadInput
from .base import AttentionBackend, AttnContext, LayerWeights, NoOptions
from .full import FullAttention
from .spec import BackendSpec, resolve_spec
from .vsa import VSAAttention, VSAOptions

_BACKENDS: tuple[type, ...] = (FullAttention, VSAAttention)

REGISTRY: dict[str, type] = {cls.name: cls for cls in _BACKENDS}

BackendName = Enum("BackendName", {n.upper().replace("-", "_"): n for n in REGISTRY}, type=str)
BackendName.__doc__ = "The registered `--attn` names (a str Enum: Typer accepts it as an option type)."


def backend_names() -> list[str]:
    """Registered `--attn` names, in registry order."""
    return list(REGISTRY)


def backend_class(name: str) -> type:
    """The class registered as `name`.

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


def make_backend(name: str, sparsity: float | None = None, impl: str = "auto", **options: Any) -> AttentionBackend:
    """Build backend `name` from the two dedicated flags' values and any other options (keyword arguments).

    Args:
        name: a registered `--attn` name.
        sparsity: for sparse backends (None: the backend's default); must be None for dense ones.
        impl: "auto", or one of the backend's implementations (vsa: "triton", "torch").
        options: further fields of the backend's Options.

    Raises:
        BadInput: unknown name (the message lists the known ones), a sparsity for a dense backend, an
            implementation the backend does not have, or an option it does not have.
    """
    from .spec import check_flags_apply, make_options

    cls = backend_class(name)
    check_flags_apply([cls.name], {"--sparsity": sparsity, "--attn-impl": impl}, cls.name)
    values = dict(options)
    if sparsity is not None:
        values["sparsity"] = sparsity
    if "impl" in cls.Options.__dataclass_fields__:
        values["impl"] = impl
    return cls(make_options(cls.name, values))


__all__ = ["AttentionBackend", "AttnContext", "BackendName", "BackendSpec", "FullAttention", "LayerWeights",
           "NoOptions", "REGISTRY", "VSAAttention", "VSAOptions", "backend_class", "backend_names", "make_backend",
           "resolve_spec", "uses_sparsity"]
