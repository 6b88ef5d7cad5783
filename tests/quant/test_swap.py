"""vsagen.quant.swap: the block linears a Wan transformer runs low-bit (and those it keeps), the swap on the tiny
model's WanTransformer3DModel, and its output close to the unquantized one."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import make_transformer, rel_l2
from vsagen.quant.fp8_linear import Fp8Linear
from vsagen.quant.int8_linear import Int8Linear
from vsagen.quant.swap import LAYER_GROUPS, block_linears, quantize_transformer


def inputs(t, seed=1):
    g = torch.Generator().manual_seed(seed)
    cfg = t.config
    x = torch.randn(2, cfg.in_channels, 3, 8, 12, generator=g)
    text = torch.randn(2, 7, cfg.text_dim, generator=g)
    return dict(hidden_states=x, timestep=torch.tensor([500.0, 300.0]), encoder_hidden_states=text,
                return_dict=False)


def test_block_linears_are_the_blocks_attention_and_ffn():
    t = make_transformer()
    names = [n for n, _ in block_linears(t)]
    per_block = ["attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_k",
                 "attn2.to_v", "attn2.to_out.0", "ffn.net.0.proj", "ffn.net.2"]
    assert names == [f"blocks.{i}.{n}" for i in range(len(t.blocks)) for n in per_block]
    every = {n for n, m in t.named_modules() if isinstance(m, nn.Linear)}
    assert every - set(names) == {n for n in every if not n.startswith("blocks.")}  # embedders and head kept
    assert [n for n, _ in block_linears(t, ["ffn"])] == [f"blocks.{i}.ffn.net.{j}" for i in range(len(t.blocks))
                                                         for j in ("0.proj", "2")]
    with pytest.raises(ValueError, match="unknown layer group"):
        block_linears(t, ["head"])
    assert set(LAYER_GROUPS) == {"self_attn", "cross_attn", "ffn"}


@pytest.mark.parametrize("precision,cls,bound", [("int8", Int8Linear, 1e-2), ("fp8", Fp8Linear, 3e-2)])
def test_swapped_transformer_stays_close(precision, cls, bound):
    """The tiny transformer with every block linear low-bit against the float32 one: the output (the velocity) within
    `bound` relative L2 (measured 0.24% for int8, 0.88% for fp8), and the modules outside the blocks untouched."""
    t = make_transformer()
    with torch.no_grad():
        want = t(**inputs(t))[0]
    head = t.proj_out
    report = quantize_transformer(t, precision)
    low = 10 if precision == "int8" else 8  # FP8 keeps the cross-attention's text k / v (FP8_KEPT)
    assert len(report.swapped) == low * len(t.blocks)
    assert [n for n, _ in report.kept] == [f"blocks.{i}.attn2.to_{x}" for i in range(len(t.blocks))
                                           for x in "kv"][: (10 - low) * len(t.blocks)]
    assert all(isinstance(m, cls) for _, m in [(n, t.get_submodule(n)) for n in report.swapped])
    assert t.proj_out is head and isinstance(t.condition_embedder.time_proj, nn.Linear)
    with torch.no_grad():
        got = t(**inputs(t))[0]
    assert got.shape == want.shape
    err = rel_l2(got, want)
    assert 1e-4 < err < bound
    assert report.note().startswith(f"{low * len(t.blocks)} block linears run as")


def test_none_changes_nothing_and_fp8_keeps_misfits():
    t = make_transformer()
    assert quantize_transformer(t, "none").swapped == []
    odd = nn.Linear(32, 24)  # N = 24: not a multiple of 16
    t.blocks[1].attn2.to_out[0] = odd
    report = quantize_transformer(t, "fp8")
    assert ("blocks.1.attn2.to_out.0", "32 -> 24 is not a multiple of 16 (torch._scaled_mm)") in report.kept
    assert t.blocks[1].attn2.to_out[0] is odd and "; 1 kept in the run's dtype (e.g. blocks.1.attn2.to_out.0: 32 -> 24" \
        in report.note() and "; 4 kept in the run's dtype (e.g. blocks.0.attn2.to_k: text / image tokens" in report.note()
    with pytest.raises(ValueError, match="unknown precision"):
        quantize_transformer(t, "fp4")


def test_install_int8_takes_given_codes_and_reports_them():
    """A `-quant` file's codes installed by name (the bias kept), then `quantize_transformer` leaves them as loaded
    and swaps the rest; the `weight` property gives the dequantized weight for code that reads shapes and dtypes."""
    from vsagen.quant.int8_linear import quantize_int8_blocks
    from vsagen.quant.swap import install_int8, precision_summary

    t = make_transformer()
    to_q = t.blocks[0].attn1.to_q
    q, s = quantize_int8_blocks(to_q.weight.detach())
    assert install_int8(t, {"blocks.0.attn1.to_q": (q, s)}) == ["blocks.0.attn1.to_q"]
    layer = t.blocks[0].attn1.to_q
    assert isinstance(layer, Int8Linear) and layer.int8_weight is q and torch.equal(layer.bias, to_q.bias.detach())
    assert layer.weight.shape == (32, 32) and layer.weight.dtype == torch.float32
    assert float((layer.weight - to_q.weight.detach()).abs().max()) <= float(s.max())
    assert precision_summary(t) == {"int8": 1, "fp8": 0, "dtype": 19}
    report = quantize_transformer(t, "int8")
    assert report.already == ["blocks.0.attn1.to_q"] and len(report.swapped) == 19 and t.blocks[0].attn1.to_q is layer
    assert report.note().startswith("20 block linears run as int8 W8A8 (128x128 block scales) (1 as loaded)")
    assert precision_summary(t) == {"int8": 20, "fp8": 0, "dtype": 0}
    with pytest.raises(ValueError, match="no linear of weight shape"):
        install_int8(t, {"blocks.0.attn2.to_q": (q[:16], s)})


def test_quantize_pipeline_swaps_every_expert():
    from types import SimpleNamespace

    from vsagen.quant.swap import precision_summary, quantize_pipeline

    pipe = SimpleNamespace(transformer=make_transformer(), transformer_2=make_transformer(seed=1))
    assert quantize_pipeline(pipe, "none") == []
    notes = quantize_pipeline(pipe, "int8")
    assert notes == [f"--quant int8: {n}: 20 block linears run as int8 W8A8 (128x128 block scales)"
                     for n in ("transformer", "transformer_2")]  # on the CPU: no compile note
    assert precision_summary(pipe.transformer_2) == {"int8": 20, "fp8": 0, "dtype": 0}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_dequantized_linear_is_the_weight_loading_a_quant_file_gives(dtype):
    """An `Int8Linear` of random codes and scales (partial 128 x 128 tiles: 200 x 130) back as an `nn.Linear` in the
    run's dtype: bitwise the weight `transformer_files.dequantize` computes from the same pair at load (float64, cast
    once), within one rounding of the float64 product; its bias as it was; the output that of F.linear with both."""
    from vsagen.models.transformer_files import dequantize
    from vsagen.quant.swap import dequantized_linear

    g = torch.Generator().manual_seed(3)
    q = torch.randint(-128, 128, (200, 130), generator=g, dtype=torch.int8)
    scale = torch.rand(2, 2, generator=g) * 1e-2 + 1e-3
    bias = torch.randn(200, generator=g).to(dtype)
    state = {"w.int8_weight": q, "w.scale": scale}
    dequantize(state, dtype, "test")
    linear = dequantized_linear(Int8Linear(q, scale, bias), dtype)
    assert isinstance(linear, nn.Linear) and linear.weight.dtype == dtype and linear.bias.dtype == dtype
    assert torch.equal(linear.weight, state["w.weight"]) and torch.equal(linear.bias, bias)
    exact = q.double() * scale.double().repeat_interleave(128, 0).repeat_interleave(128, 1)[:200, :130]
    ulp = torch.finfo(dtype).eps * exact.abs()
    assert bool(((linear.weight.double() - exact).abs() <= ulp).all())
    x = torch.randn(3, 130, generator=g).to(dtype)
    with torch.no_grad():
        assert torch.equal(linear(x), nn.functional.linear(x, state["w.weight"], bias))


@pytest.mark.parametrize("precision", ["int8", "fp8"])
def test_qkv_quantize_their_input_once(precision, monkeypatch):
    """attn1's q / k / v read one activation: with the swap's `share_inputs` it is quantized once per attention call
    (a counting quantizer sees one call per block where it saw three), and the forward is bit for bit the unshared
    one; a tensor written in place between two reads (its version moves) is quantized afresh."""
    from vsagen.quant.lowbit import LowBitLinear, SharedInput

    t = make_transformer()
    quantize_transformer(t, precision)
    attn = t.blocks[0].attn1
    shared = attn.to_q.shared_input
    assert isinstance(shared, SharedInput) and attn.to_k.shared_input is shared and attn.to_v.shared_input is shared
    assert attn.to_out[0].shared_input is None
    cls = type(attn.to_q)
    calls = []

    def counting(x):
        calls.append(tuple(x.shape))
        return own(x)
    own = cls.quantize_input
    monkeypatch.setattr(cls, "quantize_input", staticmethod(counting))
    with torch.no_grad():
        got = t(**inputs(t))[0]
    shared_calls = len(calls)
    calls.clear()
    for m in t.modules():
        if isinstance(m, LowBitLinear):
            m.shared_input = None
    with torch.no_grad():
        want = t(**inputs(t))[0]
    assert torch.equal(got, want)
    per_block = {"int8": 2 + 1, "fp8": 2}  # q / k / v: 3 -> 1; int8's text k / v: 2 -> 1 (FP8 keeps those bf16)
    assert len(calls) - shared_calls == per_block[precision] * len(t.blocks)

    x = torch.randn(6, 32)
    s = SharedInput(3)
    assert s.get(x, own) is s.get(x, own)  # the second consumer gets the first's codes
    x.mul_(2)  # written in place: the third read quantizes afresh
    again = s.get(x, own)
    assert torch.equal(again[0], own(x)[0]) and s.x is x
    with pytest.raises(ValueError, match="at least 2"):
        SharedInput(1)


def test_shared_input_under_inference_mode():
    """vsagen's runs denoise under `torch.inference_mode`, whose tensors have no version counter: the sharing still
    works there (the int8 CLI run failed on it once), one quantization for the three readers."""
    from vsagen.quant.lowbit import SharedInput
    from vsagen.quant.int8_linear import quantize_int8_blocks

    calls = []

    def counting(x):
        calls.append(1)
        return quantize_int8_blocks(x)
    with torch.inference_mode():
        x = torch.randn(5, 40)
        s = SharedInput(3)
        outs = [s.get(x, counting) for _ in range(3)]
        assert len(calls) == 1 and outs[0] is outs[2] and s.x is None  # dropped after the third reader
        s.get(x, counting)
        assert len(calls) == 2
