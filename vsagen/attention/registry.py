"""The registry: `--attn` names -> backends, and the one check that a class or object is a backend.

`REGISTRY` (built from `_BACKENDS`) is the one source of names: every caller reads it when it runs (`backend_names`,
`backend_class`, `backend_facts`), so a backend registered after import (a test's) is seen by the command line, the
presets, the listings and `--attn auto` alike. `BackendName` is a `str` Enum of the names registered at import, for
Python callers that want a type; nothing in vsagen reads it. Only backends that really work are registered; the CLI
lists exactly these. Adding a backend: its entry in `_BACKENDS` (one line), its module beside this one, tests
(docs/adding-a-backend.md).

The shipped backends are registered as `LazyBackend` entries: what the listings, the presets and the checks of
`--attn NAME:KEY=VALUE` read of a backend (its name, `Options`, `tiled`, `auto_priority`, the key and file option of
its weights, its one-line description) without importing its module, which imports torch and the kernels; the class
is imported when a backend is built (`backend_class`), and checked then against its entry. So `vsagen backends`,
`vsagen presets` and bad input answer without torch. A class registered as itself (a test's, a user's) serves both.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from ..errors import BadInput
from .backend_options import NoOptions, ROCmVSAOptions, SLAOptions, SLAStarOptions, SparseVDiTOptions, VSAOptions

# Every member of the backend protocol (`vsagen.attention.base.AttentionBackend`), for the registry's validation of
# a backend class or object (base.py, which imports torch, reads it from here).
PROTOCOL_MEMBERS = ("name", "Options", "tiled", "tile", "traceable", "weights", "per_layer", "bench_params",
                    "auto_priority", "check", "prepare", "describe", "report", "__call__")


@dataclass(frozen=True)
class WeightsRef:
    """The part of a backend's `LayerWeights` read before its module is imported: the checkpoint key prefix (with a
    `{layer}` field), the Options field naming a user's file (None: the checkpoint only) and the other key prefixes
    accepted for the same tensors (`LayerWeights.aliases`)."""

    key: str
    file_option: str | None = None
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class LazyBackend:
    """A backend registered by where its class is (`module:Class`), with the class attributes read before it is
    imported: `name`, `Options`, `tiled`, `auto_priority`, `weights` (a `WeightsRef`), `auto_fa4` (impl auto may
    run the fine stage on FlashAttention-4: `vsa`), and `summary`, the first paragraph of the class docstring
    (`vsagen backends`). `load()` imports the class and checks that it agrees."""

    name: str
    where: str
    Options: type
    summary: str
    tiled: bool = False
    auto_priority: int | None = None
    weights: WeightsRef | None = None
    auto_fa4: bool = False

    @property
    def class_name(self) -> str:
        """The class's name (`where` after the colon)."""
        return self.where.rpartition(":")[2]

    def load(self) -> type:
        """The class, imported (once) and checked against this entry.

        Raises:
            TypeError: the class is no backend, or differs from its entry (a programming error of vsagen).
        """
        return _load(self)


def summary_of(backend: Any) -> str:
    """The one-line description of a registered backend (a class or a `LazyBackend`): the first paragraph of its
    docstring, on one line, without the final period."""
    if isinstance(backend, LazyBackend):
        return backend.summary
    return " ".join((backend.__doc__ or "").strip().split("\n\n")[0].split()).rstrip(".")


@functools.cache
def _load(entry: LazyBackend) -> type:
    module, _, name = entry.where.partition(":")
    cls = check_backend_class(getattr(importlib.import_module(module), name))
    weights = getattr(cls, "weights", None)
    got = {"name": cls.name, "Options": cls.Options, "tiled": cls.tiled, "auto_priority": cls.auto_priority,
           "weights": None if weights is None else WeightsRef(weights.key, weights.file_option, weights.aliases),
           "summary": summary_of(cls), "auto_fa4": getattr(cls, "auto_fa4", False)}
    wrong = [k for k, v in got.items() if getattr(entry, k) != v]
    if wrong:
        raise TypeError(f"{entry.where} differs from its registry entry in {', '.join(wrong)}")
    return cls


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
    _check_priority(f"{cls.__name__}.auto_priority", cls.auto_priority, cls.weights is not None)
    return cls


def _check_priority(what: str, priority: Any, has_weights: bool) -> None:
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int) or not has_weights):
        raise TypeError(f"{what} must be None or an int, and only a backend with weights has one (--attn auto "
                        f"chooses by the checkpoint's weights); got {priority!r}")


def check_lazy_backend(entry: LazyBackend) -> LazyBackend:
    """`entry`, once its priority is known to be None or an int, given only with weights (as `check_backend_class`).

    Raises:
        TypeError: otherwise.
    """
    _check_priority(f"{entry.name}: auto_priority", entry.auto_priority, entry.weights is not None)
    return entry


def held_names(weights: Any) -> str:
    """The tensor names a backend's weights (a `LayerWeights` or `WeightsRef`) are found under, layer written N, for
    messages: the key, then its aliases in parentheses, e.g. "blocks.N.to_gate_compress.* (or
    blocks.N.attn1.to_gate_compress.*)"."""
    key, *aliases = (f"{t.format(layer='N')}.*" for t in (weights.key, *getattr(weights, "aliases", ())))
    return key + (f" (or {', '.join(aliases)})" if aliases else "")


def _class_name(backend: Any) -> str:
    return backend.class_name if isinstance(backend, LazyBackend) else backend.__name__


def registry_of(backends: tuple[Any, ...]) -> dict[str, Any]:
    """{name: backend} of backend classes and `LazyBackend` entries, each checked (`check_backend_class`,
    `check_lazy_backend`), in their order.

    Raises:
        TypeError: a class is not a backend, or two share a name (e.g. a subclass that kept its parent's).
    """
    out: dict[str, Any] = {}
    for backend in backends:
        check_lazy_backend(backend) if isinstance(backend, LazyBackend) else check_backend_class(backend)
        if backend.name in out:
            raise TypeError(f"{_class_name(backend)} and {_class_name(out[backend.name])} are both registered as "
                            f"{backend.name!r}")
        out[backend.name] = backend
    return out


_HERE = __name__.rpartition(".")[0]  # vsagen.attention
# vsa's trained gate (vsagen.attention.vsa.GATE_KEY): FastVideo's block-level key, vsagen's earlier attn1 key an alias
_VSA_GATE = WeightsRef("blocks.{layer}.to_gate_compress", "gate_weights",
                       aliases=("blocks.{layer}.attn1.to_gate_compress",))
_BACKENDS: tuple[Any, ...] = (
    LazyBackend("full", f"{_HERE}.full:FullAttention", NoOptions,
                "Dense self-attention, the baseline every sparse backend is measured against (no options)"),
    LazyBackend("vsa", f"{_HERE}.vsa:VSAAttention", VSAOptions,
                "VSA with a fixed sparsity (fraction of key tiles skipped per query tile)", tiled=True,
                auto_priority=1, weights=_VSA_GATE, auto_fa4=True),
    LazyBackend("rocm-vsa", f"{_HERE}.rocm_vsa:ROCmVSAAttention", ROCmVSAOptions,
                '`vsa` run with the "rocm-vsa" kernel profile', tiled=True, weights=_VSA_GATE),
    LazyBackend("sla-star", f"{_HERE}.sla_star:SLAStarAttention", SLAStarOptions,
                "VSA plus a projected linear-attention branch (global or marginal scope)", tiled=True,
                auto_priority=2, weights=WeightsRef("blocks.{layer}.attn1.proj_l", "proj_weights",
                                  aliases=("blocks.{layer}.self_attn.attn_op.local_attn.proj_l",
                                           "blocks.{layer}.attn1.attn_impl.proj_l"))),
    LazyBackend("sla", f"{_HERE}.sla:SLAAttention", SLAOptions,
                "SLA as TurboDiffusion runs it: top-k key blocks over raster token blocks plus a projected linear "
                "branch", auto_priority=3,
                weights=WeightsRef("blocks.{layer}.self_attn.attn_op.local_attn.proj_l", "proj_weights",
                                   aliases=("blocks.{layer}.attn1.attn_impl.proj_l",))),
    LazyBackend("sparse-vdit", f"{_HERE}.sparse_vdit:SparseVDiTAttention", SparseVDiTOptions,
                "Static per-head patterns from a pattern file, all heads of a layer in one block-sparse launch",
                tiled=True),
)

REGISTRY: dict[str, Any] = registry_of(_BACKENDS)

BackendName = Enum("BackendName", {n.upper().replace("-", "_"): n for n in REGISTRY}, type=str)
BackendName.__doc__ = ("The `--attn` names registered at import (a str Enum); vsagen itself reads `backend_names()`, "
                       "which sees a backend registered later too.")


def backend_names() -> list[str]:
    """Registered `--attn` names, in registry order."""
    return list(REGISTRY)


def backend_facts(name: str) -> Any:
    """What is registered as `name` (a str or a `BackendName`), without importing a backend module: the class, or
    the `LazyBackend` entry that stands for it (`name`, `Options`, `tiled`, `auto_priority`, `weights.key`,
    `weights.file_option` read the same on both).

    Raises:
        BadInput: unknown name (the message lists the known ones).
    """
    try:
        return REGISTRY[str(getattr(name, "value", name))]
    except KeyError:
        raise BadInput(f"unknown --attn {name!r}; available: {', '.join(REGISTRY)}") from None


def backend_class(name: str) -> type:
    """The class registered as `name` (a str or a `BackendName`), its module imported if it was not yet (torch).

    Raises:
        BadInput: unknown name (the message lists the known ones).
    """
    found = backend_facts(name)
    return found.load() if isinstance(found, LazyBackend) else found


def options_of(name: str) -> type:
    """The `Options` dataclass of backend `name`, without importing its module.

    Raises:
        BadInput: unknown name.
    """
    return backend_facts(name).Options


def uses_sparsity(name: str) -> bool:
    """Whether backend `name` takes a sparsity (its Options have a `sparsity` field)."""
    return "sparsity" in options_of(name).__dataclass_fields__


def named_weights_file(backend: Any, options: Any) -> Path | None:
    """The weights file a backend's options name (its `weights.file_option`), or None; `backend` is a registered
    class or `LazyBackend` (`backend_facts`)."""
    spec = backend.weights
    if spec is None or spec.file_option is None:
        return None
    named = getattr(options, spec.file_option, None)
    return Path(named) if named is not None else None
