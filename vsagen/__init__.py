"""vsagen: Wan video generation through diffusers with sparse video self-attention.

Shape vocabulary used throughout: B batch, S tokens (T*Hl*Wl latent tokens after patchify), H heads,
D head dim, (T, Hl, Wl) the post-patch latent grid, Q_TILES / KV_TILES tile counts, K top-k.

Python API: `vsagen.load_pipeline(model)` (a diffusers Wan pipeline loaded as the commands load it, see
`vsagen.models.python_loader`) and `vsagen.apply(pipe, backend, **options)` (see `vsagen.api`; `vsagen.BackendSpec`, a backend
name with its options, is one of the backends it takes), each imported on first use so that `import vsagen` stays
light (no torch, no diffusers).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "BackendSpec", "apply", "load_pipeline"]


def __getattr__(name: str) -> Any:
    if name == "apply":
        from .api import apply

        return apply
    if name == "load_pipeline":
        from .models.python_loader import load_pipeline

        return load_pipeline
    if name == "BackendSpec":
        from .attention.spec import BackendSpec

        return BackendSpec
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
