"""A video request of `vsagen serve`: the HTTP body's fields (OpenAI's `POST /v1/videos`: prompt, model, seconds,
size, input_reference; vsagen's own as extra fields: steps, seed, guidance, negative_prompt, frames, fit, attn),
checked and typed once (`parse_fields`), then turned into the command line's request: the server's options, parsed
once at its start, with the video's fields put into their groups (which check them with the command line's own
words) and resolved as `vsagen t2v` / `vsagen i2v` resolve one (`Served.config`): the uploaded image read and
sized as `vsagen i2v` reads its IMAGE, the `attn` entry parsed as `--attn` is and kept to the options the loaded
backend can change per run (`vsagen.request.backends.per_run_spec`). And the job as OpenAI's `video` object
(`video_object`).

A field's text comes as JSON (typed values) or as a multipart form (the `openai` SDK's `videos.create` sends one;
every value text): both are read to the same typed values. `input_reference` (image to video) is a file part of a
form; its bytes are kept beside the job as `FOLDER/images/<id>.<png|jpg|webp>` (`Served.save_image`). Files are
named by the job's id only; no path comes from a request.
"""

from __future__ import annotations

import math
import os
import re
import secrets
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from ..commands.generate_config import RunConfig, resolve_run, video_options
from ..errors import BadInput
from ..request.backends import per_run_spec
from ..request.options import ImageFit, RequestOptions

# OpenAI's fields, then vsagen's
FIELDS = ("prompt", "model", "seconds", "size", "input_reference", "steps", "seed", "guidance", "negative_prompt",
          "frames", "fit", "attn")
# the suffix an uploaded image is kept under, by its first bytes (`image_suffix`; what it holds is `vsagen i2v`'s
# to check when the job is resolved)
_MAGIC = ((b"\x89PNG\r\n\x1a\n", "png"), (b"\xff\xd8\xff", "jpg"))
IMAGE_SUFFIXES = ("png", "jpg", "webp", "bin")
_SIZE = re.compile(r"^([0-9]{1,5})x([0-9]{1,5})$")
_INTEGER = re.compile(r"^[+-]?[0-9]{1,20}$")
_ID = re.compile(r"^video_[0-9a-f]{32}$")
# the longest clip a request may ask for, before the model's own limits (a bound on the arithmetic)
MAX_SECONDS = 600.0


# the command line's options that are a video request's fields, as the command line's refusals name them
_OPTION_FIELDS = {"--steps": "steps", "--seed": "seed", "--guidance": "guidance", "--negative-prompt": "negative_prompt",
                  "--frames": "frames", "--height": "size", "--width": "size", "--fit": "fit", "--attn": "attn"}
_LEADING_NAME = re.compile(r"(?:the )?(--[a-z-]+|[a-z_]+)")


def field_of(message: str) -> str | None:
    """The field a refusal's one-line `message` is about (OpenAI's error `param`), from its first words: a field's
    name ("prompt must be a string, got int", "the prompt is empty", "input_reference: ..."), the command line's
    option in its own words ("--width must be a positive multiple of 16": size), an unknown field ("unknown field
    'out'": out); None where they name no field ("the body is not valid JSON")."""
    unknown = re.match(r"unknown field '([^']*)'", message)
    if unknown:
        return unknown[1]
    lead = _LEADING_NAME.match(message)
    word = lead[1] if lead else ""
    return _OPTION_FIELDS.get(word, word if word in FIELDS else None)


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
        image: the uploaded image's suffix (`IMAGE_SUFFIXES`; None: no image), kept at `Served.image_path`.
        fit: as `vsagen i2v`'s --fit (crop | resize; None: crop).
        attn: an `--attn` entry for this video (e.g. "vsa:sparsity=0.9"; None: the loaded backend as it is).
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
    image: str | None = None
    fit: str | None = None
    attn: str | None = None

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


def parse_fields(body: Mapping[str, Any], *, form: bool, image: str | None = None) -> VideoFields:
    """Check and type a `POST /v1/videos` body: a JSON object (`form` False: integers and numbers as JSON's,
    `seconds` also as text, as OpenAI sends it) or a multipart form (`form`: every value text), its
    `input_reference` file taken out by the caller, which passes its suffix as `image` (`image_suffix`).

    Raises:
        BadInput: an unknown field (naming the known ones), no prompt, a value of the wrong type, a size that is
            not WIDTHxHEIGHT, seconds outside (0, MAX_SECONDS], a fit other than crop / resize, an
            `input_reference` that is not a file part of a form.
    """
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise BadInput(f"unknown field {unknown[0]!r}; a video request takes {', '.join(FIELDS)}")
    if "input_reference" in body:
        given = body["input_reference"]
        raise BadInput("input_reference must be an image file: send it as a file part of a multipart/form-data body "
                       "(the openai SDK's videos.create(input_reference=open(PATH, 'rb')) does), got "
                       + ("text" if isinstance(given, str) else type(given).__name__))
    if "prompt" not in body:
        raise BadInput("prompt is missing: say what the video should show")
    out: dict[str, Any] = {"prompt": _text("prompt", body["prompt"])}
    for name in ("model", "negative_prompt", "attn"):
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
    if body.get("fit") is not None:
        out["fit"] = ImageFit.parse(_text("fit", body["fit"]).strip(), "fit").value
    if image is not None:
        out["image"] = image
    return VideoFields(**out)


def image_suffix(data: bytes) -> str:
    """The suffix an uploaded image is kept under, from its first bytes: png, jpg, webp, else bin (which `vsagen
    i2v`'s reading then refuses, in its words)."""
    for magic, suffix in _MAGIC:
        if data.startswith(magic):
            return suffix
    return "webp" if data[:4] == b"RIFF" and data[8:12] == b"WEBP" else "bin"


def frames_of(seconds: float, fps: int, stride: int) -> int:
    """The frame count of a clip of `seconds` at `fps`: the video's frames are `stride`k+1 (Wan's VAE), so the
    `seconds * fps` frames round up to the next whole latent frame, plus the first."""
    return 1 + stride * max(1, math.ceil(seconds * fps / stride - 1e-9))


@dataclass(frozen=True)
class Served:
    """What one server runs: the command line's options (parsed once, at start), the request it loaded, where
    the videos and the uploaded images go.

    Attributes:
        options: the `vsagen serve` options (`vsagen.request.options.RequestOptions`), every group as parsed.
        request: `options` resolved with a placeholder prompt (the loaded configuration, `Resident.request`; for an
            image-to-video model without an image, `RunConfig.images_per_video`).
        videos: the folder of the videos and their JSON (`<id>.mp4`, `<id>.json`); the images are in `images`
            beside it.
    """

    options: RequestOptions
    request: RunConfig
    videos: Path

    @property
    def images(self) -> Path:
        """The folder of the uploaded images (`<id>.<suffix>`), beside `videos`."""
        return self.videos.parent / "images"

    def paths(self, job_id: str) -> tuple[Path, Path]:
        """The video and the JSON of job `job_id`."""
        return self.videos / f"{job_id}.mp4", self.videos / f"{job_id}.json"

    def image_path(self, job_id: str, suffix: str) -> Path:
        """Where job `job_id`'s uploaded image is kept (`suffix`: one of `IMAGE_SUFFIXES`)."""
        if suffix not in IMAGE_SUFFIXES or not valid_id(job_id):
            raise ValueError(f"not a job's image: {job_id!r}, {suffix!r}")
        return self.images / f"{job_id}.{suffix}"

    def save_image(self, job_id: str, suffix: str, data: bytes) -> Path:
        """Write job `job_id`'s uploaded image (its bytes as sent) to `image_path`, whole or not at all (a hidden
        temporary renamed into place; `vsagen.serve.server.recover` removes one a crash left)."""
        path = self.image_path(job_id, suffix)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return path

    def job_images(self, job_id: str) -> list[Path]:
        """The images kept for job `job_id` (none or one)."""
        return [p for p in (self.images / f"{job_id}.{s}" for s in IMAGE_SUFFIXES) if p.is_file()]

    def check_image(self, fields: VideoFields) -> None:
        """An image where the served model takes one (an image-to-video model: always; a text-image-to-video one:
        where the video starts from one, text alone otherwise), none where it does not.

        Raises:
            BadInput: an image for a text-to-video server, none for an image-to-video one.
        """
        cfg = self.request
        if fields.image is not None and not cfg.source.takes_image:
            raise BadInput(f"input_reference: this server runs {cfg.model}, which makes videos from text and takes no "
                           "image; image to video needs a server of an image-to-video model (e.g. vsagen serve "
                           "--model tiny-i2v)")
        if fields.image is None and cfg.images_per_video:
            raise BadInput(f"input_reference is missing: this server runs {cfg.model}, an image-to-video model; send "
                           "the image the video starts from as input_reference, a file part of a multipart/form-data "
                           "body")
        if fields.fit is not None and fields.image is None:
            raise BadInput("fit says how input_reference is fitted to the video's size; give it with an image")

    def config(self, job_id: str, fields: VideoFields) -> RunConfig:
        """The `vsagen t2v` / `vsagen i2v` request of one video: the server's options with the video's fields in
        their groups (each group checks them as on the command line), resolved (`resolve_run`: the model's sizes,
        frames and steps; the image read and checked against the size as `vsagen i2v` reads its IMAGE, named
        "input_reference" in the messages), its backend's options changed as `attn` asks (`per_run_spec`), its
        files the job's (replaced if an earlier attempt left them).

        Raises:
            BadInput: another model than the served one, an image where none is taken or none where one is, an
                `attn` the loaded backend cannot take per run, or what the command line refuses, in its words.
        """
        served = self.request.model
        if fields.model is not None and fields.model != served:
            raise BadInput(f"model {fields.model!r} is not served here; this server runs {served!r}")
        self.check_image(fields)
        frames = fields.frames
        if frames is None and fields.seconds is not None:
            frames = frames_of(fields.seconds, self.request.fps, self.request.source.preset.vae_stride_temporal)
        options = video_options(self.options, height=fields.height, width=fields.width, frames=frames,
                                steps=fields.steps, seed=fields.seed, guidance=fields.guidance,
                                negative_prompt=fields.negative_prompt)
        video, _ = self.paths(job_id)
        output = replace(options.output, out=video, overwrite=True, sheet=False)
        image = self.image_path(job_id, fields.image) if fields.image is not None else None
        try:
            cfg = resolve_run(fields.prompt, replace(options, output=output), image=image, fit=fields.fit or "crop")
        except BadInput as e:  # the image by its field's name, not the server's path
            raise BadInput(str(e).replace(str(image), "input_reference") if image is not None else str(e)) from None
        if fields.attn is None:
            return cfg
        loaded = self.request
        spec = per_run_spec(loaded.backend, fields.attn, loaded.attn_requested)
        note = (f"attn {fields.attn!r}: this video ran {spec.text()} on the loaded {loaded.backend.name} (the server's "
                f"--attn {loaded.attn_requested})")
        return replace(cfg, backends=(spec,), attn_requested=fields.attn, notes=cfg.notes + (note,))


def accepted(fields: VideoFields, cfg: RunConfig) -> dict[str, Any]:
    """What the store keeps of an accepted video: its fields as asked ("request") and the video they resolved to
    ("video": model, frames, fps, width, height, steps, seed, the backend spec it runs), for the answers."""
    return {"request": fields.to_json(),
            "video": {"model": cfg.model, "frames": cfg.frames, "fps": cfg.fps, "width": cfg.width,
                      "height": cfg.height, "steps": cfg.steps, "seed": cfg.seed, "attn": cfg.backend.text()}}


def video_object(job: Any, steps_done: int | None = None) -> dict[str, Any]:
    """OpenAI's `video` object of a job (`vsagen.serve.store.Job` whose fields `accepted` gave): id, object, model,
    status, progress, created_at, completed_at, expires_at (None: kept until deleted), prompt, seconds (text),
    size ("WIDTHxHEIGHT"), remixed_from_video_id (None), error ({code, message} or None); and vsagen's own under
    "vsagen": frames, fps, steps, seed, attn (the backend spec it runs), input_reference (whether an image came),
    steps_done (while it runs; all of its steps once completed; None queued or failed), attempts, the timing
    JSON's URL."""
    video = job.fields["video"]
    return {
        "id": job.id, "object": "video", "model": video["model"], "status": job.status,
        "progress": int(job.progress), "created_at": job.created_at, "completed_at": job.completed_at,
        "expires_at": None, "prompt": job.fields["request"]["prompt"],
        "seconds": f"{video['frames'] / video['fps']:g}", "size": f"{video['width']}x{video['height']}",
        "remixed_from_video_id": None,
        "error": {"code": job.error_code, "message": job.error_message} if job.status == "failed" else None,
        "vsagen": {**{k: video[k] for k in ("frames", "fps", "steps", "seed")}, "attn": video.get("attn"),
                   "input_reference": job.fields["request"].get("image") is not None,
                   "steps_done": video["steps"] if job.status == "completed" else steps_done,
                   "attempts": job.attempts,
                   "timing_url": f"/v1/videos/{job.id}/timing" if job.status == "completed" else None},
    }
