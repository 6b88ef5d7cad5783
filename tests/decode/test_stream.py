"""vsagen.decode.stream: the streamed VAE decode equals diffusers' whole-latent decode bit for bit (every tiny family,
tiled and untiled, odd latent frame counts and sizes such as crop plans give), chunk by chunk as the Wan VAEs are
causal (1 frame, then 4 per latent frame); the uint8 frames equal the whole-video path's (NaN and infinities
included); other VAEs decode whole; an offload hook is honoured."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import saved_tiny

from vsagen.decode.stream import decode_chunks, frames_u8, host_frames, streams, unnormalized, warm_decode
from vsagen.pipeline import decode_latents, video_frames

FAMILIES = ["tiny", "tiny-ti2v", "tiny-i2v", "tiny-flf2v", "tiny-a14b", "tiny-i2v-a14b"]


def _vae(name):
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan.from_pretrained(saved_tiny(name), subfolder="vae")


def _latents(vae, frames, height, width, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, vae.config.z_dim, frames, height, width, generator=g)


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("tiled", [False, True])
def test_the_stream_equals_the_whole_decode(vsagen_cache, name, tiled):
    """Latent grids of 1, 2 and 4 frames and odd heights / widths (a crop plan's latent is any size): each chunk is
    1 frame then 4 per latent frame, and their concatenation is `vae.decode` exactly, with VAE tiling off and on
    (tiles smaller than the latent, so several tiles blend)."""
    vae = _vae(name)
    if tiled:
        vae.enable_tiling(tile_sample_min_height=64, tile_sample_min_width=64, tile_sample_stride_height=48,
                          tile_sample_stride_width=48)
    for i, (f, h, w) in enumerate([(1, 6, 10), (2, 7, 5), (4, 12, 10)]):
        z = _latents(vae, f, h, w, seed=i)
        with torch.inference_mode():
            chunks = list(decode_chunks(vae, z))
            whole = vae.decode(unnormalized(vae, z), return_dict=False)[0]
        assert [c.shape[2] for c in chunks] == [1] + [4] * (f - 1)
        assert torch.equal(torch.cat(chunks, dim=2), whole), (name, tiled, f, h, w)
        assert whole.abs().max() > 0.05  # not a degenerate comparison


def test_tiling_really_tiles_and_a_small_latent_does_not(vsagen_cache):
    """With tiling on, a latent larger than a tile runs the tiled path (several feature caches), a smaller one the
    untiled path, as diffusers decides."""
    vae = _vae("tiny")
    vae.enable_tiling(tile_sample_min_height=64, tile_sample_min_width=64, tile_sample_stride_height=48,
                      tile_sample_stride_width=48)
    calls = []
    original = vae.post_quant_conv.forward
    vae.post_quant_conv.forward = lambda x: calls.append(tuple(x.shape)) or original(x)
    with torch.inference_mode():
        list(decode_chunks(vae, _latents(vae, 2, 12, 10, 0)))  # 96 x 80 pixels: 2 x 2 tiles, 2 latent frames
        tiled = len(calls)
        calls.clear()
        list(decode_chunks(vae, _latents(vae, 2, 6, 6, 0)))  # 48 x 48: one untiled pass
    assert tiled == 2 * 4 and len(calls) == 1


def test_uint8_frames_equal_the_whole_video_path():
    """`frames_u8` per chunk gives the frames `video_frames` gives for the whole decoded video (the pipeline's video
    processor, NaN -> 0, +inf -> 255, -inf -> 0, round half up), so a streamed run writes the same mp4 frames."""
    from diffusers.video_processor import VideoProcessor

    processor = VideoProcessor(vae_scale_factor=8)
    g = torch.Generator().manual_seed(5)
    video = torch.rand(1, 3, 9, 16, 24, generator=g) * 2.4 - 1.2
    video[0, 0, 0, 0, :3] = torch.tensor([float("nan"), float("inf"), float("-inf")])
    video[0, 1, 3, 2, 2] = 0.0  # exactly mid-grey: 127.5 + 0.5 rounds up
    pipe = type("Pipe", (), {"video_processor": processor})()
    whole = video_frames(pipe, video, (9, 16, 24))
    streamed = np.concatenate([frames_u8(processor, c) for c in (video[:, :, :1], video[:, :, 1:5], video[:, :, 5:])])
    assert streamed.dtype == np.uint8 and np.array_equal(streamed, whole)
    assert tuple(whole[0, 0, :3, 0]) == (0, 255, 0)


def test_host_frames_are_the_uint8_frames_contiguous_and_close_the_decode():
    """`host_frames` gives each chunk's `frames_u8`, C-contiguous in (f, H, W, 3) (a channel-first array handed to
    the encoder cost a host transposition per frame), one per chunk in order; closed early, it closes the decode it
    wraps (the VAE's feature cache cleared at once)."""
    from diffusers.video_processor import VideoProcessor

    processor = VideoProcessor(vae_scale_factor=8)
    g = torch.Generator().manual_seed(11)
    chunks = [torch.rand(1, 3, f, 10, 14, generator=g) * 2 - 1 for f in (1, 4, 4)]
    got = list(host_frames(processor, iter(chunks)))
    assert [a.shape for a in got] == [(f, 10, 14, 3) for f in (1, 4, 4)]
    assert all(a.flags.c_contiguous and np.array_equal(a, frames_u8(processor, c)) for a, c in zip(got, chunks))
    closed = []

    def decode():
        try:
            yield from chunks
        finally:
            closed.append(True)

    stream = host_frames(processor, decode())
    next(stream)
    stream.close()
    assert closed == [True]


def test_warm_decode_decodes_the_first_latent_frames(vsagen_cache):
    """`warm_decode` (the warm-up's decode) runs the decoder on the first two latent frames only."""
    vae = _vae("tiny")
    from diffusers.video_processor import VideoProcessor

    seen = []
    original = vae.decoder.forward
    vae.decoder.forward = lambda x, *a, **k: seen.append(x.shape[2]) or original(x, *a, **k)
    with torch.inference_mode():
        warm_decode(vae, VideoProcessor(vae_scale_factor=8), _latents(vae, 5, 6, 10, seed=3))
    assert seen == [1, 1]  # a latent frame a call, two of the five


def test_the_pipeline_decode_is_the_same_as_the_stream(tiny_pipe):
    """`pipeline.decode_latents` (compare, profile) and the stream decode the same frames."""
    vae = tiny_pipe.vae
    z = _latents(vae, 3, 6, 10, seed=9)
    with torch.inference_mode():
        assert torch.equal(decode_latents(tiny_pipe, z), torch.cat(list(decode_chunks(vae, z)), dim=2))


def test_another_vae_class_decodes_whole_and_the_offload_hook_runs(vsagen_cache):
    """A VAE that is not exactly diffusers' AutoencoderKLWan (a lightweight decoder, a subclass) is decoded by its
    own `decode` in one chunk; an accelerate hook's pre_forward runs first, as diffusers' `decode` runs it."""
    from diffusers import AutoencoderKLWan

    base = _vae("tiny")

    class Other(AutoencoderKLWan):
        pass

    other = Other.from_config(base.config)
    other.load_state_dict(base.state_dict())
    seen = []
    other._hf_hook = type("Hook", (), {"pre_forward": lambda self, m: seen.append(m)})()
    assert streams(base) and not streams(other)
    z = _latents(base, 3, 6, 10, seed=2)
    with torch.inference_mode():
        chunks = list(decode_chunks(other, z))
        want = torch.cat(list(decode_chunks(base, z)), dim=2)
    assert len(chunks) == 1 and torch.equal(chunks[0], want)
    assert seen and seen[0] is other
    # a decode routed elsewhere on the instance (not a light decoder): that decode, whole
    routed = _vae("tiny")
    routed.decode = lambda x, return_dict=False: (torch.full((1, 3, 9, 48, 80), 0.25),)
    with torch.inference_mode():
        chunks = list(decode_chunks(routed, z))
    assert not streams(routed) and len(chunks) == 1 and torch.equal(chunks[0], torch.full((1, 3, 9, 48, 80), 0.25))
