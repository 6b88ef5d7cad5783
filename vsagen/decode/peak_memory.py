"""The peak memory of the stock Wan VAE decode, measured without a GPU: the decode runs under torch's
`FakeTensorMode` (shapes, dtypes and devices only: no data, no memory, seconds at 121 x 704 x 1280) while
`LiveStorageBytes`, a `TorchDispatchMode`, adds up the bytes of every tensor storage the decode's operators create
and subtracts them when the storage is freed. Its peak is the decode's activation peak: what the decode needs on top
of the weights and the latents already in memory.

This is the measuring instrument behind the fitted constants of `vsagen.decode.tiling` (the run-time rule reads
those; nothing here runs in a generation). `benchmarks/vae_decode_peak.py fit` runs it over sizes and prints the
fit; `benchmarks/vae_decode_peak.py gpu` compares the fit with `torch.cuda.max_memory_allocated` on a GPU.

What it sees, and what it cannot: every storage an ATen operator returns (activations, the causal convolutions'
padded inputs and cached frames, dtype casts, the concatenated output of a whole decode); views share their base's
storage and count once; in-place results count nothing new. It does not see memory a kernel allocates for itself
(cuDNN workspaces, oneDNN weight reorders) nor the caching allocator's rounding and fragmentation: the run-time rule's
margin is for those. The fake tensors live on the CPU device, so scaled-dot-product attention takes its fused CPU
kernel (output and log-sum-exp only), as CUDA's fused kernels do; a fake CUDA device on a CPU-only torch would take
the math path and count the N x N attention matrix that CUDA never holds.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveStorageBytes(TorchDispatchMode):
    """Bytes of the tensor storages created under this mode and still alive: `live` now, `peak` the most at once.

    A storage counts from the operator that returns it (when it is none of that operator's inputs' storages and not
    counted yet) until it is freed (a `weakref.finalize` on the storage, whose Python object torch keeps as long as
    the storage lives). Storages that existed before the mode was entered (weights, inputs) never count.
    Works the same on real tensors and under `FakeTensorMode` (entered outside this mode)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._counted: set[int] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {id(t.untyped_storage()) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = id(storage)
            if key in self._counted or key in inputs:
                continue
            size = storage.nbytes()
            self._counted.add(key)
            self.live += size
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._freed, key, size)
        return out

    def _freed(self, key: int, size: int) -> None:
        if key in self._counted:
            self._counted.discard(key)
            self.live -= size


def build_vae(config: dict[str, Any], dtype: torch.dtype, *, fake: bool, seed: int = 0) -> Any:
    """Diffusers' `AutoencoderKLWan(**config)` in `dtype`, in eval mode: with `fake`, under a new `FakeTensorMode`
    (returned with it: enter that mode to run it; no memory, no data), else with real random weights (seeded).

    Returns:
        (vae, fake mode or None).
    """
    from diffusers import AutoencoderKLWan
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode() if fake else None
    previous = torch.get_default_dtype()
    with mode if mode is not None else contextlib.nullcontext(), torch.random.fork_rng():
        torch.manual_seed(seed)
        torch.set_default_dtype(dtype)  # built in `dtype`: `.to(dtype)` cannot swap fake parameters
        try:
            vae = AutoencoderKLWan(**config).eval()
        finally:
            torch.set_default_dtype(previous)
    return vae, mode


def _streamed(vae: Any, z: torch.Tensor) -> Iterator[None]:
    """`vsagen t2v`'s decode: the stream of chunks, each turned into uint8 frames on the device and dropped."""
    from diffusers.video_processor import VideoProcessor

    from .stream import decode_chunks, device_frames_u8

    processor = VideoProcessor(vae_scale_factor=vae.config.scale_factor_spatial)
    for chunk in decode_chunks(vae, z):
        device_frames_u8(processor, chunk)
        del chunk
        yield


def decode_peak_bytes(vae: Any, latent_shape: tuple[int, int, int, int, int], *, streamed: bool = True,
                      fake_mode: Any = None) -> int:
    """The activation peak, in bytes, of decoding normalised latents of `latent_shape` (1, z_dim, F_lat, H_lat,
    W_lat) with `vae` untiled or tiled as its `use_tiling` says: `streamed` (`vsagen t2v`'s way,
    `vsagen.decode.stream.decode_chunks` with each chunk's uint8 conversion on the device) or whole (`vae.decode`,
    diffusers' way and `vsagen compare`'s: every frame concatenated into one output). Random latents in the VAE's
    dtype on the CPU; `fake_mode` (from `build_vae(fake=True)`) runs it on fake tensors.

    Raises:
        ValueError: `latent_shape`'s channels are not the VAE's z_dim.
    """
    if latent_shape[1] != vae.config.z_dim:
        raise ValueError(f"latents of {latent_shape[1]} channels for a VAE of z_dim {vae.config.z_dim}")
    dtype = next(vae.parameters()).dtype
    with fake_mode if fake_mode is not None else contextlib.nullcontext(), torch.inference_mode():
        z = torch.randn(latent_shape, dtype=dtype)
        tracker = LiveStorageBytes()
        with tracker:
            if streamed:
                for _ in _streamed(vae, z):
                    pass
            else:
                from .stream import unnormalized

                out = vae.decode(unnormalized(vae, z), return_dict=False)[0]
                del out
    return tracker.peak


def profiler_peak_bytes(run: Any) -> int:
    """The peak of the CPU allocator's bytes in use while `run()` executes (real tensors, CPU), from torch's
    profiler memory events: every allocation and free of the CPU allocator, kernel-internal buffers included. An
    instrument independent of `LiveStorageBytes` to check it against."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


__all__ = ["LiveStorageBytes", "build_vae", "decode_peak_bytes", "profiler_peak_bytes"]
