"""How the mp4s are encoded: `Encoding`, the parsed `--codec NAME[:preset=P][:crf=N][:threads=T][:segments=S]`
(H.264 through imageio-ffmpeg's bundled ffmpeg: x264 on the CPU or NVIDIA's NVENC), its refusals, the ffmpeg
options it stands for, and `check_encoder`, the probe that the encoder opens on this machine. The writers that use
it: `vsagen.media.video`, `vsagen.media.segments`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import BadInput
from . import ffmpeg_pipe


X264_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow")
NVENC_PRESETS = ("p1", "p2", "p3", "p4", "p5", "p6", "p7")
CODECS = {"x264": "libx264", "nvenc": "h264_nvenc"}  # --codec NAME -> ffmpeg's encoder
# x264's default segments (`segments=N`): the one constant to change once `benchmarks/encode_options.py` has measured
# a faster choice on the GPU machine's CPU; 1 is one ffmpeg for the whole video, as vsagen always wrote
X264_SEGMENTS = 1
# --codec's integer options and their bounds (x264's own limit on threads: 128)
_BOUNDS = {"crf": (0, 51), "threads": (0, 128), "segments": (1, 64)}


@dataclass(frozen=True)
class Encoding:
    """How the mp4s are encoded (`--codec NAME[:preset=P][:crf=N][:threads=T][:segments=S]`): H.264, yuv420p,
    exactly H x W, through imageio-ffmpeg's bundled ffmpeg (the command built with ffmpeg-python:
    `vsagen.media.ffmpeg_pipe`).

    Attributes:
        codec: "x264" (libx264 on the CPU) or "nvenc" (NVIDIA's h264_nvenc, where the GPU has an NVENC engine).
        preset: x264's speed preset (X264_PRESETS; default veryfast: measured 2.8x faster than x264's own default
            medium at CRF 10 for the same size and 0.1 dB less PSNR, BENCHMARKS.md) or NVENC's p1-p7.
        crf: constant quality, 0-51, lower is better (x264's -crf; NVENC's -cq): 10, the quality vsagen always
            wrote (imageio's quality 8).
        threads: x264's threads per ffmpeg (-threads), 0-128; 0 (default) lets x264 choose (1.5 x the cores).
        segments: x264 only: the video cut into this many contiguous segments encoded by as many ffmpeg processes
            at once and joined without re-encoding (`vsagen.media.segments`; at least 4 frames a segment, fewer
            frames make fewer segments), 1-64; default X264_SEGMENTS.

    Raises:
        BadInput: an unknown codec or preset, a crf outside [0, 51], threads or segments out of bounds, or either
            given to nvenc.
    """

    codec: str = "x264"
    preset: str | None = None
    crf: int = 10
    threads: int = 0
    segments: int | None = None

    def __post_init__(self) -> None:
        if self.codec not in CODECS:
            raise BadInput(f"--codec must be {' or '.join(CODECS)}, got {self.codec!r}")
        presets = X264_PRESETS if self.codec == "x264" else NVENC_PRESETS
        if self.preset is None:
            object.__setattr__(self, "preset", "veryfast" if self.codec == "x264" else "p4")
        if self.segments is None:
            object.__setattr__(self, "segments", X264_SEGMENTS if self.codec == "x264" else 1)
        if self.preset not in presets:
            raise BadInput(f"--codec {self.codec}: preset must be one of {', '.join(presets)}, got {self.preset!r}")
        for key, (low, high) in _BOUNDS.items():
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise BadInput(f"--codec {self.codec}: {key} must be an integer in [{low}, {high}], got {value!r}")
        if self.codec != "x264" and (self.threads, self.segments) != (0, 1):
            raise BadInput(f"--codec {self.codec}: threads and segments are x264's options; leave them out")

    @classmethod
    def parse(cls, text: str | None) -> "Encoding":
        """`NAME[:preset=P][:crf=N][:threads=T][:segments=S]` (None: the defaults). Raises BadInput, one line."""
        if text is None:
            return cls()
        name, *pairs = str(text).strip().split(":")
        fields: dict[str, Any] = {}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep or key not in ("preset", *_BOUNDS) or key in fields:
                raise BadInput(f"--codec {text}: options are preset=P, crf=N, threads=T and segments=S, each once "
                               "(e.g. x264:crf=18)")
            try:
                fields[key] = value if key == "preset" else int(value)
            except ValueError:
                low, high = _BOUNDS[key]
                raise BadInput(f"--codec {text}: {key} must be an integer in [{low}, {high}], got {value!r}") from None
        return cls(name, **fields)

    def text(self) -> str:
        extra = f":threads={self.threads}:segments={self.segments}" if self.codec == "x264" else ""
        return f"{self.codec}:preset={self.preset}:crf={self.crf}{extra}"

    def note(self) -> str | None:
        """The run note this encoding calls for: x264 at crf 0 is lossless, for which libx264 writes its High 4:4:4
        Predictive profile even from yuv420p, and browsers do not play that. None otherwise."""
        if self.codec == "x264" and self.crf == 0:
            return ("--codec x264:crf=0 is lossless: libx264 then writes the High 4:4:4 Predictive profile, which "
                    "browsers do not play (players such as VLC and ffplay do); crf 1 or more plays everywhere")
        return None

    def ffmpeg_options(self) -> dict[str, str]:
        """ffmpeg's output options for this encoding besides the encoder, as ffmpeg-python takes them (no dash);
        `-threads` only where set (x264's own choice otherwise, the command vsagen always ran)."""
        quality = {"crf": str(self.crf)} if self.codec == "x264" else {"rc": "vbr", "cq": str(self.crf)}
        return {"preset": self.preset, **quality, **({"threads": str(self.threads)} if self.threads else {})}

    def ffmpeg_params(self) -> list[str]:
        """ffmpeg's output options for this encoding (after `-vcodec`), as command-line words."""
        return [word for key, value in self.ffmpeg_options().items() for word in (f"-{key}", value)]


def check_encoder(encoding: Encoding) -> None:
    """Make sure the bundled ffmpeg can open `encoding`'s encoder here: x264 always can; NVENC needs an NVIDIA GPU
    with an NVENC engine and its driver library (a 0.1 s probe: ffmpeg encodes 4 blank frames to nowhere).

    Raises:
        BadInput: NVENC cannot be opened (one line, with ffmpeg's reason)."""
    if encoding.codec == "x264":
        return
    import subprocess

    probe = ffmpeg_pipe.probe_command(CODECS[encoding.codec], encoding.ffmpeg_options())
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BadInput(f"--codec {encoding.codec}: ffmpeg could not be run ({e})") from None
    if done.returncode != 0:
        lines = [line.split("] ", 1)[-1] for line in done.stderr.strip().splitlines()]  # ffmpeg's "[enc @ 0x..] "
        reason = next((line for line in lines if "nvenc" in line.lower() or "cuda" in line.lower()),
                      lines[0] if lines else "no reason given")
        raise BadInput(f"--codec {encoding.codec}: the bundled ffmpeg cannot open NVIDIA's h264_nvenc here "
                       f"({reason}); NVENC needs an NVIDIA GPU with an encoder engine (Hopper's H100 / H200 have "
                       f"none); use --codec x264")
