"""vsagen.attention.dense: the quality knobs every sparse backend takes (`dense_steps`, `dense_layers`, `min_tokens`),
on the tiny Wan transformer (2 blocks) on CPU with fresh random inputs: a dense call is `full`'s computation bit for
bit, the knobs pick exactly the calls they name (the backend's calls are watched), the report counts them, and bad
values are refused in one line (the CLI: exit 2, before the model loads).

The inputs are small (latent 2 x 6 x 10: grid 2 x 3 x 5, 30 tokens, partial 4x4x4 cubes) to keep the file cheap.
"""

from __future__ import annotations

import types

import pytest
import torch
from conftest import forward, make_inputs, make_transformer, one_error_line

import vsagen
from vsagen.attention.base import RunInfo
from vsagen.attention.dense import (DenseCall, check_knobs, check_knobs_fit, dense_step_count, every_layer_dense_note,
                                   every_step_dense_note, knob_info, layer_set)
from vsagen.attention.spec import resolve_spec
from vsagen.attention.vsa import VSAAttention, VSAOptions
from vsagen.errors import BadInput

LATENT = (16, 2, 6, 10)  # -> grid (2, 3, 5) with patch (1, 2, 2): 30 tokens
TOKENS = 30


@pytest.fixture(scope="module")
def case():
    """The tiny transformer, inputs (batch 2) and its `--attn full` output."""
    t = make_transformer(seed=7)
    x = make_inputs(batch=2, seed=8, latent=LATENT)
    with vsagen.apply(t, "full"):
        full = forward(t, x)
    return t, x, full


class Watched(VSAAttention):
    """vsa (torch) recording (step, layer) of every call that reaches it."""

    def __init__(self, options):
        super().__init__(options)
        self.calls = []

    def __call__(self, q, k, v, ctx):
        self.calls.append((ctx.step, ctx.layer))
        return super().__call__(q, k, v, ctx)


@pytest.fixture
def dense_calls(monkeypatch):
    """(step, layer) of every call run dense (`DenseCall`)."""
    calls = []
    original = DenseCall.__call__

    def watch(self, q, k, v, ctx):
        calls.append((ctx.step, ctx.layer))
        return original(self, q, k, v, ctx)

    monkeypatch.setattr(DenseCall, "__call__", watch)
    return calls


def watched(**knobs) -> Watched:
    return Watched(VSAOptions(sparsity=0.5, impl="torch", **knobs))


def test_dense_steps_all_is_full_bit_for_bit_and_counted(case):
    t, x, full = case
    with vsagen.apply(t, "vsa:dense_steps=all:sparsity=0.5", impl="torch") as h:
        out = forward(t, x)
        info = h.describe()
    assert torch.equal(out, full)
    assert (info["dense_steps"], info["dense_calls"], info["sparse_calls"]) == ("all", 2, 0)
    with vsagen.apply(t, "vsa:sparsity=0.5", impl="torch") as h:  # negative control: the sparse run differs
        assert not torch.equal(forward(t, x), full)
        assert "dense_calls" not in h.describe()  # no knob set: the report as before


def test_dense_steps_runs_the_first_steps_dense(case, dense_calls):
    t, x, full = case
    backend = watched(dense_steps=1)
    with vsagen.apply(t, backend) as h:
        for step in (0, 1):
            h.timer.step = step  # a bare transformer's step is the timer's (a pipeline's: its scheduler's)
            forward(t, x)
        assert knob_info(backend)["dense_calls"] == 2 and knob_info(backend)["sparse_calls"] == 2
    assert dense_calls == [(0, 0), (0, 1)] and backend.calls == [(1, 0), (1, 1)]


def test_a_fraction_of_the_schedulers_steps(case, dense_calls):
    """dense_steps=0.5 of the scheduler's 3 steps: ceil(1.5) = 2 dense steps, counted at the scheduler."""
    t, x, _ = case

    class Scheduler:
        def set_timesteps(self, n):
            self.num_inference_steps = n

        def step(self):
            pass

    pipe = types.SimpleNamespace(transformer=t, scheduler=Scheduler())
    backend = watched(dense_steps=0.5)
    with vsagen.apply(pipe, backend):
        pipe.scheduler.set_timesteps(3)
        for _ in range(3):
            forward(t, x)
            pipe.scheduler.step()
    assert [s for s, _ in dense_calls] == [0, 0, 1, 1] and backend.calls == [(2, 0), (2, 1)]


def test_dense_layers_runs_exactly_those_blocks_dense(case, dense_calls):
    t, x, full = case
    backend = watched(dense_layers="1")
    with vsagen.apply(t, backend):
        forward(t, x)
    assert backend.calls == [(0, 0)] and dense_calls == [(0, 1)]
    with vsagen.apply(t, "vsa:dense_layers=0,1:sparsity=0.5", impl="torch"):  # every block: full's output
        assert torch.equal(forward(t, x), full)


def test_min_tokens_above_the_token_count_is_full(case):
    t, x, full = case
    with vsagen.apply(t, f"sla:min_tokens={TOKENS + 1}:topk=0.5", impl="torch") as h:
        assert torch.equal(forward(t, x), full)
        assert (h.describe()["dense_calls"], h.describe()["sparse_calls"]) == (2, 0)
    with vsagen.apply(t, f"sla:min_tokens={TOKENS}:topk=0.5", impl="torch") as h:  # not below: sparse
        assert not torch.equal(forward(t, x), full)
        assert (h.describe()["dense_calls"], h.describe()["sparse_calls"]) == (0, 2)


def test_dense_steps_covering_every_step_is_a_note():
    """New-user trial: `vsa:dense_steps=5` with 2 steps ran every call dense and said nothing (the title said vsa)."""
    note = every_step_dense_note("vsa", VSAOptions(dense_steps="5"), 2)
    assert note.startswith("--attn vsa: dense_steps=5 covers all 2 steps: every step runs full, as --attn full")
    assert every_step_dense_note("vsa", VSAOptions(dense_steps="2"), 2) is not None
    assert every_step_dense_note("vsa", VSAOptions(dense_steps="0.9"), 2) is not None  # ceil(1.8) = 2
    for options, steps in ((VSAOptions(dense_steps="1"), 2), (VSAOptions(dense_steps="0.5"), 3), (VSAOptions(), 2),
                           (VSAOptions(dense_steps="all"), 2)):  # (all asks for exactly that)
        assert every_step_dense_note("vsa", options, steps) is None


def test_dense_layers_naming_every_block_is_a_note():
    """A verifying trial: `vsa:dense_layers=0,1` on a 2-block model ran every call dense and said nothing."""
    from vsagen.attention.base import Expert

    def run(*layers):
        return RunInfo(torch.device("cpu"), torch.float32, experts=tuple(Expert(f"t{i}", {"layers": n})
                                                                          for i, n in enumerate(layers)))

    every = resolve_spec("vsa:dense_layers=0-1").build()
    assert every_layer_dense_note(every, run(2)) == (
        "--attn vsa: dense_layers=0,1 names every block of this model (2): every call runs full, as --attn full "
        "(nothing runs sparse; fewer dense layers leave some sparse)")
    assert every_layer_dense_note(every, run(2, 2)) is not None  # both experts' blocks
    assert every_layer_dense_note(every, run(3)) is None  # block 2 stays sparse
    assert every_layer_dense_note(every, run()) is None  # the blocks not known
    assert every_layer_dense_note(resolve_spec("vsa:dense_steps=1").build(), run(2)) is None
    assert every_layer_dense_note(resolve_spec("full").build(), run(2)) is None


def test_values_are_typed_once_and_normalized():
    options = resolve_spec("vsa:dense_steps=0.250:dense_layers=3,0-2,1:min_tokens=64").options
    assert (options.dense_steps, options.dense_layers, options.min_tokens) == ("0.25", "0,1,2,3", 64)
    assert layer_set(options) == {0, 1, 2, 3}
    assert resolve_spec("vsa:dense_steps=ALL").options.dense_steps == "all"
    python = VSAOptions(dense_steps=2, dense_layers=[29, 0])  # from Python: an int, a list
    assert (python.dense_steps, python.dense_layers) == ("2", "0,29")
    spec = resolve_spec("vsa:dense_steps=2:dense_layers=0")
    assert spec.short_text() == "vsa:dense_steps=2:dense_layers=0"
    assert spec.label == "vsa 0.875 dense_steps=2 dense_layers=0"  # a report's row
    # ceil(F x steps): any positive fraction runs a step; 0.3 x 10 is 3, not 4 (float rounding)
    counts = [dense_step_count(resolve_spec(f"vsa:dense_steps={f}").options, n)
              for f, n in (("0.25", 10), ("0.3", 10), ("0.01", 4), ("all", 7), ("3", None))]
    assert counts == [3, 3, 1, 7, 3]


def test_a_presets_table_sets_them_under_the_entry():
    """The preset's [attention.vsa] table (TOML's types: an int, a list) gives defaults; the entry wins."""
    from vsagen.attention.spec import parse_entry, spec_of

    preset = {"vsa": {"dense_steps": 2, "dense_layers": [1, 0], "min_tokens": 512}}
    options = spec_of(parse_entry("vsa:dense_steps=0.1"), preset=preset).options
    assert (options.dense_steps, options.dense_layers, options.min_tokens) == ("0.1", "0,1", 512)


@pytest.mark.parametrize("text, words", [
    ("vsa:dense_steps=1.5", "dense_steps must be N (the first N steps), a fraction in (0, 1) or all, got '1.5'"),
    ("sla:dense_steps=-1", "dense_steps must be N"),
    ("sla-star:dense_layers=2-1", "dense_layers takes block indices such as 0,1,29 or ranges such as 0-2, got '2-1'"),
    ("vsa:dense_layers=a", "dense_layers takes block indices"),
    ("vsa:min_tokens=0", "min_tokens must be a positive integer"),
    ("full:dense_steps=1", "full has no option 'dense_steps'"),
])
def test_bad_values_are_one_line(text, words):
    try:
        resolve_spec(text)
        said = None
    except BadInput as e:
        said = str(e)
    assert said is not None and words in said and "\n" not in said


def test_what_a_run_cannot_honour_is_refused_before_patching(case):
    t, x, _ = case
    with pytest.raises(BadInput, match=r"^vsagen.apply: vsa: dense_layers=0,2 names block 2, but this model has 2 "
                                       r"blocks \(0-1\)$"):
        vsagen.apply(t, "vsa:dense_layers=0,2")
    with pytest.raises(BadInput, match="dense_steps=0.5 is a fraction of the steps, and this run's step count is "
                                       "unknown"):
        vsagen.apply(t, "vsa:dense_steps=0.5")  # a bare transformer: no scheduler, no steps=
    assert all(type(b.attn1.processor).__name__ != "VsagenAttnProcessor" for b in t.blocks)
    fp32_cuda = RunInfo(torch.device("cuda"), torch.float32)  # the dense calls are full's: its refusals hold
    with pytest.raises(BadInput, match="^--attn vsa: the calls dense_steps / dense_layers / min_tokens name run full, "
                                       "which refuses this run: --attn full on CUDA runs cuDNN/flash"):
        check_knobs_fit(resolve_spec("vsa:min_tokens=9").build(), fp32_cuda)
    check_knobs_fit(resolve_spec("vsa").build(), fp32_cuda)  # no knob: vsa's own checks only
    with pytest.raises(BadInput, match="min_tokens must be a positive integer"):
        check_knobs(types.SimpleNamespace(dense_steps=None, dense_layers=None, min_tokens=True))


def test_the_cli_refuses_a_block_past_the_models_before_loading(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from vsagen.cli.app import app

    monkeypatch.setattr("vsagen.pipeline.load_model", lambda *a, **k: pytest.fail("the model loaded"))
    res = CliRunner().invoke(app, ["t2v", "a fox", "--model", "tiny", "--device", "cpu",
                                   "--attn", "vsa:dense_layers=0,5", "--out", str(tmp_path / "v.mp4")])
    assert one_error_line(res) == ("error: --attn vsa: dense_layers=0,5 names block 5, but this model has 2 blocks "
                                   "(0-1)")
    assert not (tmp_path / "v.mp4").exists()
