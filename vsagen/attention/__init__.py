"""Attention backends for the video self-attention, and the registry that maps `--attn` names to them.

Only backends that really work are registered; the CLI lists exactly these.
"""

from __future__ import annotations

from typing import Callable

from ..errors import BadInput
from .base import AttentionBackend
from .full import FullAttention
from .vsa import DEFAULT_SPARSITY as VSA_DEFAULT
from .vsa import VSAAttention

# name -> (factory taking the sparsity or None, whether the backend uses a sparsity)
BACKENDS: dict[str, tuple[Callable[..., AttentionBackend], bool]] = {
    "full": (lambda sparsity: FullAttention(), False),
    "vsa": (lambda sparsity: VSAAttention(VSA_DEFAULT if sparsity is None else sparsity), True),
}


def backend_names() -> list[str]:
    """Registered `--attn` names, in registry order."""
    return list(BACKENDS)


def uses_sparsity(name: str) -> bool:
    """Whether backend `name` takes a sparsity."""
    return BACKENDS[name][1]


def make_backend(name: str, sparsity: float | None = None) -> AttentionBackend:
    """Build the backend called `name`.

    Raises:
        BadInput: unknown name (the message lists the known ones), or a sparsity for a dense backend.
    """
    if name not in BACKENDS:
        raise BadInput(f"unknown --attn {name!r}; available: {', '.join(BACKENDS)}")
    factory, sparse = BACKENDS[name]
    if not sparse and sparsity is not None:
        raise BadInput(f"--sparsity does not apply to --attn {name} (dense)")
    return factory(sparsity)


__all__ = ["AttentionBackend", "BACKENDS", "backend_names", "make_backend", "uses_sparsity"]
