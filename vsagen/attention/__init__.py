"""Attention backends for the video self-attention: the protocol (`base`), one module per backend (`full`, `vsa`,
`rocm-vsa`, `sla-star`, `sla`, `sparse-vdit`: each its class and its `Options`), what several backends share
(`shared`), the registry of names (`registry`), the backend-as-a-value (`spec`), `--attn auto` (`auto`), the
per-layer processor (`processor`), the transformer hooks (`hooks`) and backend-owned weights (`weights`).

Importing the package imports no torch: the backend modules import it inside the methods that compute. The
registered backends' classes and Options are names of the package, read from the registry
(`vsagen.attention.VSAAttention`, `vsagen.attention.SLAOptions`).
"""

from __future__ import annotations

from typing import Any

from .base import AttentionBackend, AttnContext, Backend, LayerWeights
from .registry import REGISTRY, BackendName, backend_class, backend_names, uses_sparsity
from .shared import NoOptions
from .spec import BackendSpec, check_flags_apply, make_options, resolve_spec


def registered_names() -> dict[str, type]:
    """{class name: class} of every registered backend's class and Options (`VSAAttention`, `VSAOptions`, ...)."""
    return {x.__name__: x for cls in REGISTRY.values() for x in (cls, cls.Options)}


def __getattr__(name: str) -> Any:
    found = registered_names().get(name)
    if found is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return found


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


__all__ = ["AttentionBackend", "AttnContext", "Backend", "BackendName", "BackendSpec", "LayerWeights", "NoOptions",
           "REGISTRY", "backend_class", "backend_names", "make_backend", "registered_names", "resolve_spec",
           "uses_sparsity", *sorted(set(registered_names()) - {"NoOptions"})]
