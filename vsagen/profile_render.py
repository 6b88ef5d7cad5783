"""Renderings of `vsagen profile`'s reports (`vsagen.profile.ProfileReport` and `KernelReport`): a Rich table
(plain text), markdown, csv, json, and the DiT bar chart (`write_plot`).

The table and markdown hold the DiT table, then one per-layer table per configuration whose backend records what
each layer ran (`ProfileRow.layers`: sparse-vdit), its caption what the backend says of itself (`describe`: the
pattern file, its sha256, density, modes). The csv has one line per configuration (the per-layer rows and the
backend's description are in the json only; their summary columns `launches_per_forward` and `block_density` are
in both)."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .errors import BadInput
from .profile import BASELINE, STOCK, KernelReport, ProfileReport, row_labels

def _sec(x: float | None) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    return f"{x:.3f}" if abs(x) >= 1 else (f"{x:.4f}" if abs(x) >= 1e-3 else f"{x:.2e}")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _times(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _signed_pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def _rel(x: float | None) -> str:
    return "-" if x is None else f"{x:.1e}"


def _header(settings: dict[str, Any]) -> str:
    s = settings
    return (f"{s['model']} | {s['frames']}x{s['height']}x{s['width']} | {s['device']} {s['dtype']}"
            + ("" if s["kernels"] else f" | {s['steps']} timed step{'s' * (s['steps'] != 1)} after {s['warmup']} "
               f"warm-up per configuration | CFG {s['guidance']:g}"))


Table = tuple[str, list[str], list[list[str]], str]  # title, header, rows of cells, caption ("" for none)
INFO_HIDDEN = ("name", "impl", "impl_ran")  # `describe` entries the DiT table already shows


def _value(v: Any) -> str:
    """A `describe` value as text: mappings as "k v, k v", floats to 4 significant digits."""
    if isinstance(v, dict):
        return ", ".join(f"{k} {_value(x)}" for k, x in v.items() if x != 0)  # a mode no head uses: left out
    if isinstance(v, bool):
        return str(v).lower()
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _modes(modes: dict[str, int]) -> str:
    """{"dense": 2, "skip": 0, "diagonal": 3} -> "dense 2, diagonal 3" (modes no head uses left out)."""
    return ", ".join(f"{k} {n}" for k, n in modes.items() if n) or "-"


def _layer_table(r: Any, label: str) -> Table:
    """One configuration's per-layer table (`ProfileRow.layers`), a last row "all" summing launches and modes over
    the layers (density: the head-weighted mean), and the backend's `describe` as caption."""
    experts = len({x["expert"] for x in r.layers}) > 1
    head = (["expert"] if experts else []) + ["layer", "heads", "launches", "groups", "block density", "modes"]
    body = [([str(x["expert"])] if experts else []) + [str(x["layer"]), str(x["heads"]), str(x["launches"]),
                                                       str(x["groups"]), _pct(x["density"]), _modes(x["modes"])]
            for x in r.layers]
    total: dict[str, int] = {}
    for x in r.layers:
        for k, n in x["modes"].items():
            total[k] = total.get(k, 0) + n
    body.append((["all", f"{len(r.layers)} layers"] if experts else [f"all ({len(r.layers)} layers)"])
                + [str(sum(x["heads"] for x in r.layers)), str(r.launches_per_forward), "-", _pct(r.block_density),
                   _modes(total)])
    caption = "; ".join(f"{k} {_value(v)}" for k, v in r.backend_info.items() if k not in INFO_HIDDEN)
    title = (f"per-layer attention of {label} (tile fit {r.tile_fit}, grid {'x'.join(map(str, r.grid))}, "
             f"{r.tiles} tiles): each layer's first call; launches per transformer forward, block density = computed "
             "tile pairs / (heads x tiles^2)")
    return title, head, body, caption


def _profile_tables(rep: ProfileReport) -> list[Table]:
    n = rep.settings["full_steps"]
    head = ["backend", "tile fit", "grid (S, tiles)", "DiT s/step", "attention s/step", "stages s/step",
            "layout s/step", "attn % DiT", "speed-up vs full", f"projected DiT s ({n} step{'s' if n != 1 else ''})",
            "latents rel-L2 vs full"]
    body = []
    for r, label in zip(rep.rows, row_labels(rep.rows)):
        stages = ", ".join(f"{k} {_sec(v)}" for k, v in r.attention_stages_s_per_step.items()) or "-"
        body.append([label, r.tile_fit, f"{'x'.join(map(str, r.grid))} ({r.tokens}, {r.tiles})",
                     _sec(r.dit_s_per_step), _sec(r.attention_s_per_step), stages, _sec(r.layout_s_per_step),
                     _pct(r.attention_share_of_dit), _times(r.speedup_vs_full), _sec(r.projected_dit_s),
                     _rel(r.latents_rel_l2_vs_full)])
    tables: list[Table] = [(f"DiT time per backend: {_header(rep.settings)}", head, body, "")]
    if rep.tile_fit_comparison:
        tables.append(("tile fit: partial edge tiles vs crop (denoise a latent rounded up to whole tiles)",
                       ["backend", "partial S", "crop S", "partial DiT s/step", "crop DiT s/step", "crop / partial",
                        "partial attention s/step", "crop attention s/step"],
                       [[c["backend"] + (f" {c['sparsity']:g}" if c["sparsity"] is not None else ""),
                         str(c["partial_tokens"]), str(c["crop_tokens"]), _sec(c["partial_dit_s_per_step"]),
                         _sec(c["crop_dit_s_per_step"]), _times(c["crop_vs_partial"]),
                         _sec(c["partial_attention_s_per_step"]), _sec(c["crop_attention_s_per_step"])]
                        for c in rep.tile_fit_comparison], ""))
    if rep.overhead:
        fit = rep.overhead[0].tile_fit
        full = [r for r in rep.rows if r.backend == BASELINE and r.tile_fit == fit]
        body = [[r.backend, _sec(r.dit_s_per_step), _sec(r.attention_s_per_step), _sec(r.layout_s_per_step),
                 "-" if r.backend == STOCK else _signed_pct(r.overhead_vs_stock), _rel(r.latents_rel_l2_vs_full)]
                for r in [rep.overhead[0], *full, *rep.overhead[1:]]]
        tables.append((f"vsagen overhead: same transformer, stock diffusers processors vs vsagen's (tile fit {fit})",
                       ["configuration", "DiT s/step", "attention s/step", "layout s/step", f"DiT vs {STOCK}",
                        "latents rel-L2 vs full"], body, ""))
    tables += [_layer_table(r, label) for r, label in zip(rep.rows, row_labels(rep.rows)) if r.layers]
    return tables


def _kernel_tables(rep: KernelReport) -> list[Table]:
    tables: list[Table] = []
    fits = list(dict.fromkeys(r.tile_fit for r in rep.rows))
    for fit in fits:
        rows = [r for r in rep.rows if r.tile_fit == fit]
        r0 = rows[0]
        title = (f"attention alone at {r0.shape}: grid {'x'.join(map(str, r0.grid))} (S={r0.tokens}), H={r0.heads}, "
                 f"D={r0.head_dim}, B=1, {rep.settings['dtype']}, tile fit {fit}, {rep.settings['device']}")
        tables.append((title, ["kernel", "pass", "timed at", "ms", f"vs {r0.baseline}"],
                       [[r.kernel, r.kind, "layer 0" if r.layers == 1 else f"mean of {r.layers} layers",
                         f"{r.ms:.3f}", _times(r.speedup_vs_baseline)] for r in rows], ""))
    return tables


def _tables(rep: ProfileReport | KernelReport) -> list[Table]:
    return _kernel_tables(rep) if isinstance(rep, KernelReport) else _profile_tables(rep)


def _markdown(rep: ProfileReport | KernelReport) -> str:
    out = []
    for title, head, body, caption in _tables(rep):
        out += [f"**{title}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in body]
        out += ["", caption] if caption else []
        out.append("")
    out += [f"Note: {n}" for n in rep.notes]
    return "\n".join(out).rstrip("\n") + "\n"


def _csv(rep: ProfileReport | KernelReport) -> str:
    buf = io.StringIO()
    if isinstance(rep, KernelReport):
        dicts = [r.to_dict() for r in rep.rows]
        for d in dicts:
            d["grid"] = "x".join(map(str, d["grid"]))
        fields = list(dicts[0]) if dicts else []
    else:
        stages = list(dict.fromkeys(k for r in rep.rows + rep.overhead for k in r.attention_stages_s_per_step))
        dicts = []
        for r in rep.rows + rep.overhead:
            d = asdict(r)
            d["grid"] = "x".join(map(str, d["grid"]))
            d["dit_per_step_s"] = " ".join(f"{x:.6g}" for x in d["dit_per_step_s"])
            st = d.pop("attention_stages_s_per_step")
            for nested in ("dit_by_expert_s_per_step", "backend_info", "layers"):
                d.pop(nested)
            for k in stages:
                d[f"stage_{k}_s_per_step"] = st.get(k)
            dicts.append({"model": rep.settings["model"], "device": rep.settings["device"],
                          "dtype": rep.settings["dtype"], **d})
        fields = list(dicts[0]) if dicts else []
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    for d in dicts:
        w.writerow({k: ("" if v is None else v) for k, v in d.items()})
    return buf.getvalue()


def render(rep: ProfileReport | KernelReport, fmt: str, width: int | None = None) -> str:
    """The report as text in `fmt` ("table" | "markdown" | "csv" | "json"); "table" is Rich's plain-text
    rendering (no colour codes) `width` columns wide (default: the terminal's when stdout is one, else 200)."""
    if fmt == "json":
        return json.dumps(rep.to_dict(), allow_nan=False) + "\n"
    if fmt == "markdown":
        return _markdown(rep)
    if fmt == "csv":
        return _csv(rep)
    if fmt != "table":
        raise BadInput(f"--format must be one of table, markdown, csv, json, got {fmt!r}")
    from rich.console import Console
    from rich.table import Table as RichTable

    import shutil
    import sys

    if width is None:
        width = max(100, shutil.get_terminal_size().columns) if sys.stdout.isatty() else 200
    buf = io.StringIO()
    con = Console(file=buf, width=width, color_system=None, force_terminal=False, highlight=False)
    for title, head, body, caption in _tables(rep):
        t = RichTable(title=title, title_justify="left")
        for i, h in enumerate(head):
            t.add_column(h, justify="left" if i < 2 else "right", overflow="fold")  # narrow: wrap, never cut
        for row in body:
            t.add_row(*row)
        con.print(t)
        if caption:  # below the table at the console's width (a table-wide caption would break the sha256)
            con.print(caption, markup=False)
    for n in rep.notes:
        con.print(f"note: {n}", markup=False)
    return buf.getvalue()


def write_plot(rep: ProfileReport, path: Path, *, overwrite: bool = False) -> None:
    """Bar chart of DiT seconds per step per configuration, split into the attention backend, the tile-order
    layout and the rest of the DiT (one grey "attention not timed" bar where `--compile` put the attention
    inside the graphs), with the speed-up against `full` over each bar. Written atomically in the
    format of `path`'s suffix (.png, .svg, .pdf); matplotlib's object API, no pyplot state.

    Raises:
        BadInput: matplotlib is not installed, or `path` exists and `overwrite` is False.
    """
    from .video import new_figure, write_with

    rows = rep.rows
    two_fits = len({r.tile_fit for r in rows}) > 1
    labels = [label + (f"\n{r.tile_fit}" if two_fits else "") for r, label in zip(rows, row_labels(rows))]
    untimed = [r.attention_s_per_step is None for r in rows]  # --compile: attention inside the graphs
    attn = [r.attention_s_per_step or 0.0 for r in rows]
    lay = [r.layout_s_per_step or 0.0 for r in rows]
    rest = [max(r.dit_s_per_step - a - b, 0.0) for r, a, b in zip(rows, attn, lay)]
    x = list(range(len(rows)))
    fig = new_figure("--plot", figsize=(max(4.5, 1.3 * len(rows) + 2.5), 4.5), layout="constrained")
    ax = fig.subplots()
    if not all(untimed):
        ax.bar(x, attn, color="#d62728", label="self-attention (backend)")
    ax.bar(x, lay, bottom=attn, color="#ff9896", label="tile layout")
    if not all(untimed):
        ax.bar(x, [0.0 if u else r for r, u in zip(rest, untimed)], bottom=[a + b for a, b in zip(attn, lay)],
               color="#1f77b4", label="rest of DiT")
    if any(untimed):
        ax.bar(x, [r if u else 0.0 for r, u in zip(rest, untimed)], bottom=[a + b for a, b in zip(attn, lay)],
               color="#7f7f7f", label="DiT, attention not timed (--compile)")
    for xi, r in zip(x, rows):
        if r.speedup_vs_full is not None:
            ax.annotate(f"{r.speedup_vs_full:.2f}x", (xi, r.dit_s_per_step), ha="center", va="bottom",
                        xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(x, labels)
    ax.set_ylabel("DiT seconds per denoising step")
    ax.set_title(_header(rep.settings), fontsize=8)
    ax.margins(y=0.12)
    ax.legend(fontsize=8)
    write_with(path, lambda tmp: fig.savefig(tmp, format=path.suffix.lstrip(".").lower(), dpi=120),
               overwrite=overwrite)
