"""Tests for vsagen/blocks.py: the Wan block forward with its elementwise steps as separate (compilable) regions."""

from __future__ import annotations

import pytest
import torch

import vsagen.blocks as blocks
from conftest import make_transformer
from vsagen.compiling import fused_blocks_apply


def run(transformer, per_token: bool, dtype, seed: int = 0):
    """One transformer forward on fresh random inputs: (B=2, C, F=3, H=6, W=8) latents, a (B,) or (B, S) timestep."""
    cfg = transformer.config
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, cfg.in_channels, 3, 6, 8, generator=g).to(dtype)
    s = 3 * (6 // cfg.patch_size[1]) * (8 // cfg.patch_size[2])
    t = torch.rand(2, s, generator=g) * 1000 if per_token else torch.rand(2, generator=g) * 1000
    text = torch.randn(2, 7, cfg.text_dim, generator=g).to(dtype)
    with torch.no_grad():
        return transformer(hidden_states=x, timestep=t, encoder_hidden_states=text, return_dict=False)[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("per_token", [False, True])  # Wan2.1 / A14B-style shared temb; Wan2.2-5B per-token temb
def test_region_forward_is_diffusers_forward_bitwise(dtype, per_token):
    transformer = make_transformer(dtype, seed=3)
    for block in transformer.blocks:  # diffusers initialises the table at random scale: make every chunk count
        block.scale_shift_table.data.normal_()
        block.norm2.weight.data.normal_()
        block.norm2.bias.data.normal_()
    want = run(transformer, per_token, dtype)
    handle = blocks.install(transformer, compiled=False)
    assert len(handle.blocks) == len(transformer.blocks)
    got = run(transformer, per_token, dtype)
    assert torch.equal(got, want)
    handle.remove()
    assert all("forward" not in b.__dict__ for b in transformer.blocks)
    assert torch.equal(run(transformer, per_token, dtype), want)


def test_switch_off_installs_nothing():
    """The run's `fused_blocks` setting off (VSAGEN_FUSED_BLOCKS=0 at the command line): no regions, and a patch
    without them leaves every block's forward alone."""
    from vsagen.attention import make_backend
    from vsagen.attention.hooks import patch_transformer
    from vsagen.timing import Timer

    transformer = make_transformer()
    fused = fused_blocks_apply("cuda", False, enabled=False)
    patch = patch_transformer(transformer, make_backend("full"), Timer("cpu"), fused_blocks=fused)
    assert all("forward" not in b.__dict__ for b in transformer.blocks)
    patch.remove()
    assert not fused_blocks_apply("cuda", False, enabled=False)


def test_other_modules_are_not_fusable():
    assert not blocks.fusable(torch.nn.Linear(2, 2))
    assert all(blocks.fusable(b) for b in make_transformer().blocks)


def test_patches_install_and_remove_the_regions():
    """patch_transformer / time_transformer with fused_blocks give every block the region forward (not compiled
    here: nothing runs) and their remove() takes it away again, with the processors and hooks."""
    from vsagen.attention import make_backend
    from vsagen.attention.hooks import patch_transformer, time_transformer
    from vsagen.timing import Timer

    t = make_transformer()
    for make in (lambda: patch_transformer(t, make_backend("vsa", 0.5), Timer("cpu"), fused_blocks=True),
                 lambda: time_transformer(t, Timer("cpu"), fused_blocks=True)):
        patch = make()
        assert all("forward" in b.__dict__ for b in t.blocks)
        patch.remove()
        assert all("forward" not in b.__dict__ for b in t.blocks)
    patch = patch_transformer(t, make_backend("full"), Timer("cpu"))  # default: diffusers' forward
    assert all("forward" not in b.__dict__ for b in t.blocks)
    patch.remove()


def test_compiled_regions_under_a_tiled_backend_match_diffusers():
    """The compiled path (torch.compile with the aot_eager backend: no C++ or GPU compiler needed) inside a vsa
    patch (tile-order hooks on blocks[0], tiled RoPE) gives diffusers' block forward under the same patch, to
    float32 rounding, with the shared and the per-token temb."""
    from vsagen.attention import make_backend
    from vsagen.attention.hooks import patch_transformer
    from vsagen.timing import Timer

    torch._dynamo.reset()
    t = make_transformer(seed=4)
    backend = make_backend("vsa", 0.5, "torch")
    patch = patch_transformer(t, backend, Timer("cpu"))
    want = [run(t, per_token, torch.float32, seed=5) for per_token in (False, True)]
    handle = blocks.install(t, backend="aot_eager")
    got = [run(t, per_token, torch.float32, seed=5) for per_token in (False, True)]
    handle.remove()
    patch.remove()
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


def test_remove_leaves_a_forward_installed_after_it_alone():
    t = make_transformer()
    handle = blocks.install(t, compiled=False)
    mine = lambda *a, **k: None  # noqa: E731 - something else wrapping the block afterwards
    t.blocks[0].forward = mine
    handle.remove()
    assert t.blocks[0].__dict__.get("forward") is mine
    assert "forward" not in t.blocks[1].__dict__
