"""vsagen.commands.compare_render: the table, csv, plot and side-by-side frames of a `CompareReport` built in the test
(real runs are in test_compare.py)."""

from __future__ import annotations

import csv
import io
import math

import numpy as np
import pytest

from vsagen.commands.compare import CompareReport, CompareRow
from vsagen.commands.compare_render import render_csv, rich_table, side_by_side, write_plot


def row(label: str, psnr: float, layers: list[float | None], expert: str = "transformer", sampler: str = "default",
        steps: int = 2, guidance: float = 5.0, vae: str = "stock", decode_s: float = 0.4) -> CompareRow:
    per_layer = [{"expert": expert, "layer": i, "rel_l2": x} for i, x in enumerate(layers)]
    finite = [x for x in layers if x is not None]
    per_step = [0.5] * steps
    return CompareRow(label=label, backend=label.split()[0], spec=label.split()[0], sparsity=None, impl="torch",
                      file=f"{label}.mp4", sampler={"name": sampler.split(":")[0], "entry": sampler}, steps=steps,
                      guidance=guidance, flow_shift=None if sampler.startswith("dmd") else 3.0,
                      dit_forwards=steps * (2 if guidance > 1 else 1), dit_s_per_video=sum(per_step),
                      dit_s_per_step=0.5, dit_per_step_s=per_step, attention_s_per_step=0.1,
                      speedup_vs_reference=1.0 if psnr == math.inf else 1.7, psnr_db=psnr,
                      psnr_per_frame_db=[psnr, psnr], ssim=1.0 if psnr == math.inf else 0.8,
                      ssim_per_frame=[1.0, 0.5], latents_rel_l2=0.0, error_steps=[0, 1], attention_rel_l2=[],
                      attention_rel_l2_per_layer=per_layer, attention_rel_l2_mean=sum(finite) / len(finite),
                      attention_rel_l2_max=max(finite), probe_s=0.01, warmup_s=0.0, vae_decoder=vae,
                      vae_weights="taew2_1.safetensors" if vae == "tiny" else None, vae_tiling=False,
                      decode_s=decode_s, decode_saved_s=0.4 - decode_s, decode_speedup_vs_reference=0.4 / decode_s)


def report() -> CompareReport:
    settings = {"model": "tiny", "prompt": "p", "device": "cpu", "dtype": "fp32", "frames": 5, "height": 64,
                "width": 128, "steps": 2, "warmup": 0, "guidance": 5.0, "seed": 0, "error_steps": [0, 1]}
    return CompareReport(settings=settings, versions={}, rows=[row("full", math.inf, [0.0, 0.0]),
                                                               row("vsa 0.875", 31.5, [0.25, 0.5])],
                         files={}, load_s=1.0, text_encode_s=0.1, notes=[])


def samplers_report() -> CompareReport:
    """A comparison of two samplers: dmd (3 steps, no CFG) against the scheduler's 50 steps with CFG 5."""
    rep = report()
    rep.settings["samplers"] = [{"label": "dmd"}, {"label": "default 50 steps CFG 5"}]
    rep.rows = [row("vsa 0.8 / dmd", math.inf, [0.25, 0.5], sampler="dmd", steps=3, guidance=1.0),
                row("full / default 50 steps CFG 5", 12.5, [0.0, 0.0], sampler="default:steps=50:guidance=5",
                    steps=50)]
    rep.rows[1].error_steps = [0, 25, 49]
    return rep


def test_csv_one_line_per_backend():
    rows = list(csv.DictReader(io.StringIO(render_csv(report()))))
    assert [r["label"] for r in rows] == ["full", "vsa 0.875"]
    assert [(r["sampler"], r["steps"], r["guidance"], r["dit_forwards"]) for r in rows] == [("default", "2", "5.0",
                                                                                             "4")] * 2
    assert rows[0]["psnr_db"] == "inf" and rows[0]["psnr_per_frame_db"] == "inf inf"
    assert float(rows[1]["psnr_db"]) == 31.5 and rows[1]["ssim_per_frame"] == "1 0.5"
    assert rows[1]["attention_rel_l2_per_layer"] == "0:0.25 1:0.5" and float(rows[1]["attention_rel_l2_max"]) == 0.5
    assert rows[0]["sparsity"] == ""  # None


def test_table_names_each_backend_and_its_worst_layer():
    from rich.console import Console

    con = Console(file=io.StringIO(), width=200, color_system=None)
    con.print(rich_table(report()))
    text = con.file.getvalue()
    assert "reference full" in text and "inf" in text and "31.50" in text and "1.70x" in text
    assert "L1 5.0e-01" in text  # the worst layer of vsa


def test_table_at_80_columns_keeps_every_digit():
    """As the CLI prints it (`vsagen.cli.terminal.fit_table`): 80 columns, no digit cut, each run on its lines."""
    from rich.console import Console

    from vsagen.cli.terminal import fit_table

    rep = report()
    rep.rows.append(row("sla-star:scope=marginal 0.875", 123.456789, [0.123456, 0.654321]))
    con = Console(file=io.StringIO(), width=80, color_system=None)
    con.print(fit_table(rich_table(rep), 80))
    text = con.file.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80 and "…" not in text
    lines = {line.split()[0]: line for line in text.splitlines() if line.split()[:1] in (["full"], ["vsa"],
                                                                                         ["sla-star:"])}
    for label, values in (("full", ("1.000", "0.5000", "1.00x", "inf", "L0 0.0e+00")),
                          ("vsa", ("31.50", "1.70x", "0.8000", "3.8e-01", "L1 5.0e-01")),
                          ("sla-star:", ("123.46", "3.9e-01", "L1 6.5e-01"))):
        for value in values:
            assert value in lines[label], (label, value)


def test_samplers_csv_table_and_title_name_each_run_s_sampler():
    """Runs of two samplers: the CSV records each run's sampler entry, steps, CFG scale, DiT forwards and seconds per
    video; the title leaves steps and CFG to the labels; the table names the runs and shows DiT s/video."""
    from rich.console import Console

    from vsagen.commands.compare_render import title

    rep = samplers_report()
    rows = list(csv.DictReader(io.StringIO(render_csv(rep))))
    assert [(r["sampler"], r["steps"], r["guidance"], r["dit_forwards"], r["flow_shift"]) for r in rows] == [
        ("dmd", "3", "1.0", "3", ""), ("default:steps=50:guidance=5", "50", "5.0", "100", "3.0")]
    assert [float(r["dit_s_per_video"]) for r in rows] == [1.5, 25.0]
    head = title(rep)
    assert "steps" not in head.replace("warm-up step", "") and "CFG" not in head and "reference vsa 0.8 / dmd" in head
    con = Console(file=io.StringIO(), width=200, color_system=None)
    con.print(rich_table(rep))
    text = con.file.getvalue()
    assert "s/video" in text and "run" in text and "25.000" in text and "each run's --error-steps" in text
    assert "default 50 steps CFG 5" in " ".join(text.split())


def unmeasured_report() -> CompareReport:
    """`--error-steps none`: no run compared its attention with dense attention."""
    rep = report()
    rep.settings["error_steps"] = []
    for r in rep.rows:
        r.error_steps, r.attention_rel_l2_mean, r.attention_rel_l2_max = [], None, None
        r.attention_rel_l2_per_layer = [{**x, "rel_l2": None} for x in r.attention_rel_l2_per_layer]
    return rep


@pytest.mark.parametrize("width", [200, 80])
def test_table_without_attention_error_says_it_was_not_measured(width):
    """A trial's `compare --error-steps none` printed "attention rel-L2 against dense attention on the same q, k, v
    at steps none" over two columns of dashes: the caption now says the error was not measured, and the attention
    columns are left out."""
    from rich.console import Console

    from vsagen.cli.terminal import fit_table

    con = Console(file=io.StringIO(), width=width, color_system=None)
    con.print(fit_table(rich_table(unmeasured_report()), width))
    text = " ".join(con.file.getvalue().split())
    assert "attention error not measured (--error-steps none)" in text, text
    assert "at steps" not in text and "against dense" not in text and "attn" not in text and "worst" not in text
    assert "31.50" in text and "1.70x" in text  # the other columns as before
    con = Console(file=io.StringIO(), width=200, color_system=None)
    con.print(rich_table(report()))
    measured = " ".join(con.file.getvalue().split())
    assert "against dense attention on the same q, k, v at steps 0, 1" in measured and "not measured" not in measured


@pytest.mark.parametrize("experts", [1, 2, "unmeasured"])
def test_plot_is_written(tmp_path, experts):
    pytest.importorskip("matplotlib")
    rep = unmeasured_report() if experts == "unmeasured" else report()
    if experts == 2:  # a two-expert model: layers of transformer, then of transformer_2, labelled ticks
        for r in rep.rows:
            r.attention_rel_l2_per_layer += [{**x, "expert": "transformer_2"} for x in r.attention_rel_l2_per_layer]
    path = tmp_path / "c.png"
    write_plot(rep, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["c.png"]


def test_side_by_side_keeps_each_video_outside_its_label():
    rng = np.random.default_rng(0)
    videos = [rng.integers(0, 256, (3, 40, 64, 3), dtype=np.uint8) for _ in range(3)]
    out = side_by_side(videos, ["full", "vsa 0.875", "sla-star"])
    assert out.shape == (3, 40, 3 * 64, 3) and out.dtype == np.uint8
    for i, v in enumerate(videos):
        panel = out[:, :, i * 64:(i + 1) * 64]
        assert np.array_equal(panel[:, 20:], v[:, 20:])  # below the label: the video itself
        corner = panel[:, :8, :16]
        assert set(np.unique(corner)) <= {0, 255} and (corner == 255).any()  # the label: white on black
    with pytest.raises(ValueError):
        side_by_side(videos, ["one label"])


def test_several_decoders_add_the_decode_columns_and_the_csv_names_each_decoder():
    """--vae stock,tiny: the table gains the decode seconds and those saved against the reference's decode (signed);
    the CSV carries each row's decoder, weights and decode seconds. One decoder: no decode columns."""
    from rich.console import Console

    rep = report()
    rep.settings["vae_decoders"] = ["stock", "tiny"]
    rep.rows = [row("full / stock VAE", math.inf, [0.0, 0.0]),
                row("full / tiny VAE", 24.5, [0.0, 0.0], vae="tiny", decode_s=0.1)]
    con = Console(width=200, record=True)
    con.print(rich_table(rep))
    text = con.export_text()
    assert "decode" in text and "s saved" in text and "+0.300" in text and "+0.000" in text
    rows = list(csv.DictReader(io.StringIO(render_csv(rep))))
    assert [(r["vae_decoder"], r["vae_weights"], float(r["decode_s"]), float(r["decode_saved_s"])) for r in rows] == [
        ("stock", "", 0.4, 0.0), ("tiny", "taew2_1.safetensors", 0.1, pytest.approx(0.3))]
    assert float(rows[1]["decode_speedup_vs_reference"]) == pytest.approx(4.0)
    con = Console(width=200, record=True)
    con.print(rich_table(report()))
    assert "s saved" not in con.export_text()


def test_the_linears_column_and_csv_fields_of_several_precisions():
    """`--quant none,fp8` on a two-expert model: a `linears` column (the precision, the block linears that ran in
    it of all: FP8 kept two in the run's dtype) only where the precisions differ; the CSV's quant fields."""
    from rich.console import Console

    from vsagen.commands.compare_render import linears_cell

    rep = report()
    rep.settings.update(dtype="bf16", quants=["none", "fp8"])
    rep.rows[0].quant = {"precision": "none", "transformer": {"int8": 0, "fp8": 0, "dtype": 20},
                         "transformer_2": {"int8": 0, "fp8": 0, "dtype": 20}}
    rep.rows[1].quant = {"precision": "fp8", "transformer": {"int8": 0, "fp8": 19, "dtype": 1},
                         "transformer_2": {"int8": 0, "fp8": 19, "dtype": 1}}
    assert [linears_cell(r, "bf16") for r in rep.rows] == ["bf16 40/40", "fp8 38/40"]
    console = Console(width=200, record=True)
    console.print(rich_table(rep))
    text = console.export_text()
    assert "linears" in text and "fp8" in text and "38/40" in text and "40/40" in text
    rows = list(csv.DictReader(io.StringIO(render_csv(rep))))
    assert [(r["quant"], r["quant_linears"]) for r in rows] == [
        ("none", "transformer:int8=0:fp8=0:dtype=20 transformer_2:int8=0:fp8=0:dtype=20"),
        ("fp8", "transformer:int8=0:fp8=19:dtype=1 transformer_2:int8=0:fp8=19:dtype=1")]
    rep.settings["quants"] = ["fp8"]  # one precision: no column
    console = Console(width=200, record=True)
    console.print(rich_table(rep))
    assert "linears" not in console.export_text()
