"""What the low-bit linears share: `LowBitLinear`, an `nn.Module` holding a quantized weight, its scales and a
bias, whose quantized buffers keep their dtypes through a module-wide `.to(dtype)` / `.half()` / `.bfloat16()`
(which would otherwise turn float8 weights and float32 scales into the run's dtype) while still following the module
to its device; its forward flattens (..., in) to (tokens, in) for the subclass' 2-D product."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn


class LowBitLinear(nn.Module):
    """Base of `Int8Linear` and `Fp8Linear`. Subclasses name their two buffers in `kept` (weight codes, scales),
    give `quantize_weight` ((out, in) float -> (codes, scales)) and `linear_2d` ((tokens, in) -> (tokens, out) in
    the input's dtype, bias included)."""

    kept: tuple[str, str] = ("", "")
    quantize_weight: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

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
