"""Attention backends for the video self-attention: the protocol (`base`), one module per backend (`full`,
`vsa`, `rocm-vsa`, `sla-star`, `sparse-vdit`), the registry of names (`registry`), the backend-as-a-value (`spec`), the per-layer
processor (`processor`), the transformer hooks (`hooks`) and backend-owned weights (`weights`).
"""

from __future__ import annotations

from typing import Any

from .base import AttentionBackend, AttnContext, LayerWeights, NoOptions
from .full import FullAttention
from .registry import REGISTRY, BackendName, backend_class, backend_names, uses_sparsity
from .rocm_vsa import ROCmVSAAttention, ROCmVSAOptions
from .sla_star import SLAStarAttention, SLAStarOptions
from .sparse_vdit import SparseVDiTAttention, SparseVDiTOptions
from .spec import BackendSpec, check_flags_apply, make_options, resolve_spec
from .vsa import VSAAttention, VSAOptions


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
