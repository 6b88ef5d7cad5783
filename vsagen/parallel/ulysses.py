"""Ulysses sequence parallelism (DeepSpeed-Ulysses, arXiv 2309.14509; issue 15) as a run sees it: the degrees that
split a model's heads and a video's tokens, the refusal of one that does not (before any model is loaded), and
diffusers' context-parallel plan for vsagen's processors.

`context_parallel_plan` hooks vsagen's processors into diffusers' context parallelism; `check_ulysses_degree`
refuses a degree that does not split the heads and the sequence; `launch` runs them under torchrun for the CLI's
`--ulysses` (and `cfg` adds CFG parallel). The exchange around the backend itself is attention's
(`vsagen.attention.ulysses_attention.UlyssesAttention`).
"""

from __future__ import annotations

from typing import Any


def ulysses_degrees(heads: int, tokens: int, up_to: int = 64) -> list[int]:
    """The Ulysses degrees N <= up_to that split both `heads` (attention heads per layer) and `tokens` (post-patch
    latent tokens of one video) evenly: each rank then holds tokens / N of the sequence and, inside attention,
    heads / N heads (`vsagen.attention.ulysses_attention.seq_to_heads`)."""
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
