"""How long a run of a real-size model would take on this CPU, said before it starts: the DiT's FLOP per denoising
step of the request's architecture and size over this machine's float32 matmul rate (measured in ~0.1 s), a lower
bound. The commands print it once the model is loaded (`vsagen t2v` / `i2v`, `profile`, `compare`, `search`).

And whether the weights fit at all, said before anything is built (`weights_refusal`): the transformers' parameter
count from their configs (`transformer_parameters`) x the bytes a parameter takes, against the free memory of where
the weights go (a new-user trial: `--model wan2.1-t2v-14b --random-weights` on a 24 GB CPU machine built for a minute,
then died out of memory)."""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Mapping

from .request.resolve import Request

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


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


def transformer_parameters(config: Mapping[str, Any]) -> int:
    """The parameter count of diffusers' `WanTransformer3DModel(**config)` (diffusers 0.42.1's modules; a field left
    out takes its constructor default, `vsagen.architecture.CONFIG_DEFAULTS` and the ones below), counted from the
    config without building anything: the patch embedding, the time / text (/ image) embedders, per block the
    self- and cross-attention projections with their RMS norms (and the image keys / values of image-to-video
    models), the cross-attention norm, the feed-forward and the modulation table, then the output projection."""
    from .architecture import CONFIG_DEFAULTS

    c_ = {**CONFIG_DEFAULTS, "out_channels": None, "text_dim": 4096, "freq_dim": 256, "cross_attn_norm": True,
          "image_dim": None, "added_kv_proj_dim": None, "pos_embed_seq_len": None,
          **{k: v for k, v in config.items() if v is not None}}
    c = int(c_["num_attention_heads"]) * int(c_["attention_head_dim"])
    f, patch = int(c_["ffn_dim"]), math.prod(int(p) for p in c_["patch_size"])
    out = int(c_["out_channels"] or c_["in_channels"])
    attn = 4 * (c * c + c) + 2 * c  # q, k, v, out projections; the RMS norms of q and k
    added = c_["added_kv_proj_dim"]
    image_kv = 2 * (int(added) * c + c) + c if added else 0  # image keys / values and their key norm
    block = 2 * attn + image_kv + (2 * c if c_["cross_attn_norm"] else 0) + (2 * c * f + f + c) + 6 * c
    embed = (int(c_["in_channels"]) * patch * c + c  # patch embedding (Conv3d)
             + int(c_["freq_dim"]) * c + c + c * c + c  # time embedder
             + c * 6 * c + 6 * c  # time projection (the blocks' modulation)
             + int(c_["text_dim"]) * c + c + c * c + c)  # text embedder
    image = c_["image_dim"]
    if image:  # CLIP image embedder: norm, feed-forward (image_dim -> image_dim -> c), norm, position table
        i = int(image)
        embed += 2 * i + (i * i + i) + (i * c + c) + 2 * c + int(c_["pos_embed_seq_len"] or 0) * i
    head = c * out * patch + out * patch + 2 * c  # output projection and modulation table
    return embed + int(c_["num_layers"]) * block + head


def weights_bytes(params: list[int], dtype_bytes: int, random_weights: bool) -> int:
    """The memory the transformers' weights take once built: every expert's `params` x `dtype_bytes`; random
    weights are built in float32 and then cast, so the largest expert's float32 copy counts (the others are cast
    by the time it is built)."""
    return sum(params) * dtype_bytes + (max(params) * (4 - dtype_bytes) if random_weights else 0)


def weights_refusal(cfg: Request, available: Callable[[str], tuple[int | None, str]] | None = None) -> str | None:
    """Why the request's transformer weights cannot fit where they go, in one line with the figures, or None (they
    fit, or it cannot be told: an architecture no preset or folder states, no free-memory reading). The need is
    `weights_bytes`: the transformers' parameters (`transformer_parameters`, every expert) x the bytes of
    `cfg.dtype` (1 for a `-quant` file's int8 weights loaded as int8), random weights built in float32 first.
    Where they go: `cfg.device` without `--offload`; with `--offload` the CPU holds them all (and `model` moves
    the largest transformer whole onto the GPU; `group` one block at a time, not checked). A lower bound: the text
    encoder, the VAE and the activations come on top. `available(device)` -> (bytes or None, what they are) reads
    the free memory (default `vsagen.decode.tiling.available_bytes`: the CPU's MemAvailable, cgroup-limited; the
    GPU's free memory, of the rank's own GPU). The ranks of a multi-process CPU run (`--ulysses`, `--cfg-parallel`)
    each hold a copy in the one machine's memory."""
    from .decode.tiling import available_bytes
    from .errors import VsagenError
    from .models.sources import transformer_configs
    from .request.quantization import holds_int8_files

    available = available or available_bytes
    src = cfg.source
    if not (src.exact_preset or src.kind == "dir"):
        return None
    try:
        params = [transformer_parameters(c) for _, c in transformer_configs(src, cfg.model)]
    except VsagenError:  # an unreadable folder config: the load says so
        return None
    int8_files = (cfg.quant == "int8" or cfg.keep_int8_files) and holds_int8_files(src, cfg.random_weights)
    per = 1 if int8_files else DTYPE_BYTES[cfg.dtype]
    copies = cfg.processes if cfg.device == "cpu" else 1  # each rank of a CPU run holds its own copy
    need = copies * weights_bytes(params, per, cfg.random_weights)
    what = (f"--model {cfg.model}: its transformer weights alone take {_gib(need)} ({sum(params) / 1e9:.2f} B "
            f"parameters x {per} bytes, {'int8' if int8_files else cfg.dtype}"
            + (", built in fp32 first" if cfg.random_weights and per < 4 else "")
            + (f"; x {copies} processes, a copy each" if copies > 1 else "") + ")")
    on_cpu = cfg.device == "cpu" or cfg.offload != "none"
    free, where = available("cpu" if on_cpu else cfg.device)
    if free is not None and need > free:
        if cfg.device == "cpu":
            half = copies * weights_bytes(params, 2, cfg.random_weights) <= free and cfg.dtype == "fp32"
            fix = ("use a GPU, " + ("--dtype bf16, " if half else "")
                   + "or a smaller model (--model tiny to try the tool)")
        elif on_cpu:
            fix = "use a machine with more memory, or a smaller model"
        else:
            fix = "use --offload model or --offload group (the weights then live in CPU memory), or a smaller model"
        place = "the CPU" if cfg.device == "cpu" else f"CPU memory (--offload {cfg.offload})" if on_cpu else "the GPU"
        return f"{what}, more than {place} has free ({_gib(free)}, {where}); {fix}"
    if cfg.offload == "model":  # each component moves onto the GPU whole
        largest = max(params) * per
        free, where = available(cfg.device)
        if free is not None and largest > free:
            return (f"{what}; --offload model moves the largest transformer ({_gib(largest)}) onto the GPU whole, "
                    f"more than it has free ({_gib(free)}, {where}); use --offload group")
    return None


def _gib(n: int) -> str:
    """Bytes in GiB, as the run's other memory lines say them: "53.2 GiB"."""
    return f"{n / 2 ** 30:.1f} GiB"
