"""The diffusers attention processor for Wan's video self-attention (`attn1`).

`VsagenAttnProcessor` is installed on every block's `attn1`, one instance per layer so it knows its layer index
(cross-attention keeps diffusers' own processor). It forms q, k, v as diffusers' `WanAttnProcessor` (0.42.1)
does: projections (fused or not), RMS norm across heads, split into heads, RoPE on interleaved pairs in float32
tables (on CUDA the norm and RoPE run as one fused Triton pass, `vsagen.kernels.qk_norm_rope`, chosen by the
`fused_prologue` parameter). It then hands (B, S, H, D) and an `AttnContext` (tile layout, layer, expert, timer,
the layer's backend-owned parameters) to the backend and times the call; where the backend's quality knobs
(`dense_steps`, `dense_layers`, `min_tokens`: `vsagen.attention.dense`) say so, the call runs `full` instead.
Under torch.compile (`--compile`) all of it is traced into the block's graph when the backend is `traceable` (the
fused prologue then gives way to diffusers' arithmetic, which inductor fuses), and the timers record nothing inside
the graph; other backends run eagerly between graphs (`run_backend_eager`).

Sequence parallelism (issue 15): after `vsagen.apply`, `transformer.enable_parallelism(config=ContextParallelConfig(
ulysses_degree=N), cp_plan=vsagen.parallel.ulysses.context_parallel_plan(transformer))` injects diffusers' parallel
config into these processors (`_parallel_config`); each then takes its rows of the whole-sequence RoPE tables
(`local_rope`) and runs the backend inside `UlyssesAttention` (all-to-all sequence <-> heads). A processor without
the config that receives a split sequence (vsagen applied after `enable_parallelism`) raises instead of attending
over its shard. Not yet on the command line.

The hooks that put tokens in tile order and time the DiT are in `vsagen.attention.hooks`.
"""

from __future__ import annotations

from typing import Any

import torch

from ..timing import Timer
from .base import AttentionBackend, AttnContext, ForwardState
from .dense import DenseCall, call_is_dense, counts_of, has_knobs
from .ulysses_attention import UlyssesAttention
from .weights import layer_params


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs (x[2i], x[2i+1]) of x by the angles in (cos, sin).

    Args:
        x: (B, S, H, D).
        cos, sin: (1, S, 1, D) float32 tables with each angle repeated for both members of a pair (Wan's
            `WanRotaryPosEmbed` output).

    Returns:
        (B, S, H, D) in x's dtype. Same arithmetic as diffusers 0.42.1 `WanAttnProcessor`
        (tests/attention/test_processor.py checks them equal).
    """
    even, odd = x.unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[..., 0::2], sin[..., 1::2]
    return torch.stack((even * c - odd * s, even * s + odd * c), dim=-1).flatten(-2).type_as(x)


# The q/k prologue (RMS norm across heads, then RoPE), the `fused_prologue` parameter of the processor: "auto"
# runs the fused Triton kernel (`vsagen.kernels.qk_norm_rope`) on CUDA (NVIDIA and ROCm builds alike: it is plain
# Triton) and diffusers' eager arithmetic elsewhere; "on" runs the kernel on any device (the tests use it under the
# Triton interpreter); "off" always runs the eager arithmetic.
PROLOGUE_MODES = ("auto", "on", "off")


def use_fused_prologue(attn: Any, x: torch.Tensor, rotary_emb: Any, mode: str = "auto") -> bool:
    """Whether this attn1 call can take the fused q/k prologue: RoPE tables given, torch.nn.RMSNorm q/k norms
    with weights (Wan's), no autograd through it (the kernel has no backward), not inside torch.compile
    (inductor fuses the eager arithmetic itself), and `mode` (PROLOGUE_MODES) allows it on x's device."""
    if mode == "off" or rotary_emb is None or (mode == "auto" and not x.is_cuda):
        return False
    norms = (getattr(attn, "norm_q", None), getattr(attn, "norm_k", None))
    if not all(isinstance(n, torch.nn.RMSNorm) and n.weight is not None for n in norms):
        return False
    return not (torch.is_grad_enabled() and x.requires_grad) and not torch.compiler.is_compiling()


def _eps(norm: torch.nn.RMSNorm, x: torch.Tensor) -> float:
    """The epsilon torch.nn.RMSNorm uses: its own, else the dtype's machine epsilon."""
    return norm.eps if norm.eps is not None else torch.finfo(x.dtype).eps


def run_backend(backend: AttentionBackend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                ctx: AttnContext) -> torch.Tensor:
    """The backend call, timed as region "self_attention" (and the stages the backend reports).

    Args:
        backend: the self-attention backend.
        q, k, v: (B, S, H, D), tile order for tiled backends (raster otherwise).
        ctx: the call's context; its timer receives the regions (no-ops while torch.compile traces).

    Returns:
        (B, S, H, D) like q.

    Traced by torch.compile for `traceable` backends (`--compile` then compiles it into the block's one graph,
    where its regions record nothing); `run_backend_eager` keeps the others out of the graph.
    """
    with ctx.timer.region("self_attention"):
        return backend(q, k, v, ctx)


@torch.compiler.disable
def run_backend_eager(backend: AttentionBackend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      ctx: AttnContext) -> torch.Tensor:
    """`run_backend`, never traced by torch.compile: for backends that are not `traceable`, whose call would
    break the graph anyway. `--compile` then breaks each block's graph around it; the backend runs eagerly
    between the compiled graphs and keeps its timing rows."""
    return run_backend(backend, q, k, v, ctx)


def ulysses_group(parallel_config: Any) -> Any:
    """The process group of diffusers' Ulysses context parallelism that `enable_parallelism` injected into a processor
    (`processor._parallel_config`), or None without one (or with a degree of 1)."""
    cp = getattr(parallel_config, "context_parallel_config", None)
    if cp is None or getattr(cp, "ulysses_degree", 1) in (None, 1):
        return None
    return cp._ulysses_mesh.get_group()  # a private name of diffusers 0.42 (REFERENCE.md, context parallelism)


def local_rope(rotary_emb: Any, local_len: int, group: Any) -> Any:
    """This rank's chunk of the RoPE tables under Ulysses: vsagen's context-parallel plan leaves the RoPE output whole
    (in tile order, with its layout), while the hidden states arrive split into contiguous chunks; the tables'
    rows [r L, (r+1) L) for rank r, keeping the tile layout of the whole sequence. Unchanged without a group."""
    if group is None or rotary_emb is None or rotary_emb[0].shape[1] == local_len:
        return rotary_emb
    import torch.distributed as dist

    start = dist.get_rank(group) * local_len
    cos, sin = (t.narrow(1, start, local_len) for t in rotary_emb)
    layout = getattr(rotary_emb, "layout", None)
    return type(rotary_emb)(cos, sin, layout) if layout is not None else (cos, sin)


_DENSE: list[DenseCall] = []


def dense_call() -> DenseCall:
    """The one `DenseCall` (a sparse backend's call run as `full`) the processors share."""
    if not _DENSE:
        _DENSE.append(DenseCall())
    return _DENSE[0]


class VsagenAttnProcessor:
    """Self-attention processor for one Wan `attn1` (one instance per layer) that delegates the attention itself
    to a backend.

    Args:
        backend: the self-attention backend (shared by every layer).
        timer: receives the "attn1" region and the backend's.
        layer: the block index of this attn1; expert: the pipeline component ("transformer", "transformer_2").
        forward: the patched transformer's `ForwardState` (timestep of the current forward), or None.
        fused_prologue: "auto", "on" or "off" (`PROLOGUE_MODES`; see `use_fused_prologue`).

    Raises (at call time):
        ValueError: used on a cross-attention, or given an attention mask.
        RuntimeError: a tiled backend without tile-ordered RoPE (hooks not installed).
    """

    _attention_backend = None
    _parallel_config = None

    def __init__(self, backend: AttentionBackend, timer: Timer, layer: int = 0, expert: str | None = None,
                 forward: ForwardState | None = None, fused_prologue: str = "auto") -> None:
        if fused_prologue not in PROLOGUE_MODES:
            raise ValueError(f"fused_prologue must be one of {PROLOGUE_MODES}, got {fused_prologue!r}")
        self.backend = backend
        self.timer = timer
        self.layer = layer
        self.expert = expert
        self.forward = forward
        self.fused_prologue = fused_prologue

    def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None,
                 rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        if encoder_hidden_states is not None or attention_mask is not None:
            raise ValueError("VsagenAttnProcessor handles self-attention (attn1) without masks only")
        group = ulysses_group(self._parallel_config)
        whole = hidden_states.shape[1] if rotary_emb is None else rotary_emb[0].shape[1]  # RoPE: the whole sequence
        if group is None and hidden_states.shape[1] != whole:
            raise RuntimeError(f"attn1 of layer {self.layer} got {hidden_states.shape[1]} of {whole} tokens: the "
                               "sequence is split (context parallelism) but this processor has no parallel config; "
                               "apply vsagen before transformer.enable_parallelism")
        token = self.timer.start("attn1")
        rotary_emb = local_rope(rotary_emb, hidden_states.shape[1], group)
        if getattr(attn, "fused_projections", False):
            query, key, value = attn.to_qkv(hidden_states).chunk(3, dim=-1)
        else:
            query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        if use_fused_prologue(attn, query, rotary_emb, self.fused_prologue):
            from ..kernels.qk_norm_rope import rms_norm_rope

            query = rms_norm_rope(query, attn.norm_q.weight, _eps(attn.norm_q, query), *rotary_emb, attn.heads)
            key = rms_norm_rope(key, attn.norm_k.weight, _eps(attn.norm_k, key), *rotary_emb, attn.heads)
        else:
            query = attn.norm_q(query).unflatten(2, (attn.heads, -1))
            key = attn.norm_k(key).unflatten(2, (attn.heads, -1))
            if rotary_emb is not None:
                query = apply_rotary(query, *rotary_emb)
                key = apply_rotary(key, *rotary_emb)
        value = value.unflatten(2, (attn.heads, -1))
        layout = getattr(rotary_emb, "layout", None)
        backend = self.backend
        if group is not None:  # this rank's chunk of the sequence: all-to-all around the backend
            backend = UlyssesAttention(backend, group)
        if backend.tiled and layout is None:
            raise RuntimeError(f"--attn {self.backend.name} needs tile order, but the RoPE tables carry no "
                               "tile layout: install the tile-order hooks (patch_transformer)")
        ctx = AttnContext(layout=layout, layer=self.layer, expert=self.expert, timer=self.timer,
                          hidden_states=hidden_states, params=layer_params(attn, self.backend.weights),
                          forward=self.forward)
        knobs = self.backend.options
        if has_knobs(knobs):  # the quality knobs: this call may run `full` instead (`vsagen.attention.dense`)
            dense = call_is_dense(knobs, self.layer, whole, self.forward is not None and self.forward.dense)
            counts = counts_of(self.backend)
            if dense:
                counts.dense += 1
                backend = dense_call() if group is None else UlyssesAttention(dense_call(), group)
            else:
                counts.sparse += 1
        call = run_backend if backend.traceable else run_backend_eager
        out = call(backend, query, key, value, ctx)
        out = out.flatten(2, 3).type_as(query)
        out = attn.to_out[1](attn.to_out[0](out))
        self.timer.stop(token)
        return out
