"""Attention backends for the video self-attention: the protocol (`base`), one module per backend (`full`,
`vsa`, `rocm-vsa`, `sla-star`, `sparse-vdit`), their options (`options`), the registry of names (`registry`), the
backend-as-a-value (`spec`), the per-layer processor (`processor`), the transformer hooks (`hooks`) and backend-owned
weights (`weights`).

Importing the package imports neither torch nor a backend module: the names, options and specs answer from
`registry`, `options` and `spec`; the backend classes and the protocol's torch types are imported on first use
(`vsagen.attention.VSAAttention`, `make_backend`).
"""

from __future__ import annotations

import importlib
from typing import Any

from .backend_options import NoOptions, ROCmVSAOptions, SLAStarOptions, SparseVDiTOptions, VSAOptions
from .registry import REGISTRY, BackendName, backend_class, backend_names, uses_sparsity
from .spec import BackendSpec, check_flags_apply, make_options, resolve_spec

# Names of the package imported on first use, and the module of each (they import torch).
_LAZY = {"AttentionBackend": "base", "AttnContext": "base", "LayerWeights": "base",
         "FullAttention": "full", "ROCmVSAAttention": "rocm_vsa", "SLAStarAttention": "sla_star",
         "SparseVDiTAttention": "sparse_vdit", "VSAAttention": "vsa"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_backend(name: str, sparsity: float | None = None, impl: str = "auto", **options: Any) -> Any:
    """Build backend `name` (an `AttentionBackend`) from the two dedicated flags' values and any other options
    (keyword arguments).

    Args:
        name: a registered `--attn` name.
        sparsity: for sparse backends (None: the backend's default); must be None for dense ones.
        impl: "auto", or one of the backend's implementations (vsa: "triton", "torch").
        options: further fields of the backend's Options.

    Raises:
        BadInput: unknown name (the message lists the known ones), a sparsity for a dense backend, an
            implementation the backend does not have, or an option it does not have.
    """
    cls = backend_class(name)
    check_flags_apply([cls.name], {"--sparsity": sparsity, "--attn-impl": impl}, cls.name)
    values = dict(options)
    if sparsity is not None:
        values["sparsity"] = sparsity
    if "impl" in cls.Options.__dataclass_fields__:
        values["impl"] = impl
    return cls(make_options(cls.name, values))


__all__ = ["AttentionBackend", "AttnContext", "BackendName", "BackendSpec", "FullAttention", "LayerWeights",
           "NoOptions", "REGISTRY", "ROCmVSAAttention", "ROCmVSAOptions", "SLAStarAttention", "SLAStarOptions",
           "SparseVDiTAttention", "SparseVDiTOptions",
           "VSAAttention", "VSAOptions",
           "backend_class", "backend_names", "make_backend", "resolve_spec", "uses_sparsity"]
