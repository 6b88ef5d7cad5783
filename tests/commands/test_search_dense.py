"""vsagen.commands.search_dense (`vsagen search --suggest-dense`): on the tiny model, the measured per-(step, layer)
errors against a float64 recomputation from the run's own q, k, v (vsa run alone on them, dense attention in float64);
the printed `--attn` text parses back (through `--attn`'s parser) to knobs that, applied by the processor's own rule
(`call_is_dense`), zero the entries they cover and leave the rest within the budget (budget 0: every entry dense;
budget 1: no knob); the JSON file; the refusals of the two modes' flags and of bad input (one line, exit 2, before
loading, nothing written); an existing file; an interrupt writes nothing."""

from __future__ import annotations

import dataclasses
import json
import math
import shlex

import pytest
import torch
from typer.testing import CliRunner

import vsagen.kernels  # noqa: F401 - the Triton import (seconds) at collection, not inside the first vsa call
import vsagen.pipeline  # noqa: F401 - diffusers' import (seconds) at collection, not in the first refusal test
from conftest import one_error_line
from vsagen.attention.dense import call_is_dense, step_is_dense
from vsagen.attention.dense_search import ErrorScorer, suggest_dense
from vsagen.attention.spec import spec_of
from vsagen.cli.app import app
from vsagen.commands.search_dense import dense_search, resolve_dense_search, sparse_backends
from vsagen.errors import RunFailure
from vsagen.models.presets import load_preset
from vsagen.request.backends import parse_attn
from vsagen.timing import Timer

STEPS = 2
SMALL = ["--model", "tiny", "--steps", str(STEPS), "--frames", "5"]  # a (2, 6, 10) latent grid: quick on a CPU
runner = CliRunner()


def dense64(q, k, v):
    logits = torch.einsum("bshd,bthd->bhst", q.double(), k.double()) / math.sqrt(q.shape[-1])
    return torch.einsum("bhst,bthd->bshd", logits.softmax(-1), v.double())


@pytest.mark.slow
def test_measured_errors_equal_a_float64_recomputation(vsagen_cache, tiny_dir, tmp_path, monkeypatch):
    captured = []
    scored = ErrorScorer.__call__

    def capture(self, q, k, v, ctx):
        captured.append((self.inner, q.clone(), k.clone(), v.clone(), dataclasses.replace(ctx, timer=Timer("cpu")),
                         ctx.step))
        return scored(self, q, k, v, ctx)

    monkeypatch.setattr(ErrorScorer, "__call__", capture)
    cfg = resolve_dense_search(attn="vsa:sparsity=0.5:impl=torch", model="tiny", prompt="a red fox", steps=STEPS,
                               frames=5, out=tmp_path / "d.json", budget=0.4)
    result = dense_search(cfg, progress=False)
    assert result.calls == len(captured) == STEPS * 2 * 2  # steps x CFG passes x 2 blocks
    sums = [[[0.0, 0.0] for _ in range(2)] for _ in range(STEPS)]
    for backend, q, k, v, ctx, step in captured:
        ref = dense64(q, k, v)
        alone = backend(q, k, v, ctx).double()  # the backend by itself on the call's q, k, v
        sums[step][ctx.layer][0] += float((alone - ref).square().sum())
        sums[step][ctx.layer][1] += float(ref.square().sum())
    want = [[math.sqrt(d / r) for d, r in row] for row in sums]
    assert all(e > 0.01 for row in want for e in row)
    for s in range(STEPS):
        assert result.errors[s] == pytest.approx(want[s], rel=1e-4)
    data = json.loads((tmp_path / "d.json").read_text())
    assert data["rel_l2"] == [[pytest.approx(e, rel=1e-5) for e in row] for row in want]
    assert (data["steps"], data["layers"], data["grid"], data["calls"]) == (STEPS, 2, [2, 6, 10], STEPS * 4)
    assert data["attn"] == "vsa:sparsity=0.5:impl=torch" and data["budget"] == 0.4
    sug = suggest_dense(result.errors, 0.4)
    assert data["suggestion"]["dense_steps"] == sug.dense_steps == result.suggestion.dense_steps
    assert data["suggestion"]["dense_layers"] == list(sug.dense_layers)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.json"]  # no temporary file left


def run_cli(tmp_path, *args):
    return runner.invoke(app, ["search", *SMALL, "--prompt", "a cat", "--suggest-dense", "--out",
                               str(tmp_path / "d.json"), *args], env={"COLUMNS": "200"})


@pytest.mark.slow
@pytest.mark.parametrize("budget", [0.0, 1.0])  # a budget between: the float64 test (0.4), the rule's brute force
def test_the_printed_spec_parses_back_and_its_knobs_meet_the_budget(vsagen_cache, tiny_dir, tmp_path, budget):
    res = run_cli(tmp_path, "--attn", "vsa:impl=torch", "--budget", str(budget))
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "relative L2 per layer" in out and "relative L2 per step" in out and "note: model 'tiny'" in out
    line = next(x for x in out.splitlines() if x.startswith("run it with --attn "))
    text = shlex.split(line)[-1]
    spec = spec_of(parse_attn(text).one(), preset=load_preset("tiny").defaults.attention)
    data = json.loads((tmp_path / "d.json").read_text())
    assert text == data["suggestion"]["attn"] and spec.options.impl == "torch"
    errors = data["rel_l2"]
    steps, layers = len(errors), len(errors[0])
    left = [e for s, row in enumerate(errors) for i, e in enumerate(row)
            if not call_is_dense(spec.options, i, 120, step_is_dense(spec.options, s, steps))]
    total = math.fsum(e for row in errors for e in row)
    assert math.fsum(left) <= budget * total * (1 + 1e-5) + 1e-9
    assert len(left) == steps * layers - round(data["suggestion"]["dense_fraction"] * steps * layers)
    if budget == 0.0:
        assert left == []  # every (step, layer) errs on random weights: all of them run full
    if budget == 1.0:
        assert text == "vsa:impl=torch" and "no dense step or layer" in out


def test_help_says_what_the_suggestion_is():
    res = runner.invoke(app, ["search", "--help"], env={"COLUMNS": "200"})
    text = " ".join(res.stdout.split())
    assert res.exit_code == 0 and "--suggest-dense" in text and "--budget" in text
    assert "fewest (step, layer) entries full" in text and "sqrt(sum ||O - O_full||^2 / sum ||O_full||^2)" in text


BAD = [
    ("no-attn", ["--suggest-dense"], "give it, e.g. --attn vsa"),
    ("full", ["--suggest-dense", "--attn", "full"], "--attn full has no dense_steps"),
    ("auto-full", ["--suggest-dense", "--attn", "auto"], "auto chose full"),
    ("lam", ["--suggest-dense", "--attn", "vsa", "--lam", "0.1", "--ranges", "2"], "--lam / --ranges tune"),
    ("attn-alone", ["--attn", "vsa"], "--attn goes with --suggest-dense"),
    ("budget-alone", ["--budget", "0.1", "--sparsity", "0.5"], "--sparsity / --budget go with --suggest-dense"),
    ("budget", ["--suggest-dense", "--attn", "vsa", "--budget", "-1"], "--budget must be a finite number >= 0"),
    ("budget-nan", ["--suggest-dense", "--attn", "vsa", "--budget", "nan"], "--budget must be a finite number"),
    ("budget-inf", ["--suggest-dense", "--attn", "vsa", "--budget", "inf"], "--budget must be a finite number"),
    ("two", ["--suggest-dense", "--attn", "vsa,sla"], "runs one backend"),
    ("option", ["--suggest-dense", "--attn", "vsa:nope=1"], "vsa has no option 'nope'"),
    ("sparsity", ["--suggest-dense", "--attn", "vsa", "--sparsity", "1.5"], "--sparsity must be in [0, 1)"),
    ("suffix", ["--suggest-dense", "--attn", "vsa", "--out", "{tmp}/d.txt"], "the measurements file is JSON"),
    ("i2v", ["--suggest-dense", "--attn", "vsa", "--model", "tiny-i2v"], "image-to-video"),
]


@pytest.mark.parametrize("case_id,extra,needle", BAD, ids=[c[0] for c in BAD])
def test_bad_input_is_one_error_line_before_loading(vsagen_cache, tmp_path, monkeypatch, case_id, extra, needle):
    monkeypatch.setattr("vsagen.pipeline.Session.load", lambda *a, **k: pytest.fail("loaded despite bad input"))
    monkeypatch.chdir(tmp_path)
    args = [a.replace("{tmp}", str(tmp_path)) for a in extra]
    model = [] if "--model" in args else ["--model", "tiny"]
    line = one_error_line(runner.invoke(app, ["search", "--prompt", "a", *model, *args]))
    assert needle in line, line
    assert list(tmp_path.iterdir()) == []


def test_every_sparse_backend_is_offered():
    assert {"vsa", "sla", "sla-star", "sparse-vdit"} <= set(sparse_backends()) and "full" not in sparse_backends()


@pytest.mark.slow
def test_an_existing_file_is_refused_and_an_interrupted_search_writes_nothing(vsagen_cache, tiny_dir, tmp_path):
    (tmp_path / "d.json").write_text("precious")
    line = one_error_line(run_cli(tmp_path, "--attn", "vsa"))
    assert "--overwrite" in line and (tmp_path / "d.json").read_text() == "precious"
    cfg = resolve_dense_search(attn="vsa:impl=torch", model="tiny", prompt="a", steps=1, frames=5,
                               out=tmp_path / "new.json")
    with pytest.raises(KeyboardInterrupt):
        dense_search(cfg, progress=False, cancelled=lambda: True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.json"]


@pytest.mark.slow
def test_a_non_finite_error_is_a_run_failure_that_writes_nothing(vsagen_cache, tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(ErrorScorer, "errors", lambda self: {(0, "transformer", 1): (math.nan, 1.0)})
    cfg = resolve_dense_search(attn="vsa:impl=torch", model="tiny", prompt="a", steps=1, frames=5,
                               out=tmp_path / "d.json")
    with pytest.raises(RunFailure, match="NaN or infinite"):
        dense_search(cfg, progress=False)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_two_experts_are_pooled_per_step_and_layer(vsagen_cache, a14b_dir, tmp_path):
    """tiny-a14b: the high-noise expert runs step 0 and the low-noise one step 1; each (step, layer) entry holds the
    expert that ran it, and `dense_layers` covers a block of both."""
    cfg = resolve_dense_search(attn="vsa:impl=torch", model="tiny-a14b", prompt="a", steps=2, frames=5,
                               out=tmp_path / "d.json")
    result = dense_search(cfg, progress=False)
    data = json.loads((tmp_path / "d.json").read_text())
    per_expert = {(r["step"], r["layer"]): (r["expert"], r["rel_l2"]) for r in data["rel_l2_per_expert"]}
    assert len(per_expert) == len(data["rel_l2_per_expert"]) == 4  # one expert an entry
    assert {e for e, _ in per_expert.values()} == {"transformer", "transformer_2"}
    for (s, layer), (_, e) in per_expert.items():
        assert data["rel_l2"][s][layer] == e and result.errors[s][layer] == pytest.approx(e, rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("errors,budget,sparse", [([[1.0, 1.0], [0.1, 1.0]], 0.1, {(1, 0)}),
                                                  ([[0.5, 0.2], [0.3, 0.1]], 0.0, set()),
                                                  ([[0.5, 0.2], [0.3, 0.1]], 1.0, {(0, 0), (0, 1), (1, 0), (1, 1)})])
def test_a_run_with_the_suggested_knobs_runs_the_suggested_entries_full(vsagen_cache, tiny_dir, tmp_path, errors,
                                                                        budget, sparse):
    """A suggestion's `--attn` text, pasted (parsed as `--attn` parses it) and run through the processor in the
    search's own denoise loop: the calls that still reach the backend are exactly the entries the suggestion leaves
    sparse; the others ran `full` (error 0)."""
    from vsagen.attention.base import BackendWrapper
    from vsagen.commands.search import denoise_prompts
    from vsagen.commands.search_dense import suggested_spec

    cfg = resolve_dense_search(attn="vsa:impl=torch", model="tiny", prompt="a", steps=STEPS, frames=5,
                               out=tmp_path / "d.json")
    sug = suggest_dense(errors, budget)
    assert {(s, i) for s in range(2) for i in range(2) if not sug.is_dense(s, i)} == sparse
    text = suggested_spec(cfg.backends[0], sug, STEPS).command_text(cfg.source.preset.defaults.attention)
    spec = spec_of(parse_attn(text).one(), preset=cfg.source.preset.defaults.attention)

    class Recorder(BackendWrapper):
        def __call__(self, q, k, v, ctx):
            self.seen.add((ctx.step, ctx.layer))
            return self.inner(q, k, v, ctx)

    recorder = Recorder(spec.build())
    recorder.seen = set()
    denoise_prompts(cfg, recorder, progress=False)
    assert recorder.seen == sparse, text
