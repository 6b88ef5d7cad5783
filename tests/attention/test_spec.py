"""vsagen.attention.spec: a backend as one value (name + Options) from the command line to the processor.

Covers the `NAME[:KEY=VALUE...]` form, the precedence of an option's value (entry > dedicated flag > preset table
> the Options default), option typing, the errors (one line naming the backend's options), and
`vsagen profile` comparing two configurations of one backend in one run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vsagen.attention import REGISTRY, BackendSpec, resolve_spec
from vsagen.attention.spec import BackendEntry, check_flags_apply, make_options, parse_entry, spec_of
from vsagen.attention.vsa import DEFAULT_SPARSITY, VSAOptions
from vsagen.errors import BadInput


def test_name_alone_takes_the_defaults():
    spec = resolve_spec("vsa")
    assert spec == BackendSpec("vsa", VSAOptions())
    assert (spec.sparsity, spec.impl) == (DEFAULT_SPARSITY, "auto")
    full = resolve_spec("full")
    assert full.sparsity is None and full.impl == "auto"
    assert full.summary() == {"name": "full", "sparsity": None, "impl": "auto"}


def test_options_are_typed_from_the_dataclass(tmp_path):
    f = tmp_path / "g.safetensors"
    f.write_bytes(b"")
    spec = resolve_spec(f" vsa : sparsity=0.5 : impl=torch : gate_weights={f} ")
    assert spec.options == VSAOptions(sparsity=0.5, impl="torch", gate_weights=f)
    assert isinstance(spec.options.sparsity, float) and isinstance(spec.options.gate_weights, Path)
    assert resolve_spec("vsa:gate_weights=none").options.gate_weights is None


def test_text_round_trips():
    spec = resolve_spec("vsa:sparsity=0.9:impl=torch")
    assert spec.text() == "vsa:sparsity=0.9:impl=torch:tile=4x4x4:query_rows=64:precision=bf16:topk_count=tiles"
    assert resolve_spec(spec.text()) == spec
    assert spec.label == "vsa 0.9"
    # a cube other than the default is part of the label (compare labelled vsa:tile=4x4x8 "vsa 0.875": a trial)
    assert resolve_spec("vsa:sparsity=0.9:tile=4x4x8").label == "vsa 0.9 tile 4x4x8"
    assert resolve_spec("vsa:precision=int8").label == "vsa 0.875 int8"  # compare's rows of both precisions differ
    assert resolve_spec("sla-star:tile=4x8x8").label.endswith(" tile 4x8x8") and resolve_spec("full").label == "full"


def test_precedence_entry_over_flag_over_preset_over_default():
    preset = {"vsa": {"sparsity": 0.6}}
    assert resolve_spec("vsa").sparsity == DEFAULT_SPARSITY
    assert resolve_spec("vsa", preset=preset).sparsity == 0.6
    assert resolve_spec("vsa", preset=preset, flags={"--sparsity": 0.7}).sparsity == 0.7
    assert resolve_spec("vsa:sparsity=0.8", preset=preset, flags={"--sparsity": 0.7}).sparsity == 0.8
    # a flag None (not given) does not override the preset
    assert resolve_spec("vsa", preset=preset, flags={"--sparsity": None}).sparsity == 0.6
    # a flag whose option the backend lacks is skipped here (check_flags_apply refuses flags nobody takes)
    assert resolve_spec("full", flags={"--sparsity": 0.7}) == BackendSpec("full", REGISTRY["full"].Options())


@pytest.mark.parametrize("text,needles", [
    ("nope", ["unknown --attn 'nope'", "full, vsa"]),
    ("vsa:sparsity", ["NAME:KEY=VALUE"]),
    ("vsa:=0.5", ["NAME:KEY=VALUE"]),
    # issue 29: `tuning` (an object, set through vsagen.apply) is named too, as Python-only
    ("vsa:density=0.5", ["no option 'density'", "its options: sparsity, impl, tile, query_rows, gate_weights, "
                         "precision, topk_count, dense_steps, dense_layers, min_tokens; from Python only (vsagen.apply): "
                         "tuning"]),
    ("full:sparsity=0.5", ["no option 'sparsity'", "full takes no options"]),
    ("vsa:sparsity=0.5:sparsity=0.6", ["given twice"]),
    ("vsa:sparsity=lots", ["sparsity='lots' is not a number"]),
    ("vsa:sparsity=nan", ["sparsity='nan'"]),
    ("vsa:sparsity=1.0", ["--attn vsa: sparsity must be in [0, 1), got 1.0"]),
    ("vsa:impl=cuda", ["impl must be one of auto, triton, torch, fa4, got 'cuda'"]),
    ("vsa:tuning=fast", ["'tuning' is set from Python", "options here: sparsity, impl, tile, query_rows, gate_weights"]),
    ("vsa:gate_weights=/no/such/file.safetensors", ["gate_weights", "no such file"]),
])
def test_bad_entries_are_one_clear_error(text, needles):
    with pytest.raises(BadInput) as e:
        resolve_spec(text)
    msg = str(e.value)
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, (needle, msg)


def test_make_options_refuses_unknown_keys_listing_the_options():
    with pytest.raises(BadInput, match=r"its options: sparsity, impl, tile, query_rows, gate_weights, precision, "
                                       r"topk_count, tuning \(Python only\), dense_steps, dense_layers, min_tokens$"):
        make_options("vsa", {"sparsity": 0.5, "topk": 3})
    assert make_options("vsa", {"sparsity": 0.25}).sparsity == 0.25


def test_flags_that_no_backend_takes_are_refused():
    check_flags_apply(["full", "vsa"], {"--sparsity": 0.5, "--attn-impl": "torch"}, "full,vsa")
    check_flags_apply(["full"], {"--sparsity": None, "--attn-impl": "auto"}, "full")
    with pytest.raises(BadInput, match="--sparsity applies to sparse backends, and --attn full lists none"):
        check_flags_apply(["full"], {"--sparsity": 0.5}, "full")
    with pytest.raises(BadInput, match="--attn-impl torch does not apply to --attn full; choose from auto"):
        check_flags_apply(["full"], {"--attn-impl": "torch"}, "full")


def test_an_entry_is_parsed_once_into_typed_values(tmp_path):
    """`parse_entry` reads the text (name, keys, values typed as the Options fields declare); `spec_of` fills the
    rest from it without reading text again; the Options' own validation runs there, over the preset's values too."""
    f = tmp_path / "g.safetensors"
    f.write_bytes(b"")
    entry = parse_entry(f" vsa : sparsity=0.5 : query_rows=128 : tile=4x4x8 : gate_weights={f} ")
    assert entry == BackendEntry("vsa", (("sparsity", 0.5), ("query_rows", 128), ("tile", "4x4x8"),
                                         ("gate_weights", f)), f"vsa : sparsity=0.5 : query_rows=128 : tile=4x4x8 : "
                                                                f"gate_weights={f}")
    assert spec_of(entry, preset={"vsa": {"sparsity": 0.6, "impl": "torch"}}) == \
        BackendSpec("vsa", VSAOptions(sparsity=0.5, impl="torch", query_rows=128, tile="4x4x8", gate_weights=f))
    assert parse_entry("vsa:sparsity=1.0").options == {"sparsity": 1.0}  # a number: refused by VSAOptions, later
    with pytest.raises(BadInput, match=r"--attn vsa: sparsity must be in \[0, 1\), got 1.0"):
        spec_of(parse_entry("vsa:sparsity=1.0"))


def test_build_gives_a_backend_with_those_options():
    backend = resolve_spec("vsa:sparsity=0.25:impl=torch").build()
    assert backend.name == "vsa" and backend.sparsity == 0.25 and backend.impl == "torch"


# --------------------------------------------------------------------------------------------------------------
# The command line


def test_t2v_takes_options_in_the_attn_entry(monkeypatch, tmp_path):
    from vsagen.commands.generate_config import resolve_generate as resolve

    cfg = resolve("a fox", model="tiny", attn="vsa:sparsity=0.6:impl=torch", out=tmp_path / "v.mp4")
    assert (cfg.attn, cfg.sparsity, cfg.attn_impl) == ("vsa", 0.6, "torch")
    assert cfg.out.name == "v.mp4"
    assert cfg.summary()["backend"] == {"name": "vsa", "sparsity": 0.6, "impl": "torch", "tile": "4x4x4",
                                              "query_rows": 64, "precision": "bf16",
                                              "topk_count": "tiles"}
    # the preset's [attention.vsa] table fills what neither the entry nor a flag gives
    assert resolve("a fox", model="tiny", attn="vsa", out=tmp_path / "x.mp4").sparsity == 0.875
    # a flag and the entry setting one option: which was meant is unclear, so it is refused
    with pytest.raises(BadInput, match="--sparsity 0.3 and --attn entry 'vsa:sparsity=0.6' both set vsa's sparsity"):
        resolve("a fox", model="tiny", attn="vsa:sparsity=0.6", sparsity=0.3, out=tmp_path / "w.mp4")
    with pytest.raises(BadInput, match="--attn-impl torch and --attn entry 'vsa:impl=triton' both set vsa's impl"):
        resolve("a fox", model="tiny", attn="vsa:impl=triton", attn_impl="torch", out=tmp_path / "w.mp4")
    # --attn-impl auto is its default, so it neither conflicts nor overrides
    assert resolve("a fox", model="tiny", attn="vsa:impl=torch", attn_impl="auto", out=tmp_path / "w.mp4").attn_impl \
        == "torch"


def test_profile_resolves_two_configurations_of_one_backend():
    from vsagen.commands.profile_config import resolve_profile

    cfg = resolve_profile(model="tiny", attn="full,vsa:sparsity=0.85,vsa:sparsity=0.9:impl=torch")
    assert [(b.name, b.sparsity, b.impl) for b in cfg.backends] == [("full", None, "auto"), ("vsa", 0.85, "auto"),
                                                                    ("vsa", 0.9, "torch")]


@pytest.mark.slow
def test_profile_compares_two_sparsities_in_one_run(vsagen_cache, tiny_dir):
    from vsagen.cli.app import app

    res = CliRunner().invoke(app, ["profile", "--model", "tiny", "--attn", "full,vsa:sparsity=0.5,vsa:sparsity=0.75",
                                   "--attn-impl", "torch", "--steps", "1", "--warmup", "0", "--no-stock",
                                   "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    assert [(r["backend"], r["sparsity"]) for r in rows] == [("full", None), ("vsa", 0.5), ("vsa", 0.75)]
    tail = ":impl=torch:tile=4x4x4:query_rows=64:precision=bf16:topk_count=tiles"
    assert rows[1]["spec"] == "vsa:sparsity=0.5" + tail and rows[2]["spec"] == "vsa:sparsity=0.75" + tail
    # each row is compared with `full`, not with the other vsa row
    assert all(r["speedup_vs_full"] is not None and r["latents_rel_l2_vs_full"] is not None for r in rows[1:])
    assert rows[0]["latents_rel_l2_vs_full"] == 0.0


def test_python_only_options_are_refused_on_the_command_line():
    from vsagen.attention.spec import text_options

    assert text_options(VSAOptions) == ["sparsity", "impl", "tile", "query_rows", "gate_weights", "precision",
                                        "topk_count", "dense_steps", "dense_layers", "min_tokens"]
    with pytest.raises(BadInput, match="'tuning' is set from Python, not on the command line"):
        resolve_spec("vsa:tuning=fast")


def test_tuning_is_passed_down_to_the_kernels(monkeypatch):
    """A KernelTuning in vsa's options reaches both launchers (the kernels' choice of path is data)."""
    import dataclasses

    import torch

    import vsagen.kernels.block_sparse_attn as bsa
    import vsagen.kernels.coarse as coarse
    from vsagen.attention.base import AttnContext
    from vsagen.kernels.tuning import kernel_tuning
    from vsagen.layout import tile_layout
    from vsagen.timing import NullTimer

    tuning = dataclasses.replace(kernel_tuning(torch.device("cpu"), 16), pack_partial_tiles=False)
    seen = []
    real_bsa, real_coarse = bsa.block_sparse_attention, coarse.coarse_stage
    monkeypatch.setattr(bsa, "block_sparse_attention", lambda *a, tuning=None, **k: seen.append(("fine", tuning))
                        or real_bsa(*a, tuning=tuning, **k))
    monkeypatch.setattr(coarse, "coarse_stage", lambda *a, tuning=None, **k: seen.append(("coarse", tuning))
                        or real_coarse(*a, tuning=tuning, **k))
    lay = tile_layout((2, 4, 5))
    q, k, v = (torch.randn(1, lay.num_tokens, 1, 16) for _ in range(3))
    backend = resolve_spec("vsa:impl=triton").build()
    backend = type(backend)(dataclasses.replace(backend.options, tuning=tuning))
    backend(lay.to_tiles(q), lay.to_tiles(k), lay.to_tiles(v), AttnContext(lay, 0, None, NullTimer()))
    assert seen == [("coarse", tuning), ("fine", tuning)]
    with pytest.raises(BadInput, match="KernelTuning"):
        VSAOptions(tuning="fast")


def test_rows_that_read_the_same_are_labelled_by_their_spec():
    from vsagen.commands.profile import ProfileRow, row_labels

    def row(sparsity, spec, fit="partial"):
        return ProfileRow(backend="vsa", kind="backend", sparsity=sparsity, impl=None, tile_fit=fit, grid=[1, 1, 1],
                          tokens=1, tiles=1, full_tiles=1, steps=1, dit_forwards=1, dit_s_per_step=1.0,
                          dit_per_step_s=[1.0], attn1_s_per_step=None, attention_s_per_step=None,
                          attention_stages_s_per_step={}, layout_s_per_step=None, attention_share_of_dit=None,
                          projected_steps=1, projected_dit_s=1.0, warmup_s=0.0, spec=spec)

    rows = [row(0.5, "vsa:sparsity=0.5:impl=torch"), row(0.5, "vsa:sparsity=0.5:impl=triton"),
            row(0.75, "vsa:sparsity=0.75:impl=torch"), row(0.5, "vsa:sparsity=0.5:impl=torch", fit="crop")]
    assert row_labels(rows) == ["vsa:sparsity=0.5:impl=torch", "vsa:sparsity=0.5:impl=triton", "vsa 0.75", "vsa 0.5"]


def test_short_text_keeps_only_what_differs_from_the_defaults():
    assert resolve_spec("vsa").short_text() == "vsa"
    assert resolve_spec("vsa:sparsity=0.9:impl=auto").short_text() == "vsa:sparsity=0.9"
    assert resolve_spec("sla-star:scope=marginal").short_text() == "sla-star:scope=marginal"


def test_short_text_names_a_path_option_by_its_file_name(tmp_path):
    from vsagen.attention.spec import short_spec_text

    # two pattern files: the labels differ by file name, not by a cut-off common folder prefix
    deep = tmp_path / "a" / "very" / "long" / "folder"
    assert short_spec_text(f"sparse-vdit:patterns={deep / 'h22.json'}:remap=true") == \
        "sparse-vdit:patterns=h22.json:remap=true"
    assert short_spec_text(f"sparse-vdit:patterns={deep / 'h.json'}") == "sparse-vdit:patterns=h.json"


def test_option_help_lists_the_command_line_options_with_defaults_and_values():
    from vsagen.attention import backend_class
    from vsagen.attention.spec import option_help, text_options

    assert option_help(backend_class("full").Options) == []
    assert option_help(VSAOptions) == [("sparsity", "0.875", "a number"), ("impl", "auto", "auto | triton | torch | fa4"),
                                       ("tile", "4x4x4", "TxHxW, power-of-two sides, 64 / 128 / 256 tokens, e.g. "
                                                                  "4x4x4 | 4x4x8 | 4x8x8"),
                                       ("query_rows", "64", "64 | 128 (128: a 128 / 256-token tile)"),
                                       ("gate_weights", "none", "a file, or none"),
                                       ("precision", "bf16", "bf16 | int8"),  # not `tuning` (Python only)
                                       ("topk_count", "tiles", "tiles | tokens"),
                                       ("dense_steps", "none", "N (the first N steps) | a fraction in (0, 1) (the "
                                                               "first ceil(F x steps)) | all, or none"),
                                       ("dense_layers", "none", "block indices, e.g. 0,1,29 or 0-2,29, or none"),
                                       ("min_tokens", "none", "an integer (a call over fewer tokens runs full), or "
                                                              "none")]
    vdit = dict((k, (d, v)) for k, d, v in option_help(backend_class("sparse-vdit").Options))
    assert vdit["remap"] == ("false", "true | false") and vdit["query_block"] == ("64", "an integer")
    for name in REGISTRY:
        assert [k for k, _, _ in option_help(backend_class(name).Options)] == text_options(backend_class(name).Options)


@pytest.mark.parametrize("text", ["vsa", "vsa:sparsity=0.9:dense_steps=2:dense_layers=0-2,29", "vsa:dense_steps=0.25",
                                  "sla-star:sparsity=0.5:dense_layers=3:min_tokens=64", "vsa:dense_steps=all:impl=torch",
                                  "sparse-vdit:patterns={tmp}/p.json:dense_layers=1"])
def test_command_text_parses_back_to_the_same_options(tmp_path, text):
    """What `vsagen search --suggest-dense` prints to paste goes through `--attn`'s own parser (its commas included:
    `parse_attn` joins the pieces of dense_layers) to the same options, with the preset's tables or without."""
    from vsagen.request.backends import parse_attn

    # a pattern file that reads (sparse-vdit's options read it): the tiny preset's
    (tmp_path / "p.json").write_bytes((Path(__file__).parents[2] / "vsagen" / "preset_data" / "patterns" / "tiny.json")
                                      .read_bytes())
    spec = resolve_spec(text.replace("{tmp}", str(tmp_path)))
    for preset in (None, {"vsa": {"sparsity": 0.875}, "sla-star": {"sparsity": 0.9}}):
        pasted = spec.command_text(preset)
        assert spec_of(parse_attn(pasted).one(), preset=preset).options == spec.options, pasted
    assert spec.command_text().startswith(spec.name) and "=none" not in spec.command_text()


def test_command_text_writes_a_value_the_preset_would_change_and_leaves_out_what_it_sets():
    spec = resolve_spec("sla-star:sparsity=0.875")  # vsa's default, but this preset's table says 0.9
    assert spec.command_text() == "sla-star" and spec.command_text({"sla-star": {"sparsity": 0.9}}) == \
        "sla-star:sparsity=0.875"
    assert resolve_spec("vsa:sparsity=0.9").command_text({"vsa": {"sparsity": 0.9}}) == "vsa"
