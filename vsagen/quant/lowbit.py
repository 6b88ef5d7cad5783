"""What the low-bit linears share: `LowBitLinear`, an `nn.Module` holding a quantized weight, its scales and a
bias, whose quantized buffers keep their dtypes through a module-wide `.to(dtype)` / `.half()` / `.bfloat16()`
(which would otherwise turn float8 weights and float32 scales into the run's dtype) while still following the module
to its device; its forward flattens (..., in) to (tokens, in) for the subclass' 2-D product. `SharedInput` lets the
linears that read one activation (a self-attention's q, k and v projections) quantize it once."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn


def _version(x: torch.Tensor) -> int | None:
    """x's version counter (bumped by every in-place write), None for an inference tensor (which has none)."""
    return None if x.is_inference() else x._version


class SharedInput:
    """One activation's quantization shared by the `consumers` low-bit linears that read it in turn (a Wan block's
    `attn1.to_q`, `to_k`, `to_v`, all fed the modulated hidden states): the first to see a tensor quantizes it, the
    others get the same (codes, scales), and the entry is dropped once `consumers` linears have had it.

    Same tensor means: the same storage address, shape, strides, dtype and device, and the same version counter
    (no in-place write since; tensors made under `torch.inference_mode`, as vsagen's runs make them, have no version
    counter: there the sharing relies on nothing writing the input in place between its readers, which diffusers'
    Wan attention and vsagen's processor never do). The entry holds the tensor itself, so its memory cannot be freed
    and reused by another tensor while the entry lives: an address match is never a stale one. Bit for bit what each
    linear's own quantization gives (the same function on the same values). Costs, while an entry lives, the input
    and its codes (at Wan2.1-14B's 75,600 tokens x 5120: 774 MB bf16 + 387 MB e4m3, freed after the third
    projection).
    Measured need: the FP8 row quantizer takes 0.07 ms of a 0.36 ms 32760x1536x1536 layer on an H100 (BENCHMARKS.md,
    2026-12-07 evening), and q / k / v quantized the same input three times.
    """

    def __init__(self, consumers: int) -> None:
        if consumers < 2:
            raise ValueError(f"SharedInput: {consumers} consumer(s); sharing needs at least 2")
        self.consumers = consumers
        self.clear()

    def clear(self) -> None:
        """Drop the entry (its tensor and codes)."""
        self.x: torch.Tensor | None = None
        self.out: tuple[torch.Tensor, torch.Tensor] | None = None
        self.version: int | None = -1  # x's version counter when it was quantized (None: an inference tensor)
        self.uses = 0

    def _same(self, x: torch.Tensor) -> bool:
        y = self.x
        return (y is not None and y.data_ptr() == x.data_ptr() and y.shape == x.shape and y.stride() == x.stride()
                and y.dtype == x.dtype and y.device == x.device and _version(x) == self.version)

    def get(self, x: torch.Tensor,
            quantize: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """`quantize(x)`, computed once for the consumers that read x in turn (class docstring)."""
        if self._same(x):
            out = self.out
            self.uses += 1
        else:
            out = quantize(x)
            self.x, self.out, self.version, self.uses = x, out, _version(x), 1
        if self.uses >= self.consumers:
            self.clear()
        return out


class LowBitLinear(nn.Module):
    """Base of `Int8Linear` and `Fp8Linear`. Subclasses name their two buffers in `kept` (weight codes, scales),
    give `quantize_weight` ((out, in) float -> (codes, scales)) and `linear_2d` ((tokens, in) -> (tokens, out) in
    the input's dtype, bias included)."""

    kept: tuple[str, str] = ("", "")
    quantize_weight: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    quantize_input: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    shared_input: SharedInput | None = None  # set by `vsagen.quant.swap.share_inputs`

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = codes.shape
        self.register_buffer(self.kept[0], codes.contiguous())
        self.register_buffer(self.kept[1], scales.float().contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "LowBitLinear":
        """The layer with `linear`'s weight quantized by the subclass' `quantize_weight`, its bias as it is."""
        codes, scales = cls.quantize_weight(linear.weight.detach())
        return cls(codes, scales, None if linear.bias is None else linear.bias.detach())

    def linear_2d(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def quantized_input(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (tokens, in) as the subclass' activation quantizer gives it, through `shared_input` where set (in
        inference outside `torch.compile`: under compilation Inductor merges the identical quantizations of one
        graph itself, and a tensor that needs a gradient is quantized afresh)."""
        shared = self.shared_input
        if shared is None or x.requires_grad or torch.compiler.is_compiling():
            return self.quantize_input(x)
        return shared.get(x, self.quantize_input)

    def dequantized_weight(self, dtype: Any = torch.float32) -> torch.Tensor:
        raise NotImplementedError

    @property
    def weight(self) -> torch.Tensor:
        """The (out, in) weight the codes stand for, dequantized on each access in the bias' dtype (float32 without
        one) on the codes' device: for code that reads a linear's shape, dtype or device (vsagen's attention
        backends read `attn.to_q.weight`); never on the forward path."""
        return self.dequantized_weight(torch.float32 if self.bias is None else self.bias.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        return self.linear_2d(x.reshape(-1, shape[-1])).reshape(*shape[:-1], self.out_features)

    def _apply(self, fn: Callable[[Any], Any], recurse: bool = True) -> "LowBitLinear":
        kept = {name: self._buffers.pop(name) for name in self.kept if self._buffers.get(name) is not None}
        try:
            super()._apply(fn, recurse)
        finally:
            for name, t in kept.items():
                self._buffers[name] = t.to(fn(t.new_empty(0)).device)
        return self
