"""vsagen.request.backends: `--attn` entries as specs: one entry (with `auto`) or a list, options by precedence
(entry or flag, never both > the preset's table > the default), entries that are one configuration, `--attn auto`'s
choice; names and implementations read from the registry (a new backend needs no change here); a loaded backend's
options changed for one run (`vsagen serve`'s per-video `attn`)."""

from __future__ import annotations

import pytest

from vsagen.attention import backend_names
from vsagen.attention.spec import impls_of
from vsagen.errors import BadInput
from vsagen.attention.spec import resolve_spec
from vsagen.request.backends import (attention_specs, auto_spec, backend_specs, fixed_changes, known_impls, parse_attn,
                                     per_run_options, per_run_spec)
from vsagen.request.options import AttentionOptions


def test_one_entry_or_a_list():
    """`--attn` is parsed with its group (`AttnList`); the command says whether it takes one entry or a list."""
    assert AttentionOptions(attn="auto").attn.one().name == "auto"
    one = AttentionOptions(attn=" vsa:sparsity=0.9 ").attn.one()
    assert (one.name, one.options, one.text) == ("vsa", {"sparsity": 0.9}, "vsa:sparsity=0.9")  # typed, as written
    assert [e.name for e in AttentionOptions(attn="full,vsa").attn.several()] == ["full", "vsa"]
    for name in backend_names():
        assert AttentionOptions(attn=name).attn.one().name == name
    with pytest.raises(BadInput, match="this command runs one backend; `vsagen compare` and `vsagen profile` run"):
        AttentionOptions(attn="full,vsa").attn.one()
    with pytest.raises(BadInput, match="--attn auto takes no options"):
        AttentionOptions(attn="auto:sparsity=0.5").attn.one()
    with pytest.raises(BadInput, match=r"unknown --attn ''; available: "):
        AttentionOptions(attn=" ").attn.one()
    with pytest.raises(BadInput, match=r"unknown --attn 'nope'; available: " + ", ".join(backend_names())):
        AttentionOptions(attn="full,nope")  # refused when the group is built, before any model
    for text, words in ((" , ", "--attn ' , ' has an empty entry"), ("", "--attn is empty; give a comma-separated"),
                        ("vsa,full,vsa", "--attn lists 'vsa' twice")):
        with pytest.raises(BadInput, match=words):
            parse_attn(text).several()


@pytest.mark.parametrize("args", [["profile", "--model", "tiny", "--attn", "full,auto"],
                                  ["profile", "--model", "tiny", "--attn", "auto"],
                                  ["compare", "x", "--model", "tiny", "--attn", "full,auto"]], ids=" ".join)
def test_auto_in_a_list_says_the_list_takes_backend_names(args, tmp_path, monkeypatch):
    """A trial's `vsagen profile --attn auto` said "unknown --attn 'auto'", though t2v takes it: profile and compare
    say they run named backends, name them, and point to `vsagen backends`; one line, exit 2, nothing written."""
    from conftest import one_error_line
    from typer.testing import CliRunner

    from vsagen.cli.app import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("vsagen.pipeline.Session.load", lambda *a, **k: pytest.fail("loaded despite bad input"))
    line = one_error_line(CliRunner().invoke(app, args))
    assert "profile and compare run the backends named in --attn (auto picks one for a t2v / i2v run)" in line
    assert f"available: {', '.join(backend_names())} (see `vsagen backends`)" in line and "unknown" not in line
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(BadInput, match=r"--attn 'vsa,auto:sparsity=0.5': profile and compare run the backends"):
        parse_attn("vsa,auto:sparsity=0.5").several()


def test_precedence_and_one_configuration_once():
    tables = {"vsa": {"sparsity": 0.8}}

    def specs(**options):
        at = AttentionOptions(**options)
        return attention_specs(at.attn.several(), at, tables)

    full, vsa = specs(attn="full,vsa")
    assert full.name == "full" and vsa.sparsity == 0.8  # the preset's table over the default
    assert specs(attn="vsa", sparsity=0.5)[0].sparsity == 0.5  # flag
    assert specs(attn="vsa:sparsity=0.6")[0].sparsity == 0.6  # entry
    with pytest.raises(BadInput, match="once"):  # the flag and the entry both set it
        specs(attn="vsa:sparsity=0.6", sparsity=0.5)
    with pytest.raises(BadInput, match=r"--attn lists vsa:sparsity=0.8:impl=auto:tile=4x4x4:query_rows=64:"
                                       r"precision=bf16:topk_count=tiles twice \('vsa' and 'vsa:sparsity=0.8'\)"):
        specs(attn="vsa,vsa:sparsity=0.8")


def test_implementations_come_from_the_registry():
    assert set(known_impls()) == {"auto"} | {i for n in backend_names() for i in impls_of(n)}
    with pytest.raises(BadInput, match="--attn-impl cuda is not an implementation any backend has"):
        AttentionOptions(attn="vsa", attn_impl="cuda")
    with pytest.raises(BadInput, match="--attn-impl torch does not apply to --attn full; choose from auto"):
        backend_specs(parse_attn("full").several(), {}, None, "torch", "full")


def test_auto_chooses_from_the_checkpoint_and_names_the_choice():
    spec, note = auto_spec("tiny", "", AttentionOptions(), {}, random_weights=False, device="cpu")
    assert spec.name == "full" and note.startswith("--attn auto chose full")
    with pytest.raises(BadInput, match=r"\(--attn auto chose full for this checkpoint: name a backend"):
        auto_spec("tiny", "", AttentionOptions(sparsity=0.5), {}, random_weights=False, device="cpu")


def test_a_file_from_the_preset_is_a_note(tmp_path):
    """Issue 29: plain `--attn sparse-vdit` on tiny ran the preset's bundled pattern file without a word."""
    from vsagen.commands.generate_config import resolve_generate

    cfg = resolve_generate("x", model="tiny", attn="sparse-vdit", out=tmp_path / "a.mp4")
    assert cfg.notes[0].startswith("sparse-vdit: patterns=") and "tiny.json is the tiny preset's" in cfg.notes[0]
    assert "--attn sparse-vdit:patterns=FILE names another" in cfg.notes[0]
    named = cfg.backend.options.patterns
    assert resolve_generate("x", model="tiny", attn=f"sparse-vdit:patterns={named}", out=tmp_path / "b.mp4").notes == ()
    assert resolve_generate("x", model="tiny", attn="vsa", out=tmp_path / "c.mp4").notes == ()  # a number: no note


def test_a_tile_other_than_the_trained_one_is_a_note(tmp_path):
    """Issue 33: FastWan's gates were trained on 4x4x4 cubes (its preset's [attention.*] tables say so); a run with
    another tile says so and how to see what it costs, a run with the trained one says nothing (nothing loads)."""
    from vsagen.models.sources import resolve_model
    from vsagen.request.options import request_options
    from vsagen.request.resolve import SEVERAL, resolve

    src = resolve_model("fastwan2.1-t2v-1.3b")

    def notes(attn: str, **kw) -> tuple[str, ...]:
        return resolve(src, request_options(attn=attn, random_weights=True), prompt="p", **kw).notes

    for name in ("vsa", "rocm-vsa", "sla-star"):
        assert notes(f"{name}:tile=4x4x8") == (
            f"{name}: fastwan2.1-t2v-1.3b was trained with tile 4x4x4; tile=4x4x8 runs it off its training (vsagen "
            f"compare --model fastwan2.1-t2v-1.3b --attn {name},{name}:tile=4x4x8 shows what it costs)",)
        assert notes(name) == notes(f"{name}:tile=4x4x4") == ()
    assert notes("vsa,vsa:tile=4x8x8", backends=SEVERAL) == (
        "vsa: fastwan2.1-t2v-1.3b was trained with tile 4x4x4; tile=4x8x8 runs it off its training (vsagen compare "
        "--model fastwan2.1-t2v-1.3b --attn vsa,vsa:tile=4x8x8 shows what it costs)",)
    assert notes("full", backends=SEVERAL) == ()
    from vsagen.commands.generate_config import resolve_generate

    assert resolve_generate("x", model="tiny", attn="vsa:tile=4x4x8", out=tmp_path / "a.mp4").notes == ()  # no claim


@pytest.mark.parametrize("attn,several,crop_tile,grid", [
    ("vsa", False, (4, 4, 4), (8, 8, 12)),
    ("vsa:tile=4x8x8", False, (4, 8, 8), (8, 8, 16)),
    ("sla-star:tile=4x4x8", False, (4, 4, 8), (8, 8, 16)),
    ("vsa,vsa:tile=4x8x8", True, (4, 8, 8), (8, 8, 16)),
    ("full,vsa:tile=4x4x8,rocm-vsa:tile=4x8x4", True, (4, 8, 8), (8, 8, 16)),  # the cube covering both
    ("full", True, (4, 4, 4), (8, 8, 12)),
])
def test_tile_fit_crop_rounds_to_the_covering_tile_of_the_run(attn, several, crop_tile, grid):
    """`--tile-fit crop` rounds the tiny preset's 5x6x10 grid (17 x 96 x 160) up to multiples of the cube covering
    every backend's tile, one plan for every backend of a compare; `partial` keeps the grid (nothing loads)."""
    from vsagen.models.sources import resolve_model
    from vsagen.request.options import request_options
    from vsagen.request.resolve import ONE, SEVERAL, resolve

    r = resolve(resolve_model("tiny"), request_options(attn=attn, tile_fit="crop,partial"), prompt="p",
                backends=SEVERAL if several else ONE, several_fits=True)
    plan = r.plan("crop")
    assert r.crop_tile == crop_tile and plan.grid == (5, 6, 10) and plan.denoise_grid == grid
    assert all(g % t == 0 for g, t in zip(plan.denoise_grid, crop_tile))
    assert all(g % s.tile[i] == 0 for s in r.backends if s.tile for i, g in enumerate(plan.denoise_grid))
    assert r.plan("partial").denoise_grid == (5, 6, 10)


def test_compare_runs_every_backend_on_one_covering_crop_plan(tmp_path):
    """`vsagen compare --attn vsa,vsa:tile=4x8x8 --tile-fit crop`: both rows denoise the grid rounded for 4x8x8."""
    from vsagen.commands.compare_config import resolve_compare

    cfg = resolve_compare("x", model="tiny", attn="vsa,vsa:tile=4x8x8", tile_fit="crop", out=tmp_path / "c")
    assert [s.tile for s in cfg.backends] == [(4, 4, 4), (4, 8, 8)] and cfg.crop_tile == (4, 8, 8)
    assert cfg.plan().fit == "crop" and cfg.plan().denoise_grid == (8, 8, 16)


def test_the_commas_of_dense_layers_stay_in_their_entry():
    entries = parse_attn("full,vsa:dense_layers=0,2-3,29:sparsity=0.5,sla:dense_layers=1,vsa").entries
    assert [e.text for e in entries] == ["full", "vsa:dense_layers=0,2-3,29:sparsity=0.5", "sla:dense_layers=1", "vsa"]
    assert entries[1].options == {"dense_layers": "0,2-3,29", "sparsity": 0.5}
    assert resolve_spec(entries[1].text).options.dense_layers == "0,2,3,29"  # normalized by the Options
    with pytest.raises(BadInput, match="unknown --attn '2'"):  # elsewhere a number is no backend
        parse_attn("vsa:sparsity=0.5,2")


def test_the_options_a_run_can_change_leave_out_the_cube_and_the_files():
    assert per_run_options("vsa") == ("sparsity", "impl", "query_rows", "precision", "topk_count", "dense_steps",
                                      "dense_layers", "min_tokens")
    assert per_run_options("sparse-vdit") == ("remap", "impl", "query_block", "sdpa_heads", "dense_steps",
                                              "dense_layers", "min_tokens")  # not its patterns file
    assert "topk" in per_run_options("sla") and "proj_weights" not in per_run_options("sla")
    assert per_run_options("full") == ()
    for name in backend_names():  # never a file nor the cube, whatever the backend
        assert not {"tile", "gate_weights", "proj_weights", "patterns"} & set(per_run_options(name))


def test_a_run_s_spec_is_the_loaded_one_with_what_the_entry_changes():
    loaded = resolve_spec("vsa:sparsity=0.5:impl=torch")
    spec = per_run_spec(loaded, " vsa:sparsity=0.9 ", "vsa:sparsity=0.5:impl=torch")
    assert (spec.name, spec.sparsity, spec.impl, spec.options.tile) == ("vsa", 0.9, "torch", "4x4x4")  # impl kept
    assert per_run_spec(loaded, "vsa", "x") == loaded and fixed_changes(loaded, spec) == []
    assert fixed_changes(loaded, resolve_spec("vsa:tile=4x4x8")) == ["tile"]
    assert fixed_changes(loaded, resolve_spec("sla")) == ["backend"]


@pytest.mark.parametrize("text,words", [
    ("sla", "attn 'sla' needs the sla backend; this server was started with --attn auto and runs vsa:sparsity=0.5:"),
    ("auto", "attn 'auto' chooses a backend when the model loads; this server was started with --attn auto"),
    ("vsa:tile=4x4x8", "attn 'vsa:tile=4x4x8': tile is fixed when the model loads; this server was started with"),
    ("vsa:gate_weights=g.safetensors", "attn 'vsa:gate_weights=g.safetensors': gate_weights is fixed when"),
    ("vsa:sparsity=1.5", "attn 'vsa:sparsity=1.5': sparsity must be in [0, 1), got 1.5"),
    ("vsa:sparsity=lots", "--attn 'vsa:sparsity=lots': sparsity='lots' is not a number"),  # the --attn parser's words
    ("vsa,full", "--attn 'vsa,full': this command runs one backend"),
    ("vsb", "unknown --attn 'vsb'; available: "),
])
def test_what_a_run_cannot_change_is_one_line_naming_the_loaded_backend(text, words):
    with pytest.raises(BadInput) as e:
        per_run_spec(resolve_spec("vsa:sparsity=0.5"), text, "auto")
    assert str(e.value).startswith(words) and "\n" not in str(e.value)
    if text in ("sla", "auto", "vsa:tile=4x4x8"):
        assert str(e.value).endswith("a video may change vsa's sparsity, impl, query_rows, precision, topk_count, "
                                     "dense_steps, dense_layers, min_tokens")
    with pytest.raises(BadInput, match="a video may not change full's options$"):
        per_run_spec(resolve_spec("full"), "vsa:sparsity=0.9", "full")
