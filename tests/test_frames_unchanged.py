"""The tiny model's frames under `full` and `vsa` (torch) are the ones recorded before issue 11's refactor.

`tests/data/frames_before_issue11.npz` was written by the code of commit 2ff0614 (the last one before the
refactor of the backend seams, the orchestrator and the kernels): `vsagen t2v --model tiny --frames 5 --height 64
--width 80 --steps 2 --seed 3` (grid 2x4x5: partial tiles on two axes), `full`, and `vsa --sparsity 0.5
--attn-impl torch`, on CPU in float32. The refactor was meant to change no arithmetic, so the uint8 frames may
differ only by rounding: at most one level.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vsagen.commands.generate_config import resolve_generate as resolve

REFERENCE = Path(__file__).parent / "data" / "frames_before_issue11.npz"
MAX_LEVELS = 1  # uint8 levels: float32 summation-order noise may flip a rounding, nothing more


@pytest.mark.slow
@pytest.mark.parametrize("attn,options", [("full", {}), ("vsa", {"sparsity": 0.5, "attn_impl": "torch"})])
def test_frames_match_the_recorded_reference(vsagen_cache, tmp_path, monkeypatch, attn, options):
    import vsagen.media.video as video
    from vsagen.commands.generate import generate

    written = {}
    encode_mp4_stream = video.encode_mp4_stream

    def capture(chunks, path, *args, **kwargs):  # t2v streams the decode into the encoder (issue 32)
        chunks = [c.copy() for c in chunks]
        written["frames"] = np.concatenate(chunks)
        return encode_mp4_stream(iter(chunks), path, *args, **kwargs)

    monkeypatch.setattr(video, "encode_mp4_stream", capture)
    cfg = resolve("a red fox in the snow", model="tiny", attn=attn, frames=5, height=64, width=80, steps=2, seed=3,
                  device="cpu", out=tmp_path / f"{attn}.mp4", **options)  # recorded on CPU in float32
    generate(cfg, progress=False)
    want = np.load(REFERENCE)[attn]
    got = written["frames"]
    assert got.shape == want.shape == (5, 64, 80, 3)
    assert np.abs(got.astype(np.int16) - want.astype(np.int16)).max() <= MAX_LEVELS


def test_reference_tells_the_backends_apart():
    """The recorded `vsa` frames differ from `full`'s, so the test above would notice a backend swap."""
    ref = np.load(REFERENCE)
    assert (ref["full"] != ref["vsa"]).mean() > 0.1
