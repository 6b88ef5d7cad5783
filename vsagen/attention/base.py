"""The attention backend protocol shared by every `--attn` choice.

A backend receives q, k, v of shape (B, S, H, D) (the layout Wan's processor already holds) and returns the
attention output of the same shape and dtype. Backends with `tiled = True` receive the tokens in tile order
together with the `TileLayout`; the others receive raster order and `layout=None`. Backends with
`traceable = True` can be traced by torch.compile without a graph break (`--compile` then compiles the whole
transformer block as one graph, attention included); the others run eagerly between compiled graphs.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ..layout import TileLayout
from ..timing import Timer


class AttentionBackend(Protocol):
    """What the vsagen processor calls for the video self-attention (`attn1`)."""

    name: str
    tiled: bool          # wants tile order and a TileLayout
    supports_gate: bool  # uses a checkpoint's `to_gate_compress` gate (VSA's coarse branch)
    traceable: bool      # torch.compile traces the call with no graph break (custom ops or plain torch ops)

    def check(self, device: torch.device, dtype: torch.dtype) -> None:
        """Raise `BadInput` with a reason if this backend cannot run on `device` / `dtype`."""

    def describe(self) -> dict:
        """JSON-ready options (e.g. sparsity) for reports."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TileLayout | None, *,
                 gate: torch.Tensor | None, timer: Timer) -> torch.Tensor:
        """q, k, v, gate: (B, S, H, D); returns (B, S, H, D) like q."""
