"""vsagen.media.encoding: `--codec` parsed and checked, the ffmpeg options it stands for, and the NVENC probe's
one-line refusal where no NVIDIA encoder is (the encoding reaching ffmpeg: tests/media/test_video.py)."""

from __future__ import annotations

import re

import pytest

from vsagen.errors import BadInput
from vsagen.media.encoding import Encoding, check_encoder


def test_encoding_parses_checks_and_says_its_ffmpeg_options():
    """`--codec NAME[:preset=P][:crf=N]`: the defaults (x264 veryfast, CRF 10: the quality vsagen always wrote),
    NVENC's own presets, and one-line refusals."""
    assert Encoding.parse(None) == Encoding("x264", "veryfast", 10)
    assert Encoding.parse("x264:crf=18").ffmpeg_params() == ["-preset", "veryfast", "-crf", "18"]
    assert Encoding.parse("x264:preset=medium:crf=0:segments=2").text() == "x264:preset=medium:crf=0:threads=0:segments=2"
    # a new-user trial: crf 0 wrote a High 4:4:4 Predictive stream, which browsers do not play, without a word
    assert "High 4:4:4 Predictive profile, which browsers do not play" in Encoding.parse("x264:crf=0").note()
    assert Encoding.parse("x264:crf=1").note() is None and Encoding().note() is None
    assert Encoding.parse("nvenc").ffmpeg_params() == ["-preset", "p4", "-rc", "vbr", "-cq", "10"]
    for bad, says in (("h265", "x264 or nvenc"), ("x264:crf=52", "[0, 51]"), ("x264:crf=1.5", "[0, 51]"),
                      ("x264:preset=p1", "preset must be"), ("nvenc:preset=veryfast", "preset must be"),
                      ("x264:crf", "options are"), ("x264:crf=1:crf=2", "each once"), ("x264:speed=1", "options")):
        with pytest.raises(BadInput, match=re.escape(says)):
            Encoding.parse(bad)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU may have an NVENC engine")
def test_nvenc_without_an_nvidia_encoder_is_refused_in_one_line():
    check_encoder(Encoding())  # x264: nothing to probe
    with pytest.raises(BadInput, match=r"--codec nvenc: the bundled ffmpeg cannot open NVIDIA's h264_nvenc") as e:
        check_encoder(Encoding("nvenc"))
    assert "\n" not in str(e.value)
