"""Fidelity metrics of one video against a reference video, and of one tensor against a reference tensor.

Videos are (F, H, W, 3) uint8 frames, as written to the mp4 (`vsagen.media.video.to_uint8_frames`), so the metrics
describe what a user sees (after the VAE decode and the 8-bit rounding), not the latents.

* PSNR (dB) = 10 log10(255^2 / MSE), MSE over every pixel and channel: per frame, and overall from the MSE of
  the whole video (not the mean of the per-frame dB values, which one identical frame would make infinite).
  Identical videos have MSE 0 and PSNR +inf (`math.inf`; `json_number` writes it as the string "inf").
* SSIM: scikit-image's `structural_similarity` with the settings of Wang et al. 2004 (Gaussian window
  sigma 1.5, K1 0.01, K2 0.03, population covariance, data range 255), averaged over the RGB channels; the
  overall value is the mean of the per-frame values. 1 for identical frames.
* relative L2 of attention outputs pooled over several calls (`pooled_rel_l2`; one pair: `vsagen.bench.rel_l2`).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

PIXEL_MAX = 255.0  # uint8 frames


def _check_videos(ref: np.ndarray, x: np.ndarray) -> None:
    """Raises ValueError unless both are (F, H, W, 3) uint8 of one shape."""
    for name, v in (("reference", ref), ("video", x)):
        if v.dtype != np.uint8 or v.ndim != 4 or v.shape[-1] != 3:
            raise ValueError(f"the {name} must be (F, H, W, 3) uint8 frames, got {v.dtype} {v.shape}")
    if ref.shape != x.shape:
        raise ValueError(f"the videos differ in shape: {ref.shape} vs {x.shape}")


def psnr_from_mse(mse: float) -> float:
    """PSNR in dB of 8-bit pixels for a mean squared error `mse` (in squared pixel levels): +inf for 0."""
    return math.inf if mse == 0 else 10.0 * math.log10(PIXEL_MAX ** 2 / mse)


def psnr_db(ref: np.ndarray, x: np.ndarray) -> tuple[float, list[float]]:
    """PSNR of video `x` against `ref`, overall and per frame.

    Args:
        ref, x: (F, H, W, 3) uint8 frames of one shape.

    Returns:
        (overall dB from the MSE of the whole video, [dB of each frame]); +inf where identical.

    Raises:
        ValueError: not two uint8 videos of one shape.
    """
    _check_videos(ref, x)
    err = np.square(ref.astype(np.float64) - x.astype(np.float64))
    per_frame = err.reshape(err.shape[0], -1).mean(axis=1)
    return psnr_from_mse(float(err.mean())), [psnr_from_mse(float(m)) for m in per_frame]


def ssim(ref: np.ndarray, x: np.ndarray) -> tuple[float, list[float]]:
    """SSIM of video `x` against `ref` (scikit-image, Wang et al.'s settings: module docstring), overall (mean of
    the frames) and per frame, each in [-1, 1] (1: identical).

    Args:
        ref, x: (F, H, W, 3) uint8 frames of one shape, each frame at least 7 x 7 pixels.

    Raises:
        ValueError: not two uint8 videos of one shape, or frames smaller than 7 x 7.
    """
    from skimage.metrics import structural_similarity

    _check_videos(ref, x)
    if min(ref.shape[1:3]) < 7:
        raise ValueError(f"SSIM needs frames of at least 7 x 7 pixels, got {ref.shape[2]} x {ref.shape[1]}")
    per_frame = [float(structural_similarity(a, b, data_range=PIXEL_MAX, channel_axis=-1, gaussian_weights=True,
                                             sigma=1.5, use_sample_covariance=False))
                 for a, b in zip(ref, x)]
    return float(np.mean(per_frame)), per_frame


def pooled_rel_l2(diff_sq: Sequence[float], ref_sq: Sequence[float]) -> float | None:
    """sqrt(sum ||x_i - ref_i||^2 / sum ||ref_i||^2) of several (x, ref) pairs given their squared norms: the
    relative L2 of all the pairs as one tensor. 0.0 when every difference is 0; None when not finite."""
    d, r = float(sum(diff_sq)), float(sum(ref_sq))
    if d == 0.0:
        return 0.0
    value = math.sqrt(d / r) if r > 0 else math.inf
    return value if math.isfinite(value) else None


def json_number(x: float | None) -> float | str | None:
    """A metric for JSON (which has no infinity): +inf -> "inf", -inf -> "-inf", NaN -> None, others unchanged."""
    if x is None or math.isnan(x):
        return None
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x
