"""How long a run of a real-size model would take on this CPU, said before it starts: the DiT's FLOP per denoising
step of the request's architecture and size over this machine's float32 matmul rate (measured in ~0.1 s), a lower
bound. The commands print it once the model is loaded (`vsagen t2v` / `i2v`, `profile`, `compare`, `search`)."""

from __future__ import annotations

import math
import time
from typing import Any

from .request.resolve import Request


def dit_step_flops(transformer: dict[str, Any], tokens: int, text_tokens: int, forwards: int) -> float:
    """Multiply-adds x 2 of one denoising step of a Wan transformer: `forwards` passes (2 with CFG) over `tokens`
    post-patch tokens, each layer's self-attention (projections, Q K^T and P V over all tokens), cross-attention to
    `text_tokens` and feed-forward; embeddings and norms left out (small). `transformer`: the preset's
    [transformer] table (num_layers, num_attention_heads, attention_head_dim, ffn_dim)."""
    c = int(transformer["num_attention_heads"]) * int(transformer["attention_head_dim"])
    f = int(transformer["ffn_dim"])
    per_token = 2 * (4 * c * c + 2 * c * c + 2 * c * f) + 4 * tokens * c + 4 * text_tokens * c
    return float(forwards) * int(transformer["num_layers"]) * tokens * per_token


def cpu_time_estimate(cfg: Request, threshold_s: float = 60.0, runs: int = 1, runs_of: str = "") -> str | None:
    """A one-line warning when a model of real size would take more than `threshold_s` per denoising step on this
    CPU: its FLOP per step (`dit_step_flops`) over this machine's float32 matmul rate (measured here in ~0.1 s), a
    lower bound, and the whole: `runs` runs (configurations, prompts) of `cfg.warmup` warm-up + `cfg.steps` steps
    each (`runs_of` names what a run is, e.g. "configurations"). None for the tiny models, a directory of unknown
    architecture, or a short step."""
    import torch

    src = cfg.source
    if src.kind == "tiny" or not src.exact_preset:
        return None
    p = src.preset
    grid = cfg.plan().denoise_grid
    forwards = 2 if cfg.guidance > 1 else 1
    flops = dit_step_flops(p.transformer, math.prod(grid), cfg.max_sequence_length, forwards)
    a = torch.randn(512, 512)
    a @ a  # warm-up (threads, caches)
    t0 = time.perf_counter()
    for _ in range(8):
        a @ a
    rate = 8 * 2 * 512 ** 3 / max(time.perf_counter() - t0, 1e-9)  # FLOP/s of this CPU, this process
    per_step = flops / rate
    if per_step < threshold_s:
        return None
    steps = runs * (cfg.warmup + cfg.steps)
    each = f"{cfg.warmup} warm-up + {cfg.steps}" if cfg.warmup else f"{cfg.steps}"
    detail = f" ({runs} {runs_of or 'runs'} of {each})" if runs > 1 else (f" ({each})" if cfg.warmup else "")
    return (f"warning: {cfg.model} ({cfg.frames}x{cfg.height}x{cfg.width}) on the CPU: at least {_duration(per_step)} "
            f"per denoising step ({flops:.1e} FLOP at ~{rate / 1e9:.0f} GFLOP/s measured here), "
            f"{_duration(per_step * steps)} for {steps} step{'s' if steps != 1 else ''}{detail}; use a GPU, or "
            "--model tiny to try the tool")


def _duration(seconds: float) -> str:
    """"45 s", "12 min", "3.4 h", "2.1 days"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
