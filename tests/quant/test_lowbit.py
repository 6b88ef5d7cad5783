"""vsagen.quant.lowbit: a LowBitLinear's kept buffers (codes, scales) follow the module's device moves but never its
dtype casts; its bias is cast as any module's buffers are; forward flattens to 2-D and back."""

from __future__ import annotations

import torch

from vsagen.quant.lowbit import LowBitLinear


class Toy(LowBitLinear):
    """Codes stored as float8 (a floating dtype a cast would change), the product in float32."""
    kept = ("codes", "scale")

    def linear_2d(self, x):
        return (x.float() @ (self.codes.float() * self.scale).t() + self.bias.float()).to(x.dtype)


def test_kept_buffers_keep_dtype_and_values():
    torch.manual_seed(0)
    toy = Toy(torch.randn(4, 8).to(torch.float8_e4m3fn), torch.rand(4, 1) + 0.5, torch.randn(4))
    codes, scale, bias = toy.codes.clone(), toy.scale.clone(), toy.bias.clone()
    toy.to(torch.bfloat16)
    assert toy.codes.dtype == torch.float8_e4m3fn and torch.equal(toy.codes.view(torch.uint8), codes.view(torch.uint8))
    assert toy.scale.dtype == torch.float32 and torch.equal(toy.scale, scale)
    assert toy.bias.dtype == torch.bfloat16 and torch.equal(toy.bias, bias.to(torch.bfloat16))
    toy.half().to("cpu")
    assert toy.scale.dtype == torch.float32 and toy.bias.dtype == torch.float16
    assert sorted(dict(toy.named_buffers())) == ["bias", "codes", "scale"]  # re-registered, none lost
    assert (toy.in_features, toy.out_features) == (8, 4)


def test_forward_flattens_and_restores_the_leading_dims():
    torch.manual_seed(1)
    toy = Toy(torch.randn(4, 8).to(torch.float8_e4m3fn), torch.rand(4, 1) + 0.5, torch.randn(4))
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    got = toy(x)
    w = toy.codes.double() * toy.scale.double()
    assert got.shape == (2, 3, 5, 4) and got.dtype == torch.float64
    assert torch.allclose(got, x @ w.t() + toy.bias.double(), rtol=1e-6, atol=1e-6)
