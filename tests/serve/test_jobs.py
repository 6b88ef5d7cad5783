"""A video request's fields (`vsagen.serve.jobs`): typed from JSON and from a form alike, refused in one line;
seconds to frames; the served request with the video's fields in the command line's groups (refusals in the
command line's words); OpenAI's `video` object, checked against the `openai` SDK's own model where it installs."""

from __future__ import annotations

from pathlib import Path

import pytest

from vsagen.errors import BadInput
from vsagen.request.options import request_options
from vsagen.serve.jobs import (FIELDS, MAX_SECONDS, Served, VideoFields, accepted, frames_of, parse_fields, valid_id,
                               video_object)
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
    ({"prompt": "x", "input_reference": "a.png"}, True, "image to video is not served"),
])
def test_bad_fields_are_one_line(body, form, words):
    with pytest.raises(BadInput) as e:
        parse_fields(body, form=form)
    assert words in str(e.value) and "\n" not in str(e.value)


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
    assert video["vsagen"] == {"frames": 9, "fps": 8, "steps": 2, "seed": 4, "steps_done": None, "attempts": 2,
                               "timing_url": None}
    running = video_object(Job(job_id, kept, "in_progress", 45, 1, 1, None, None, None, None), steps_done=1)
    assert running["error"] is None and running["vsagen"]["steps_done"] == 1 and running["completed_at"] is None
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
