"""A video request of `vsagen serve`: the HTTP body's fields (OpenAI's `POST /v1/videos`: prompt, model, seconds,
size; vsagen's own as extra fields: steps, seed, guidance, negative_prompt, frames), checked and typed once
(`parse_fields`), then turned into the command line's request: the server's options, parsed once at its start,
with the video's fields put into their groups (which check them with the command line's own words) and resolved as
`vsagen t2v` resolves one (`Served.config`). And the job as OpenAI's `video` object (`video_object`).

A field's text comes as JSON (typed values) or as a multipart form (the `openai` SDK's `videos.create` sends one;
every value text): both are read to the same typed values. Files are named by the job's id only; no path comes
from a request.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from ..commands.generate_config import RunConfig, resolve_run, video_options
from ..errors import BadInput
from ..request.options import RequestOptions

# OpenAI's fields, then vsagen's
FIELDS = ("prompt", "model", "seconds", "size", "input_reference", "steps", "seed", "guidance", "negative_prompt",
          "frames")
_SIZE = re.compile(r"^([0-9]{1,5})x([0-9]{1,5})$")
_INTEGER = re.compile(r"^[+-]?[0-9]{1,20}$")
_ID = re.compile(r"^video_[0-9a-f]{32}$")
# the longest clip a request may ask for, before the model's own limits (a bound on the arithmetic)
MAX_SECONDS = 600.0


def valid_id(text: str) -> bool:
    """Whether `text` has the form of a job id ("video_" and 32 lowercase hex digits)."""
    return bool(_ID.match(text))


@dataclass(frozen=True)
class VideoFields:
    """A video request's fields, typed (None: not given, the server's default).

    Attributes:
        prompt: the text; model: the model asked for (None: the served one).
        seconds: the clip's length in seconds (> 0); frames: the exact frame count (vsagen's, over `seconds`).
        width, height: pixels (OpenAI's `size`, "WIDTHxHEIGHT").
        steps, seed, guidance, negative_prompt: as `vsagen t2v`'s --steps, --seed, --guidance, --negative-prompt.
    """

    prompt: str
    model: str | None = None
    seconds: float | None = None
    frames: int | None = None
    width: int | None = None
    height: int | None = None
    steps: int | None = None
    seed: int | None = None
    guidance: float | None = None
    negative_prompt: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The fields as a JSON object (what the job store keeps)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "VideoFields":
        """The fields `to_json` gave."""
        return cls(**data)


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise BadInput(f"{name} must be a string, got {type(value).__name__}")
    return value


def _integer(name: str, value: Any, form: bool) -> int:
    if form and isinstance(value, str) and _INTEGER.match(value.strip()):
        return int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadInput(f"{name} must be an integer, got {value!r}")
    return value


def _number(name: str, value: Any, form: bool) -> float:
    if isinstance(value, str) and (form or name == "seconds"):
        try:
            value = float(value.strip())
        except ValueError:
            raise BadInput(f"{name} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadInput(f"{name} must be a number, got {value!r}")
    return float(value)


def parse_fields(body: Mapping[str, Any], *, form: bool) -> VideoFields:
    """Check and type a `POST /v1/videos` body: a JSON object (`form` False: integers and numbers as JSON's,
    `seconds` also as text, as OpenAI sends it) or a multipart form (`form`: every value text).

    Raises:
        BadInput: an unknown field (naming the known ones), no prompt, a value of the wrong type, a size that is
            not WIDTHxHEIGHT, seconds outside (0, MAX_SECONDS], an `input_reference` (image to video is not
            served).
    """
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise BadInput(f"unknown field {unknown[0]!r}; a video request takes {', '.join(FIELDS)}")
    if "input_reference" in body:
        raise BadInput("input_reference: this server makes text-to-video videos; image to video is not served")
    if "prompt" not in body:
        raise BadInput("prompt is missing: say what the video should show")
    out: dict[str, Any] = {"prompt": _text("prompt", body["prompt"])}
    for name in ("model", "negative_prompt"):
        if body.get(name) is not None:
            out[name] = _text(name, body[name])
    for name in ("steps", "seed", "frames"):
        if body.get(name) is not None:
            out[name] = _integer(name, body[name], form)
    if body.get("guidance") is not None:
        out["guidance"] = _number("guidance", body["guidance"], form)
    if body.get("seconds") is not None:
        seconds = _number("seconds", body["seconds"], form)
        if not 0 < seconds <= MAX_SECONDS:
            raise BadInput(f"seconds must be in (0, {MAX_SECONDS:g}], got {body['seconds']!r}")
        out["seconds"] = seconds
    if body.get("size") is not None:
        match = _SIZE.match(_text("size", body["size"]).strip())
        if match is None:
            raise BadInput(f"size must be WIDTHxHEIGHT in pixels (e.g. 160x96), got {body['size']!r}")
        out["width"], out["height"] = int(match[1]), int(match[2])
    return VideoFields(**out)


def frames_of(seconds: float, fps: int, stride: int) -> int:
    """The frame count of a clip of `seconds` at `fps`: the video's frames are `stride`k+1 (Wan's VAE), so the
    `seconds * fps` frames round up to the next whole latent frame, plus the first."""
    return 1 + stride * max(1, math.ceil(seconds * fps / stride - 1e-9))


@dataclass(frozen=True)
class Served:
    """What one server runs: the command line's options (parsed once, at start), the request it loaded, where
    the videos go.

    Attributes:
        options: the `vsagen serve` options (`vsagen.request.options.RequestOptions`), every group as parsed.
        request: `options` resolved with a placeholder prompt (the loaded configuration, `Resident.request`).
        videos: the folder of the videos and their JSON (`<id>.mp4`, `<id>.json`).
    """

    options: RequestOptions
    request: RunConfig
    videos: Path

    def paths(self, job_id: str) -> tuple[Path, Path]:
        """The video and the JSON of job `job_id`."""
        return self.videos / f"{job_id}.mp4", self.videos / f"{job_id}.json"

    def config(self, job_id: str, fields: VideoFields) -> RunConfig:
        """The `vsagen t2v` request of one video: the server's options with the video's fields in their groups
        (each group checks them as on the command line), resolved (`resolve_run`: the model's sizes, frames and
        steps), its files the job's (replaced if an earlier attempt left them).

        Raises:
            BadInput: another model than the served one, or what the command line refuses, in its words.
        """
        served = self.request.model
        if fields.model is not None and fields.model != served:
            raise BadInput(f"model {fields.model!r} is not served here; this server runs {served!r}")
        frames = fields.frames
        if frames is None and fields.seconds is not None:
            frames = frames_of(fields.seconds, self.request.fps, self.request.source.preset.vae_stride_temporal)
        options = video_options(self.options, height=fields.height, width=fields.width, frames=frames,
                                steps=fields.steps, seed=fields.seed, guidance=fields.guidance,
                                negative_prompt=fields.negative_prompt)
        video, _ = self.paths(job_id)
        output = replace(options.output, out=video, overwrite=True, sheet=False)
        return resolve_run(fields.prompt, replace(options, output=output))


def accepted(fields: VideoFields, cfg: RunConfig) -> dict[str, Any]:
    """What the store keeps of an accepted video: its fields as asked ("request") and the video they resolved to
    ("video": model, frames, fps, width, height, steps, seed), for the answers."""
    return {"request": fields.to_json(),
            "video": {"model": cfg.model, "frames": cfg.frames, "fps": cfg.fps, "width": cfg.width,
                      "height": cfg.height, "steps": cfg.steps, "seed": cfg.seed}}


def video_object(job: Any, steps_done: int | None = None) -> dict[str, Any]:
    """OpenAI's `video` object of a job (`vsagen.serve.store.Job` whose fields `accepted` gave): id, object, model,
    status, progress, created_at, completed_at, expires_at (None: kept until deleted), prompt, seconds (text),
    size ("WIDTHxHEIGHT"), remixed_from_video_id (None), error ({code, message} or None); and vsagen's own under
    "vsagen": frames, fps, steps, seed, steps_done (while it runs), attempts, the timing JSON's URL."""
    video = job.fields["video"]
    return {
        "id": job.id, "object": "video", "model": video["model"], "status": job.status,
        "progress": int(job.progress), "created_at": job.created_at, "completed_at": job.completed_at,
        "expires_at": None, "prompt": job.fields["request"]["prompt"],
        "seconds": f"{video['frames'] / video['fps']:g}", "size": f"{video['width']}x{video['height']}",
        "remixed_from_video_id": None,
        "error": {"code": job.error_code, "message": job.error_message} if job.status == "failed" else None,
        "vsagen": {**{k: video[k] for k in ("frames", "fps", "steps", "seed")}, "steps_done": steps_done,
                   "attempts": job.attempts,
                   "timing_url": f"/v1/videos/{job.id}/timing" if job.status == "completed" else None},
    }
