"""Ulysses all-to-all around an attention backend (DeepSpeed-Ulysses, arXiv 2309.14509; issue 15).

With the sequence split across N ranks (rank r holds tokens [r S/N, (r+1) S/N) of the sequence in tile order, for every
head), one all-to-all gives every rank the whole sequence for H / N heads (rank r: heads [r H/N, (r+1) H/N)); the
backend then runs unchanged on the whole sequence (VSA's global top-k included, which ring attention cannot give), and
the reverse all-to-all brings the output back to the rank's chunk of the sequence for every head. Both exchanges are
autograd functions (`torch.distributed.nn.functional.all_to_all_single`), so the backward runs the transposed
exchanges. Works on any process group (gloo on CPUs, NCCL on GPUs).

`context_parallel_plan` hooks vsagen's processors into diffusers' context parallelism; `check_ulysses_degree`
refuses a degree that does not split the heads and the sequence; `launch` runs them under torchrun for the CLI's
`--ulysses` (and `cfg` adds CFG parallel).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..attention.base import BackendWrapper


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


def ulysses_degrees(heads: int, tokens: int, up_to: int = 64) -> list[int]:
    """The Ulysses degrees N <= up_to that split both `heads` (attention heads per layer) and `tokens` (post-patch
    latent tokens of one video) evenly: each rank then holds tokens / N of the sequence and, inside attention,
    heads / N heads (`seq_to_heads`)."""
    return [n for n in range(1, up_to + 1) if heads % n == 0 and tokens % n == 0]


def check_ulysses_degree(degree: int, heads: int, tokens: int) -> None:
    """Refuse a Ulysses degree that does not split the heads and the sequence evenly (before any model is loaded).

    Args:
        degree: N, the ranks the sequence is split across (>= 1).
        heads: attention heads per layer; tokens: the run's post-patch latent tokens (frames x height x width of
            the latent grid after patching).

    Raises:
        BadInput: degree < 1, or N not dividing heads or tokens; the message lists the degrees that do.
    """
    from ..errors import BadInput

    if degree < 1:
        raise BadInput(f"--ulysses must be at least 1, got {degree}")
    if heads % degree == 0 and tokens % degree == 0:
        return
    what = " and ".join(f"{n} {name}" for n, name in ((heads, "heads"), (tokens, "tokens")) if n % degree)
    valid = ", ".join(map(str, ulysses_degrees(heads, tokens, max(8, degree))))
    raise BadInput(f"--ulysses {degree} does not divide {what} (this model has {heads} heads, this size {tokens} "
                   f"tokens); degrees that do: {valid}")


def context_parallel_plan(transformer: Any) -> dict:
    """diffusers' context-parallel plan of a Wan transformer (`_cp_plan`: split the hidden states entering
    `blocks.0`, a per-token timestep, gather at `proj_out`) without its RoPE split, for
    `transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=N), cp_plan=...)` after `vsagen.apply`.

    vsagen's tile-order hooks reorder the whole sequence before diffusers splits it (forward pre-hooks run before
    diffusers' forward wrappers), so each rank holds a contiguous chunk of tile order; the RoPE tables stay whole, in
    tile order with their layout, and each processor takes its rows (`processor.local_rope`). diffusers' RoPE split
    would hand vsagen's RoPE hook raster-order shards and drop the layout.

    Raises:
        ValueError: a transformer without a `_cp_plan`.
    """
    plan = getattr(type(transformer), "_cp_plan", None)
    if not plan:
        raise ValueError(f"{type(transformer).__name__} has no context-parallel plan (_cp_plan)")
    return {k: v for k, v in plan.items() if k != "rope"}
