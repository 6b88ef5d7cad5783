"""vsagen.media.metrics: PSNR against the textbook formula on known perturbations, SSIM against an independent
implementation of Wang et al.'s Gaussian-window SSIM (numpy + scipy), the pooled relative L2 against one
concatenated tensor, and the JSON form of infinities."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from vsagen.media.metrics import json_number, pooled_rel_l2, psnr_db, psnr_from_mse, ssim

# PSNR and SSIM are computed in float64 from uint8 frames: the only error is float64 rounding of sums over
# ~1e5 values (~1e-12 relative); 1e-9 leaves room and catches any formula difference.
TOL = 1e-9


def video(frames=3, h=24, w=32, seed=0, lo=0, hi=256):
    return np.random.default_rng(seed).integers(lo, hi, (frames, h, w, 3), dtype=np.uint8)


def test_psnr_of_a_known_perturbation():
    """n values of frame 1 moved by +d (no clipping: values in [10, 240]): MSE = n d^2 / (values of the video),
    frame 1's MSE = n d^2 / (values of a frame), the other frames identical (+inf)."""
    ref = video(lo=10, hi=241)
    x = ref.copy()
    rng = np.random.default_rng(1)
    flat = x[1].reshape(-1)
    idx = rng.choice(flat.size, size=100, replace=False)
    d = 7
    flat[idx] += d
    x[1] = flat.reshape(x[1].shape)
    overall, per_frame = psnr_db(ref, x)
    assert math.isclose(overall, 10 * math.log10(255**2 / (100 * d**2 / ref.size)), rel_tol=TOL)
    assert per_frame[0] == per_frame[2] == math.inf
    assert math.isclose(per_frame[1], 10 * math.log10(255**2 / (100 * d**2 / ref[1].size)), rel_tol=TOL)


def test_psnr_identical_is_infinite_and_one_level_everywhere_is_48_db():
    ref = video(lo=0, hi=255)
    assert psnr_db(ref, ref) == (math.inf, [math.inf] * 3)
    overall, per_frame = psnr_db(ref, ref + 1)  # MSE exactly 1: 20 log10(255)
    assert math.isclose(overall, 20 * math.log10(255), rel_tol=TOL) and overall == pytest.approx(48.1308, abs=1e-4)
    assert all(math.isclose(p, overall, rel_tol=TOL) for p in per_frame)
    assert psnr_from_mse(0.0) == math.inf


def ssim_reference(a: np.ndarray, b: np.ndarray) -> float:
    """Wang et al. 2004 SSIM of one (H, W, 3) uint8 pair, written from the paper: Gaussian window sigma 1.5
    (truncated at 3.5 sigma, reflected at the borders), K1 0.01, K2 0.03, L 255, population (co)variances, the
    mean over the pixels at least the window radius from the border, averaged over the channels."""
    from scipy.ndimage import gaussian_filter

    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    radius = int(3.5 * 1.5 + 0.5)
    out = []
    for ch in range(3):
        x, y = a[..., ch].astype(np.float64), b[..., ch].astype(np.float64)
        g = lambda z: gaussian_filter(z, 1.5, truncate=3.5, mode="reflect")  # noqa: E731
        mx, my = g(x), g(y)
        vx, vy, cxy = g(x * x) - mx * mx, g(y * y) - my * my, g(x * y) - mx * my
        s = (2 * mx * my + c1) * (2 * cxy + c2) / ((mx * mx + my * my + c1) * (vx + vy + c2))
        out.append(s[radius:-radius, radius:-radius].mean())
    return float(np.mean(out))


def test_ssim_matches_an_independent_implementation():
    ref = video(seed=2)
    noisy = np.clip(ref.astype(np.int16) + np.random.default_rng(3).integers(-40, 41, ref.shape), 0, 255)
    x = noisy.astype(np.uint8)
    overall, per_frame = ssim(ref, x)
    expected = [ssim_reference(a, b) for a, b in zip(ref, x)]
    assert per_frame == pytest.approx(expected, rel=TOL, abs=TOL)
    assert overall == pytest.approx(float(np.mean(expected)), rel=TOL)
    assert 0.1 < overall < 0.99  # a real difference, not a degenerate case


def test_ssim_identical_is_one():
    ref = video(seed=4)
    overall, per_frame = ssim(ref, ref)
    assert overall == pytest.approx(1.0, abs=1e-12) and per_frame == pytest.approx([1.0] * 3, abs=1e-12)


@pytest.mark.parametrize("fn", [psnr_db, ssim])
def test_bad_videos_raise(fn):
    ref = video()
    with pytest.raises(ValueError, match="shape"):
        fn(ref, ref[:2])
    with pytest.raises(ValueError, match="uint8"):
        fn(ref.astype(np.float32), ref)
    if fn is ssim:
        with pytest.raises(ValueError, match="7 x 7"):
            fn(ref[:, :6], ref[:, :6])


def test_pooled_rel_l2_equals_the_rel_l2_of_the_concatenation():
    g = torch.Generator().manual_seed(0)
    refs = [torch.randn(50 + 10 * i, generator=g, dtype=torch.float64) for i in range(3)]
    xs = [r + 0.1 * torch.randn(r.shape, generator=g, dtype=torch.float64) for r in refs]
    got = pooled_rel_l2([float((x - r).square().sum()) for x, r in zip(xs, refs)],
                        [float(r.square().sum()) for r in refs])
    x, r = torch.cat(xs), torch.cat(refs)
    assert got == pytest.approx(float((x - r).norm() / r.norm()), rel=1e-12)
    assert pooled_rel_l2([0.0, 0.0], [1.0, 2.0]) == 0.0
    assert pooled_rel_l2([1.0], [0.0]) is None and pooled_rel_l2([math.nan], [1.0]) is None


def test_json_number():
    assert [json_number(x) for x in (math.inf, -math.inf, math.nan, None, 1.5)] == ["inf", "-inf", None, None, 1.5]
    json.dumps([json_number(math.inf)], allow_nan=False)  # valid JSON
