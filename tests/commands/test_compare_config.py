"""vsagen.commands.compare_config: the `vsagen compare` request: --error-steps, the runs of several samplers (labels,
files, error steps), bad input through the command line (one line, exit 2, nothing written, nothing loaded), notes,
the plot without matplotlib, and the bounds every command shares (issue 28: compare refused `--fps 10000` and
`--flow-shift 5000` only loosely before the one request layer)."""

from __future__ import annotations

import pytest
from conftest import assert_one_error_line
from typer.testing import CliRunner

from vsagen.cli.app import app
from vsagen.commands.compare_config import file_stem, parse_error_steps, resolve_compare
from vsagen.errors import BadInput

runner = CliRunner()


def test_parse_error_steps():
    assert parse_error_steps("first,middle,last", 5) == (0, 2, 4)
    assert parse_error_steps("last, 0, 3", 4) == (0, 3)
    assert parse_error_steps("first,middle,last", 1) == (0,)
    assert parse_error_steps("none", 3) == ()
    for bad in ("4", "-1", "x", "1,,2"):
        with pytest.raises(BadInput, match="--error-steps"):
            parse_error_steps(bad, 4)
    with pytest.raises(BadInput, match="not a step of the dmd run, which runs steps 0 to 2"):
        parse_error_steps("3", 3, "the dmd run")


# --------------------------------------------------------------------------------------------------------------
# Bad input: one line, exit 2, before the model is loaded


BAD = [
    ("one-backend", ["--attn", "full"], ["is one run", "--attn full,vsa", "--sampler dmd,default"]),
    ("one-backend-one-sampler", ["--attn", "vsa", "--sampler", "dmd"], ["'vsa' with --sampler 'dmd' is one run"]),
    ("sampler-twice", ["--sampler", "dmd,default,dmd"], ["written twice"]),
    ("sampler-same", ["--sampler", "dmd,dmd:noise=fresh"], ["'dmd:noise=fresh' runs the same sampler as 'dmd'"]),
    ("sampler-same-run", ["--sampler", "default:steps=4,default"], ["default:steps=4 and default run the same",
                                                                   "4 steps CFG 5 shift 3"]),
    ("sampler-vs-guidance", ["--sampler", "dmd", "--guidance", "5"], ["--guidance 5", "dmd sampler runs without CFG"]),
    ("sampler-list-vs-steps", ["--sampler", "dmd,default", "--steps", "2"], ["--steps 2", "every --sampler entry",
                                                                            "default:steps="]),
    ("sampler-unknown", ["--sampler", "dmd,euler"], ["unknown --sampler 'euler'"]),
    ("error-steps-of-every-run", ["--sampler", "dmd,default:steps=8", "--error-steps", "5"],
     ["step 5", "the dmd run", "0 to 2"]),
    ("unknown-backend", ["--attn", "full,nope"], ["unknown --attn 'nope'", "available"]),
    ("unknown-option", ["--attn", "full,vsa:spars=0.5"], ["spars"]),
    ("repeated", ["--attn", "full,vsa,vsa"], ["twice"]),
    ("height-off-stride", ["--height", "100"], ["--height", "multiple of 16", "96 or 112"]),
    ("frames", ["--frames", "6"], ["--frames", "5", "9"]),
    ("too-wide", ["--width", "4096"], ["--width too large"]),
    ("error-steps", ["--steps", "2", "--error-steps", "2"], ["--error-steps", "0 to 1"]),
    ("image-model", ["--model", "tiny-i2v"], ["image-to-video"]),
    ("out-is-file", ["--out", "{tmp}/afile"], ["is a file"]),
    ("cache-unknown", ["--cache", "none,teacache"], ["unknown --cache 'teacache'; available: none, first-block"]),
    ("cache-option", ["--cache", "none,first-block:thr=1"],
     ["first-block has no option 'thr'; its options: threshold"]),
    ("cache-value", ["--cache", "none,taylorseer:max_order=-1"], ["max_order must be an integer >= 0"]),
    ("cache-twice", ["--cache", "none,none"], ["--cache lists none twice"]),
    ("cache-mag", ["--cache", "none,mag"], ["--cache mag: no calibration file", "mag:calibrate=true"]),
    ("cache-mag-calibrate", ["--cache", "none,mag:calibrate=true"], ["calibrates in a vsagen t2v or i2v run"]),
    ("one-backend-one-cache", ["--attn", "full", "--cache", "first-block"], ["is one run", "two caches"]),
    ("vae-unknown", ["--attn", "full", "--vae", "stock,small"], ["--vae must be one of auto, light, stock, tiny, "
                                                                 "got 'small'"]),
    ("vae-twice", ["--vae", "stock,tiny,stock"], ["--vae 'stock,tiny,stock' lists stock twice"]),
    ("vae-auto-in-a-list", ["--vae", "stock,auto"], ["a list names its decoders"]),
    ("vae-light-without-one", ["--attn", "full", "--vae", "stock,light"],
     ["--vae light: --model tiny has no lightweight VAE decoder"]),
    ("vae-tiny-of-another-width", ["--attn", "full", "--vae", "stock,tiny:name=taew2_2"],
     ["--vae tiny:name=taew2_2 decodes 48-channel latents and --model tiny's VAE makes 16-channel ones"]),
    ("vae-tiny-file-of-another-width", ["--attn", "full", "--vae", "stock,tiny:weights={tmp}/w48.safetensors"],
     ["decodes 48-channel latents and --model tiny's VAE makes 16-channel ones"]),
    ("one-backend-one-decoder", ["--attn", "full", "--vae", "tiny"], ["is one run", "two VAE decoders"]),
]


@pytest.mark.parametrize("args,needles", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_is_one_line_exit_2_before_loading(vsagen_cache, tmp_path, monkeypatch, args, needles):
    monkeypatch.setattr("vsagen.pipeline.Session.load", lambda *a, **k: pytest.fail("loaded despite bad input"))
    (tmp_path / "afile").write_text("a file, not a folder")
    if any("w48.safetensors" in a for a in args):  # a TAEHV decoder of the Wan2.2-5B latent width (48 channels)
        from vsagen.decode.tiny_decoder import TinyVaeConfig, random_decoder, save_file

        save_file(random_decoder(TinyVaeConfig(48, 2, (8, 8, 8, 8)), seed=0), tmp_path / "w48.safetensors")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    res = runner.invoke(app, ["compare", "a prompt", *(["--model", "tiny"] if "--model" not in args else []),
                              *(["--out", str(tmp_path / "out")] if "--out" not in args else []), *args])
    line = assert_one_error_line(res.stderr, res.stdout)
    assert res.exit_code == 2, res.output
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    written = sorted(p.name for p in tmp_path.iterdir() if p.name != "w48.safetensors")
    assert written == ["afile"], "something was written"


def test_runs_are_every_sampler_with_every_backend_sampler_major(tmp_path):
    """--sampler dmd,default:steps=2:guidance=3 with --attn full,vsa: four runs, each sampler with every backend;
    labels and file names name both; each run's error steps are its own (first, middle, last of its steps); the
    settings list each sampler's steps, CFG scale and flow shift (none for dmd, whose sigmas are used as given)."""
    cfg = resolve_compare("a cat", model="tiny", attn="full,vsa", sampler="dmd,default:steps=2:guidance=3",
                          out=tmp_path / "o", plot=False, sheet=True)
    runs = cfg.runs
    assert [r.label for r in runs] == ["full / dmd", "vsa 0.875 / dmd", "full / default 2 steps CFG 3",
                                       "vsa 0.875 / default 2 steps CFG 3"]
    assert [r.file.name for r in runs] == ["full-dmd.mp4", "vsa-dmd.mp4", "full-default-2-steps-cfg-3.mp4",
                                           "vsa-default-2-steps-cfg-3.mp4"]
    assert [(r.plan.steps, r.plan.guidance, r.error_steps) for r in runs] == [(3, 1.0, (0, 1, 2))] * 2 + [
        (2, 3.0, (0, 1))] * 2
    assert [r.spec.name for r in runs] == ["full", "vsa"] * 2 and cfg.error_steps == (0, 1, 2)
    assert cfg.files["vsa 0.875 / dmd sheet"].name == "vsa-dmd.sheet.png"
    samplers = cfg.summary()["samplers"]
    assert [(x["sampler"]["entry"], x["steps"], x["guidance"], x["flow_shift"]) for x in samplers] == [
        ("dmd", 3, 1.0, None), ("default:steps=2:guidance=3", 2, 3.0, 3.0)]
    # default entries that differ in their shift say it; one sampler leaves labels and files as they were
    cfg = resolve_compare("a cat", model="tiny", attn="full", sampler="default:shift=5,default", out=tmp_path / "s",
                          plot=False)
    assert cfg.labels == ["full / default 4 steps CFG 5 shift 5", "full / default 4 steps CFG 5 shift 3"]
    assert [p.name for p in cfg.run_files] == ["full-default-4-steps-cfg-5-shift-5.mp4",
                                               "full-default-4-steps-cfg-5-shift-3.mp4"]
    cfg = resolve_compare("a cat", model="tiny", attn="full,vsa", sampler="dmd", out=tmp_path / "one", plot=False)
    assert cfg.labels == ["full", "vsa 0.875"] and [p.name for p in cfg.run_files] == ["full.mp4", "vsa.mp4"]


def test_runs_are_every_backend_with_every_cache(tmp_path):
    """--attn full,vsa --cache none,first-block: each backend uncached and cached, side by side, the reference full
    uncached; labels and file names say the cache (its options where not the default); with samplers too, the
    sampler is the outer loop; the settings list the caches."""
    cfg = resolve_compare("a cat", model="tiny", attn="full,vsa", cache="none,first-block:threshold=0.1",
                          out=tmp_path / "o", plot=False, sheet=True)
    assert cfg.labels == ["full", "full + first-block:threshold=0.1", "vsa 0.875",
                          "vsa 0.875 + first-block:threshold=0.1"]
    assert [p.name for p in cfg.run_files] == ["full.mp4", "full-first-block-threshold-0.1.mp4", "vsa.mp4",
                                               "vsa-first-block-threshold-0.1.mp4"]
    assert [(r.spec.name, r.cache.name, r.backend_index) for r in cfg.runs] == [
        ("full", "none", 0), ("full", "first-block", 0), ("vsa", "none", 1), ("vsa", "first-block", 1)]
    assert cfg.files["full + first-block:threshold=0.1 sheet"].name == "full-first-block-threshold-0.1.sheet.png"
    assert cfg.summary()["caches"] == [{"name": "none"}, {"name": "first-block", "threshold": 0.1}]
    cfg = resolve_compare("a cat", model="tiny", attn="full", cache="none,first-block", sampler="dmd,default",
                          out=tmp_path / "s", plot=False)
    assert cfg.labels == ["full / dmd", "full + first-block / dmd", "full / default 4 steps CFG 5",
                          "full + first-block / default 4 steps CFG 5"]
    assert cfg.run_files[1].name == "full-first-block-dmd.mp4"
    assert any("--cache first-block with the dmd sampler" in n for n in cfg.notes)


def test_runs_are_every_triple_with_every_decoder(tmp_path):
    """--attn full,vsa --vae stock,tiny:name=lighttaew2_1: each backend's DiT run decoded by each decoder, the
    decoders innermost (one DiT run, then its decodes), the reference full with the stock decoder; labels and file
    names say the decoder; the settings list every --vae entry; one decoder leaves labels and files as they were."""
    cfg = resolve_compare("a cat", model="tiny", attn="full,vsa", vae="stock,tiny:name=lighttaew2_1",
                          out=tmp_path / "o", plot=False, sheet=True)
    assert cfg.labels == ["full / stock VAE", "full / tiny:name=lighttaew2_1 VAE", "vsa 0.875 / stock VAE",
                          "vsa 0.875 / tiny:name=lighttaew2_1 VAE"]
    assert [p.name for p in cfg.run_files] == ["full-vae-stock.mp4", "full-vae-tiny-name-lighttaew2-1.mp4",
                                               "vsa-vae-stock.mp4", "vsa-vae-tiny-name-lighttaew2-1.mp4"]
    assert [(r.spec.name, r.backend_index, r.vae_index) for r in cfg.runs] == [
        ("full", 0, 0), ("full", 0, 1), ("vsa", 1, 0), ("vsa", 1, 1)]
    assert cfg.vae_decoder.kind == "stock" and cfg.several_vaes
    assert cfg.files["full / stock VAE sheet"].name == "full-vae-stock.sheet.png"
    assert cfg.summary()["vae_decoders"] == ["stock", "tiny:name=lighttaew2_1"]
    cfg = resolve_compare("a cat", model="tiny", attn="full", vae="stock,tiny", out=tmp_path / "one", plot=False)
    assert cfg.labels == ["full / stock VAE", "full / tiny VAE"] and len(cfg.runs) == 2  # one DiT run, two decodes
    cfg = resolve_compare("a cat", model="tiny", attn="full,vsa", vae="tiny", out=tmp_path / "t", plot=False)
    assert cfg.labels == ["full", "vsa 0.875"] and not cfg.several_vaes and cfg.summary()["vae_decoders"] == ["tiny"]


def test_default_mag_file_stays_out_of_labels_and_names(tmp_path, monkeypatch):
    """A plain `mag` reads the per-model default file: labels and file names say `mag` (they said mag:file=tiny.json),
    the settings keep the file; a file given is shown. A few-step sampler after the first gets its note too."""
    from vsagen.cache.install import save_ratios
    from vsagen.request.caching import default_mag_file

    monkeypatch.setenv("VSAGEN_CACHE", str(tmp_path / "cache"))  # its own: the others find no default file
    save_ratios(default_mag_file("tiny"), "tiny", 4, {"transformer": [1.0, 0.9, 0.9, 0.9]}, "default")
    cfg = resolve_compare("a cat", model="tiny", attn="full", cache="none,mag", out=tmp_path / "o", plot=False)
    assert cfg.labels == ["full", "full + mag"] and cfg.run_files[1].name == "full-mag.mp4"
    assert cfg.summary()["caches"][1]["file"] == str(default_mag_file("tiny"))
    assert cfg.runs[1].cache.text().endswith(f"file={default_mag_file('tiny')}")
    save_ratios(tmp_path / "my.json", "tiny", 4, {"transformer": [1.0, 0.9, 0.9, 0.9]}, "default")
    cfg = resolve_compare("a cat", model="tiny", attn="full", cache=f"none,mag:file={tmp_path / 'my.json'}",
                          sampler="default,dmd", out=tmp_path / "p", plot=False)
    assert cfg.labels[1] == "full + mag:file=my.json / default 4 steps CFG 5"
    assert sum("with the dmd sampler (3 steps): a cache may reuse" in n for n in cfg.notes) == 1
    assert sum(n.startswith("mag: calibrated at 4 steps and the default sampler, run at 3 steps and the dmd") for n in
               cfg.notes) == 1


def test_a_negative_prompt_steers_the_runs_with_cfg(tmp_path):
    """The first sampler (dmd) runs without CFG, a later one with it: the negative prompt has an effect, no note."""
    cfg = resolve_compare("a cat", model="tiny", attn="full", sampler="dmd,default", negative_prompt="blurry",
                          out=tmp_path / "o", plot=False)
    assert cfg.notes == ()
    cfg = resolve_compare("a cat", model="tiny", attn="full", sampler="dmd,default:guidance=1",
                          negative_prompt="blurry", out=tmp_path / "p", plot=False)
    assert len(cfg.notes) == 1 and "no effect" in cfg.notes[0]


def test_empty_prompt_is_one_line_exit_2():
    res = runner.invoke(app, ["compare", " ", "--model", "tiny"])
    assert res.exit_code == 2 and "prompt is empty" in assert_one_error_line(res.stderr, res.stdout)


def test_existing_outputs_are_kept_without_overwrite(vsagen_cache, tmp_path, monkeypatch):
    monkeypatch.setattr("vsagen.pipeline.Session.load", lambda *a, **k: pytest.fail("loaded despite bad input"))
    (tmp_path / "vsa.mp4").write_text("older")
    res = runner.invoke(app, ["compare", "a prompt", "--model", "tiny", "--out", str(tmp_path)])
    line = assert_one_error_line(res.stderr, res.stdout)
    assert res.exit_code == 2 and str(tmp_path / "vsa.mp4") in line and "--overwrite" in line
    assert (tmp_path / "vsa.mp4").read_text() == "older"


def test_a_negative_prompt_without_cfg_is_a_note_of_the_comparison(tmp_path):
    """As for t2v (`vsagen.request.resolve.negative_prompt_note`): a note, first among the run's notes, not a silent no-op."""
    cfg = resolve_compare("a prompt", model="tiny", attn="full,vsa", guidance=1.0, negative_prompt="blurry",
                          out=tmp_path / "out", plot=False)
    assert len(cfg.notes) == 1 and cfg.notes[0].startswith("--negative-prompt has no effect: CFG is off")
    assert resolve_compare("a prompt", model="tiny", attn="full,vsa", negative_prompt="blurry", out=tmp_path / "o2",
                           plot=False).notes == ()


def test_the_plot_is_skipped_with_a_note_without_matplotlib_unless_asked_for(tmp_path, monkeypatch):
    """`pip install -e .` has no matplotlib (an extra): the README's compare example must still run."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    cfg = resolve_compare("a cat", model="tiny", attn="full,vsa", device="cpu", out=tmp_path / "o")
    assert cfg.plot is False and any("no plot (compare.png): matplotlib" in n for n in cfg.notes)
    assert "plot" not in cfg.files
    with pytest.raises(BadInput, match="the plot needs matplotlib"):
        resolve_compare("a cat", model="tiny", attn="full,vsa", device="cpu", out=tmp_path / "p", plot=True)


def test_sheet_files_are_checked_as_the_mp4s(tmp_path):
    """--sheet: each backend's contact sheet beside its mp4, refused before the run where it exists."""
    cfg = resolve_compare("a cat", model="tiny", attn="full,vsa", out=tmp_path / "o", plot=False, sheet=True)
    assert [cfg.files[k].name for k in ("full sheet", "vsa 0.875 sheet")] == ["full.sheet.png", "vsa.sheet.png"]
    assert "full sheet" not in resolve_compare("a cat", model="tiny", attn="full,vsa", out=tmp_path / "o",
                                               plot=False).files
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "vsa.sheet.png").write_text("older")
    with pytest.raises(BadInput, match=r"vsa\.sheet\.png exists; pass --overwrite"):
        resolve_compare("a cat", model="tiny", attn="full,vsa", out=tmp_path / "o", plot=False, sheet=True)


@pytest.mark.parametrize("spec,stem", [
    ("vsa:sparsity=0.9", "vsa-sparsity-0.9"), ("full", "full"),
    ("sparse-vdit:patterns=tiny.json", "sparse-vdit-patterns-tiny"),  # issue 29: was sparse-vdit_patterns=tiny.json
    ("vsa:sparsity=0.5:impl=torch", "vsa-sparsity-0.5-impl-torch"),
    ("sla-star:proj_weights=my weights.safetensors", "sla-star-proj-weights-my-weights"),
    ("vsa:sparsity=1e-3", "vsa-sparsity-1e-3"), ("::", "")])
def test_backend_file_names_are_clean(spec, stem):
    assert file_stem(spec) == stem


def test_a_pattern_file_backend_is_named_after_the_file(tmp_path):
    """The spec's path option shows its file name (`short_text`), and the file stem drops its extension. (A real
    pattern file: sparse-vdit's options read it when `--attn` is parsed.)"""
    import shutil
    from pathlib import Path

    import vsagen

    patterns = tmp_path / "tiny.json"
    shutil.copy(Path(vsagen.__file__).parent / "preset_data" / "patterns" / "tiny.json", patterns)
    cfg = resolve_compare("a cat", model="tiny", attn=f"full,sparse-vdit:patterns={patterns}", out=tmp_path / "o",
                          plot=False)
    assert [p.name for p in cfg.run_files] == ["full.mp4", "sparse-vdit-patterns-tiny.mp4"]
