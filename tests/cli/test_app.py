"""vsagen.cli.app: the `vsagen` command (Typer app through CliRunner in-process; `main()` through subprocesses where
exit codes of the console-script wrapper, click's own usage errors or start-up time are the subject).

Every run uses the session's private VSAGEN_CACHE (conftest's `vsagen_cache`); subprocesses get it, and a
private HF_HOME, through their environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import assert_one_error_line, cached_locally, one_error_line
from typer.testing import CliRunner

from vsagen.cli.app import app
from vsagen.media.video import read_mp4

# `vsagen --help` must feel instant: no torch / diffusers import. Observed ~0.15 s on this 2-core machine; 2 s
# is generous (a torch import alone takes ~2 s, a diffusers import ~5 s).
HELP_WALL_S = 2.0
# Tiny preset defaults (vsagen/preset_data/tiny.toml): 17 frames of 96 x 160, 4 steps, CFG 5.0 (two forwards a step).
TINY_FRAMES, TINY_H, TINY_W, TINY_STEPS = 17, 96, 160, 4
HEAVY_MODULES = ("torch", "diffusers", "transformers", "triton")
REPORT_KEYS = {"video", "model", "attn", "frames", "height", "width", "timing"}
TIMING_KEYS = {"dit_s", "attention_backend_s", "total_s", "dit_forwards", "attn1_module_s", "deprecated_aliases",
               "self_attention_s", "attn1_s"}  # the last two: deprecated aliases, kept for one release

runner = CliRunner()


@pytest.fixture
def cli_cache(vsagen_cache, tiny_dir):
    """The private cache with the tiny checkpoint already built (so runs time the CLI, not the build)."""
    return vsagen_cache


def t2v(*args: str):
    return runner.invoke(app, ["t2v", *args])


def sub_env(cache: Path, tmp: Path) -> dict:
    env = dict(os.environ)
    env["VSAGEN_CACHE"] = str(cache)
    env["HF_HOME"] = str(tmp / "hf-home")  # never the user's hub cache; nothing is downloadable here anyway
    env.pop("COLUMNS", None)
    return env


def run_main(args: list[str], env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m vsagen ARGS` (`vsagen.cli.main`, which the console script runs too)."""
    return subprocess.run([sys.executable, "-m", "vsagen", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def check_report(data: dict, steps: int, cfg_on: bool = True) -> None:
    assert REPORT_KEYS <= set(data)
    timing = data["timing"]
    assert TIMING_KEYS <= set(timing)
    assert timing["dit_s"] > 0
    assert 0 < timing["attention_backend_s"] <= timing["attn1_module_s"] <= timing["dit_s"]
    for old, new in timing["deprecated_aliases"].items():
        assert timing[old] == timing[new]
    assert timing["dit_s"] <= timing["denoise_s"] <= timing["total_s"]
    assert timing["dit_forwards"] == (2 if cfg_on else 1) * steps
    assert len(timing["dit_per_step_s"]) == steps
    assert 0 < timing["attention_share_of_dit"] <= 1


# --------------------------------------------------------------------------------------------------------------
# Runs


@pytest.mark.slow
def test_t2v_tiny_defaults_writes_video_and_json(cli_cache, tmp_path):
    out = tmp_path / "x.mp4"
    res = t2v("--model", "tiny", "a prompt", "--out", str(out))
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    frames = read_mp4(out)
    assert frames.shape == (TINY_FRAMES, TINY_H, TINY_W, 3)
    # the note says what random weights give (it said "noise"; issue 29 item 8); for this run a near-uniform green
    # field, as the README says
    assert "its videos show nothing of the prompt" in res.stderr
    mean = frames.reshape(-1, 3).astype(float).mean(0)
    assert mean[1] > mean[0] + 20 and mean[1] > mean[2] + 20 and frames.astype(float).std(axis=(1, 2)).max() < 30
    data = json.loads((tmp_path / "x.json").read_text())
    check_report(data, TINY_STEPS)
    assert data["video"] == str(out) and data["model"] == "tiny" and data["attn"] == "full"
    assert (data["frames"], data["height"], data["width"]) == (TINY_FRAMES, TINY_H, TINY_W)
    assert data["steps"] == TINY_STEPS and data["guidance"] == 5.0 and data["random_weights"] is True
    assert data["vae_dtype"] == "fp32"  # the dtype the VAE ran in (tiny: the pipeline's, fp32 on CPU)
    # no --attn: auto, which runs full on the tiny model and says why, first among the notes, and in the title
    assert data["attn_requested"] == "auto" and data["timing"]["notes"][0].startswith("--attn auto chose full")
    assert "note: --attn auto chose full" in res.stderr and "attn full (auto)" in res.stdout
    # a status line for each phase without a progress bar of its own
    assert "decoding the video (VAE" in res.stderr and f"writing {out}" in res.stderr
    # The human-readable report goes to stdout and names where the files went.
    assert str(out) in res.stdout and "attention backend share of DiT time" in res.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json", "x.mp4"]


@pytest.mark.slow
def test_json_flag_prints_exactly_one_object(cli_cache, tmp_path):
    out = tmp_path / "j.mp4"
    res = t2v("--model", "tiny", "a prompt", "--steps", "2", "--out", str(out), "--json", "--guidance", "1",
              "--negative-prompt", "blurry")
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert len(lines) == 1, res.stdout
    data = json.loads(lines[0])
    assert isinstance(data, dict)
    check_report(data, 2, cfg_on=False)
    # a negative prompt without CFG is not ignored silently: a note, after --attn auto's
    assert data["timing"]["notes"][1].startswith("--negative-prompt has no effect: CFG is off")
    assert "note: --negative-prompt has no effect" in res.stderr
    assert data["video"] == str(out)
    assert json.loads((tmp_path / "j.json").read_text()) == data


@pytest.mark.slow
def test_seeds_print_one_object_a_seed_and_their_tables(cli_cache, tmp_path):
    common = ["--model", "tiny", "a prompt", "--steps", "1", "--frames", "5", "--height", "64", "--width", "64",
              "--seeds", "3,1"]
    res = t2v(*common, "--out", str(tmp_path / "j.mp4"), "--json")
    assert res.exit_code == 0, res.output
    lines = [json.loads(line) for line in res.stdout.splitlines()]
    assert [(d["seed"], d["video"]) for d in lines] == [(3, str(tmp_path / "j-seed3.mp4")),
                                                        (1, str(tmp_path / "j-seed1.mp4"))]
    assert [json.loads((tmp_path / f"j-seed{n}.json").read_text()) for n in (3, 1)] == lines
    assert "seed 3 (1 of 2)" in res.stderr and "seed 1 (2 of 2)" in res.stderr
    res = t2v(*common, "--out", str(tmp_path / "t.mp4"))  # the table, then where the files went, for each seed
    assert res.exit_code == 0, res.output
    assert res.stdout.count("attention backend share of DiT time") == 2
    assert res.stdout.index("video: " + str(tmp_path / "t-seed3.mp4")) < res.stdout.index(
        "video: " + str(tmp_path / "t-seed1.mp4"))


@pytest.mark.slow
@pytest.mark.parametrize("fit", ["partial", "crop"])
def test_vsa_runs_with_either_tile_fit(cli_cache, tmp_path, fit):
    out = tmp_path / "v.mp4"
    res = t2v("--model", "tiny", "a prompt", "--attn", "vsa", "--sparsity", "0.5", "--tile-fit", fit,
              "--steps", "1", "--out", str(out), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["attn"] == "vsa" and data["backend"]["sparsity"] == 0.5 and data["tile_fit"] == fit
    assert set(data["timing"]["self_attention_stages_s"]) == {"coarse", "fine"}
    assert data["denoised"]["grid"] == ([5, 6, 10] if fit == "partial" else [8, 8, 12])
    assert read_mp4(out).shape == (TINY_FRAMES, TINY_H, TINY_W, 3)


@pytest.mark.slow
def test_overwrite_replaces_existing_output(cli_cache, tmp_path):
    out = tmp_path / "x.mp4"
    out.write_bytes(b"an older video")
    (tmp_path / "x.json").write_text("{\"old\": true}\n")
    res = t2v("--model", "tiny", "a prompt", "--steps", "1", "--out", str(out), "--overwrite")
    assert res.exit_code == 0, res.output
    assert read_mp4(out).shape == (TINY_FRAMES, TINY_H, TINY_W, 3)
    data = json.loads((tmp_path / "x.json").read_text())
    assert "old" not in data and data["video"] == str(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json", "x.mp4"]


@pytest.mark.slow
def test_warmup_is_reported_apart(cli_cache, tmp_path):
    res = t2v("--model", "tiny", "a prompt", "--steps", "1", "--warmup", "1", "--out", str(tmp_path / "w.mp4"),
              "--json")
    assert res.exit_code == 0, res.output
    timing = json.loads(res.stdout)["timing"]
    assert timing["warmup_s"] > 0
    parts = timing["warmup_parts_s"]
    assert parts["denoise"] + parts["decode"] == pytest.approx(timing["warmup_s"]) and parts["denoise"] > 0
    assert timing["dit_forwards"] == 2  # the warm-up's forwards are not counted


# --------------------------------------------------------------------------------------------------------------
# Flag precedence and error mapping, with the generation replaced by a recorder (no model needed)


class _Recorder:
    """Stands in for vsagen.commands.generate.generate: records the RunConfig, or raises `error`."""

    def __init__(self, error: Exception | None = None):
        self.configs = []
        self.error = error

    def __call__(self, cfg, *, log=None, progress=True, writer=True, cancelled=None):
        self.configs.append(cfg)
        if self.error is not None:
            raise self.error

        class Result:
            summary = {"video": str(cfg.out), "recorded": True}

        return Result()


@pytest.fixture
def recorder(monkeypatch):
    rec = _Recorder()
    monkeypatch.setattr("vsagen.commands.generate.generate", rec)
    return rec


def test_flags_override_preset_defaults(recorder, tmp_path):
    res = t2v("p", "--model", "tiny", "--out", str(tmp_path / "a.mp4"), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == {"video": str(tmp_path / "a.mp4"), "recorded": True}
    cfg = recorder.configs[-1]
    assert (cfg.frames, cfg.height, cfg.width, cfg.steps, cfg.fps) == (TINY_FRAMES, TINY_H, TINY_W, TINY_STEPS, 8)
    assert (cfg.guidance, cfg.flow_shift, cfg.negative_prompt) == (5.0, 3.0, "")
    assert (cfg.attn, cfg.sparsity, cfg.tile_fit) == ("full", None, "partial")
    assert (cfg.device, cfg.dtype, cfg.seed, cfg.warmup) == ("cpu", "fp32", 0, 0)
    assert cfg.json_out == tmp_path / "a.json" and not cfg.overwrite and not cfg.random_weights

    res = t2v("p", "--model", "tiny", "--out", str(tmp_path / "b.mp4"), "--json", "--attn", "vsa",
              "--frames", "9", "--height", "64", "--width", "80", "--steps", "2", "--guidance", "1.5",
              "--fps", "12", "--seed", "7", "--negative-prompt", "blurry", "--tile-fit", "crop", "--dtype", "bf16",
              "--device", "cpu", "--random-weights", "--allow-pickle", "--warmup", "1", "--flow-shift", "7.5")
    assert res.exit_code == 0, res.output
    cfg = recorder.configs[-1]
    assert cfg.flow_shift == 7.5
    assert (cfg.frames, cfg.height, cfg.width, cfg.steps, cfg.fps, cfg.seed) == (9, 64, 80, 2, 12, 7)
    assert (cfg.guidance, cfg.negative_prompt, cfg.tile_fit, cfg.dtype) == (1.5, "blurry", "crop", "bf16")
    assert cfg.attn == "vsa" and cfg.sparsity == 0.875  # the preset's default sparsity for a sparse backend
    assert cfg.random_weights and cfg.allow_pickle and cfg.warmup == 1

    res = t2v("p", "--model", "tiny", "--out", str(tmp_path / "c.mp4"), "--json", "--attn", "vsa",
              "--sparsity", "0.25")
    assert res.exit_code == 0, res.output
    assert recorder.configs[-1].sparsity == 0.25


def test_default_output_name_never_overwrites(recorder, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert t2v("p", "--model", "tiny", "--json").exit_code == 0
    assert recorder.configs[-1].out == Path("vsagen-tiny-full-seed0.mp4")
    Path("vsagen-tiny-full-seed0.json").write_text("{}")  # an earlier run's report alone also blocks the name
    assert t2v("p", "--model", "tiny", "--json", "--attn", "full").exit_code == 0
    assert recorder.configs[-1].out == Path("vsagen-tiny-full-seed0-1.mp4")


@pytest.mark.parametrize("error,code,expected", [
    (RuntimeError("boom\nsecond line"), 1,
     "error: RuntimeError: boom (run again with --verbose for the traceback)"),
    ("RunFailure", 1, "error: decoding failed"),
    ("ModelNotFound", 2, "error: no such model"),
], ids=["unexpected", "run-failure", "model-not-found"])
def test_errors_while_running_map_to_one_line(monkeypatch, tmp_path, error, code, expected):
    from vsagen import errors

    if error == "RunFailure":
        error = errors.RunFailure("decoding failed")
    elif error == "ModelNotFound":
        error = errors.ModelNotFound("no such model")
    monkeypatch.setattr("vsagen.commands.generate.generate", _Recorder(error))
    res = t2v("p", "--model", "tiny", "--out", str(tmp_path / "x.mp4"))
    assert res.exit_code == code
    assert assert_one_error_line(res.stderr, res.stdout) == expected
    # --verbose: an unexpected exception propagates (with its traceback); a vsagen error prints its traceback and
    # keeps its exit code (bad input stays exit 2)
    res = t2v("p", "--model", "tiny", "--out", str(tmp_path / "x.mp4"), "--verbose")
    if isinstance(error, errors.VsagenError):
        assert res.exit_code == code and "Traceback (most recent call last)" in res.stderr
        assert res.stderr.rstrip().endswith(expected)
    else:
        assert res.exit_code != 0 and res.exception is error


# --------------------------------------------------------------------------------------------------------------
# Bad input: exit 2, one `error:` line, no traceback, nothing written

BAD_INPUTS = [
    # (id, extra args, substrings the message must contain)
    ("frames", ["--frames", "10"], ["--frames", "9", "13"]),
    ("height", ["--height", "100"], ["--height", "96", "112"]),
    ("width", ["--width", "170"], ["--width", "160", "176"]),
    ("sparsity-1", ["--attn", "vsa", "--sparsity", "1.0"], ["--sparsity", "1.0"]),
    ("sparsity-neg", ["--attn", "vsa", "--sparsity", "-0.1"], ["--sparsity", "-0.1"]),
    ("sparsity-neg-eq", ["--attn", "vsa", "--sparsity=-0.1"], ["--sparsity", "-0.1"]),
    ("attn", ["--attn", "nope"], ["nope", "full", "vsa"]),
    ("model", ["--model", "nope"], ["nope", "--model tiny"]),
    # a new-user trial: a mistyped folder answered "not a preset (" and all 25 presets
    ("model-folder", ["--model", "./models/Wan2.1"], ["--model './models/Wan2.1': no such folder"]),
    ("model-abs-folder", ["--model", "{tmp}/models/Wan2.1"], ["/models/Wan2.1': no such folder"]),
    ("device", ["--device", "cuda"], ["--device cuda", "cpu"]),
    ("avi", ["--out", "{tmp}/x.avi"], [".mp4"]),
    ("sparsity-dense", ["--sparsity", "0.5"], ["--sparsity", "full"]),
    ("steps-0", ["--steps", "0"], ["--steps"]),
    ("tile-fit", ["--tile-fit", "pad"], ["--tile-fit", "partial", "crop"]),
    ("dtype", ["--dtype", "fp8"], ["--dtype", "bf16"]),
    ("out-is-dir", ["--out", "{tmp}/adir.mp4"], ["--out is the video file to write (.mp4, .webm",
                                                     "adir.mp4 is a folder"]),
    # found by a new-user trial: these used to run (or fail late with exit 1)
    ("guidance-nan", ["--guidance", "nan"], ["--guidance", "nan"]),
    ("guidance-inf", ["--guidance", "inf"], ["--guidance", "inf"]),
    ("flow-shift-0", ["--flow-shift", "0"], ["--flow-shift", "(0, 1000]"]),
    ("flow-shift-nan", ["--flow-shift", "nan"], ["--flow-shift", "nan"]),
    # found by the second new-user trial: these used to load the model and fail with exit 1, or write black frames
    ("steps-huge", ["--steps", "99999999999999999999"], ["--steps", "10000"]),
    ("warmup-huge", ["--warmup", "99999999999999999999"], ["--warmup", "10000"]),
    ("guidance-huge", ["--guidance", "1e308"], ["--guidance", "100"]),
    ("flow-shift-huge", ["--flow-shift", "1e300"], ["--flow-shift", "1000"]),
    ("attn-impl-unknown", ["--attn-impl", "cuda"], ["--attn-impl", "triton", "torch"]),
    ("out-no-name", ["--out", "{tmp}/.mp4"], ["no file name"]),
    ("seed-negative", ["--seed=-1"], ["--seed", "-1"]),
    ("seed-huge", ["--seed", str(2**64)], ["--seed"]),
    ("out-dot", ["--out", "{tmp}/."], [".mp4"]),  # pathlib reads "dir/." as "dir": no .mp4 name
    # issue 44: several seeds a run
    ("seed-and-seeds", ["--seed", "1", "--seeds", "1,2"], ["--seed and --seeds together"]),
    ("seeds-twice", ["--seeds", "3,3"], ["--seeds names a seed twice"]),
    ("seeds-not-integers", ["--seeds", "1,x"], ["--seeds takes comma-separated integers", "1,x"]),
    ("seeds-gpus", ["--seeds", "1,2", "--gpus", "2", "--device", "cpu"], ["--seeds runs its seeds in one process"]),
    ("seeds-calibrate", ["--seeds", "1,2", "--cache", "mag:calibrate=true"], ["calibrate with one --seed"]),
    ("seeds-random-weights", ["--seeds", "1,2", "--random-weights"], ["--random-weights draws the weights"]),
    ("seeds-second-exists", ["--seeds", "1,2", "--out", "{tmp}/x.mp4"], ["x-seed2.json"]),
    ("frames-past-rope", ["--frames", "129", "--height", "16", "--width", "16"], ["--frames", "125"]),
    ("height-past-rope", ["--height", "528", "--frames", "1"], ["--height", "512"]),
    ("width-past-rope", ["--width", "1024", "--frames", "1"], ["--width", "512"]),
    ("width-huge-off-stride", ["--width", "99999999"], ["--width", "<= 512", "99999999"]),
    ("random-weights-unknown-arch", ["--model", "some-org/some-model", "--random-weights"],
     ["--random-weights", "preset", "tiny"]),
    # issue 30: a few-step sampler and the flags it would not honour
    ("sampler-unknown", ["--sampler", "dmx"], ["--sampler", "dmd", "default"]),
    ("sampler-cfg", ["--sampler", "dmd", "--guidance", "5"], ["--guidance 5", "dmd sampler runs without CFG"]),
    ("sampler-steps", ["--sampler", "dmd", "--steps", "8"], ["--steps 8", "runs 3 steps", "--sampler default"]),
    ("sampler-sigmas", ["--sampler", "dmd:sigmas=1,0.5,0.7"], ["sigmas must decrease"]),
    ("preset-sampler-cfg", ["--model", "fastwan2.1-t2v-1.3b", "--random-weights", "--guidance", "5"],
     ["--guidance 5", "dmd sampler"]),
    # issue 32: the mp4's encoding
    ("codec-unknown", ["--codec", "h265"], ["--codec must be x264 or nvenc"]),
    ("codec-crf", ["--codec", "x264:crf=60"], ["crf must be an integer in [0, 51]"]),
    ("codec-preset", ["--codec", "x264:preset=p4"], ["preset must be one of ultrafast"]),
    # issue 45: segment-parallel x264
    ("codec-segments", ["--codec", "x264:segments=0"], ["segments must be an integer in [1, 64], got 0"]),
]


@pytest.mark.parametrize("case_id,extra,needles", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_one_error_line_exit_2(cli_cache, tmp_path, case_id, extra, needles):
    if case_id == "device":
        import torch

        if torch.cuda.is_available():
            pytest.skip("CUDA is available here")
    if case_id == "out-is-dir":
        (tmp_path / "adir.mp4").mkdir()
    if case_id == "seeds-second-exists":  # the second seed's JSON: refused before the first seed runs
        (tmp_path / "x-seed2.json").write_text("{}")
    before = sorted(p.name for p in tmp_path.iterdir())
    extra = [a.replace("{tmp}", str(tmp_path)) for a in extra]
    args = ["--model", "tiny", *extra] if "--model" not in extra else list(extra)
    if "--out" not in extra:
        args += ["--out", str(tmp_path / "o" / "x.mp4")]
    res = t2v("a prompt", *args)
    assert res.exit_code == 2, res.output
    line = assert_one_error_line(res.stderr, res.stdout)
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "something was written"


def test_empty_prompt_is_refused(cli_cache, tmp_path):
    res = t2v("  ", "--model", "tiny", "--out", str(tmp_path / "x.mp4"))
    assert res.exit_code == 2
    assert "prompt" in assert_one_error_line(res.stderr, res.stdout)
    assert list(tmp_path.iterdir()) == []


def test_a_missing_prompt_is_said_missing_as_compare_says_it(monkeypatch, capsys):
    """New-user trial: `vsagen t2v --model tiny` said "the prompt is empty"; compare says "Missing argument"."""
    from vsagen.cli import app as cli_app

    lines = {}
    for command in ("t2v", "compare"):
        monkeypatch.setattr(sys, "argv", ["vsagen", command, "--model", "tiny"])
        with pytest.raises(SystemExit) as e:
            cli_app.main()
        out, err = capsys.readouterr()
        assert e.value.code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
        lines[command] = err.strip()
    assert lines["t2v"] == ("error: Missing argument 'PROMPT': say what the video should show, or give --prompts FILE "
                            "(see `vsagen t2v --help`)")
    assert lines["compare"].startswith("error: Missing argument 'PROMPT'")


def test_i2v_with_its_arguments_swapped_says_the_order(monkeypatch, capsys, tmp_path):
    from vsagen.cli import app as cli_app

    monkeypatch.chdir(tmp_path)
    Path("fox.png").write_bytes(b"x")
    monkeypatch.setattr(sys, "argv", ["vsagen", "i2v", "a fox", "fox.png"])
    with pytest.raises(SystemExit) as e:
        cli_app.main()
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == "" and err == ("error: the arguments are IMAGE PROMPT, and fox.png is an image "
                                                       "while 'a fox' is no file: vsagen i2v ... fox.png 'a fox' (your "
                                                       "options where the ... is) (see `vsagen i2v --help`)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fox.png"]


def test_existing_output_is_kept_without_overwrite(cli_cache, tmp_path):
    for existing in ("x.mp4", "x.json"):
        folder = tmp_path / existing.replace(".", "-")
        folder.mkdir()
        (folder / existing).write_bytes(b"precious")
        res = t2v("a prompt", "--model", "tiny", "--out", str(folder / "x.mp4"))
        assert res.exit_code == 2, res.output
        line = assert_one_error_line(res.stderr, res.stdout)
        assert existing in line and "--overwrite" in line
        assert (folder / existing).read_bytes() == b"precious"
        assert [p.name for p in folder.iterdir()] == [existing]


@pytest.mark.parametrize("target", ["/proc/vsagen-test/x.mp4", "/proc/x.mp4", "/sys/x.mp4"])
def test_unwritable_virtual_folder_is_refused(cli_cache, target):
    """As root, os.access says yes everywhere; the real probe (a temporary file) must say no for /proc, /sys."""
    res = t2v("a prompt", "--model", "tiny", "--out", target)
    assert res.exit_code == 2, res.output
    line = assert_one_error_line(res.stderr, res.stdout)
    assert "cannot write to" in line
    assert not Path(target).exists()


def test_read_only_folder_is_refused(cli_cache, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        try:
            (ro / "probe").write_bytes(b"")
            (ro / "probe").unlink()
            pytest.skip("this user (root?) can write into a 0o555 folder")
        except PermissionError:
            pass
        res = t2v("a prompt", "--model", "tiny", "--out", str(ro / "x.mp4"))
        assert res.exit_code == 2, res.output
        assert "cannot write to" in assert_one_error_line(res.stderr, res.stdout)
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)




@pytest.mark.parametrize("command", [["t2v", "a fox"], ["compare", "a fox"], ["profile"], ["search", "--prompt", "x"],
                                     ["t2v", "a fox", "--model", "some-org/some-model"]])
def test_an_uncached_hub_model_offline_is_one_line_before_anything_loads(tmp_path, monkeypatch, command):
    """New-user trial (issue 44): `vsagen t2v fox` (the default preset, not in the Hugging Face cache) printed
    "loading wan2.1-t2v-1.3b" and failed ~7 s later; every command that loads a model now refuses it in one line
    before the load starts, nothing written."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr("vsagen.pipeline.Session.load", lambda *a, **k: pytest.fail("loading began"))
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, [*command, "--device", "cpu"])
    line = one_error_line(res)
    assert "is not in the local Hugging Face cache and the hub is off (HF_HUB_OFFLINE is set)" in line, line
    assert "--model tiny" in line and list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_default_model_unavailable_suggests_tiny(cli_cache, tmp_path):
    if cached_locally("Wan-AI/Wan2.1-T2V-1.3B-Diffusers"):
        pytest.skip("the default model is in the local Hugging Face cache")
    res = t2v("a prompt", "--out", str(tmp_path / "o" / "x.mp4"))
    assert res.exit_code == 2, res.output
    line = assert_one_error_line(res.stderr, res.stdout)
    assert "wan2.1-t2v-1.3b" in line and "--model tiny" in line
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------------------------------
# main(): the console-script wrapper, in subprocesses


@pytest.mark.parametrize("args,needle", [
    (["t2v", "a prompt", "--steps", "abc"], "--steps"),
    (["t2v", "a prompt", "--no-such-option"], "--no-such-option"),
    (["nope-command"], "nope-command"),
    (["t2v"], "prompt"),
], ids=["steps-abc", "unknown-option", "unknown-command", "missing-prompt"])
def test_main_usage_errors_are_one_line_exit_2(vsagen_cache, tmp_path, args, needle):
    res = run_main(args, sub_env(vsagen_cache, tmp_path))
    assert res.returncode == 2, res.stderr
    line = assert_one_error_line(res.stderr, res.stdout)
    assert needle.lower() in line.lower()
    assert list(tmp_path.iterdir()) == []


def test_main_bad_input_exit_2(vsagen_cache, tmp_path):
    """A library BadInput through the real entry point (exit status, not just CliRunner's exit_code)."""
    res = run_main(["t2v", "a prompt", "--model", "tiny", "--frames", "10", "--out", str(tmp_path / "x.mp4")],
                   sub_env(vsagen_cache, tmp_path))
    assert res.returncode == 2, res.stderr
    line = assert_one_error_line(res.stderr, res.stdout)
    assert "9" in line and "13" in line
    assert list(tmp_path.iterdir()) == []


def test_main_no_args_prints_help_exit_2(vsagen_cache, tmp_path):
    """Issue 29: `vsagen` alone printed the help and exited 0, as if it had done something; a script must see the
    missing command (exit 2, a usage error), the user still gets the help."""
    res = run_main([], sub_env(vsagen_cache, tmp_path))
    assert res.returncode == 2, res.stderr
    assert "t2v" in res.stdout and "Usage" in res.stdout


def test_search_help_speaks_of_no_decode():
    """New-user trial: search's --tile-fit said "crop before decode", while its help says no video is decoded."""
    flat = {c: " ".join(runner.invoke(app, [c, "--help"], env={"COLUMNS": "200"}).stdout.split())
            for c in ("search", "t2v")}
    assert "crop before decode" in flat["t2v"] and "decode)" not in flat["search"]
    assert "the attention scored is that larger grid's" in flat["search"]


def test_help_is_fast_and_imports_nothing_heavy(vsagen_cache, tmp_path):
    env = sub_env(vsagen_cache, tmp_path)
    for args in (["--help"], ["t2v", "--help"]):
        t0 = time.perf_counter()
        res = run_main(args, env, timeout=30)
        wall = time.perf_counter() - t0
        assert res.returncode == 0, res.stderr
        assert "Usage" in res.stdout and res.stderr == ""
        assert wall < HELP_WALL_S, f"`vsagen {' '.join(args)}` took {wall:.2f} s"
    probe = (
        "import sys, json\n"
        "import vsagen.cli.app\n"
        "after_import = sorted(m for m in sys.modules if m.split('.')[0] in %r)\n"
        "sys.argv = ['vsagen', 't2v', '--help']\n"
        "try:\n    vsagen.cli.app.main()\nexcept SystemExit:\n    pass\n"
        "after_help = sorted(m for m in sys.modules if m.split('.')[0] in %r)\n"
        "sys.stderr.write(json.dumps([after_import, after_help]))\n" % (HEAVY_MODULES, HEAVY_MODULES)
    )
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=30)
    assert res.returncode == 0, res.stderr
    after_import, after_help = json.loads(res.stderr)
    assert after_import == [] and after_help == []


def test_shell_completion_offers_presets_and_backends_without_torch(vsagen_cache, tmp_path):
    """Issue 44 item 8: `--show-completion` prints the bash script, and Typer's completion protocol
    (`_VSAGEN_COMPLETE=complete_bash`, COMP_WORDS / COMP_CWORD) completes subcommands, `--model` with the preset
    names, `--attn` with the backend names and `--vae` with the decoders (the last item of a comma list), importing
    neither torch nor diffusers."""
    env = {**sub_env(vsagen_cache, tmp_path), "SHELL": "/bin/bash"}
    # the shell named, not detected: Typer detects it from the process tree (shellingham), which under a
    # background job or a CI runner finds none ("Shell  not supported."), whatever SHELL says
    # (Typer's switch for that makes --show-completion take the shell as its value)
    res = run_main(["--show-completion", "bash"], {**env, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"},
                   timeout=30)
    assert res.returncode == 0 and "_VSAGEN_COMPLETE=complete_bash" in res.stdout and "complete " in res.stdout
    probe = (
        "import contextlib, io, json, os, sys\n"
        "import vsagen.cli.app\n"
        "sys.argv = ['vsagen']\n"
        "answers = []\n"
        "for words in json.loads(sys.argv_words):\n"
        "    os.environ.update(_VSAGEN_COMPLETE='complete_bash', COMP_WORDS=words,\n"
        "                      COMP_CWORD=str(len(words.split(' ')) - 1))\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out):\n"
        "        try:\n            vsagen.cli.app.main()\n        except SystemExit:\n            pass\n"
        "    answers.append(out.getvalue().split())\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in %r)\n"
        "sys.stderr.write(json.dumps([answers, heavy]))\n" % (HEAVY_MODULES,)
    )
    words = ["vsagen t2", "vsagen t2v --model wan2.1-t2v", "vsagen i2v --model tiny-i", "vsagen t2v --attn v",
             "vsagen profile --attn full,sla", "vsagen compare --attn vsa:", "vsagen download wan2.2-t",
             "vsagen t2v --vae ti", "vsagen compare --vae stock,tiny:name=light"]
    probe = probe.replace("sys.argv_words", repr(json.dumps(words)))
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=30)
    answers, heavy = json.loads(res.stderr)
    from vsagen.attention.registry import backend_names

    assert answers == [["t2v"], ["wan2.1-t2v-1.3b", "wan2.1-t2v-14b"], ["tiny-i2v", "tiny-i2v-a14b"], ["vsa"],
                       [f"full,{n}" for n in backend_names() if n.startswith("sla")], [],
                       ["wan2.2-t2v-a14b", "wan2.2-ti2v-5b"],
                       ["tiny", "tiny:name=taew2_1", "tiny:name=taew2_2", "tiny:name=lighttaew2_1",
                        "tiny:name=lighttaew2_2"],  # --vae completed nothing (a new user's finding)
                       ["stock,tiny:name=lighttaew2_1", "stock,tiny:name=lighttaew2_2"]]
    assert heavy == []


# Bad input that needs no model answers before torch and diffusers load: ~0.4 s idle on this 2-core machine (it took
# 4.4 s for --height 100, 10-14 s for a damaged checkpoint, issue 29; 2.9 s for the --ulysses degree and
# --cfg-parallel --guidance 1 with --attn auto, whose weights check imported torch); 3 s is generous.
BAD_INPUT_WALL_S = 3.0
# The bad inputs of one VSAGEN_CACHE run in one process, one `main()` after another, each followed by this line on
# stdout and stderr (a process per input cost ~0.7 s each). Each one's time is the import of vsagen.cli.app plus its
# own `main()`, what it takes from a cold start less the interpreter's; the heavy modules are read after each.
_SEPARATOR = "--- next bad input ---"
_BATCH_PROBE = (
    "import json, sys, time\nt0 = time.perf_counter()\nfrom vsagen.cli.app import main\n"
    "imported = time.perf_counter() - t0\nreport, answers = sys.argv[1], []\n"
    "for argv in json.loads(sys.argv[2]):\n    sys.argv = ['vsagen', *argv]\n    t = time.perf_counter()\n"
    "    try:\n        main()\n        code = 0\n    except SystemExit as e:\n        code = e.code\n"
    "    heavy = sorted(m for m in sys.modules if m.split('.')[0] in %r)\n"
    "    answers.append([code, heavy, imported + time.perf_counter() - t])\n"
    "    for stream in (sys.stdout, sys.stderr):\n        stream.write(%r + chr(10))\n        stream.flush()\n"
    "open(report, 'w').write(json.dumps(answers))\n" % (HEAVY_MODULES, _SEPARATOR))
# where each command's output goes: the option and the name in the test's output folder
_TARGETS = {"t2v": ("--out", "v.mp4"), "i2v": ("--out", "i.mp4"), "search": ("--out", "p.json"),
            "compare": ("--out", "c"), "profile": ("--out", "r.md"), "serve": ("--folder", "s")}


def test_bad_input_answers_fast_in_one_line_writing_nothing(cli_cache, tiny_dir, tmp_path):
    """Issue 29 (items 4 and 5): each bad input gives one `error:` line and exit 2 through `main()`, within
    BAD_INPUT_WALL_S, having imported neither torch nor diffusers, and writes nothing (no output file, no cache
    folder), t2v's and also i2v's, profile's, search's, compare's and serve's. A truncated or overwritten safetensors
    file is named as damaged (it was blamed on pickle), a folder without transformer weights gets vsagen's line only
    (diffusers printed its own first), an unwritable VSAGEN_CACHE is bad input (it exited 1), and an unknown option is
    offered only close ones (`--bogus` was offered `--out, --verbose`). The process splits (--ulysses, --cfg-parallel)
    are refused after `--attn auto` read the checkpoint's weight names and a named backend weights file's, which
    import no torch (they did: 2.9 s and 240 MB on every torchrun rank)."""
    import shutil

    import numpy as np
    from PIL import Image
    from safetensors.numpy import save_file

    checkpoints = {}
    for case in ("truncated", "overwritten", "no-weights"):
        ckpt = shutil.copytree(tiny_dir, tmp_path / case)
        weights = ckpt / "transformer" / "diffusion_pytorch_model.safetensors"
        if case == "truncated":
            os.truncate(weights, weights.stat().st_size // 2)
        elif case == "overwritten":
            with open(weights, "r+b") as f:
                f.write(b"garbage!garbage!")
        else:
            weights.unlink()
        checkpoints[case] = ckpt
    (tmp_path / "a-file").write_text("not a folder")
    image = tmp_path / "first.png"
    Image.new("RGB", (160, 96), (200, 90, 30)).save(image)
    gates = tmp_path / "gates.safetensors"
    save_file({"blocks.0.attn1.to_gate_compress.weight": np.random.default_rng(0).random((3, 5), np.float32)},
              str(gates))
    out = tmp_path / "out"
    out.mkdir()
    split = ["--device", "cpu", "--height", "112", "--width", "176"]  # 7 x 11 x 5 = 385 tokens: 2 does not divide
    cases = {  # args after `t2v PROMPT` (or a whole command line), what the line says, the VSAGEN_CACHE
        "height": (["--model", "tiny", "--height", "100"], "--height must be a positive multiple of 16", None),
        "search ranges": (["search", "--prompt", "p", "--model", "tiny", "--steps", "2", "--ranges", "3"],
                          "--ranges must be in [1, --steps] = [1, 2]", None),
        "search ti2v size": (["search", "--prompt", "p", "--model", "tiny-ti2v", "--height", "48"],
                             "--height must be a positive multiple of 32 for tiny-ti2v", None),
        "compare height": (["compare", "p", "--model", "tiny", "--width", "100"], "--width must be a positive", None),
        "attn option": (["--model", "tiny", "--attn", "vsa:sparsity=2"], "sparsity must be in [0, 1)", None),
        "codec": (["--model", "tiny", "--codec", "x264:crf=-1"], "crf must be an integer in [0, 51]", None),
        "compare codec": (["compare", "p", "--model", "tiny", "--codec", "av1"], "--codec must be x264 or nvenc",
                          None),
        "unknown option": (["--bogus", "1"], "No such option: --bogus (see", None),
        "close option": (["--hieght", "1"], "--height", None),
        "option twice": (["--model", "tiny", "--attn", "vsa:tile=4x4x8", "--attn", "vsa:tile=4x8x8"],
                         "--attn given 2 times; give it once (see `vsagen t2v --help`)", None),
        "flag both ways": (["--model", "tiny", "--overwrite", "--no-overwrite"],
                           "given 2 times (--overwrite --no-overwrite); give it once", None),
        "compare option twice": (["compare", "p", "--model", "tiny", "--tile-fit", "crop", "--tile-fit=partial"],
                                 "--tile-fit given 2 times; give it once", None),
        "ulysses degree": (["--model", "tiny", "--ulysses", "2", *split], "--ulysses 2 does not divide 385 tokens",
                           None),
        "ulysses heads": (["--model", "tiny", "--device", "cpu", "--ulysses", "3"],
                          "--ulysses 3 does not divide 2 heads", None),
        "cfg-parallel no cfg": (["--model", "tiny", "--device", "cpu", "--cfg-parallel", "--guidance", "1"],
                                "--guidance 1 turns classifier-free guidance off", None),
        "ulysses with gate weights": (["--model", "tiny", "--attn", f"vsa:gate_weights={gates}", "--ulysses", "2",
                                       *split], "--ulysses 2 does not divide 385 tokens", None),
        "i2v ulysses": (["i2v", str(image), "p", "--model", "tiny-i2v", "--ulysses", "2", *split],
                        "--ulysses 2 does not divide 385 tokens", None),
        "i2v no image": (["i2v", str(tmp_path / "none.png"), "p", "--model", "tiny-i2v"], "none.png does not exist",
                         None),
        "i2v ti2v size": (["i2v", str(image), "p", "--model", "tiny-ti2v", "--width", "100"],
                          "--width must be a positive multiple of 32 for tiny-ti2v", None),
        "profile ulysses": (["profile", "--model", "tiny", "--ulysses", "2", *split],
                            "--ulysses 2 does not divide 385 tokens", None),
        "profile cfg-parallel": (["profile", "--model", "tiny", "--device", "cpu", "--cfg-parallel", "--guidance", "1"],
                                 "--guidance 1 turns classifier-free guidance off", None),
        "serve open host": (["serve", "--model", "tiny", "--host", "0.0.0.0"], "give it a token", None),
        "truncated": (["--model", str(checkpoints["truncated"])],
                      "transformer/diffusion_pytorch_model.safetensors is damaged or truncated", None),
        "overwritten": (["--model", str(checkpoints["overwritten"])],
                        "transformer/diffusion_pytorch_model.safetensors is damaged or truncated", None),
        "no weights": (["--model", str(checkpoints["no-weights"])], "transformer/ holds no weights", None),
        "cache": (["--model", "tiny"], f"vsagen cache {tmp_path}/a-file/cache (not a folder: {tmp_path}/a-file)",
                  tmp_path / "a-file" / "cache"),
    }
    batches: dict[Path, list[tuple[str, list[str], str]]] = {}
    for name, (args, says, cache) in cases.items():
        command = args if args[0] in _TARGETS else ["t2v", "a prompt", *args]
        option, target = _TARGETS[command[0]]
        batches.setdefault(cli_cache if cache is None else cache, []).append(
            (name, [*command, option, str(out / target)], says))
    for i, (cache, batch) in enumerate(batches.items()):
        report = tmp_path / f"batch-{i}.json"
        res = subprocess.run([sys.executable, "-c", _BATCH_PROBE, str(report), json.dumps([a for _, a, _ in batch])],
                             capture_output=True, text=True, env=sub_env(cache, tmp_path), timeout=120)
        answers = json.loads(report.read_text())
        errs, outs = res.stderr.split(_SEPARATOR + "\n"), res.stdout.split(_SEPARATOR + "\n")
        assert len(answers) == len(batch) == len(errs) - 1 == len(outs) - 1, res.stderr[-2000:]
        for (name, _, says), (code, heavy, wall), err, stdout in zip(batch, answers, errs, outs):
            line = assert_one_error_line(err, stdout)
            assert (code, heavy) == (2, []) and says in line, (name, line, heavy)
            assert wall < BAD_INPUT_WALL_S, f"{name}: {wall:.2f} s"
    assert list(out.iterdir()) == []
    assert not (tmp_path / "a-file").is_dir()


def test_console_script_entry_point(vsagen_cache, tmp_path):
    """The installed `vsagen` script calls the same main()."""
    script = Path(sys.executable).parent / "vsagen"
    if not script.exists():
        pytest.skip("console script not installed next to this interpreter")
    res = subprocess.run([str(script), "t2v", "a prompt", "--steps", "abc"], capture_output=True, text=True,
                         env=sub_env(vsagen_cache, tmp_path), timeout=30)
    assert res.returncode == 2
    assert "--steps" in assert_one_error_line(res.stderr, res.stdout)


# One process runs the bad inputs through CliRunner, one after another, each answer with the heavy modules imported
# by then (it exits 0: the answers are its JSON on stdout).
_CLIRUNNER_PROBE = (
    "import json, sys\nfrom typer.testing import CliRunner\nfrom vsagen.cli.app import app\n"
    "runner = CliRunner()\nanswers = []\n"
    "for argv in json.loads(sys.argv[1]):\n    res = runner.invoke(app, argv)\n"
    "    heavy = sorted({m.split('.')[0] for m in sys.modules} & set(%r))\n"
    "    answers.append([res.exit_code, res.stdout, res.stderr, heavy])\n"
    "print(json.dumps(answers))\n" % (HEAVY_MODULES,))


def test_file_refusals_come_before_torch(vsagen_cache, tmp_path):
    """A user trial: these were refused right (one `error:` line, exit 2) but only once `import torch` had run (4-7 s
    instead of ~1 s): `resolve` asks torch for CUDA under `--device auto` (the default), and each command checked its
    own files (--out, --plot, the input image) after it, as it checked `--attn auto`'s choice against --sparsity. Every
    one runs through CliRunner in one fresh process that has imported none of HEAVY_MODULES at the end, and none
    writes anything."""
    from PIL import Image

    for name in ("exist.mp4", "pat.json", "fox.png"):
        (tmp_path / name).write_bytes(b"precious")
    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "mix.txt").write_text("dense everywhere, not JSON")
    Image.new("RGB", (8, 8), (200, 90, 30)).save(tmp_path / "small.png")
    before = sorted(p.name for p in tmp_path.iterdir())
    t = tmp_path
    cases = {  # the command line, what its one line says
        "avi": (["t2v", "--model", "tiny", "--out", f"{t}/foo.avi", "a fox"], "the extension picks the format"),
        "avi full": (["t2v", "--model", "tiny", "--attn", "full", "--out", f"{t}/foo.avi", "a fox"],
                     "the extension picks the format"),
        "exists": (["t2v", "--model", "tiny", "--out", f"{t}/exist.mp4", "a fox"], "exist.mp4 exists; pass --overwrite"),
        "proc": (["t2v", "--model", "tiny", "--out", "/proc/x.mp4", "a fox"], "cannot write to /proc"),
        "proc folder": (["t2v", "--model", "tiny", "--out", "/proc/vsagen-test/x.mp4", "a fox"],
                        "cannot write to /proc/vsagen-test"),
        "not a folder": (["t2v", "--model", "tiny", "--out", f"{t}/a-file/x.mp4", "a fox"], "is not a directory"),
        "search exists": (["search", "--model", "tiny", "--prompt", "a fox", "--out", f"{t}/pat.json"],
                          "pat.json exists; pass --overwrite"),
        "profile exists": (["profile", "--model", "tiny", "--out", f"{t}/exist.mp4"], "exist.mp4 exists"),
        "compare file": (["compare", "--model", "tiny", "x", "--out", f"{t}/fox.png"], "fox.png is a file"),
        "plot suffix": (["profile", "--model", "tiny", "--plot", f"{t}/foo.txt"], "foo.txt: give a file name ending"),
        "small image": (["i2v", "--model", "tiny-i2v", f"{t}/small.png", "x"], "is 8x8 pixels"),
        "sparsity under auto": (["t2v", "--model", "tiny", "--sparsity", "0.5", "--out", f"{t}/v.mp4", "a fox"],
                                "--attn auto chose full"),
        "patterns not json": (["t2v", "--model", "tiny", "--attn", f"sparse-vdit:patterns={t}/mix.txt", "--out",
                               f"{t}/v.mp4", "a fox"], "is not JSON"),
    }
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", _CLIRUNNER_PROBE, json.dumps([a for a, _ in cases.values()])],
                         capture_output=True, text=True, env=sub_env(vsagen_cache, tmp_path), timeout=60)
    wall = time.perf_counter() - t0
    assert res.returncode == 0, res.stderr[-2000:]
    answers = json.loads(res.stdout)
    assert len(answers) == len(cases)
    for (name, (_, says)), (code, stdout, stderr, heavy) in zip(cases.items(), answers):
        line = assert_one_error_line(stderr, stdout)
        assert (code, heavy) == (2, []) and says in line, (name, line, heavy)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "hf-home") == before
    assert (tmp_path / "exist.mp4").read_bytes() == b"precious"
    assert wall < 5, f"{wall:.2f} s"


# `python -m vsagen t2v ...` with the run itself faked (no torch: nor its process group's end): the files written,
# then the report printed.
FAKE_RUN = textwrap.dedent("""
    import contextlib, sys, types
    from rich.table import Table
    import vsagen.parallel.launch

    vsagen.parallel.launch.joined = lambda *args: contextlib.nullcontext()

    class Report:
        attention_share_of_dit = 0.5
        def rich_table(self, title, cached):
            table = Table(title=title)
            table.add_column("region")
            table.add_row("DiT")
            return table
        def ranks_table(self):
            return None

    class Result:
        def __init__(self, cfg):
            self.video_path, self.json_path, self.report = cfg.out, cfg.json_out, Report()
            self.summary = {"video": str(cfg.out), "model": cfg.model, "attn": "full", "backend": {},
                            "vae_tiling": False}

    def generate(cfg, **kwargs):
        cfg.out.write_bytes(b"video")
        cfg.json_out.write_text("{}")
        return Result(cfg)

    sys.modules["vsagen.commands.generate"] = types.SimpleNamespace(generate=generate, generate_seeds=None)
    sys.argv = ["vsagen", *sys.argv[1:]]
    from vsagen.cli import main
    main()
""")


T2V = ["t2v", "a fox", "--model", "tiny", "--random-weights", "--steps", "1", "--device", "cpu"]  # (cpu: no torch)


@pytest.mark.parametrize("args", [T2V, [*T2V, "--json"], ["presets"]], ids=["t2v-table", "t2v-json", "presets"])
def test_a_reader_that_goes_away_ends_the_command_quietly_with_exit_0(vsagen_cache, tmp_path, args):
    """A user trial: `vsagen t2v --model tiny --steps 1 --out j3.mp4 "a fox" | head -1` exited 1 without a word,
    both files written (stdout closed early: Rich's broken-pipe exit; the JSON line's was an error line). Here
    stdout's reader is gone before the command prints: exit 0, nothing on stderr, the files in place."""
    out = tmp_path / "j3.mp4"
    argv = [sys.executable, "-m", "vsagen", *args] if args == ["presets"] else \
        [sys.executable, "-c", FAKE_RUN, *args, "--out", str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=sub_env(vsagen_cache, tmp_path),
                            cwd=tmp_path)
    proc.stdout.close()  # the reader gone before the command's first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and err == ""
    if args != ["presets"]:
        assert out.read_bytes() == b"video" and out.with_suffix(".json").read_text() == "{}"


def test_dangling_symlink_output_is_refused_up_front(cli_cache, tmp_path):
    """A dangling symlink at --out used to pass the pre-check and fail only after the whole run."""
    link = tmp_path / "link.mp4"
    link.symlink_to(tmp_path / "nowhere.mp4")
    res = t2v("a prompt", "--model", "tiny", "--out", str(link))
    assert res.exit_code == 2, res.output
    assert "exists" in assert_one_error_line(res.stderr, res.stdout)
    assert link.is_symlink() and not (tmp_path / "nowhere.mp4").exists()


def test_default_output_name_counts_up_and_overwrite_reuses_it(cli_cache, tmp_path, monkeypatch):
    from vsagen.commands.generate_config import resolve_generate as resolve

    monkeypatch.chdir(tmp_path)
    (tmp_path / "vsagen-tiny-full-seed0.mp4").write_bytes(b"old")
    assert resolve("a prompt", model="tiny").out.name == "vsagen-tiny-full-seed0-1.mp4"
    assert resolve("a prompt", model="tiny", overwrite=True).out.name == "vsagen-tiny-full-seed0.mp4"
    # a few-step sampler is in the name (a new-user trial: a dmd run took the default run's name plus -1)
    assert resolve("a prompt", model="tiny", sampler="dmd").out.name == "vsagen-tiny-full-dmd-seed0.mp4"


def test_unwritable_cache_gives_one_line_naming_the_fix(cli_cache, tmp_path, monkeypatch):
    """An unwritable VSAGEN_CACHE is bad input (exit 2; it was 1, issue 29), said before the model loads."""
    monkeypatch.setenv("VSAGEN_CACHE", "/proc/vsagen-cache")
    res = t2v("a prompt", "--model", "tiny", "--out", str(tmp_path / "x.mp4"))
    line = one_error_line(res)
    assert "VSAGEN_CACHE" in line and "XDG_CACHE_HOME" in line and "/proc" in line
    assert list(tmp_path.iterdir()) == []


def test_version_prints_the_version_and_exits_0():
    import vsagen

    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.stdout.strip() == f"vsagen {vsagen.__version__}"


def _synopses() -> dict[str, set[str]]:
    """The flags docs/commands.md's Synopsis gives each command, "[the t2v options]" (i2v) and "[the t2v options but
    A, B]" (compare) spelled out."""
    import re

    doc = (Path(__file__).parents[2] / "docs" / "commands.md").read_text()
    block = doc.split("## Synopsis", 1)[1].split("```")[1]
    texts: dict[str, str] = {}
    name = None
    for line in block.splitlines():
        if line.startswith("vsagen "):  # a command's first line ("vsagen --version": none)
            name = m.group(1) if (m := re.match(r"vsagen (\w+)", line)) else None
        if name is not None:
            texts[name] = texts.get(name, "") + line.split("#")[0] + "\n"
    flags = {}
    for name, text in texts.items():
        found = set(re.findall(r"--[a-z][a-z0-9-]*", text))
        if m := re.search(r"\[the (\w+) options(?: but ([^\]]*))?\]", text):
            but = set(re.findall(r"--[a-z][a-z0-9-]*", m.group(2) or ""))
            found = (found - but) | (set(re.findall(r"--[a-z][a-z0-9-]*", texts[m.group(1)])) - but)
        flags[name] = found
    return flags


def test_every_option_of_each_command_is_in_its_docs_synopsis():
    """Each command's --help options against its synopsis in docs/commands.md, both ways (a new-user trial: the
    profile synopsis lacked --cache, the search one --sampler; nothing compared them). An option counts as given
    under any of its names (--stock as --no-stock, --gpus as --nproc)."""
    import typer

    synopses = _synopses()
    commands = typer.main.get_command(app).commands
    assert set(synopses) == set(commands)
    for name, command in commands.items():
        options = [p.opts + p.secondary_opts for p in command.params if p.param_type_name == "option"]
        missing = [names[0] for names in options if not set(names) & synopses[name]]
        unknown = synopses[name] - {n for names in options for n in names}
        assert not missing and not unknown, (name, "in --help, not the synopsis:", missing, "not options:", unknown)


def test_the_run_title_says_the_attention_precision():
    """New-user trial: a `--attn vsa:precision=int8` run's title did not say int8 (`--quant` says "int8 linears")."""
    from types import SimpleNamespace

    from vsagen.cli.app import _attn_details

    vsa = {"name": "vsa", "sparsity": 0.875, "tile": "4x4x4", "precision": "bf16"}
    assert _attn_details(SimpleNamespace(sparsity=0.875), vsa) == " (sparsity 0.875)"
    assert _attn_details(SimpleNamespace(sparsity=0.875), {**vsa, "precision": "int8", "tile": "4x4x8"}) == \
        " (sparsity 0.875, tile 4x4x8, precision int8)"
    assert _attn_details(SimpleNamespace(sparsity=None), {"name": "sla", "topk": 0.1, "precision": "int8"}) == \
        " (top-k 0.1, precision int8)"
    assert _attn_details(SimpleNamespace(sparsity=None), {"name": "full"}) == ""
    # the knobs ran no call sparse (new-user trial: vsa:dense_steps=5 of 2 steps read "vsa (sparsity 0.875)")
    assert _attn_details(SimpleNamespace(sparsity=0.875), {**vsa, "dense_calls": 8, "sparse_calls": 0}) == \
        " (sparsity 0.875, every call dense)"
    assert _attn_details(SimpleNamespace(sparsity=0.875), {**vsa, "dense_calls": 4, "sparse_calls": 4}) == \
        " (sparsity 0.875)"
