"""The VAE decode as a stream of frame chunks, so the mp4 encode can run while the rest decodes (issue 32).

The Wan VAEs (diffusers' `AutoencoderKLWan`: the Wan2.1 VAE and the Wan2.2 one with its 2x2 patchified output) are
causal over time: `AutoencoderKLWan._decode` runs its decoder on one latent frame at a time, carrying each causal
convolution's last frames in a feature cache, and concatenates the results (the first latent frame gives 1 video
frame, every later one 4). `decode_chunks` runs the same calls in the same order and hands each latent frame's
video frames on as soon as they exist, instead of concatenating them:

* untiled (diffusers @0.42 `_decode`): post_quant_conv over the whole latent, then per latent frame
  `decoder(x[:, :, i:i+1], feat_cache, feat_idx=[0], first_chunk=i == 0)`, unpatchify (Wan2.2), clamp to [-1, 1];
* tiled (`tiled_decode`, when the VAE's tiling is on and the latent exceeds a tile): the same per latent frame for
  every spatial tile, each tile with its own feature cache, then that frame's tiles blended (`blend_v` / `blend_h`,
  which mix along height and width only) and cropped as diffusers does.

Concatenated, the chunks equal `vae.decode` bit for bit (tests: every tiny family, tiled and untiled, odd frame counts).
Hummingbird-XT's lightweight decoder (`vsagen.decode.light_decoder`, attached to the stock VAE) streams window by window
(`LightVaeDecoder.decode_chunks`), the TAEHV tiny decoder (`vsagen.decode.tiny_decoder`) latent frame by latent frame
(`TinyVaeDecoder.decode_chunks`: causal too, 1 frame then 4 per latent frame). Any other VAE, or one whose `decode` was routed elsewhere, is decoded whole by its
own `decode` and given as one chunk.

`frames_u8` turns a chunk into the mp4's uint8 frames on the chunk's device (the pipeline's video processor, then
the rounding of `vsagen.media.video.to_uint8_frames`), so only uint8 crosses to the host.
"""

from __future__ import annotations

from typing import Any, Iterator


def unnormalized(vae: Any, latents: Any) -> Any:
    """Wan latents (1, z, F_lat, H_lat, W_lat) in the VAE's dtype, un-normalised with its latents_mean / std."""
    from .decoder_choice import latent_stats

    latents = latents.to(vae.dtype)
    mean, std = latent_stats(vae, latents)
    return latents * std + mean


def streams(vae: Any) -> bool:
    """Whether `decode_chunks` decodes `vae` in pieces: diffusers' AutoencoderKLWan exactly, its `decode` its own
    (latent frame by latent frame) or routed to a lightweight decoder (`decoder_choice.attach`: window by window when
    that decoder decodes in temporal windows, as Hummingbird-XT's does) or to a tiny one (latent frame by latent
    frame)."""
    from diffusers import AutoencoderKLWan

    from .decoder_choice import uses_light_decoder, uses_tiny_decoder

    if type(vae) is not AutoencoderKLWan:
        return False
    if uses_tiny_decoder(vae):
        return True
    if uses_light_decoder(vae):
        return bool(vae.light_decoder.use_framewise_decoding)
    return "decode" not in vars(vae)


def decode_chunks(vae: Any, latents: Any) -> Iterator[Any]:
    """Decode normalised Wan latents (1, z, F_lat, H_lat, W_lat) as a stream of video chunks (1, 3, f, H, W) in
    [-1, 1], in the VAE's dtype and device: f = 1 for the first latent frame, then 4 per latent frame (Wan VAEs, the
    tiny decoder);
    one chunk with every frame for other VAEs. Call it under `torch.inference_mode()`. An accelerate offload hook
    on the VAE (`--offload model`) moves it to the device first, as diffusers' `decode` does.

    Source: diffusers `AutoencoderKLWan._decode` / `tiled_decode` (see the module docstring)."""
    hook = getattr(vae, "_hf_hook", None)
    if hook is not None and hasattr(hook, "pre_forward"):
        hook.pre_forward(vae)
    from .decoder_choice import light_decode_chunks, tiny_decode_chunks, uses_light_decoder, uses_tiny_decoder

    if uses_tiny_decoder(vae):  # the DiT's latents as they are (it un-normalises them itself where it must)
        yield from tiny_decode_chunks(vae, latents)
        return
    z = unnormalized(vae, latents)
    if uses_light_decoder(vae):
        yield from light_decode_chunks(vae, z)
        return
    if not streams(vae):
        yield vae.decode(z, return_dict=False)[0]
        return
    _, _, _, height, width = z.shape
    ratio = vae.spatial_compression_ratio
    if vae.use_tiling and (width > vae.tile_sample_min_width // ratio or height > vae.tile_sample_min_height // ratio):
        yield from _tiled(vae, z)
    else:
        yield from _untiled(vae, z)


def _finish(vae: Any, out: Any) -> Any:
    import torch
    from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

    if vae.config.patch_size is not None:
        out = unpatchify(out, patch_size=vae.config.patch_size)
    return torch.clamp(out, min=-1.0, max=1.0)


def _fresh_cache(vae: Any) -> list:
    vae.clear_cache()  # the decoder's causal-conv count, as diffusers sizes its cache
    return [None] * vae._conv_num


def _untiled(vae: Any, z: Any) -> Iterator[Any]:
    cache = _fresh_cache(vae)
    x = vae.post_quant_conv(z)
    try:
        for i in range(z.shape[2]):
            out = vae.decoder(x[:, :, i:i + 1], feat_cache=cache, feat_idx=[0], first_chunk=i == 0)
            yield _finish(vae, out)
    finally:
        vae.clear_cache()


def _tiled(vae: Any, z: Any) -> Iterator[Any]:
    import torch

    _, _, frames, height, width = z.shape
    ratio = vae.spatial_compression_ratio
    tile_h, tile_w = vae.tile_sample_min_height // ratio, vae.tile_sample_min_width // ratio
    step_h, step_w = vae.tile_sample_stride_height // ratio, vae.tile_sample_stride_width // ratio
    out_h, out_w = height * ratio, width * ratio
    stride_h, stride_w = vae.tile_sample_stride_height, vae.tile_sample_stride_width
    blend_h, blend_w = vae.tile_sample_min_height - stride_h, vae.tile_sample_min_width - stride_w
    patch = vae.config.patch_size
    if patch is not None:
        out_h, out_w, stride_h, stride_w = out_h // patch, out_w // patch, stride_h // patch, stride_w // patch
        blend_h = vae.tile_sample_min_height // patch - stride_h
        blend_w = vae.tile_sample_min_width // patch - stride_w
    starts = [(i, j) for i in range(0, height, step_h) for j in range(0, width, step_w)]
    caches = {ij: _fresh_cache(vae) for ij in starts}
    try:
        for k in range(frames):
            decoded = {}
            for i, j in starts:
                tile = vae.post_quant_conv(z[:, :, k:k + 1, i:i + tile_h, j:j + tile_w])
                decoded[i, j] = vae.decoder(tile, feat_cache=caches[i, j], feat_idx=[0], first_chunk=k == 0)
            rows_i, cols_j = sorted({i for i, _ in starts}), sorted({j for _, j in starts})
            result_rows = []
            for a, i in enumerate(rows_i):
                row = []
                for b, j in enumerate(cols_j):
                    tile = decoded[i, j]  # blended in place, as diffusers' tiles are (its neighbours see that)
                    if a > 0:
                        tile = vae.blend_v(decoded[rows_i[a - 1], j], tile, blend_h)
                    if b > 0:
                        tile = vae.blend_h(decoded[i, cols_j[b - 1]], tile, blend_w)
                    row.append(tile[:, :, :, :stride_h, :stride_w])
                result_rows.append(torch.cat(row, dim=-1))
            yield _finish(vae, torch.cat(result_rows, dim=3)[:, :, :, :out_h, :out_w])
    finally:
        vae.clear_cache()


def frames_u8(processor: Any, chunk: Any) -> Any:
    """A decoded chunk (1, 3, f, H, W) in [-1, 1] -> (f, H, W, 3) uint8 numpy, C-contiguous: the pipeline's
    `video_processor` (diffusers' denormalisation to [0, 1]) in float32, then NaN -> 0, +inf -> 1, -inf -> 0, clip
    and round half up as `vsagen.media.video.to_uint8_frames` does, on the chunk's device; only the uint8 frames are
    copied to the host."""
    return device_frames_u8(processor, chunk).cpu().numpy()


def device_frames_u8(processor: Any, chunk: Any) -> Any:
    """`frames_u8` before the copy to the host: (f, H, W, 3) uint8 on the chunk's device, contiguous in that order
    (the layout the encoder writes, made on the device: a channel-first array handed over instead cost a host-side
    transposition per frame in the encoder thread)."""
    import torch

    pictures = processor.postprocess(chunk[0].permute(1, 0, 2, 3).float(), output_type="pt")  # (f, 3, H, W)
    v = torch.nan_to_num(pictures, nan=0.0, posinf=1.0, neginf=0.0).clamp(0.0, 1.0)
    return (v * 255.0 + 0.5).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def host_frames(processor: Any, chunks: Iterator[Any]) -> Iterator[Any]:
    """Decoded chunks (1, 3, f, H, W) in [-1, 1] -> their `frames_u8` (f, H, W, 3) uint8 numpy, in order.

    On a CUDA device each chunk's frames are copied into page-locked host memory asynchronously, and a chunk is
    handed on only once the next chunk's decode has been queued: the copy, and the host's wait for it, overlap that
    decode instead of following it (a synchronous copy into pageable memory waited for the whole decode of its chunk
    first, then copied at pageable speed). The frames are the same bytes as `frames_u8`'s. The last chunk is given
    once `chunks` ends. Elsewhere each chunk is converted and given as it comes.
    """
    import torch

    pending = None  # (pinned host frames, the event after their copy)
    try:
        for chunk in chunks:
            frames = device_frames_u8(processor, chunk)
            if frames.device.type != "cuda":
                yield frames.cpu().numpy()
                continue
            host = torch.empty(frames.shape, dtype=torch.uint8, pin_memory=True)
            host.copy_(frames, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record()
            if pending is not None:
                pending[1].synchronize()
                yield pending[0].numpy()
            pending = (host, copied)
        if pending is not None:
            pending[1].synchronize()
            yield pending[0].numpy()
    finally:  # left unfinished (an interrupt, an error): the decode's own clean-up runs now
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


def warm_decode(vae: Any, processor: Any, latents: Any, frames: int = 2) -> None:
    """Decode the first `frames` latent frames of `latents` (1, z, F_lat, H_lat, W_lat) and make them host frames,
    discarding them: the first decode in a process pays cuDNN's and the kernels' first-call costs (measured on an H100:
    the tiny decoder's first 81x480x832 decode 1.06 s against 0.19 s warm, BENCHMARKS.md 2026-12-07 evening), which an
    untimed warm-up (`--warmup N`) takes out of the timed run as it does the DiT's. Call it under inference mode; the
    VAE's tiling as the timed decode will have it."""
    for _ in host_frames(processor, decode_chunks(vae, latents[:, :, :frames])):
        pass
