"""vsagen.commands.search: prompts files, the request checks through `vsagen search` (one error line, exit 2, nothing
written), an interrupted search writes nothing (Ctrl-C and SIGTERM), and end to end on the tiny models: a file
`load_patterns` accepts, tied to the tiny architecture, each head's mode the rule's choice on the file's own scores,
eps 0 -> dense, huge lam -> skip, both experts of tiny-a14b; `vsagen t2v --attn sparse-vdit:patterns=<searched
file>` records the file and its sha256; the shipped vsagen/preset_data/patterns files are searches of their presets. (The
scoring itself: tests/attention/test_sparse_vdit_search.py.)"""

from __future__ import annotations

import json
import math
import os
import signal

import pytest
from typer.testing import CliRunner

from conftest import one_error_line
from vsagen.cli.app import _sigterm_as_interrupt, app
from vsagen.commands.search import read_prompts, resolve_search, search
from vsagen.errors import BadInput
from vsagen.architecture import architecture_of
from vsagen.sparsity.files import file_hash, load_patterns
from vsagen.sparsity.patterns import block_density, default_catalog
from vsagen.attention.sparse_vdit_search import DEFAULT_EPS, DEFAULT_LAM, choose_mode

STEPS = 2  # fewest denoising steps that still exercise the loop
TINY_ARCH = {"layers": 2, "heads": 2, "head_dim": 16, "in_channels": 16, "ffn_dim": 32, "patch_size": [1, 2, 2]}

runner = CliRunner()


# ------------------------------------------------------------------------------------ prompts


def test_prompts_file_skips_blank_lines_and_comments(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("# a comment\n  a fox  \n\n\t\n#another\na cat # not a comment\n", encoding="utf-8")
    assert read_prompts(f) == ("a fox", "a cat # not a comment")


def test_prompts_file_is_read_as_t2v_reads_it(tmp_path):
    """User trial: `search --prompts` read a `t2v --prompts` file's JSON lines as prompts, braces and all."""
    f = tmp_path / "p.txt"
    f.write_text('a fox\n{"prompt": "a cat", "seed": 3, "height": 32}\n# x\n{"prompt": "a dog", "seed": 4}\n'
                 '{"prompt": "an owl"}\n', encoding="utf-8")
    assert read_prompts(f) == ("a fox", "a cat", "a dog", "an owl")


def test_a_json_line_s_own_values_are_ignored_with_one_note(vsagen_cache, tmp_path):
    f = tmp_path / "p.txt"
    f.write_text('a fox\n{"prompt": "a cat", "seed": 3, "height": 32}\n{"prompt": "a dog", "seed": 4}\n')
    cfg = resolve_search(prompts=f, model="tiny", device="cpu", steps=STEPS, out=tmp_path / "p.json")
    assert cfg.prompts == ("a fox", "a cat", "a dog") and cfg.seed != 3 and cfg.height != 32
    note = f"--prompts {f}: a search takes each line's prompt only; height (line 2), seed (lines 2, 3) are ignored: " \
           "every prompt runs with the command line's --height, --seed"
    assert [n for n in cfg.notes if n.startswith("--prompts")] == [note]
    f.write_text('a fox\n{"prompt": "a cat"}\n')  # no value of its own: no note
    cfg = resolve_search(prompts=f, model="tiny", device="cpu", steps=STEPS, out=tmp_path / "p.json")
    assert cfg.prompts == ("a fox", "a cat") and not [n for n in cfg.notes if n.startswith("--prompts")]


def test_the_note_of_ignored_values_comes_with_the_summary(vsagen_cache, tiny_dir, tmp_path):
    f = tmp_path / "p.txt"
    f.write_text('{"prompt": "a cat", "seed": 3}\n{"prompt": "a dog", "negative_prompt": "rain"}\n')
    res = runner.invoke(app, ["search", "--model", "tiny", "--prompts", str(f), "--steps", "1", "--height", "16",
                              "--width", "16", "--frames", "1", "--out", str(tmp_path / "p.json")])
    assert res.exit_code == 0, res.output
    flat = " ".join(res.stdout.split())
    assert flat.count(f"note: --prompts {f}: a search takes each line's prompt only; seed (line 1), "
                      "negative_prompt (line 2) are ignored") == 1 and "note:" not in res.stderr
    assert load_patterns(tmp_path / "p.json").prompts == 2


@pytest.mark.parametrize("content", [None, "", "\n  \n# only comments\n", b"\xff\xfe bad"])
def test_bad_prompts_file_is_one_error(tmp_path, content):
    f = tmp_path / "p.txt"
    if isinstance(content, bytes):
        f.write_bytes(content)
    elif content is not None:
        f.write_text(content)
    with pytest.raises(BadInput, match="--prompts"):
        read_prompts(f)


# ----------------------------------------------------------------------------------------------- the command


def search_cli(*args: str):
    return runner.invoke(app, ["search", *args])


BAD = [
    ("no-prompt", [], ["--prompt", "--prompts"]),
    ("both", ["--prompt", "a", "--prompts", "{tmp}/p.txt"], ["not both"]),
    ("empty-prompts", ["--prompts", "{tmp}/empty.txt"], ["--prompts", "no prompt"]),
    ("missing-prompts", ["--prompts", "{tmp}/none.txt"], ["--prompts", "no such file"]),
    # the lines `t2v --prompts` refuses, refused alike
    ("json-string-line", ["--prompts", "{tmp}/quoted.txt"], ["quoted.txt line 2 is a JSON string, not an object"]),
    ("json-bad-value", ["--prompts", "{tmp}/seed.txt"], ["seed.txt line 1: seed must be an integer"]),
    ("ranges", ["--prompt", "a", "--steps", "3", "--ranges", "4"], ["--ranges", "[1, 3]"]),
    ("lam", ["--prompt", "a", "--lam", "-1"], ["--lam"]),
    ("eps", ["--prompt", "a", "--eps", "nan"], ["--eps"]),
    ("suffix", ["--prompt", "a", "--out", "{tmp}/o/p.txt"], [".json"]),
    ("i2v", ["--prompt", "a", "--model", "tiny-i2v"], ["image-to-video"]),
    ("frames", ["--prompt", "a", "--frames", "6"], ["--frames"]),
    # issue 30: a distilled preset searches its own 3-step sampler, so its ranges count those steps (not the 50
    # steps of its scheduler's default)
    ("ranges-of-the-sampler", ["--prompt", "a", "--model", "fastwan2.1-t2v-1.3b", "--random-weights", "--ranges", "4"],
     ["--ranges", "[1, 3]"]),
]


@pytest.mark.parametrize("case_id,extra,needles", BAD, ids=[c[0] for c in BAD])
def test_bad_input_is_one_error_line_exit_2(vsagen_cache, tmp_path, case_id, extra, needles):
    (tmp_path / "p.txt").write_text("a fox\n")
    (tmp_path / "empty.txt").write_text("# nothing\n\n")
    (tmp_path / "quoted.txt").write_text('a fox\n"a cat"\n')
    (tmp_path / "seed.txt").write_text('{"prompt": "a cat", "seed": "1"}\n')
    before = sorted(p.name for p in tmp_path.iterdir())
    args = [a.replace("{tmp}", str(tmp_path)) for a in extra]
    if "--model" not in args:
        args += ["--model", "tiny"]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "o" / "p.json")]
    line = one_error_line(search_cli(*args))
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "something was written"


def test_existing_out_is_refused_without_overwrite(vsagen_cache, tmp_path):
    out = tmp_path / "p.json"
    out.write_text("precious")
    line = one_error_line(search_cli("--model", "tiny", "--prompt", "a", "--out", str(out)))
    assert str(out) in line and "--overwrite" in line
    assert out.read_text() == "precious"


def test_help_says_what_the_error_is():
    res = runner.invoke(app, ["search", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    text = " ".join(res.output.split())
    assert "relative MSE" in text and "mean(O_full^2)" in text and "--ranges" in text


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm", "swallowed"])
def test_an_interrupted_search_writes_nothing(vsagen_cache, tiny_dir, tmp_path, monkeypatch, how):
    import vsagen.pipeline

    def interrupted(self, *args, **kwargs):
        if how == "ctrl-c":
            raise KeyboardInterrupt
        if how == "swallowed":  # SIGINT inside a finalizer: Python drops the KeyboardInterrupt, the run goes on
            import gc

            class Finalized:
                def __del__(self):
                    os.kill(os.getpid(), signal.SIGINT)
                    for _ in range(10_000):
                        pass

            Finalized()
            gc.collect()
            return None
        # never the default handler here (it would end pytest): the command's raises KeyboardInterrupt
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN, None)
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10_000):  # the handler runs between bytecodes
            pass
        raise AssertionError("SIGTERM did not interrupt")

    monkeypatch.setattr(vsagen.pipeline.Session, "run", interrupted)
    res = search_cli("--model", "tiny", "--prompt", "a", "--steps", "1", "--out", str(tmp_path / "p.json"))
    assert res.exit_code == (143 if how == "sigterm" else 130), res.output
    assert "interrupted" in res.stderr
    assert list(tmp_path.iterdir()) == []


def test_sigterm_becomes_keyboard_interrupt_and_the_handler_comes_back():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with _sigterm_as_interrupt() as interrupted:
            assert not interrupted()
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10_000):  # the handler runs between bytecodes
                pass
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_an_interrupt_swallowed_by_a_finalizer_still_writes_nothing():
    """A KeyboardInterrupt raised inside a `__del__` is printed and dropped by Python: the review saw a search go on
    and write its file. The handler records the signal, and the search asks before it writes."""
    import gc

    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(10_000):
                pass

    with _sigterm_as_interrupt() as interrupted:
        Finalized()
        gc.collect()
        assert interrupted()  # the exception was swallowed, the flag was not



# ----------------------------------------------------------------------------------------------- end to end


def run_search(tmp_path, name="p.json", **kw):
    cfg = resolve_search(model=kw.pop("model", "tiny"), prompt=kw.pop("prompt", "a red fox in the snow"),
                         steps=kw.pop("steps", STEPS), out=tmp_path / name, **kw)
    return search(cfg, progress=False)


@pytest.mark.slow
def test_search_on_tiny_writes_a_file_t2v_runs(vsagen_cache, tiny_dir, tmp_path, tiny_pipe):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red fox in the snow\n# skipped\n\na cat on a sofa\n")
    res = runner.invoke(app, ["search", "--model", "tiny", "--prompts", str(prompts), "--steps", str(STEPS),
                              "--ranges", "2", "--out", str(tmp_path / "p.json")], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert "overall block density" in res.stdout and "speed-up" in res.stdout
    # issue 29: at 80 columns every line fits and the mode headers break after their hyphen (multi-diag/onal before)
    assert all(len(line) <= 80 or len(line.split()) == 1 for line in res.stdout.splitlines())  # a long path: alone
    assert {"multi-", "diagonal", "vertical-", "stripe"} <= set(res.stdout.replace("│", " ").split())
    # every note with the summary, on stdout (the model's random weights too), none on stderr
    assert "note: model 'tiny' has random weights" in res.stdout and "note:" not in res.stderr
    flat = " ".join(res.stdout.split())  # a search makes no video: its note says what its result means
    assert "what the search finds means nothing" in flat and "video" not in flat
    pf = load_patterns(tmp_path / "p.json")
    assert architecture_of(tiny_pipe.transformer) == TINY_ARCH == {**pf.architecture}
    assert (pf.model, pf.experts, pf.steps, pf.prompts, pf.grid) == ("tiny", ("transformer",), STEPS, 2, (5, 6, 10))
    assert (pf.height, pf.width, pf.frames, pf.lam, pf.eps) == (96, 160, 17, DEFAULT_LAM, DEFAULT_EPS)
    assert [(r.start, r.stop) for r in pf.ranges] == [(0, 1), (1, 2)]
    assert set(pf.modes) == {p.name for p in default_catalog()}
    for r in pf.ranges:
        assert len(r.heads["transformer"]) == 2 and all(len(layer) == 2 for layer in r.heads["transformer"])
    assert set(pf.scores) == {f"transformer/{layer}/{h}" for layer in range(2) for h in range(2)}
    for s in pf.scores.values():
        assert set(s) == set(pf.modes) and s["dense"] == 0.0 and s["skip"] == pytest.approx(1.0, rel=1e-6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json", "prompts.txt"]  # no temporary files left

    video = tmp_path / "v.mp4"
    res = runner.invoke(app, ["t2v", "a cat", "--model", "tiny", "--steps", str(STEPS), "--attn",
                              f"sparse-vdit:patterns={tmp_path / 'p.json'}", "--out", str(video)])
    assert res.exit_code == 0, res.output
    backend = json.loads(video.with_suffix(".json").read_text())["backend"]
    assert backend["patterns"] == str(tmp_path / "p.json")
    assert backend["patterns_sha256"] == file_hash(tmp_path / "p.json")
    assert video.stat().st_size > 0


@pytest.mark.slow
def test_each_head_gets_the_rule_s_choice_on_its_scores(vsagen_cache, tiny_dir, tmp_path):
    for lam, eps in ((DEFAULT_LAM, DEFAULT_EPS), (0.0, 1e9), (0.05, 0.05)):
        result = run_search(tmp_path, f"p-{lam}-{eps}.json", lam=lam, eps=eps)
        pf = result.patterns
        modes = list(pf.modes.values())
        costs = [block_density(p, pf.tiles) for p in modes]
        for layer, names in enumerate(pf.ranges[0].heads["transformer"]):
            for h, name in enumerate(names):
                errors = [pf.scores[f"transformer/{layer}/{h}"][p.name] for p in modes]
                assert name == modes[choose_mode(modes, errors, costs, lam, eps)].name


@pytest.mark.slow
@pytest.mark.parametrize("lam,eps,want", [(DEFAULT_LAM, 0.0, {"dense"}), (100.0, DEFAULT_EPS, {"skip"})])
def test_eps_zero_is_dense_and_huge_lam_skips(vsagen_cache, tiny_dir, tmp_path, lam, eps, want):
    result = run_search(tmp_path, lam=lam, eps=eps)
    assert {n for layer in result.patterns.ranges[0].heads["transformer"] for n in layer} == want
    assert result.density == (1.0 if want == {"dense"} else 0.0)


@pytest.mark.slow
def test_two_experts_both_get_modes(vsagen_cache, a14b_dir, tmp_path):
    result = run_search(tmp_path, model="tiny-a14b", steps=2)
    pf = load_patterns(result.path)
    assert pf.experts == ("transformer", "transformer_2")
    assert {k.split("/")[0] for k in pf.scores} == {"transformer", "transformer_2"}  # each expert ran one step
    for e in pf.experts:
        assert len(pf.ranges[0].heads[e]) == 2
    assert result.calls == 2 * 2 * 2  # 2 steps x CFG x 2 layers


# ------------------------------------------------------------------------------------------ shipped files


@pytest.mark.parametrize("preset", ["tiny", "tiny-a14b"])
def test_shipped_pattern_files_fit_their_presets(preset, tmp_path):
    from vsagen.attention import backend_class
    from vsagen.commands.generate_config import resolve_generate as resolve
    from vsagen.layout import plan_crop
    from vsagen.models.presets import load_preset

    p = load_preset(preset)
    path = p.defaults.attention["sparse-vdit"]["patterns"]
    pf = load_patterns(path)
    assert pf.model == preset and {**pf.architecture} == TINY_ARCH
    assert pf.experts == (("transformer", "transformer_2") if p.transformer_2 is not None else ("transformer",))
    d = p.defaults
    assert (pf.height, pf.width, pf.frames, pf.steps) == (d.height, d.width, d.frames, d.steps)
    assert pf.grid == plan_crop(d.frames, d.height, d.width, fit="partial", vae_stride_temporal=p.vae_stride_temporal,
                                vae_stride_spatial=p.vae_stride_spatial, patch_size=p.patch_size).grid
    cfg = resolve("a cat", model=preset, attn="sparse-vdit", out=tmp_path / "v.mp4")
    assert cfg.backend.options.patterns == path
    backend = backend_class("sparse-vdit")(cfg.backend.options)
    assert math.isclose(backend.describe()["density"], pf.density(), abs_tol=1e-6)


def test_a_distilled_preset_searches_its_scheduler_with_sampler_default(tmp_path):
    """The ranges error suggests `--sampler default --steps N` (a new-user trial: search had no --sampler)."""
    cfg = resolve_search(prompt="a", model="fastwan2.1-t2v-1.3b", random_weights=True, sampler="default", steps=50,
                         ranges=10, device="cpu", out=tmp_path / "p.json")
    assert (cfg.steps, cfg.ranges, cfg.sampler.name) == (50, 10, "default")
    res = search_cli("--prompt", "a", "--model", "fastwan2.1-t2v-1.3b", "--random-weights", "--sampler", "default",
                     "--steps", "2", "--ranges", "3", "--out", str(tmp_path / "q.json"))
    assert "--ranges must be in [1, --steps] = [1, 2]" in one_error_line(res)
