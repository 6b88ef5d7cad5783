"""`vsagen.decode.light_decoder`: Hummingbird-XT's lightweight VAE decoder (AMD's `AutoencoderKLTurboVAED`).

Shapes for odd latent frame counts (whole, temporal windows, spatial tiles); each new block against a float64
re-enactment of its formula on random inputs (the convolutions as sums of shifted slices, not torch's conv); the
real folder layout (config.json + diffusion_pytorch_model.safetensors, decoder keys) written and read back; damaged or
missing files refused in one line. In a pipeline (`--vae`, the stream): `decode/test_decoder_choice.py`. Equivalence
with HummingbirdXT's own module: `benchmarks/light_vae_equivalence.py`.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from vsagen.errors import BadInput
from vsagen.decode.light_decoder import (EdgeConv3d, LightVaeConfig, LightVaeDecoder, PixelShuffle2d, ResBlock,
                                         SeparableConv3d, Upsampler3d, channel_rms, read_folder, save_folder)
from vsagen.models.presets import load_preset

TINY = LightVaeConfig.from_dict(load_preset("tiny-ti2v").light_vae.config, "tiny-ti2v")


def rand(*shape, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype)


def randomize(module: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """Every parameter random (biases and LayerNorm weights too, never zeros or ones)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)
    return module


# ---- float64 references from the formulas ------------------------------------------------------------------------

def pad_time(x, k, causal):
    if causal:
        return torch.cat([x[:, :, :1]] * (k - 1) + [x], dim=2)
    n = (k - 1) // 2
    return torch.cat([x[:, :, :1]] * n + [x] + [x[:, :, -1:]] * n, dim=2)


def conv_ref(x, weight, bias, k, causal, groups=1):
    """y[o, t, h, w] = b[o] + sum_{i, a, b, c} W[o, i, a, b, c] x'[i, t + a, h + b - k//2, w + c - k//2]: time padded
    by repeated edge frames, height / width by zeros; `groups` = channels for a depthwise conv."""
    xp = F.pad(pad_time(x, k, causal), (k // 2, k // 2, k // 2, k // 2))
    t, h, w = x.shape[2], x.shape[3], x.shape[4]
    y = bias.view(1, -1, 1, 1, 1).expand(x.shape[0], -1, t, h, w).clone()
    for a in range(k):
        for b in range(k):
            for c in range(k):
                patch = xp[:, :, a: a + t, b: b + h, c: c + w]
                if groups == 1:
                    y += torch.einsum("oi,bithw->bothw", weight[:, :, a, b, c], patch)
                else:
                    y += weight[:, 0, a, b, c].view(1, -1, 1, 1, 1) * patch
    return y


def edge_ref(m, x):
    return conv_ref(x, m.conv.weight, m.conv.bias, m.kernel, m.causal)


def separable_ref(m, x):
    y = conv_ref(x, m.depthwise_conv.weight, m.depthwise_conv.bias, m.kernel, False, groups=x.shape[1])
    return torch.einsum("oi,bithw->bothw", m.pointwise_conv.weight[:, :, 0, 0, 0], y) + \
        m.pointwise_conv.bias.view(1, -1, 1, 1, 1)


def conv_of(m, x):
    return separable_ref(m, x) if isinstance(m, SeparableConv3d) else edge_ref(m, x)


def rms_ref(x):
    return x / torch.sqrt((x * x).mean(dim=1, keepdim=True) + 1e-8)


def silu(x):
    return x / (1 + torch.exp(-x))


def resblock_ref(m, x):
    h = rms_ref(x)
    h = conv_of(m.conv1, torch.clamp(h, min=0) if m.relu_first else silu(h))
    h = conv_of(m.conv2, silu(rms_ref(h)))
    if m.norm3 is not None:
        mu = x.mean(dim=1, keepdim=True)
        var = ((x - mu) ** 2).mean(dim=1, keepdim=True)
        xn = (x - mu) / torch.sqrt(var + m.norm3.eps) * m.norm3.weight.view(1, -1, 1, 1, 1) \
            + m.norm3.bias.view(1, -1, 1, 1, 1)
        x = conv_of(m.conv_shortcut, xn)
    return h + x


def upsampler_ref(m, x):
    """out[c, t st + j - (st - 1), y s + dy, x s + dx] = conv[((c s + dy) s + dx) st + j, t, y, x] (no - (st - 1)
    with keep_first)."""
    st, s = m.stride[0], m.stride[1]
    y = edge_ref(m.conv, x)
    b, ch, t, hh, ww = y.shape
    c_out = ch // (st * s * s)
    out = torch.empty(b, c_out, t * st, hh * s, ww * s, dtype=y.dtype)
    for c in range(c_out):
        for dy in range(s):
            for dx in range(s):
                for j in range(st):
                    out[:, c, j::st, dy::s, dx::s] = y[:, ((c * s + dy) * s + dx) * st + j]
    return out if m.keep_first else out[:, :, st - 1:]


def shuffle2d_ref(m, x):
    b, c, t, h, w = x.shape
    y = torch.stack([F.conv2d(F.pad(x[:, :, i], (1, 1, 1, 1)), m.conv.weight, m.conv.bias) for i in range(t)], 2)
    out = torch.empty(b, c // 4, t, 2 * h, 2 * w, dtype=x.dtype)
    for co in range(c // 4):
        for dy in range(2):
            for dx in range(2):
                out[:, co, :, dy::2, dx::2] = y[:, co * 4 + dy * 2 + dx]
    return out


# ---- blocks in float64 -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kernel,causal", [(3, False), (3, True), (5, False), (1, False)])
def test_edge_conv_is_the_padded_sum(kernel, causal):
    m = randomize(EdgeConv3d(5, 7, kernel, causal).double())
    x = rand(2, 5, 4, 6, 5)
    torch.testing.assert_close(m(x), edge_ref(m, x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kernel,causal", [(3, False), (3, True), (5, False), (1, True)])
def test_separable_conv_is_depthwise_then_pointwise_with_symmetric_time_padding(kernel, causal):
    """Time padded by (k - 1) / 2 edge copies on both sides even when the block is causal (theirs ignores it)."""
    m = randomize(SeparableConv3d(6, 4, kernel, causal).double())
    x = rand(1, 6, 5, 7, 4, seed=2)
    torch.testing.assert_close(m(x), separable_ref(m, x), rtol=1e-12, atol=1e-12)
    assert m.depthwise_conv.weight.shape == (6, 1, kernel, kernel, kernel)


@pytest.mark.parametrize("cin,cout,separable,relu_first", [(6, 6, False, False), (6, 4, True, False),
                                                           (4, 6, False, True), (6, 6, True, True)])
def test_resblock_is_its_formula(cin, cout, separable, relu_first):
    m = randomize(ResBlock(cin, cout, eps=1e-6, causal=False, separable=separable, kernel=3,
                           relu_first=relu_first).double())
    x = rand(1, cin, 3, 5, 6, seed=3)
    torch.testing.assert_close(m(x), resblock_ref(m, x), rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("stride,keep", [((2, 2, 2), False), ((1, 2, 2), False), ((2, 2, 2), True)])
def test_upsampler_is_its_index_formula(stride, keep):
    m = randomize(Upsampler3d(3, stride, causal=False, keep_first=keep).double())
    x = rand(1, 3, 3, 4, 5, seed=4)
    torch.testing.assert_close(m(x), upsampler_ref(m, x), rtol=1e-12, atol=1e-12)
    assert m(x).shape[2] == 3 * stride[0] - (0 if keep else stride[0] - 1)


def test_pixel_shuffle_upsampler_and_channel_rms():
    m = randomize(PixelShuffle2d(8).double())
    x = rand(2, 8, 3, 4, 5, seed=5)
    torch.testing.assert_close(m(x), shuffle2d_ref(m, x), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(channel_rms(x), rms_ref(x), rtol=1e-14, atol=1e-14)
    half = x.to(torch.bfloat16)
    assert channel_rms(half).dtype == torch.bfloat16


def test_decoder_is_its_blocks_in_order():
    """The whole decoder in float64 against the blocks' references composed as their decoder composes them."""
    d = randomize(LightVaeDecoder(TINY).double())
    z = rand(1, 48, 3, 2, 3, seed=6)
    h = edge_ref(d.conv_in, z)
    for r in d.mid_block.resnets:
        h = resblock_ref(r, h)
    for block in d.up_blocks:
        if block.conv_in is not None:
            h = resblock_ref(block.conv_in, h)
        for up in block.upsamplers or ():
            h = upsampler_ref(up, h)
        for r in block.resnets:
            h = resblock_ref(r, h)
    for up in (d.upsampler2d_1, d.upsampler2d_2):
        h = shuffle2d_ref(up, silu(rms_ref(h)))
    ref = edge_ref(d.conv_out, silu(rms_ref(h)))
    torch.testing.assert_close(d(z), ref, rtol=1e-10, atol=1e-10)


# ---- shapes ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("frames", [1, 3, 5, 7])
def test_output_shapes_for_odd_latent_frame_counts(frames):
    d = LightVaeDecoder(TINY).eval()
    out = d.decode(torch.randn(1, 48, frames, 2, 3))
    assert out.shape == (1, 3, 4 * (frames - 1) + 1, 32, 48)
    d.set_temporal_tiling(8, 4)  # windows of 2 + 1 latent frames every one
    assert d.decode(torch.randn(1, 48, frames, 2, 3)).shape == out.shape
    d.set_temporal_tiling(None)
    d.use_tiling, d.tile_sample_min_height, d.tile_sample_stride_height = True, 32, 16
    d.tile_sample_min_width = d.tile_sample_stride_width = 32
    assert d.decode(torch.randn(1, 48, frames, 3, 5)).shape == (1, 3, 4 * (frames - 1) + 1, 48, 80)


def test_temporal_windows_keep_the_first_windows_frames():
    """The first window's frames before the blend are the first window decoded alone (their first stride + 1)."""
    d = randomize(LightVaeDecoder(TINY)).eval()
    z = torch.randn(1, 48, 7, 2, 2)
    d.set_temporal_tiling(8, 4)
    tiled = d.decode(z)
    alone = d(z[:, :, :3])
    torch.testing.assert_close(tiled[:, :, :5], alone[:, :, :5])
    assert not torch.allclose(tiled, d(z), atol=1e-3)  # windows see less context than the whole decode


# ---- the folder --------------------------------------------------------------------------------------------------

def test_folder_round_trip_in_their_layout(tmp_path):
    d = randomize(LightVaeDecoder(TINY)).eval()
    save_folder(d, tmp_path / "vae")
    cfg = json.loads((tmp_path / "vae" / "config.json").read_text())
    assert cfg["_class_name"] == "AutoencoderKLTurboVAED" and cfg["scale_factor_spatial"] == 16
    from safetensors.torch import load_file, save_file

    keys = load_file(str(tmp_path / "vae" / "diffusion_pytorch_model.safetensors"))
    assert "conv_in.conv.weight" in keys and "mid_block.resnets.0.conv1.depthwise_conv.weight" in keys
    back = read_folder(tmp_path / "vae", "--model x")
    z = torch.randn(1, 48, 3, 2, 2)
    torch.testing.assert_close(back.decode(z), d.decode(z), rtol=0, atol=0)
    save_file({f"decoder.{k}": v for k, v in keys.items()}, str(tmp_path / "vae" / "diffusion_pytorch_model.safetensors"))
    torch.testing.assert_close(read_folder(tmp_path / "vae", "--model x").decode(z), d.decode(z), rtol=0, atol=0)


def test_damaged_or_missing_files_are_one_line(tmp_path):
    d = LightVaeDecoder(TINY)
    save_folder(d, tmp_path / "v")
    weights = tmp_path / "v" / "diffusion_pytorch_model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(BadInput, match="damaged"):
        read_folder(tmp_path / "v", "--model x")
    weights.unlink()
    with pytest.raises(BadInput, match="no diffusion_pytorch_model.safetensors"):
        read_folder(tmp_path / "v", "--model x")
    save_folder(d, tmp_path / "v")
    (tmp_path / "v" / "config.json").write_text("{not json")
    with pytest.raises(BadInput, match="config.json is damaged"):
        read_folder(tmp_path / "v", "--model x")
    other = {**json.loads(json.dumps(load_preset("tiny-ti2v").light_vae.config)), "patch_size": 2}
    (tmp_path / "v" / "config.json").write_text(json.dumps(other))
    with pytest.raises(BadInput, match="has shape|lacks"):
        read_folder(tmp_path / "v", "--model x")
    (tmp_path / "v" / "config.json").write_text(json.dumps({**other, "timestep_conditioning": True}))
    with pytest.raises(BadInput, match="not supported"):
        read_folder(tmp_path / "v", "--model x")
