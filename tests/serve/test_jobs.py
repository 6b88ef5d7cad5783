"""A video request's fields (`vsagen.serve.jobs`): typed from JSON and from a form alike, refused in one line;
seconds to frames; the served request with the video's fields in the command line's groups (refusals in the
command line's words); the image of an image-to-video server kept under the job's id and read as `vsagen i2v` reads
its IMAGE; a video's `attn`; OpenAI's `video` object, checked against the `openai` SDK's own model where it
installs."""

from __future__ import annotations

from pathlib import Path

import pytest

from vsagen.errors import BadInput
from vsagen.request.options import request_options
from vsagen.serve.jobs import (FIELDS, MAX_SECONDS, Served, VideoFields, accepted, field_of, frames_of,
                               image_suffix, parse_fields, valid_id, video_object)
from vsagen.serve.store import Job


def test_json_and_form_give_the_same_typed_fields():
    as_json = parse_fields({"prompt": "a fox", "model": "tiny", "seconds": "1.5", "size": "160x96", "steps": 3,
                            "seed": 7, "guidance": 4, "negative_prompt": "blur", "frames": 5}, form=False)
    as_form = parse_fields({"prompt": "a fox", "model": "tiny", "seconds": "1.5", "size": "160x96", "steps": "3",
                            "seed": " 7", "guidance": "4.0", "negative_prompt": "blur", "frames": "5"}, form=True)
    assert as_json == as_form == VideoFields(prompt="a fox", model="tiny", seconds=1.5, frames=5, width=160,
                                              height=96, steps=3, seed=7, guidance=4.0, negative_prompt="blur")
    assert parse_fields({"prompt": "x", "seconds": 2, "steps": None}, form=False) == VideoFields("x", seconds=2.0)
    assert VideoFields.from_json(as_json.to_json()) == as_json
    extra = parse_fields({"prompt": "x", "fit": "resize", "attn": "vsa:sparsity=0.9"}, form=True, image="png")
    assert (extra.fit, extra.attn, extra.image) == ("resize", "vsa:sparsity=0.9", "png")
    assert VideoFields.from_json({k: v for k, v in extra.to_json().items()  # a job an older server stored
                                  if k not in ("image", "fit", "attn")}) == VideoFields("x")


@pytest.mark.parametrize("body,form,words", [
    ({"prompt": "x", "bogus": 1}, False, "unknown field 'bogus'; a video request takes " + ", ".join(FIELDS)),
    ({"steps": 1}, False, "prompt is missing"),
    ({"prompt": ["x"]}, False, "prompt must be a string, got list"),
    ({"prompt": "x", "steps": "3"}, False, "steps must be an integer, got '3'"),
    ({"prompt": "x", "steps": True}, False, "steps must be an integer, got True"),
    ({"prompt": "x", "seed": "0x10"}, True, "seed must be an integer, got '0x10'"),
    ({"prompt": "x", "guidance": "high"}, True, "guidance must be a number, got 'high'"),
    ({"prompt": "x", "guidance": "5"}, False, "guidance must be a number, got '5'"),
    ({"prompt": "x", "guidance": float("nan")}, False, "guidance must be a number, got nan"),
    ({"prompt": "x", "seconds": "0"}, False, f"seconds must be in (0, {MAX_SECONDS:g}], got '0'"),
    ({"prompt": "x", "seconds": 1e9}, False, "seconds must be in (0, 600]"),
    ({"prompt": "x", "size": "160 x 96"}, False, "size must be WIDTHxHEIGHT in pixels (e.g. 160x96), got '160 x 96'"),
    ({"prompt": "x", "size": "-16x16"}, False, "size must be WIDTHxHEIGHT"),
    ({"prompt": "x", "input_reference": "a.png"}, True, "input_reference must be an image file: send it as a file "
                                                        "part of a multipart/form-data body"),
    ({"prompt": "x", "input_reference": {"url": "u"}}, False,
     "multipart/form-data body (the openai SDK's videos.create(input_reference=open(PATH, 'rb')) does), got dict"),
    ({"prompt": "x", "fit": "stretch"}, True, "fit must be one of crop, resize"),
    ({"prompt": "x", "attn": 0.9}, False, "attn must be a string, got float"),
])
def test_bad_fields_are_one_line(body, form, words):
    with pytest.raises(BadInput) as e:
        parse_fields(body, form=form)
    assert words in str(e.value) and "\n" not in str(e.value)
    # the field it is about, OpenAI's error `param` (a user trial: null throughout): the prompt, or the other field
    assert field_of(str(e.value)) == ("prompt" if words.startswith("prompt") else
                                      next(k for k in body if k != "prompt"))


def test_the_field_a_refusal_is_about_from_its_words():
    """The command line's refusals name its options (`--width`: the request's size); the others name no field."""
    assert field_of("--width must be a positive multiple of 16 for tiny, got 100") == "size"
    assert field_of("--negative-prompt is too long") == "negative_prompt"
    assert field_of("the prompt is empty: say what the video should show") == "prompt"
    assert field_of("input_reference: this server runs tiny") == "input_reference"
    for words in ("the body is not valid JSON", "this server's model was loaded with its seed", "--out x", "", "x"):
        assert field_of(words) is None, words


def test_frames_of_seconds_round_up_to_whole_latent_frames():
    for fps in (8, 16, 24):
        for stride in (4,):
            for tenths in range(1, 60):
                seconds = tenths / 10
                frames = frames_of(seconds, fps, stride)
                assert (frames - 1) % stride == 0 and frames >= 1 + stride
                # the fewest frames of the stride whose length (frames - 1 intervals) covers seconds * fps
                assert frames - 1 >= seconds * fps - 1e-6 or frames == 1 + stride
                assert frames - 1 - stride < seconds * fps
    assert frames_of(1, 8, 4) == 9 and frames_of(0.1, 8, 4) == 5 and frames_of(5, 16, 4) == 81


def test_valid_ids_only():
    assert valid_id("video_" + "0123456789abcdef" * 2)
    for bad in ("video_" + "0" * 31, "video_" + "A" * 32, "../video_" + "0" * 32, "video_" + "0" * 32 + "/x", ""):
        assert not valid_id(bad)


@pytest.fixture
def served(tmp_path, vsagen_cache):
    from vsagen.commands.generate_config import resolve_run

    options = request_options(model="tiny", steps=2, height=16, width=16, frames=1, device="cpu")
    base = resolve_run("vsagen serve", request_options(model="tiny", steps=2, height=16, width=16, frames=1,
                                                       device="cpu", out=tmp_path / "videos" / "x.mp4",
                                                       overwrite=True))
    return Served(options, base, tmp_path / "videos")


def test_the_served_request_takes_the_video_fields_in_the_command_line_groups(served, tmp_path):
    job_id = "video_" + "ab" * 16
    cfg = served.config(job_id, VideoFields("a fox", model="tiny", seconds=1, width=32, height=48, steps=3, seed=11,
                                            guidance=2.5, negative_prompt="rain"))
    assert (cfg.prompt, cfg.width, cfg.height, cfg.frames, cfg.steps, cfg.seed, cfg.guidance, cfg.negative_prompt) \
        == ("a fox", 32, 48, 9, 3, 11, 2.5, "rain")
    assert cfg.out == tmp_path / "videos" / f"{job_id}.mp4" and cfg.json_out == tmp_path / "videos" / f"{job_id}.json"
    assert cfg.overwrite and cfg.sheet_out is None and cfg.model == "tiny" and cfg.fps == 8
    plain = served.config(job_id, VideoFields("x"))  # the server's options where the video sets nothing
    assert (plain.width, plain.height, plain.frames, plain.steps, plain.seed) == (16, 16, 1, 2, 0)
    assert served.config(job_id, VideoFields("x", seconds=9, frames=5)).frames == 5  # frames over seconds
    assert served.paths(job_id) == (cfg.out, cfg.json_out)


@pytest.mark.parametrize("fields,words", [
    (VideoFields("x", model="wan2.1-t2v-1.3b"), "model 'wan2.1-t2v-1.3b' is not served here; this server runs 'tiny'"),
    (VideoFields("x", frames=3), "--frames must be 4k+1 (1, 5, 9, ...); got 3, nearest valid: 1 or 5"),
    (VideoFields("x", width=20), "--width must be a positive multiple of 16 for tiny; got 20"),
    (VideoFields("x", steps=10_001), "--steps must be in [1, 10000], got 10001"),
    (VideoFields("x", guidance=-1.0), "--guidance must be a number in [0, 100], got -1.0"),
    (VideoFields("x", seed=-1), "--seed must be in [0, 2^63), got -1"),
    (VideoFields(" "), "the prompt is empty"),
])
def test_the_command_line_refusals_in_its_words(served, fields, words):
    with pytest.raises(BadInput) as e:
        served.config("video_" + "0" * 32, fields)
    assert str(e.value).startswith(words)


def test_the_video_object_has_openai_s_shape(served):
    job_id = "video_" + "cd" * 16
    fields = VideoFields("a fox", seconds=1, width=32, height=16, seed=4)
    kept = accepted(fields, served.config(job_id, fields))
    job = Job(job_id, kept, "failed", 40, 2, 1_700_000_000, 1_700_000_005, 1.0, "run_failed", "out of memory")
    video = video_object(job, steps_done=None)
    assert video["error"] == {"code": "run_failed", "message": "out of memory"}
    assert (video["seconds"], video["size"], video["prompt"], video["model"]) == ("1.125", "32x16", "a fox", "tiny")
    assert video["vsagen"] == {"frames": 9, "fps": 8, "steps": 2, "seed": 4, "attn": "full", "input_reference": False,
                               "steps_done": None, "attempts": 2, "timing_url": None}
    running = video_object(Job(job_id, kept, "in_progress", 45, 1, 1, None, None, None, None), steps_done=1)
    assert running["error"] is None and running["vsagen"]["steps_done"] == 1 and running["completed_at"] is None
    done = video_object(Job(job_id, kept, "completed", 100, 1, 1, 2, 1.0, None, None))  # no longer running
    assert done["vsagen"]["steps_done"] == 2 == done["vsagen"]["steps"]  # (new-user trial: null once completed)
    openai = pytest.importorskip("openai")
    model = openai.types.Video  # every field the SDK's model has (its sizes are OpenAI's four: any size here)
    assert set(model.model_fields) <= set(video) and video["object"] == "video"
    parsed = model.model_validate({**video, "size": "1280x720"})
    assert (parsed.id, parsed.status, parsed.progress, parsed.error.code) == (job_id, "failed", 40, "run_failed")
    assert model.model_validate({**running, "size": "1280x720"}).status == "in_progress"


def test_a_job_s_files_are_named_by_its_id_only(served):
    job_id = "video_" + "ef" * 16
    video, timing = served.paths(job_id)
    assert video.parent == timing.parent == served.videos and (video.name, timing.name) == (f"{job_id}.mp4",
                                                                                           f"{job_id}.json")
    assert Path(video).resolve().is_relative_to(served.videos.resolve())


def test_an_upload_is_kept_under_the_suffix_of_its_first_bytes():
    assert image_suffix(b"\x89PNG\r\n\x1a\n....") == "png" and image_suffix(b"\xff\xd8\xff\xe0") == "jpg"
    assert image_suffix(b"RIFF\x10\x00\x00\x00WEBPVP8 ") == "webp"
    assert image_suffix(b"GIF89a") == image_suffix(b"") == image_suffix(b"RIFF\x00\x00\x00\x00WAVE") == "bin"


@pytest.fixture
def served_i2v(tmp_path, vsagen_cache):
    """An image-to-video server's request (tiny-i2v, `--attn vsa`), loaded without an image."""
    from vsagen.commands.generate_config import resolve_run

    flags = dict(model="tiny-i2v", steps=1, height=32, width=32, frames=1, device="cpu", attn="vsa")
    base = resolve_run("vsagen serve", request_options(**flags, out=tmp_path / "videos" / "x.mp4", overwrite=True),
                       images_per_video=True)
    return Served(request_options(**flags), base, tmp_path / "videos")


def test_an_image_to_video_server_reads_the_job_s_image_as_vsagen_i2v_does(served_i2v, tmp_path):
    from conftest import noise_image

    job_id = "video_" + "12" * 16
    data = noise_image(tmp_path / "up.png", (40, 36)).read_bytes()
    path = served_i2v.save_image(job_id, "png", data)
    assert path == tmp_path / "images" / f"{job_id}.png" and path.read_bytes() == data
    assert served_i2v.job_images(job_id) == [path] and not list(path.parent.glob(".*"))  # no temporary left
    cfg = served_i2v.config(job_id, VideoFields("a fox", image="png", fit="resize"))
    assert (cfg.image, cfg.fit, cfg.image_to_video, cfg.backend.name) == (path, "resize", True, "vsa")
    with pytest.raises(BadInput, match=r"^input_reference is missing: this server runs tiny-i2v, an image-to-video"):
        served_i2v.config(job_id, VideoFields("a fox"))
    small = "video_" + "34" * 16
    served_i2v.save_image(small, "png", noise_image(tmp_path / "s.png", (8, 8)).read_bytes())
    with pytest.raises(BadInput) as e:  # vsagen i2v's words, the image named by its field, not by the server's path
        served_i2v.config(small, VideoFields("a fox", image="png"))
    assert str(e.value).startswith("image input_reference is 8x8 pixels (height x width): too small to start a "
                                   "32x32 video from") and str(tmp_path) not in str(e.value)
    gif = "video_" + "56" * 16
    served_i2v.save_image(gif, "bin", b"GIF89a" + bytes(64))
    with pytest.raises(BadInput, match=r"^cannot read image input_reference: UnidentifiedImageError"):
        served_i2v.config(gif, VideoFields("a fox", image="bin"))
    for bad in (("video_x", "png"), (job_id, "exe"), ("../" + job_id, "png")):
        with pytest.raises(ValueError):
            served_i2v.image_path(*bad)


def test_a_text_image_to_video_server_takes_a_video_with_an_image_or_without(tmp_path, vsagen_cache):
    """tiny-ti2v: loaded as for text (no `images_per_video`); a video without input_reference is `vsagen t2v`'s
    request, one with it `vsagen i2v`'s (its image read and fitted), fit only with an image."""
    from conftest import noise_image
    from vsagen.commands.generate_config import resolve_run

    flags = dict(model="tiny-ti2v", steps=1, height=32, width=32, frames=1, device="cpu")
    base = resolve_run("vsagen serve", request_options(**flags, out=tmp_path / "videos" / "x.mp4", overwrite=True),
                       images_per_video=True)
    served = Served(request_options(**flags), base, tmp_path / "videos")
    assert not base.images_per_video and base.source.takes_image
    job_id = "video_" + "ab" * 16
    path = served.save_image(job_id, "png", noise_image(tmp_path / "up.png", (40, 36)).read_bytes())
    image = served.config(job_id, VideoFields("a fox", image="png", fit="resize"))
    text = served.config(job_id, VideoFields("a fox"))
    assert (image.image, image.fit, image.image_to_video) == (path, "resize", True)
    assert (text.image, text.fit, text.image_to_video) == (None, None, False)
    with pytest.raises(BadInput, match="^fit says how input_reference is fitted"):
        served.check_image(VideoFields("x", fit="crop"))


def test_a_text_to_video_server_takes_no_image_and_a_video_changes_its_backend_per_run(served, tmp_path):
    with pytest.raises(BadInput, match=r"^input_reference: this server runs tiny, which makes videos from text and "
                                       r"takes no image; image to video needs a server of an image-to-video model"):
        served.check_image(VideoFields("x", image="png"))
    with pytest.raises(BadInput, match="^fit says how input_reference is fitted"):
        served.check_image(VideoFields("x", fit="crop"))
    job_id = "video_" + "78" * 16
    plain = served.config(job_id, VideoFields("x"))  # the server's --attn auto: full on the tiny model
    with pytest.raises(BadInput, match=r"^attn 'vsa:sparsity=0.9' needs the vsa backend; this server was started "
                                       r"with --attn auto and runs full \(another backend needs another server\); a "
                                       r"video may not change full's options$"):
        served.config(job_id, VideoFields("x", attn="vsa:sparsity=0.9"))
    assert served.config(job_id, VideoFields("x", attn="full")).backends == plain.backends


def test_a_video_s_attn_changes_the_loaded_backend_s_options_and_is_recorded(served_i2v, tmp_path):
    from conftest import noise_image

    job_id = "video_" + "9a" * 16
    served_i2v.save_image(job_id, "png", noise_image(tmp_path / "up.png", (32, 32)).read_bytes())
    fields = VideoFields("a fox", image="png", attn="vsa:sparsity=0.5")
    cfg = served_i2v.config(job_id, fields)
    assert (cfg.backend.name, cfg.sparsity, cfg.attn_requested) == ("vsa", 0.5, "vsa:sparsity=0.5")
    assert cfg.notes[-1].startswith("attn 'vsa:sparsity=0.5': this video ran vsa:sparsity=0.5:impl=auto:tile=4x4x4")
    video = video_object(Job(job_id, accepted(fields, cfg), "queued", 0, 0, 1, None, None, None, None))
    assert video["vsagen"]["attn"] == cfg.backend.text() and video["vsagen"]["input_reference"] is True
    with pytest.raises(BadInput, match=r"^attn 'vsa:tile=4x4x8': tile is fixed when the model loads; this server was "
                                       r"started with --attn vsa and runs vsa:sparsity=0.875"):
        served_i2v.config(job_id, VideoFields("a fox", image="png", attn="vsa:tile=4x4x8"))
