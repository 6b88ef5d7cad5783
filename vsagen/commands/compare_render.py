"""Renderings of `vsagen compare`'s report (`vsagen.commands.compare.CompareReport`): the Rich table, the csv, the plot
(speed-up against PSNR per run; attention error per layer) and the side-by-side video's frames (each panel labelled
with its run: backend, its step cache where it has one, and sampler where the samplers differ; drawn with Pillow)."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..media.metrics import json_number


def _num(x: float | None, fmt: str) -> str:
    if x is None:
        return "-"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return format(x, fmt)


def _worst_layer(row: Any) -> str:
    """"L<layer> <rel_l2>" (expert too with two experts) of the layer with the largest attention error."""
    layers = [x for x in row.attention_rel_l2_per_layer if x["rel_l2"] is not None]
    if not layers:
        return "-"
    worst = max(layers, key=lambda x: x["rel_l2"])
    experts = len({x["expert"] for x in row.attention_rel_l2_per_layer}) > 1
    return (f"{worst['expert']} " if experts else "") + f"L{worst['layer']} {worst['rel_l2']:.1e}"


def _attention_measured(report: Any) -> bool:
    """Whether some run compared its attention with dense attention (not with `--error-steps none`)."""
    return any(r.error_steps for r in report.rows)


def title(report: Any) -> str:
    """One line: model, size, steps and CFG (where every run has the same; else the warm-up only: the labels name each
    run's sampler), device and dtype, the reference."""
    s = report.settings
    walk = (f"{s['steps']} step{'s' * (s['steps'] != 1)} after {s['warmup']} warm-up | CFG {s['guidance']:g}"
            if len(s.get("samplers") or [None]) < 2 else
            f"{s['warmup']} warm-up step{'s' * (s['warmup'] != 1)} per run (a re-noise sampler: one pass)")
    return (f"{s['model']} | {s['frames']}x{s['height']}x{s['width']} | {walk} | {s['device']} {s['dtype']} | "
            f"reference {report.rows[0].label}")


def several_vaes(report: Any) -> bool:
    """Whether the runs were decoded by several decoders (`--vae stock,tiny`)."""
    return len(report.settings.get("vae_decoders") or ()) > 1


def several_quants(report: Any) -> bool:
    """Whether the runs' block linears ran in several precisions (`--quant none,int8`)."""
    return len(report.settings.get("quants") or ()) > 1


def linears_cell(row: Any, dtype: str) -> str:
    """A row's precision and how many block linears ran in it, of all (every transformer): "int8 20/20", "bf16
    20/20" (`--quant none`: the run's dtype), "fp8 18/20" (FP8 keeps a shape `torch._scaled_mm` refuses)."""
    from .compare_config import precision_label

    precision = row.quant.get("precision", "none")
    counts = [v for k, v in row.quant.items() if k != "precision"]
    key = "dtype" if precision == "none" else precision
    ran, total = sum(c[key] for c in counts), sum(sum(c.values()) for c in counts)
    return f"{precision_label(precision, dtype)} {ran}/{total}"


def rich_table(report: Any) -> Any:
    """The report as a `rich.table.Table`: per run DiT s/video (every timed step, both CFG passes), DiT s/step, the
    speed-up (of the DiT time per video), PSNR, SSIM, latents rel-L2, the mean attention error over the layers and
    the worst layer (both left out, and the caption says so, where no run measured it: `--error-steps none`); with
    several decoders (`--vae stock,tiny`) the decode seconds and those saved against the reference's decode; with
    several precisions (`--quant none,int8`) the precision of the blocks' linears (`linears_cell`). A
    cached run's cell says the DiT forwards its cache reused, of all ("reused 4/6": in the run's cell, not a column
    of its own, so that 80 columns still fit without breaking a number)."""
    from rich.table import Table

    steps = report.settings["error_steps"]
    alike = len({tuple(r.error_steps) for r in report.rows}) < 2
    measured = _attention_measured(report)  # --error-steps none: no attention columns, the caption says so
    at = (f"at step{'s' if len(steps) != 1 else ''} {', '.join(map(str, steps))}" if alike else
          "at each run's --error-steps (- where none)")
    attention = (f"attention rel-L2 against dense attention on the same q, k, v {at}" if measured else
                 "attention error not measured (--error-steps none)")
    t = Table(title=title(report), title_justify="left",
              caption=f"speed-up: of the DiT seconds per video; {attention}; PSNR / SSIM of the decoded frames "
                      "against the reference" + ("; decode s saved: the reference's decode s minus the run's"
                                                 if several_vaes(report) else ""),
              caption_justify="left")
    # headers broken by hand so that 80 columns fit without breaking a word; a label's options each on a line
    # (`vsagen.cli.terminal.fit_table` makes the table compact where its words still do not fit); cells fold, never cut
    cached = any(r.cached for r in report.rows)  # --cache: the forwards each run computed / reused
    vaes = several_vaes(report)  # --vae stock,tiny: each run's decode seconds and those saved against the reference
    quants = several_quants(report)  # --quant none,int8: the precision each run's linears ran in
    t.add_column("run" if len({r.sampler["entry"] for r in report.rows}) > 1 or cached or vaes or quants
                 else "backend", overflow="fold", min_width=8)
    if quants:
        t.add_column("linears", justify="right", overflow="fold")
    kept = any(r.key_tiles_kept for r in report.rows)  # VSA's backends: key tiles kept per query tile, of all
    for col in ("DiT\ns/video", "DiT\ns/step", "speed-\nup", *(("key\ntiles\nkept",) if kept else ()),
                *(("decode\ns", "decode\ns saved") if vaes else ()), "PSNR\ndB",
                "SSIM", "latents\nrel-L2", *(("attn\nrel-L2\nmean", "attn rel-L2\nworst layer") if measured else ())):
        t.add_column(col, justify="right", overflow="fold")
    for r in report.rows:
        share = (f"{r.key_tiles_kept[0]}/{r.key_tiles_kept[1]}" if r.key_tiles_kept else
                 "all" if r.sparsity is None else "")
        reused = (f"\nreused {r.dit_reused_forwards}/{r.dit_computed_forwards + r.dit_reused_forwards}"
                  if r.cached else "")
        t.add_row(r.label.replace(":", ":\n").replace(" / ", " /\n").replace(" + ", " +\n") + reused,
                  *((linears_cell(r, report.settings["dtype"]).replace(" ", "\n"),) if quants else ()),
                  f"{r.dit_s_per_video:.3f}", f"{r.dit_s_per_step:.4f}", f"{r.speedup_vs_reference:.2f}x",
                  *((share,) if kept else ()),
                  *((f"{r.decode_s:.3f}", f"{r.decode_saved_s:+.3f}") if vaes else ()),
                  _num(r.psnr_db, ".2f"),
                  _num(r.ssim, ".4f"), _num(r.latents_rel_l2, ".1e"),
                  *((_num(r.attention_rel_l2_mean, ".1e"), _worst_layer(r)) if measured else ()))
    return t


CSV_FIELDS = ("label", "backend", "spec", "sparsity", "impl", "sampler", "cache", "cache_spec", "quant", "quant_linears",
              "steps", "guidance",
              "flow_shift", "dit_forwards", "dit_computed_forwards", "dit_reused_forwards", "dit_reuse_share",
              "dit_per_computed_forward_s", "dit_per_reused_forward_s", "dit_computed_s", "dit_reused_s",
              "dit_reused_steps", "dit_s_per_video", "dit_s_per_step", "speedup_vs_reference", "attention_s_per_step",
              "key_tiles_kept", "vae_decoder", "vae_weights", "vae_tiling", "decode_s", "decode_saved_s",
              "decode_speedup_vs_reference", "psnr_db", "ssim", "latents_rel_l2", "attention_rel_l2_mean", "attention_rel_l2_max", "probe_s",
              "psnr_per_frame_db", "ssim_per_frame", "attention_rel_l2_per_layer", "file")


def render_csv(report: Any) -> str:
    """One line per run (CSV_FIELDS): scalars as numbers (PSNR +inf as "inf", missing as ""), the sampler as its
    entry (`dmd`, `default:steps=50:guidance=5`), per-frame values space-separated, the per-layer attention error as
    space-separated `layer:value` (`expert/layer:value` with two experts), `quant` the precision of the blocks'
    linears ("none" | "fp8" | "int8") and `quant_linears` how many ran in each, per transformer, space-separated
    (`transformer:int8=20:fp8=0:dtype=0`)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    for r in report.rows:
        experts = len({x["expert"] for x in r.attention_rel_l2_per_layer}) > 1
        d = {k: getattr(r, k) for k in CSV_FIELDS if k != "quant_linears"}
        d["psnr_db"] = json_number(r.psnr_db)
        d["sampler"] = r.sampler["entry"]
        d["quant"] = r.quant.get("precision")
        d["quant_linears"] = " ".join(f"{name}:" + ":".join(f"{k}={n}" for k, n in counts.items())
                                      for name, counts in r.quant.items() if name != "precision")
        d["key_tiles_kept"] = "/".join(map(str, r.key_tiles_kept)) if r.key_tiles_kept else None
        d["dit_reused_steps"] = " ".join(map(str, r.dit_reused_steps))
        d["psnr_per_frame_db"] = " ".join(str(json_number(x)) for x in r.psnr_per_frame_db)
        d["ssim_per_frame"] = " ".join(f"{x:.6g}" for x in r.ssim_per_frame)
        d["attention_rel_l2_per_layer"] = " ".join(
            (f"{x['expert']}/" if experts else "") + f"{x['layer']}:"
            + ("" if x["rel_l2"] is None else format(x["rel_l2"], ".6g")) for x in r.attention_rel_l2_per_layer)
        w.writerow({k: ("" if v is None else v) for k, v in d.items()})
    return buf.getvalue()


def side_by_side(videos: Sequence[np.ndarray], labels: Sequence[str]) -> np.ndarray:
    """The videos next to each other, left to right, each panel's label written at its top-left corner (white on
    a black box, Pillow's built-in font scaled to the frame height).

    Args:
        videos: (F, H, W, 3) uint8 each, one shape.
        labels: one per video.

    Returns:
        (F, H, W * len(videos), 3) uint8.

    Raises:
        ValueError: no video, shapes that differ, or not one label per video.
    """
    from PIL import Image, ImageDraw, ImageFont

    if not videos or len(videos) != len(labels) or any(v.shape != videos[0].shape for v in videos):
        raise ValueError("side_by_side needs one label per video and videos of one shape")
    f, h, w, _ = videos[0].shape
    font = ImageFont.load_default(size=max(8, h // 16))
    stamps = []  # each label drawn once: (mask of the box, mask of the text) for one panel
    for label in labels:
        img = Image.new("L", (w, h), 0)
        draw = ImageDraw.Draw(img)
        left, top, right, bottom = draw.textbbox((3, 2), label, font=font)
        box = np.zeros((h, w), dtype=bool)
        box[:min(bottom + 3, h), :min(right + 3, w)] = True
        draw.text((3, 2), label, fill=255, font=font)
        stamps.append((box, np.asarray(img) > 127))
    out = np.concatenate(videos, axis=2)
    for i, (box, text) in enumerate(stamps):
        panel = out[:, :, i * w:(i + 1) * w]
        panel[:, box] = 0
        panel[:, text] = 255
    return out


def write_plot(report: Any, path: Path, *, overwrite: bool = False, outputs: Any = None) -> None:
    """Two panels: speed-up over the reference (DiT time per video) against PSNR per run (infinite PSNR drawn at the
    top with an arrow mark), and the attention error (rel-L2 against dense) per layer, one line per run. Written
    atomically (`vsagen.media.video.write_with`) in the format of `path`'s suffix; matplotlib's object API. With
    `outputs` (a `vsagen.media.video.Outputs`), added to that set instead (published with it; `overwrite` is the set's).

    Raises:
        BadInput: matplotlib is not installed, or `path` exists and `overwrite` is False.
    """
    from ..media.video import new_figure, write_with

    rows = report.rows
    finite = [r.psnr_db for r in rows if math.isfinite(r.psnr_db)]
    top = (max(finite) + 5.0) if finite else 100.0
    fig = new_figure("the plot", figsize=(11, 4.5), layout="constrained")
    ax, bx = fig.subplots(1, 2)
    for r in rows:
        inf = not math.isfinite(r.psnr_db)
        y = top if inf else r.psnr_db
        ax.scatter([r.speedup_vs_reference], [y], marker="^" if inf else "o")
        ax.annotate(r.label + (" (PSNR inf)" if inf else ""), (r.speedup_vs_reference, y), xytext=(4, 4),
                    textcoords="offset points", fontsize=8)
    ax.set_xlabel(f"DiT speed-up over {rows[0].label} (seconds per video)")
    ax.set_ylabel(f"PSNR against {rows[0].label} (dB)")
    ax.margins(0.2)
    bx.xaxis.get_major_locator().set_params(integer=True)  # layers (two experts: labelled ticks instead)
    for r in rows:
        layers = r.attention_rel_l2_per_layer
        experts = len({x["expert"] for x in layers}) > 1
        xs = list(range(len(layers)))
        bx.plot(xs, [np.nan if x["rel_l2"] is None else x["rel_l2"] for x in layers], marker=".", label=r.label)
        if experts and r is rows[0]:
            bx.set_xticks(xs, [f"{x['expert'][-1]}:{x['layer']}" for x in layers], fontsize=6)
    bx.set_xlabel("layer" + (" (expert:layer)" if any(len({x["expert"] for x in r.attention_rel_l2_per_layer}) > 1
                                                      for r in rows) else ""))
    bx.set_ylabel("attention rel-L2 vs dense (chosen steps)")
    if not _attention_measured(report):
        bx.text(0.5, 0.5, "not measured (--error-steps none)", ha="center", va="center", transform=bx.transAxes)
    bx.legend(fontsize=8)
    fig.suptitle(title(report), fontsize=8)
    def save(tmp: Path) -> None:
        fig.savefig(tmp, format=path.suffix.lstrip(".").lower(), dpi=120)

    if outputs is not None:
        outputs.add(path, save)
    else:
        write_with(path, save, overwrite=overwrite)
