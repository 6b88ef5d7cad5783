"""Ulysses attention (DeepSpeed-Ulysses, arXiv 2309.14509; issue 15): any attention backend over a sequence split
across ranks.

With the sequence split across N ranks (rank r holds tokens [r S/N, (r+1) S/N) of the sequence in tile order, for every
head), one all-to-all gives every rank the whole sequence for H / N heads (rank r: heads [r H/N, (r+1) H/N)); the
backend then runs unchanged on the whole sequence (VSA's global top-k included, which ring attention cannot give), and
the reverse all-to-all brings the output back to the rank's chunk of the sequence for every head. Both exchanges are
autograd functions, so the backward runs the transposed exchanges. Works on any process group (gloo on CPUs, NCCL on
GPUs).

The processor wraps its backend in `UlyssesAttention` when diffusers' context parallelism splits the sequence
(`vsagen.attention.processor`); the degree checks, diffusers' context-parallel plan and the launch are
`vsagen.parallel`'s (`ulysses`, `launch`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .base import BackendWrapper


def _world(group: Any) -> int:
    import torch.distributed as dist

    return dist.get_world_size(group)


class _AllToAll(torch.autograd.Function):
    """The equal-split all_to_all_single with autograd: its gradient is the same exchange (block j of rank r came
    from rank j, so its gradient goes back there, to block r). Written here because torch's
    `torch.distributed.nn.functional.all_to_all_single` is deprecated (a FutureWarning on every rank)."""

    @staticmethod
    def forward(ctx: Any, send: torch.Tensor, group: Any) -> torch.Tensor:
        import torch.distributed as dist

        ctx.group = group
        send = send.contiguous()
        out = torch.empty_like(send, memory_format=torch.contiguous_format)
        dist.all_to_all_single(out, send, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        import torch.distributed as dist

        grad = grad.contiguous()  # (a gradient may come strided; the exchange reads and writes memory order)
        out = torch.empty_like(grad, memory_format=torch.contiguous_format)
        dist.all_to_all_single(out, grad, group=ctx.group)
        return out, None


def _exchange(send: torch.Tensor, group: Any) -> torch.Tensor:
    """all_to_all_single of a (N, ...) contiguous tensor: block j goes to rank j; returns the (N, ...) blocks received
    (block j from rank j), with autograd."""
    return _AllToAll.apply(send, group)


def seq_to_heads(x: torch.Tensor, group: Any) -> torch.Tensor:
    """A rank's chunk of the sequence for every head -> the whole sequence for its share of the heads.

    Args:
        x: (B, S / N, H, D), this rank's contiguous chunk of the sequence (rank order = sequence order).
        group: the process group of the N ranks.

    Returns:
        (B, S, H / N, D): heads [r H/N, (r+1) H/N) of rank r, every token, in sequence order.

    Raises:
        ValueError: H not divisible by N.
    """
    n = _world(group)
    b, s, h, d = x.shape
    if h % n:
        raise ValueError(f"{h} heads cannot be split over {n} ranks")
    send = x.reshape(b, s, n, h // n, d).permute(2, 0, 1, 3, 4).contiguous()  # (N, B, S/N, H/N, D): heads chunk j
    recv = _exchange(send, group)  # (N, B, S/N, H/N, D): sequence chunk j (from rank j) of my heads
    return recv.permute(1, 0, 2, 3, 4).reshape(b, n * s, h // n, d)


def heads_to_seq(x: torch.Tensor, group: Any) -> torch.Tensor:
    """The inverse of `seq_to_heads`: (B, S, H / N, D) -> (B, S / N, H, D).

    Raises:
        ValueError: S not divisible by N.
    """
    n = _world(group)
    b, s, hl, d = x.shape
    if s % n:
        raise ValueError(f"a sequence of {s} tokens cannot be split over {n} ranks")
    send = x.reshape(b, n, s // n, hl, d).permute(1, 0, 2, 3, 4).contiguous()  # (N, B, S/N, H/N, D): seq chunk j
    recv = _exchange(send, group)  # (N, B, S/N, H/N, D): my sequence chunk of heads chunk j
    return recv.permute(1, 2, 0, 3, 4).reshape(b, s // n, n * hl, d)


class UlyssesAttention(BackendWrapper):
    """Any attention backend over a sequence split across ranks: `seq_to_heads` on q, k, v, the backend on the whole
    sequence for H / N heads (with the global tile layout in `ctx.layout`), `heads_to_seq` on its output.

    Args:
        backend: the attention backend (protocol of `vsagen.attention.base`).
        group: the process group of the ranks the sequence is split across.

    Per-layer inputs computed from the rank's own tokens do not travel: the backend's context gets no
    `hidden_states` (a trained VSA gate, which projects them, is not supported here yet).
    """

    def __init__(self, backend: Any, group: Any) -> None:
        super().__init__(backend)
        self.group = group
        self.traceable = False

    def describe(self, device: torch.device | None = None) -> dict:
        """The backend's description with "ulysses": N."""
        return {**self.inner.describe(device), "ulysses": _world(self.group)}

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: Any) -> torch.Tensor:
        """q, k, v: (B, S / N, H, D), this rank's chunk (of the global tile order for tiled backends, whose
        `ctx.layout` is the whole sequence's) -> (B, S / N, H, D). The exchanges are timed as region "all_to_all"
        of `ctx.timer` (inside the caller's "self_attention")."""
        import torch.distributed as dist

        with ctx.timer.region("all_to_all"):  # a no-op unless timing (no sync either way: events on CUDA)
            qh, kh, vh = (seq_to_heads(x, self.group) for x in (q, k, v))
        start = ctx.head_start + dist.get_rank(self.group) * qh.shape[2]
        out = self.inner(qh, kh, vh, dataclasses.replace(ctx, hidden_states=None, head_start=start))
        with ctx.timer.region("all_to_all"):
            return heads_to_seq(out, self.group)
