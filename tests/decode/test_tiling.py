"""vsagen.decode.tiling: the fitted estimate of the untiled decode's peak against the fake-tensor tracker on the real
VAE architectures (Wan2.1, Wan2.2-5B) at a small size, an upper bound on other architectures (the tiny models);
`--vae-tiling` decided for given free memory (faked numbers), with the note's and the JSON's wording; the memory
read on CUDA (faked) and on the CPU; the VAE's tiling set; the light decoder left to its own rule."""

from __future__ import annotations

import math

import pytest
import torch

from vsagen.decode import tiling
from vsagen.decode.peak_memory import build_vae, decode_peak_bytes
from vsagen.decode.tiling import (AREA_RULE_MAX_AREA, GIB, PEAK_FIT, RESERVE_BYTES, SAFETY_FACTOR, WAN21_VAE, WAN22_VAE,
                                  architecture_key, available_bytes, choose_tiling, decide_decode_tiling,
                                  decode_peak_estimate, encode_tiled)
from vsagen.models.presets import load_preset


def _config(preset: str) -> dict:
    return dict(load_preset(preset).vae)


def test_the_presets_vaes_are_the_fitted_architectures():
    """Every real preset's VAE is one of the two fitted ones (the tiny presets' are not)."""
    for name in ("wan2.1-t2v-1.3b", "wan2.1-t2v-14b", "wan2.2-t2v-a14b", "wan2.1-i2v-14b-720p"):
        assert architecture_key(_config(name)) == WAN21_VAE, name
    for name in ("wan2.2-ti2v-5b", "fastwan2.2-ti2v-5b", "hummingbird-xt"):
        assert architecture_key(_config(name)) == WAN22_VAE, name
    assert architecture_key(_config("tiny")) not in PEAK_FIT


@pytest.mark.parametrize("preset,dtype", [("wan2.1-t2v-1.3b", torch.float32), ("wan2.2-ti2v-5b", torch.bfloat16)])
def test_the_fit_matches_the_tracker_on_the_real_architectures(preset, dtype):
    """Random latents of 3 frames (the peak comes with the third) of 16 x 16 (128 x 128 / 256 x 256 pixels) through
    the real architecture on fake tensors, streamed: the estimate within 1% of the tracker's peak (the fit's own
    rows: < 0.3%)."""
    config = _config(preset)
    vae, fake = build_vae(config, dtype, fake=True)
    peak = decode_peak_bytes(vae, (1, config["z_dim"], 3, 16, 16), fake_mode=fake)
    estimate = decode_peak_estimate(config, 3, 16, 16, dtype.itemsize)
    assert abs(estimate - peak) / peak < 0.01, (estimate, peak)


def test_other_architectures_get_an_upper_bound():
    """A VAE of no fit of its own (tiny-ti2v's, a Wan2.2-type decoder): the generic estimate is above the tracker's
    peak, in bf16 and streamed, where it is the closest of the tiny VAEs (1.3x; 1.04x to 4.8x over the tiny VAEs,
    both dtypes, streamed and whole, when the rule was written)."""
    config = _config("tiny-ti2v")
    vae, fake = build_vae(config, torch.bfloat16, fake=True)
    peak = decode_peak_bytes(vae, (1, config["z_dim"], 3, 8, 36), fake_mode=fake)
    assert peak <= decode_peak_estimate(config, 3, 8, 36, 2) < 2 * peak


def test_the_estimate_at_real_sizes():
    """The formula's terms: linear in the latent frame's pixels, the latents three times, the whole decode two
    copies of the video on top; the peaks the module docstring quotes."""
    c21, c22 = _config("wan2.1-t2v-1.3b"), _config("wan2.2-ti2v-5b")
    slope, intercept = PEAK_FIT[WAN22_VAE][2]
    latents = 48 * 31 * 44 * 80 * 2
    assert decode_peak_estimate(c22, 31, 44, 80, 2) == slope * 44 * 80 + intercept + 3 * latents
    video = 3 * 121 * 704 * 1280 * 2
    assert decode_peak_estimate(c22, 31, 44, 80, 2, streamed=False) == \
        decode_peak_estimate(c22, 31, 44, 80, 2) + 2 * video
    assert round(decode_peak_estimate(c22, 31, 44, 80, 2) / GIB, 1) == 9.1
    assert round(decode_peak_estimate(c22, 31, 44, 80, 4) / GIB, 1) == 18.1
    assert round(decode_peak_estimate(c21, 21, 60, 104, 4) / GIB, 1) == 7.3
    assert round(decode_peak_estimate(c21, 21, 60, 104, 2) / GIB, 1) == 3.8
    # the frame count barely matters (the latents only), the frame size does
    more_frames = decode_peak_estimate(c21, 21, 60, 104, 4) - decode_peak_estimate(c21, 2, 60, 104, 4)
    assert more_frames == 3 * 16 * 19 * 6240 * 4
    with pytest.raises(ValueError):
        decode_peak_estimate(c21, 0, 60, 104, 4)
    with pytest.raises(ValueError):
        decode_peak_estimate(c21, 3, 60, 104, 8)


def test_auto_decides_by_the_estimate_against_the_free_memory():
    estimate = 8 * GIB
    need = math.ceil(estimate * SAFETY_FACTOR) + RESERVE_BYTES  # 11 GiB
    assert need == 11 * GIB
    fits = choose_tiling("auto", estimate, need, "cuda:0 free ...")
    assert not fits.tiled and (fits.estimate, fits.need, fits.available) == (estimate, need, need)
    assert fits.why() == ("--vae-tiling auto: the VAE decodes untiled: its estimated peak 8.00 GiB x 1.25 + 1.00 GiB "
                          "= 11.00 GiB <= 11.00 GiB available (cuda:0 free ...)")
    short = choose_tiling("auto", estimate, need - 1, "CPU MemAvailable")
    assert short.tiled
    assert short.why() == ("--vae-tiling auto: the VAE decodes tiled: its estimated peak 8.00 GiB x 1.25 + 1.00 GiB "
                           "= 11.00 GiB > 11.00 GiB available (CPU MemAvailable)")
    assert short.summary() == {"mode": "auto", "tiled": True, "estimated_peak_gib": 8.0, "needed_gib": 11.0,
                               "available_gib": 11.0, "available_from": "CPU MemAvailable",
                               "weights_to_move_gib": 0.0, "why": short.why()}
    moved = choose_tiling("auto", estimate, 12 * GIB, "cuda:0", weights=GIB // 2)  # --offload model: VAE on the CPU
    assert not moved.tiled and moved.need == need + GIB // 2
    assert "+ 1.00 GiB + 0.50 GiB of VAE weights to move = 11.50 GiB <= 12.00 GiB" in moved.why()


def test_on_off_and_unknown_memory():
    for mode, tiled in (("on", True), ("off", False)):
        choice = choose_tiling(mode, 100 * GIB, 1, "x")  # as given, whatever the memory
        assert choice.tiled is tiled and choice.estimate is None
        assert choice.why() == f"--vae-tiling {mode}: the VAE decodes {'tiled' if tiled else 'untiled'} " \
                               f"(--vae-tiling {mode})"
    # no memory reading: the earlier area rule (480 x 832 untiled, larger tiled)
    assert not choose_tiling("auto", GIB, None, "no /proc/meminfo", height=480, width=832).tiled
    unknown = choose_tiling("auto", GIB, None, "no /proc/meminfo", height=704, width=1280)
    assert unknown.tiled and unknown.why() == ("--vae-tiling auto: the VAE decodes tiled (free memory unknown "
                                               "(no /proc/meminfo): tiled above 480x832 pixels)")
    with pytest.raises(ValueError, match="auto, on or off"):
        choose_tiling("maybe", GIB, GIB, "x")


def test_the_condition_encode_keeps_the_area_rule():
    assert AREA_RULE_MAX_AREA == 480 * 832
    assert not encode_tiled("auto", 480, 832) and not encode_tiled("auto", 832, 480)
    assert encode_tiled("auto", 496, 832) and encode_tiled("auto", 704, 1280)
    assert encode_tiled("on", 16, 16) and not encode_tiled("off", 720, 1280)


def test_the_memory_read_on_cuda_and_on_the_cpu(monkeypatch):
    """CUDA (faked): the driver's free bytes plus the caching allocator's reserved-but-unallocated ones. CPU:
    /proc/meminfo's MemAvailable, at most the cgroup's headroom."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (30 * GIB, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i: 12 * GIB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda i: 10 * GIB)
    assert available_bytes("cuda") == (32 * GIB, "cuda:0 free 30.00 GiB + 2.00 GiB cached by torch")
    got, where = available_bytes("cpu")
    with open("/proc/meminfo") as f:
        mem_available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    assert where == "CPU MemAvailable" and 0 < got <= mem_available * 1.05  # (read a moment apart)


def test_decide_sets_the_vaes_tiling(vsagen_cache, monkeypatch):
    """The stock VAE's tiling follows the decision; weights not on the run's device count (a CPU VAE for a CUDA
    run: `--offload model`); a light decoder is not estimated and tiles in space for `on` only."""
    from diffusers import AutoencoderKLWan

    from conftest import saved_tiny

    vae = AutoencoderKLWan.from_pretrained(saved_tiny("tiny"), subfolder="vae")
    shape = (1, 16, 3, 8, 36)
    weights = sum(p.numel() * p.element_size() for p in vae.parameters())
    estimate = decode_peak_estimate(vae.config, 3, 8, 36, 4)
    need = math.ceil(estimate * SAFETY_FACTOR) + RESERVE_BYTES
    for free, tiled in ((need + weights, False), (need + weights - 1, True)):
        monkeypatch.setattr(tiling, "available_bytes", lambda device, free=free: (free, f"{device} faked"))
        choice = decide_decode_tiling(vae, shape, "auto", "cuda")
        assert choice.tiled is tiled and vae.use_tiling is tiled and choice.weights == weights
        assert choice.where == "cuda faked"
    assert decide_decode_tiling(vae, shape, "auto", "cpu").weights == 0  # on the CPU already
    assert not decide_decode_tiling(vae, shape, "off", "cpu").tiled and not vae.use_tiling
    assert decide_decode_tiling(vae, shape, "on", "cpu").tiled and vae.use_tiling


def test_the_light_decoder_keeps_its_rule(monkeypatch):
    from vsagen.decode.light_decoder import LightVaeDecoder

    class Vae:
        light_decoder = LightVaeDecoder.__new__(LightVaeDecoder)
        use_tiling = None

        def enable_tiling(self):
            self.use_tiling = True

        def disable_tiling(self):
            self.use_tiling = False

    monkeypatch.setattr(tiling, "available_bytes", lambda device: pytest.fail("the light decoder is not estimated"))
    vae = Vae()
    for mode, tiled in (("auto", False), ("off", False), ("on", True)):
        choice = decide_decode_tiling(vae, (1, 48, 3, 44, 80), mode, "cuda")
        assert choice.tiled is tiled and vae.use_tiling is tiled and choice.estimate is None
        assert "the light decoder" in choice.why()
