"""vsagen.commands.profile_render: the renderings of a `vsagen profile` report (table, markdown, csv, json, the plot) agree
with one another, on a report built here (no model run: `tests/test_profile.py` renders real runs)."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest

from vsagen.errors import BadInput
from vsagen.commands.profile import ProfileReport, ProfileRow
from vsagen.commands.profile_render import render, write_plot

SETTINGS = {"model": "tiny", "device": "cpu", "dtype": "fp32", "frames": 5, "height": 64, "width": 64, "steps": 2,
            "warmup": 1, "full_steps": 4, "guidance": 5.0, "kernels": False}


def row(backend, sparsity, spec, dit, attention):
    return ProfileRow(backend=backend, kind="backend", sparsity=sparsity, impl="torch", tile_fit="partial",
                      grid=[2, 4, 4], tokens=32, tiles=2, full_tiles=0, steps=2, dit_forwards=4, dit_s_per_step=dit,
                      dit_per_step_s=[dit, dit], attn1_s_per_step=attention * 1.5, attention_s_per_step=attention,
                      attention_stages_s_per_step={"coarse": attention / 4, "fine": attention * 3 / 4}
                      if sparsity is not None else {}, layout_s_per_step=0.001, attention_share_of_dit=attention / dit,
                      projected_steps=4, projected_dit_s=4 * dit, warmup_s=0.1, spec=spec)


def report():
    rows = [row("full", None, "full", 0.8, 0.5), row("vsa", 0.5, "vsa:sparsity=0.5:impl=torch", 0.4, 0.1),
            row("vsa", 0.5, "vsa:sparsity=0.5:impl=triton", 0.3, 0.05)]
    for r in rows:
        r.speedup_vs_full = 0.8 / r.dit_s_per_step
    return ProfileReport(settings=SETTINGS, versions={}, rows=rows, overhead=[], tile_fit_comparison=[], load_s=1.0,
                         text_encode_s=0.1, notes=["a note"])


def test_formats_carry_the_same_numbers():
    rep = report()
    data = json.loads(render(rep, "json"))
    assert [r["dit_s_per_step"] for r in data["rows"]] == [0.8, 0.4, 0.3]
    rows = list(csv.DictReader(io.StringIO(render(rep, "csv"))))
    assert [float(r["dit_s_per_step"]) for r in rows] == [0.8, 0.4, 0.3]
    assert [r["spec"] for r in rows] == ["full", "vsa:sparsity=0.5:impl=torch", "vsa:sparsity=0.5:impl=triton"]
    assert float(rows[1]["stage_fine_s_per_step"]) == pytest.approx(0.075)
    md = render(rep, "markdown")
    assert "| 2.00x |" in md and "Note: a note" in md
    table = render(rep, "table", width=240)
    assert "\x1b[" not in table and "note: a note" in table


def test_notes_wrap_for_a_terminal_and_stay_one_line_for_a_pipe_or_file():
    """In a pipe or file a note is one line, for grep, as the README says (it was wrapped at 200 columns there:
    a new-user trial); on a terminal it wraps between words under its text."""
    rep = report()
    long = "cached rows: " + "the seconds per computed and per reused forward carry over " * 5
    rep.notes = [long.strip()]
    piped = render(rep, "table", width=80, wrap_notes=False)
    assert f"note: {long.strip()}\n" in piped
    on_terminal = render(rep, "table", width=80).split("note: ", 1)[1].splitlines()
    assert len(on_terminal) > 1 and all(len(line) <= 80 for line in on_terminal)
    assert on_terminal[1].startswith("      ") and " ".join(x.strip() for x in on_terminal) == long.strip()


def test_rows_that_would_read_the_same_show_their_spec():
    """Two vsa rows at one sparsity differ only in impl: both labels are their full specs, in table and markdown."""
    rep = report()
    for fmt in ("markdown", "table"):
        text = render(rep, fmt, width=240) if fmt == "table" else render(rep, fmt)
        assert "vsa:sparsity=0.5:impl=torch" in text and "vsa:sparsity=0.5:impl=triton" in text
        assert "vsa 0.5 " not in text


def test_unknown_format_is_bad_input():
    with pytest.raises(BadInput, match="--format"):
        render(report(), "yaml")


def test_plot_is_written_once(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "dit.svg"
    write_plot(report(), path)
    assert path.read_text().lstrip().startswith("<?xml")
    with pytest.raises(BadInput):
        write_plot(report(), path)
    write_plot(report(), path, overwrite=True)


def sparse_vdit_report():
    """`full` and a sparse-vdit row with two layers recorded (a fused mixed layer, an all-skip one)."""
    rep = report()
    r = row("sparse-vdit", None, "sparse-vdit:patterns=p.json:remap=false:impl=torch", 0.5, 0.2)
    r.backend_info = {"name": "sparse-vdit", "impl": "auto", "remap": False, "patterns": "p.json",
                      "patterns_sha256": "ab" * 32, "density": 0.3125,
                      "modes": {"dense": 1, "skip": 3, "diagonal": 0}, "impl_ran": "torch"}
    r.layers = [{"expert": "transformer", "layer": 0, "heads": 2, "launches": 1, "groups": 2, "density": 0.625,
                 "modes": {"dense": 1, "skip": 1}},
                {"expert": "transformer", "layer": 1, "heads": 2, "launches": 0, "groups": 1, "density": 0.0,
                 "modes": {"skip": 2}}]
    r.launches_per_forward, r.block_density = 1, 0.3125
    rep.rows = [rep.rows[0], r]
    return rep


def test_per_layer_table_in_table_and_markdown():
    """A backend that records its layers gets its own table: one line a layer (launches, block density, modes)
    and an "all" line; the caption is what it says of itself (pattern file, sha256, density, modes in use)."""
    rep = sparse_vdit_report()
    md = render(rep, "markdown")
    assert "**per-layer attention of sparse-vdit (tile fit partial, grid 2x4x4, 2 tiles)" in md
    assert "| layer | heads | launches | groups | block density | modes |" in md  # one expert: no expert column
    assert "| 0 | 2 | 1 | 2 | 62.5% | dense 1, skip 1 |" in md
    assert "| 1 | 2 | 0 | 1 | 0.0% | skip 2 |" in md
    assert "| all (2 layers) | 4 | 1 | - | 31.2% | dense 1, skip 3 |" in md
    caption = next(ln for ln in md.splitlines() if ln.startswith("remap false"))
    assert caption == (f"remap false; patterns p.json; patterns_sha256 {'ab' * 32}; density 0.3125; "
                       "modes dense 1, skip 3")
    assert md.count("per-layer attention") == 1  # `full` records nothing
    table = render(rep, "table", width=240)
    assert "per-layer attention of sparse-vdit" in table and "all (2 layers)" in table
    assert "patterns_sha256 " + "ab" * 32 in table


def test_per_layer_table_names_experts_when_there_are_two():
    rep = sparse_vdit_report()
    rep.rows[1].layers[1]["expert"] = "transformer_2"
    md = render(rep, "markdown")
    assert "| expert | layer | heads |" in md and "| transformer_2 | 1 | 2 | 0 |" in md
    assert "| all | 2 layers | 4 | 1 |" in md


def test_json_and_csv_carry_the_layer_fields():
    rep = sparse_vdit_report()
    data = json.loads(render(rep, "json"))
    svd = data["rows"][1]
    assert svd["layers"] == rep.rows[1].layers and svd["backend_info"]["patterns_sha256"] == "ab" * 32
    assert (svd["launches_per_forward"], svd["block_density"]) == (1, 0.3125)
    assert data["rows"][0]["layers"] == [] and data["rows"][0]["launches_per_forward"] is None
    rows = list(csv.DictReader(io.StringIO(render(rep, "csv"))))
    assert "layers" not in rows[0] and "backend_info" not in rows[0]  # nested: json only
    assert (rows[1]["launches_per_forward"], rows[1]["block_density"]) == ("1", "0.3125")
    assert rows[0]["block_density"] == ""


def ulysses_report():
    """A `--ulysses 2 --cfg-parallel` report (4 ranks) with both tile fits, long labels and a sparse-vdit layer table:
    every column and table the renderer has."""
    rep = sparse_vdit_report()
    rep.settings = {**SETTINGS, "ulysses": 2, "cfg_parallel": True}
    crop = row("vsa", 0.875, "vsa:sparsity=0.875:impl=torch", 12.3456, 0.000123)
    crop.tile_fit, crop.grid, crop.tokens, crop.tiles = "crop", [8, 8, 12], 768, 12
    rep.rows.append(crop)
    for i, r in enumerate(rep.rows):
        r.all_to_all_s_per_step, r.cfg_exchange_s_per_step = 0.0123 + i, 1.5e-05 * (i + 1)
        r.latents_rel_l2_vs_full = 0.019 * i
        r.ranks = [{"rank": k, "dit_forwards": 4, "dit_s_per_step": r.dit_s_per_step - 0.01 * k,
                    "attention_s_per_step": r.attention_s_per_step, "all_to_all_s_per_step": 0.0123 + i,
                    "cfg_exchange_s_per_step": 1.5e-05 * (i + 1)} for k in range(4)]
    rep.tile_fit_comparison = [{"label": "vsa 0.875", "spec": "vsa:sparsity=0.875:impl=torch", "backend": "vsa",
                                "sparsity": 0.875, "partial_tokens": 32, "crop_tokens": 768,
                                "partial_dit_s_per_step": 0.4, "crop_dit_s_per_step": 12.3456,
                                "crop_vs_partial": 30.864, "partial_attention_s_per_step": 0.1,
                                "crop_attention_s_per_step": 0.000123}]
    stock = row("diffusers-sdpa", None, None, 0.9, 0.2)
    stock.kind, stock.attention_s_per_step, stock.layout_s_per_step = "overhead", None, None
    tiled = row("full+tile-order", None, None, 0.85, 0.5)
    tiled.kind, tiled.overhead_vs_stock = "overhead", -0.0556
    rep.overhead = [stock, tiled]
    rep.notes = ["a note long enough to wrap at eighty columns, which the console does at its spaces " * 2]
    return rep


NUMBER = re.compile(r"[-+]?\d[\w.%+-]*")  # 0.8, 6.41e-04, +529.9%, 1.00x, 5x6x10


def test_table_at_80_columns_cuts_no_number():
    """At 80 columns every table is split into tables that fit (the key columns repeated): every number of every
    cell appears whole, no line is wider than 80, nothing is cut ("…"), headers wrap at their spaces."""
    from vsagen.commands.profile_render import _tables

    rep = ulysses_report()
    text = render(rep, "table", width=80)
    lines = text.splitlines()
    assert "…" not in text and max(map(len, lines)) <= 80, text
    numbers = {n for t in _tables(rep) for cells in t.body for cell in cells[t.keys:] for n in NUMBER.findall(cell)}
    assert {"12.346", "1.23e-04", "0.0123", "1.50e-05", "30.86x", "-5.6%", "62.5%", "8x8x12"} <= numbers
    assert not [n for n in numbers if n not in text], text
    for header in ("all-to-all", "exchange", "speed-up", "rel-L2"):
        assert header in text
    assert "DiT time per backend (slowest rank), continued (2 of" in text  # the DiT table did not fit in one
    # the note wraps between words, its lines indented under its text (they started at column 0)
    note = text[text.index("note: "):].splitlines()
    assert len(note) >= 2 and all(line.startswith("      ") and not line.startswith("       ") for line in note[1:])
    assert " ".join(line.strip() for line in note) == "note: " + rep.notes[0].strip()
    wide = render(rep, "table", width=400)
    assert "continued" not in wide and "…" not in wide


def test_multi_process_columns_in_every_format():
    """--ulysses / --cfg-parallel: all-to-all and CFG-exchange columns in the table, markdown and csv; every rank's
    row in the json."""
    rep = ulysses_report()
    md = render(rep, "markdown")
    assert "| backend | tile fit | DiT s/step | attention s/step | all-to-all s/step | CFG exchange s/step |" in md
    assert "DiT time per backend (slowest rank)" in md and "| ulysses 2 | CFG parallel" in md
    rows = list(csv.DictReader(io.StringIO(render(rep, "csv"))))
    assert [float(r["all_to_all_s_per_step"]) for r in rows[:3]] == [0.0123, 1.0123, 2.0123]
    assert "ranks" not in rows[0]  # nested: json only
    data = json.loads(render(rep, "json"))
    assert [r["rank"] for r in data["rows"][2]["ranks"]] == [0, 1, 2, 3]
    assert data["rows"][2]["ranks"][3]["all_to_all_s_per_step"] == 2.0123
    one = report()  # one process: no exchange columns
    assert "all-to-all" not in render(one, "markdown") and "exchange" not in render(one, "table", width=80)


def test_kernel_table_says_where_each_row_was_timed():
    from vsagen.bench import KernelRow
    from vsagen.commands.profile import KernelReport

    rows = [KernelRow("s", "partial", (2, 4, 4), 32, 2, 16, k, "fwd", 1.0, "SDPA (torch CPU)", 1.0, n)
            for k, n in (("SDPA (torch CPU)", 1), ("sparse-vdit", 2))]
    rep = KernelReport(settings={**SETTINGS, "kernels": True}, versions={}, rows=rows, notes=[])
    md = render(rep, "markdown")
    assert "| kernel | pass | timed at | ms |" in md
    assert "| SDPA (torch CPU) | fwd | layer 0 |" in md and "| sparse-vdit | fwd | mean of 2 layers |" in md
    assert json.loads(render(rep, "json"))["rows"][1]["layers"] == 2
