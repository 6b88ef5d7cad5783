"""Fused elementwise regions for diffusers' `WanTransformerBlock` in eager runs (issue 5, "lower the floor").

A Wan block's forward does, around its three matmul-heavy parts (self-attention, cross-attention, FFN), a string
of float32 elementwise passes: the modulation (`scale_shift_table + temb`, six chunks), three LayerNorms, the
`* (1 + scale) + shift` modulations and the gated residual adds, each materializing a float32 (B, S, D) tensor in
eager mode. With the Wan2.2-5B's per-token timestep the modulation alone materializes a float32 (B, S, 6, D) tensor
(2 GB at 704x1280x121) in every block. `torch.compile` fuses all of this (that is most of the gap between the
eager and compiled DiT floors in REFERENCE.md); here the same arithmetic runs as four small compiled functions per
block, while the attention, FFN and everything else stay eager:

    modulate_msa  norm1(x) * (1 + scale_msa) + shift_msa           -> attn1's input (x's dtype)
    gate_norm     x + attn1_out * gate_msa, then norm2 of it       -> (new x, attn2's input)
    modulate_ff   norm3(x) * (1 + c_scale_msa) + c_shift_msa       -> the FFN's input
    gate_ff       x + ffn_out * c_gate_msa                          -> the block's output

Each function recomputes its modulation chunks from `temb` and the table in registers, so nothing of size
(B, S, 6, D) is ever stored. The regions are written with the same torch operations in the same order as
diffusers' `WanTransformerBlock.forward` (diffusers 0.42), so uncompiled they give its result bitwise (tested);
compiled, Inductor may reassociate inside a LayerNorm's reductions (float32 rounding differences only).

Used by `patch_transformer(..., fused_blocks=True)`: on CUDA, in eager runs (not `--compile`, which compiles whole
blocks) without offloading (whose hooks wrap `forward`). Each function is compiled once per input shape and temb
rank, on its first call (a few seconds: in the warm-up, or in the first timed step with `--warmup 0`). Past
dynamo's recompile limit (8 variants per function) a function runs uncompiled, as it does when Inductor fails
to compile it (a warning says so). Whether a run gets them is the run's `fused_blocks` setting (the command line
reads `VSAGEN_FUSED_BLOCKS=0` once, in `vsagen.cli.app`); nothing here reads the environment.
"""

from __future__ import annotations

import functools
import types
import warnings
from typing import Any

import torch
import torch.nn.functional as F


def _chunk(table: torch.Tensor, temb: torch.Tensor, i: int) -> torch.Tensor:
    """Modulation chunk i (0 shift_msa, 1 scale_msa, 2 gate_msa, 3 c_shift_msa, 4 c_scale_msa, 5 c_gate_msa) as
    diffusers forms it: float32 `table[i] + temb[..., i, :]`, (B, S, D) for a per-token temb (B, S, 6, D), else
    (B, 1, D) for temb (B, 6, D). table: (1, 6, D) float32."""
    if temb.ndim == 4:
        return table[0, i] + temb[:, :, i].float()
    return (table[0, i] + temb[:, i].float()).unsqueeze(1)


def modulate(x: torch.Tensor, temb: torch.Tensor, table: torch.Tensor, i_shift: int, i_scale: int,
             eps: float) -> torch.Tensor:
    """`(LayerNorm(x.float()) * (1 + scale) + shift).type_as(x)`, the norm1 / norm3 step of a Wan block (no affine).

    Args:
        x: (B, S, D) hidden states (bf16 / fp16 / fp32). temb: (B, S, 6, D) or (B, 6, D). table: (1, 6, D) fp32.
        i_shift, i_scale: the chunks used (0, 1 before attn1; 3, 4 before the FFN). eps: the norm's epsilon.
    """
    scale = _chunk(table, temb, i_scale)
    shift = _chunk(table, temb, i_shift)
    return (F.layer_norm(x.float(), (x.shape[-1],), None, None, eps) * (1 + scale) + shift).type_as(x)


def modulate_msa(x: torch.Tensor, temb: torch.Tensor, table: torch.Tensor, eps: float) -> torch.Tensor:
    """`modulate` with the self-attention chunks (shift_msa, scale_msa): attn1's input."""
    return modulate(x, temb, table, 0, 1, eps)


def modulate_ff(x: torch.Tensor, temb: torch.Tensor, table: torch.Tensor, eps: float) -> torch.Tensor:
    """`modulate` with the FFN chunks (c_shift_msa, c_scale_msa): the FFN's input."""
    return modulate(x, temb, table, 3, 4, eps)


def gate_norm(x: torch.Tensor, y: torch.Tensor, temb: torch.Tensor, table: torch.Tensor, eps: float,
              weight: torch.Tensor | None, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """attn1's gated residual, then norm2 (an affine float32 LayerNorm) for attn2: returns (x', norm2(x')).

    x' = `(x.float() + y * gate_msa).type_as(x)`; norm2(x') = `LayerNorm(x'.float(), weight, bias).type_as(x')`.
    y: attn1's output (B, S, D); weight / bias: norm2's (D,) parameters (None when it has none).
    """
    x = (x.float() + y * _chunk(table, temb, 2)).type_as(x)
    w = weight.float() if weight is not None else None
    b = bias.float() if bias is not None else None
    return x, F.layer_norm(x.float(), (x.shape[-1],), w, b, eps).type_as(x)


def gate_ff(x: torch.Tensor, y: torch.Tensor, temb: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """The FFN's gated residual: `(x.float() + y.float() * c_gate_msa).type_as(x)`; y: the FFN output (B, S, D)."""
    return (x.float() + y.float() * _chunk(table, temb, 5)).type_as(x)


class _Region:
    """A region function under torch.compile (static shapes), built on first call; if the compiler backend fails
    (e.g. Inductor cannot build its kernels) it warns once and runs the plain function from then on. Without
    `fullgraph`, dynamo itself runs the plain function past its recompile limit."""

    def __init__(self, fn: Any, backend: str):
        self.fn = fn
        self.backend = backend
        self.compiled: Any = None

    def __call__(self, *args: Any) -> Any:
        if self.compiled is None:
            self.compiled = torch.compile(self.fn, dynamic=False, backend=self.backend)
        if self.compiled is self.fn:
            return self.fn(*args)
        try:
            return self.compiled(*args)
        except torch._dynamo.exc.BackendCompilerFailed as e:
            warnings.warn(f"vsagen.blocks: torch.compile failed for {self.fn.__name__} ({type(e).__name__}); "
                          "running it uncompiled", RuntimeWarning, stacklevel=2)
            self.compiled = self.fn
            return self.fn(*args)


@functools.cache
def _compiled(backend: str = "inductor") -> types.SimpleNamespace:
    """The four region functions, each compiled on first use with `backend` (one set per backend)."""
    return types.SimpleNamespace(**{f.__name__: _Region(f, backend)
                                    for f in (modulate_msa, gate_norm, modulate_ff, gate_ff)})


_EAGER = types.SimpleNamespace(modulate_msa=modulate_msa, gate_norm=gate_norm, modulate_ff=modulate_ff,
                               gate_ff=gate_ff)


def fusable(block: Any) -> bool:
    """Whether `block` is a diffusers WanTransformerBlock whose forward `fused_forward` reproduces: float32
    LayerNorms without affine for norm1 / norm3, an affine float32 LayerNorm for norm2 (Wan's cross_attn_norm)."""
    from diffusers.models.normalization import FP32LayerNorm
    from diffusers.models.transformers.transformer_wan import WanTransformerBlock

    return (isinstance(block, WanTransformerBlock) and isinstance(block.norm1, FP32LayerNorm)
            and isinstance(block.norm2, FP32LayerNorm) and isinstance(block.norm3, FP32LayerNorm)
            and block.norm1.weight is None and block.norm3.weight is None)


def fused_forward(block: Any, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor, temb: torch.Tensor,
                  rotary_emb: Any, *, regions: types.SimpleNamespace = _EAGER) -> torch.Tensor:
    """`WanTransformerBlock.forward` with its elementwise steps as `regions` (default: the plain functions; the
    installed forward passes the compiled ones). Shapes as diffusers: hidden_states (B, S, D), temb (B, S, 6, D)
    (per-token timestep) or (B, 6, D)."""
    table = block.scale_shift_table
    x = regions.modulate_msa(hidden_states, temb, table, block.norm1.eps)
    attn_output = block.attn1(x, None, None, rotary_emb)
    hidden_states, x = regions.gate_norm(hidden_states, attn_output, temb, table, block.norm2.eps,
                                         block.norm2.weight, block.norm2.bias)
    attn_output = block.attn2(x, encoder_hidden_states, None, None)
    hidden_states = hidden_states + attn_output
    x = regions.modulate_ff(hidden_states, temb, table, block.norm3.eps)
    return regions.gate_ff(hidden_states, block.ffn(x), temb, table)


class FusedBlocks:
    """Handle of `install`: `remove()` gives every block its class's forward back."""

    def __init__(self, installed: list[tuple[Any, Any]]):
        self.installed = installed  # (block, the forward installed on it)

    @property
    def blocks(self) -> list[Any]:
        return [block for block, _ in self.installed]

    def remove(self) -> None:
        """Remove the region forwards still in place (a forward that replaced one since is left alone)."""
        for block, forward in self.installed:
            if block.__dict__.get("forward") is forward:
                del block.__dict__["forward"]
        self.installed = []


def install(transformer: Any, *, compiled: bool = True, backend: str = "inductor") -> FusedBlocks:
    """Give every fusable block of `transformer` (`fusable`) `fused_forward` as its forward (an instance attribute,
    so module hooks still run around it), with the regions compiled by torch.compile's `backend` unless
    `compiled` is False.

    Returns:
        FusedBlocks, whose `remove()` undoes it.
    """
    regions = _compiled(backend) if compiled else _EAGER
    done = []
    for block in transformer.blocks:
        if fusable(block) and "forward" not in block.__dict__:
            forward = types.MethodType(functools.partial(fused_forward, regions=regions), block)
            block.forward = forward
            done.append((block, forward))
    return FusedBlocks(done)

