"""vsagen.profile_render: the renderings of a `vsagen profile` report (table, markdown, csv, json, the plot) agree
with one another, on a report built here (no model run: `tests/test_profile.py` renders real runs)."""

from __future__ import annotations

import csv
import io
import json

import pytest

from vsagen.errors import BadInput
from vsagen.profile import ProfileReport, ProfileRow
from vsagen.profile_render import render, write_plot

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
