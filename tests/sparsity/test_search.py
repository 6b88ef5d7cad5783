"""vsagen.sparsity.search: the scores against a float64 reference built from the oracle masks (random q, k, v on a
grid with partial tiles), the choice rule (eps, lam extremes, against brute force), step ranges, prompts files, the
request checks through `vsagen search` (one error line, exit 2, nothing written), an interrupted search writes
nothing (Ctrl-C and SIGTERM), and end to end on the tiny models: a file `load_patterns` accepts, tied to the tiny
architecture, each head's mode the rule's choice on the file's own scores, eps 0 -> dense, huge lam -> skip, both
experts of tiny-a14b; `vsagen t2v --attn sparse-vdit:patterns=<searched file>` records the file and its sha256; the
shipped presets/patterns files are searches of their presets."""

from __future__ import annotations

import json
import math
import os
import signal

import pytest
import torch
from typer.testing import CliRunner

from conftest import make_qkv, masked_dense, one_error_line
from vsagen.attention.sparse_vdit import SparseVDiTAttention, SparseVDiTOptions
from vsagen.cli import _sigterm_as_interrupt, app
from vsagen.errors import BadInput, RunFailure
from vsagen.layout import tile_layout
from vsagen.sparsity.files import architecture_of, file_hash, load_patterns
from vsagen.sparsity.patterns import (block_density, default_catalog, dense, diagonal, oracle_block_map, skip,
                                      vertical_stripe)
from vsagen.sparsity.search import (DEFAULT_EPS, DEFAULT_LAM, ModeScorer, ScoreOptions, choose_mode, mode_errors,
                                    patterns_from_scores, read_prompts, resolve_search, search, step_ranges)

# float64 scores of the torch impl against a float64 reference: only summation order differs.
SCORE_RTOL = 1e-9
STEPS = 2  # fewest denoising steps that still exercise the loop
TINY_ARCH = {"layers": 2, "heads": 2, "head_dim": 16, "in_channels": 16, "ffn_dim": 32, "patch_size": [1, 2, 2]}

runner = CliRunner()


def reference_errors(q, k, v, modes, lay):
    """(M, H) float64 relative MSEs from the oracle masks, computed directly."""
    n = lay.num_tiles
    full, _ = masked_dense(q, k, v, torch.ones(1, q.shape[2], n, n, dtype=torch.bool), lay)
    ms = full.square().mean(dim=(0, 1, 3))
    rows = []
    for p in modes:
        tiles = oracle_block_map(p, lay.tiles_per_dim)[None, None].expand(1, q.shape[2], n, n)
        out, _ = masked_dense(q, k, v, tiles, lay)
        rows.append((out - full).square().mean(dim=(0, 1, 3)) / ms)
    return torch.stack(rows), full


# ---------------------------------------------------------------------------------------------- scoring


@pytest.mark.parametrize("grid", [(9, 10, 13), (5, 6, 10)])
def test_mode_errors_match_the_oracle_masks(grid):
    lay = tile_layout(grid)
    q, k, v = make_qkv(2, lay.num_tokens, 3, 8, torch.float64, seed=1)
    modes = default_catalog()
    want, full = reference_errors(q, k, v, modes, lay)
    attend = SparseVDiTAttention(SparseVDiTOptions(impl="torch")).attend
    got = mode_errors(q, k, v, full, modes, lay, attend)
    assert got.shape == (len(modes), 3) and got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=SCORE_RTOL, atol=1e-15)
    names = [p.name for p in modes]
    assert got[names.index("dense")].eq(0).all() and got[names.index("skip")].eq(1).all()
    if grid == (9, 10, 13):  # tiles (3, 3, 4): every sparse mode misses some key tile, so errs
        assert (got[2:] > 0).all()


def test_a_mode_covering_every_tile_scores_exactly_zero():
    """multi-diagonal(2) on a 2 x 3 tile slab reaches every tile: it is dense there (err 0, not computed)."""
    lay = tile_layout((5, 6, 10))
    assert oracle_block_map(default_catalog()[3], lay.tiles_per_dim).all()
    q, k, v = make_qkv(1, lay.num_tokens, 2, 8, seed=2)
    calls = []

    def attend(*args):
        calls.append(args[3])
        return SparseVDiTAttention(SparseVDiTOptions(impl="torch")).attend(*args)

    full = torch.nn.functional.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v))).transpose(1, 2)
    got = mode_errors(q, k, v, full, default_catalog(), lay, attend)
    assert got[3].eq(0).all()
    assert [m[0].name for m in calls] == ["diagonal", "vertical-stripe", "mixed"]  # dense, skip, full cover: none


def test_scorer_returns_full_attention_and_averages_per_range_and_layer():
    from vsagen.attention.base import AttnContext, ForwardState
    from vsagen.timing import NullTimer

    lay = tile_layout((9, 10, 13))
    scorer = ModeScorer(steps=4, ranges=2, options=ScoreOptions("torch"))
    qkvs = [make_qkv(1, lay.num_tokens, 2, 8, seed=s) for s in range(3)]
    for (q, k, v), step in zip(qkvs, (0, 1, 3)):
        ctx = AttnContext(layout=lay, layer=1, expert="transformer", timer=NullTimer(), forward=ForwardState(step=step))
        out = scorer(q, k, v, ctx)
        full = torch.nn.functional.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)))
        torch.testing.assert_close(out, full.transpose(1, 2))
    assert scorer.counts == {(0, "transformer", 1): 2, (1, "transformer", 1): 1} and scorer.calls == 3
    want = [reference_errors(*x, scorer.modes, lay)[0] for x in qkvs]
    torch.testing.assert_close(scorer.mean_errors("transformer", 1, 0), (want[0] + want[1]) / 2, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(scorer.mean_errors("transformer", 1), sum(want) / 3, rtol=1e-4, atol=1e-6)
    assert scorer.mean_errors("transformer", 0) is None


# ---------------------------------------------------------------------------------------------- the choice


MODES = (dense(), skip(), diagonal(1), vertical_stripe(1, 4))
COSTS = [1.0, 0.0, 0.2, 0.3]


def test_eps_zero_keeps_dense_unless_a_mode_is_exact():
    errors = [0.0, 1.0, 0.01, 0.02]
    assert choose_mode(MODES, errors, COSTS, DEFAULT_LAM, 0.0) == 0
    assert choose_mode(MODES, [0.0, 1.0, 0.0, 0.02], COSTS, DEFAULT_LAM, 0.0) == 2  # exact and cheaper


def test_huge_lam_skips_and_zero_lam_takes_the_lowest_error():
    errors = [0.0, 1.0, 0.01, 0.02]
    assert choose_mode(MODES, errors, COSTS, 1e6, DEFAULT_EPS) == 1
    assert choose_mode(MODES, errors, COSTS, 1e6, 0.5) == 2  # skip (err 1) is over eps: the cheapest allowed one
    assert choose_mode(MODES, errors, COSTS, 0.0, 1e9) == 0  # dense's error is 0
    assert choose_mode(MODES[1:] + (dense(),), errors[1:] + [0.0], COSTS[1:] + [1.0], 0.0, 1e9) == 3
    assert choose_mode(MODES, [0.0, 1.0, 0.0, 0.0], COSTS, 0.0, 1e9) == 2  # ties at err 0: the cheaper one


def test_choose_mode_is_the_brute_force_minimum():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        errors = [0.0, 1.0, *torch.rand(2, generator=g).tolist()]
        lam, eps = float(torch.rand((), generator=g)) * 2, float(torch.rand((), generator=g))
        allowed = [i for i in range(4) if i == 0 or errors[i] <= eps]
        best = min(errors[i] + lam * COSTS[i] for i in allowed)
        got = choose_mode(MODES, errors, COSTS, lam, eps)
        assert got in allowed and errors[got] + lam * COSTS[got] == best


def test_non_finite_errors_write_nothing():
    scorer = ModeScorer(steps=1)
    scorer.architectures["transformer"] = TINY_ARCH
    for layer in range(2):
        scorer.sums[(0, "transformer", layer)] = torch.full((len(scorer.modes), 2), float("nan") if layer else 0.5)
        scorer.counts[(0, "transformer", layer)] = 1
    scorer.calls = 2
    with pytest.raises(RunFailure, match="transformer layer 1 gave NaN"):
        patterns_from_scores(scorer, model="tiny", experts=["transformer"], layers=2, heads=2, grid=(5, 6, 10),
                             height=96, width=160, frames=17, lam=0.5, eps=1.0, prompts=1)


def test_a_catalog_without_dense_is_refused():
    with pytest.raises(ValueError, match="dense"):
        choose_mode(MODES[1:], [1.0, 0.0, 0.0], COSTS[1:], 0.5, 1.0)
    with pytest.raises(ValueError, match="dense"):
        ModeScorer(MODES[1:])


# ------------------------------------------------------------------------------------ ranges and prompts


@pytest.mark.parametrize("steps,n,want", [(4, 1, ((0, 4),)), (4, 3, ((0, 1), (1, 2), (2, 4))),
                                          (5, 5, tuple((i, i + 1) for i in range(5))), (50, 3, ((0, 16), (16, 33),
                                                                                                 (33, 50)))])
def test_step_ranges_are_equal_and_cover_the_steps(steps, n, want):
    assert step_ranges(steps, n) == want
    assert ModeScorer(steps=steps, ranges=n).range_of(steps - 1) == n - 1


@pytest.mark.parametrize("n", [0, 5])
def test_step_ranges_without_a_step_are_refused(n):
    with pytest.raises(BadInput, match="--ranges"):
        step_ranges(4, n)


def test_prompts_file_skips_blank_lines_and_comments(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("# a comment\n  a fox  \n\n\t\n#another\na cat # not a comment\n", encoding="utf-8")
    assert read_prompts(f) == ("a fox", "a cat # not a comment")


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
    ("ranges", ["--prompt", "a", "--steps", "3", "--ranges", "4"], ["--ranges", "[1, 3]"]),
    ("lam", ["--prompt", "a", "--lam", "-1"], ["--lam"]),
    ("eps", ["--prompt", "a", "--eps", "nan"], ["--eps"]),
    ("suffix", ["--prompt", "a", "--out", "{tmp}/o/p.txt"], [".json"]),
    ("i2v", ["--prompt", "a", "--model", "tiny-i2v"], ["image-to-video"]),
    ("frames", ["--prompt", "a", "--frames", "6"], ["--frames"]),
]


@pytest.mark.parametrize("case_id,extra,needles", BAD, ids=[c[0] for c in BAD])
def test_bad_input_is_one_error_line_exit_2(vsagen_cache, tmp_path, case_id, extra, needles):
    (tmp_path / "p.txt").write_text("a fox\n")
    (tmp_path / "empty.txt").write_text("# nothing\n\n")
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
    res = search_cli("--model", "tiny", "--prompts", str(prompts), "--steps", str(STEPS), "--ranges", "2",
                     "--out", str(tmp_path / "p.json"))
    assert res.exit_code == 0, res.output
    assert "overall block density" in res.stdout and "speed-up" in res.stdout and "vertical-stripe" in res.stdout
    # every note with the summary, on stdout (the model's random weights too), none on stderr
    assert "note: model 'tiny' has random weights" in res.stdout and "note:" not in res.stderr
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
    from vsagen.config import resolve
    from vsagen.layout import plan_crop
    from vsagen.presets import load_preset

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
