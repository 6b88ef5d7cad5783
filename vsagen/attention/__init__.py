"""Attention backends for the video self-attention, and the registry that maps `--attn` names to them.

Only backends that really work are registered; the CLI lists exactly these.
"""

from __future__ import annotations

from typing import Callable

from ..errors import BadInput
from .base import AttentionBackend
from .full import FullAttention
from .vsa import DEFAULT_SPARSITY as VSA_DEFAULT
from .vsa import IMPLS as VSA_IMPLS
from .vsa import VSAAttention

# name -> (factory taking (sparsity or None, impl), whether the backend uses a sparsity, its implementations)
BACKENDS: dict[str, tuple[Callable[..., AttentionBackend], bool, tuple[str, ...]]] = {
    "full": (lambda sparsity, impl: FullAttention(), False, ("auto",)),
    "vsa": (lambda sparsity, impl: VSAAttention(VSA_DEFAULT if sparsity is None else sparsity, impl), True,
            VSA_IMPLS),
}


def backend_names() -> list[str]:
    """Registered `--attn` names, in registry order."""
    return list(BACKENDS)


def uses_sparsity(name: str) -> bool:
    """Whether backend `name` takes a sparsity."""
    return BACKENDS[name][1]


def backend_impls(name: str) -> tuple[str, ...]:
    """Implementations backend `name` offers ("auto" first)."""
    return BACKENDS[name][2]


def make_backend(name: str, sparsity: float | None = None, impl: str = "auto") -> AttentionBackend:
    """Build the backend called `name`.

    Args:
        name: a registered `--attn` name.
        sparsity: for sparse backends (None: the backend's default); must be None for dense ones.
        impl: "auto", or one of the backend's implementations (vsa: "triton", "torch").

    Raises:
        BadInput: unknown name (the message lists the known ones), a sparsity for a dense backend, or an
            implementation the backend does not have.
    """
    if name not in BACKENDS:
        raise BadInput(f"unknown --attn {name!r}; available: {', '.join(BACKENDS)}")
    factory, sparse, impls = BACKENDS[name]
    if not sparse and sparsity is not None:
        raise BadInput(f"--sparsity does not apply to --attn {name} (dense)")
    if impl not in impls:
        raise BadInput(f"--attn-impl {impl} does not apply to --attn {name}; choose from {', '.join(impls)}")
    return factory(sparsity, impl)


__all__ = ["AttentionBackend", "BACKENDS", "backend_impls", "backend_names", "make_backend", "uses_sparsity"]
