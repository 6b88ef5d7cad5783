"""Renderings of `vsagen profile`'s reports (`vsagen.commands.profile.ProfileReport` and `KernelReport`): a Rich table
(plain text), markdown, csv, json, and the DiT bar chart (`write_plot`).

The table and markdown hold the DiT table, then one per-layer table per configuration whose backend records what
each layer ran (`ProfileRow.layers`: sparse-vdit), its caption what the backend says of itself (`describe`: the
pattern file, its sha256, density, modes). The csv has one line per configuration (the per-layer rows and the
backend's description are in the json only; their summary columns `launches_per_forward` and `block_density` are
in both).

The plain-text table fits the console's width without cutting a number: a table too wide for it is split into
several, each repeating the key columns (backend, ...) with as many of the other columns as fit, numbers on one
line (`_split_columns`); headers wrap at their spaces."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import BadInput
from .profile import BASELINE, STOCK, KernelReport, ProfileReport, row_labels

PIPE_WIDTH = 200
"""Columns of a report sent to a pipe or a file; equal to `vsagen.cli.terminal.PIPE_WIDTH` (a test checks: the terminal
module sits above the commands, so neither imports the other's)."""


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
    ulysses, cfg_parallel = s.get("ulysses", 1), s.get("cfg_parallel", False)
    return (f"{s['model']} | {s['frames']}x{s['height']}x{s['width']} | {s['device']} {s['dtype']}"
            + ("" if s["kernels"] else f" | {s['steps']} timed step{'s' * (s['steps'] != 1)} after {s['warmup']} "
               f"warm-up per configuration | " + (f"{s['sampler']['name']} sampler, CFG off"
                                                  if s.get("sampler", {}).get("kind") == "renoise"
                                                  else f"CFG {s['guidance']:g}"))
            + (f" | ulysses {ulysses}" if ulysses > 1 else "") + (" | CFG parallel" if cfg_parallel else ""))


class Table(NamedTuple):
    """One table of a report: `keys` leading columns name a row (repeated when the table is split to fit)."""

    title: str
    head: list[str]
    body: list[list[str]]  # rows of cells
    caption: str = ""  # printed below the table ("" for none)
    keys: int = 1

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
    return Table(title, head, body, caption, keys=2 if experts else 1)


def _profile_tables(rep: ProfileReport) -> list[Table]:
    n = rep.settings["full_steps"]
    s = rep.settings
    ulysses, cfg_parallel = s.get("ulysses", 1) > 1, s.get("cfg_parallel", False)
    fits = list(dict.fromkeys(r.tile_fit for r in rep.rows))
    cached = any(r.cached for r in rep.rows)  # --cache: what each row computed and reused
    # the columns most read first: a narrow terminal's first table holds them (`_split_columns`)
    head = (["backend"] + (["tile fit"] if len(fits) > 1 else []) + ["DiT s/step", "attention s/step"]
            + (["all-to-all s/step"] if ulysses else []) + (["CFG exchange s/step"] if cfg_parallel else [])
            + ["attention % of DiT", "speed-up vs full", "latents rel-L2 vs full"]
            + (["DiT forwards computed / reused", "DiT s per computed forward", "DiT s per reused forward"]
               if cached else [])
            + [f"DiT s for {n} step{'s' if n != 1 else ''}", "stages s/step", "layout s/step", "grid (S, tiles)"])
    body = []
    for r, label in zip(rep.rows, row_labels(rep.rows)):
        stages = ", ".join(f"{k} {_sec(v)}" for k, v in r.attention_stages_s_per_step.items()) or "-"
        body.append([label] + ([r.tile_fit] if len(fits) > 1 else [])
                    + [_sec(r.dit_s_per_step), _sec(r.attention_s_per_step)]
                    + ([_sec(r.all_to_all_s_per_step)] if ulysses else [])
                    + ([_sec(r.cfg_exchange_s_per_step)] if cfg_parallel else [])
                    + [_pct(r.attention_share_of_dit), _times(r.speedup_vs_full), _rel(r.latents_rel_l2_vs_full)]
                    + ([f"{r.dit_computed_forwards} / {r.dit_reused_forwards}", _sec(r.dit_per_computed_forward_s),
                        _sec(r.dit_per_reused_forward_s)] if cached else [])
                    + [_sec(r.projected_dit_s), stages, _sec(r.layout_s_per_step),
                       f"{'x'.join(map(str, r.grid))} ({r.tokens}, {r.tiles})"])
    slowest = " (slowest rank)" if ulysses or cfg_parallel else ""
    tables: list[Table] = [Table(f"DiT time per backend{slowest}" + (f", tile fit {fits[0]}" if len(fits) == 1
                                                                     else "") + f": {_header(s)}",
                                 head, body, keys=1 + (len(fits) > 1))]
    if rep.tile_fit_comparison:
        tables.append(Table("tile fit: partial edge tiles vs crop (denoise a latent rounded up to whole tiles)",
                            ["backend", "partial S", "crop S", "partial DiT s/step", "crop DiT s/step",
                             "crop / partial", "partial attention s/step", "crop attention s/step"],
                            [[c["label"],
                              str(c["partial_tokens"]), str(c["crop_tokens"]), _sec(c["partial_dit_s_per_step"]),
                              _sec(c["crop_dit_s_per_step"]), _times(c["crop_vs_partial"]),
                              _sec(c["partial_attention_s_per_step"]), _sec(c["crop_attention_s_per_step"])]
                             for c in rep.tile_fit_comparison]))
    if rep.overhead:
        fit = rep.overhead[0].tile_fit
        full = [r for r in rep.rows if r.backend == BASELINE and r.tile_fit == fit and not r.cached]
        body = [[r.backend, _sec(r.dit_s_per_step), _sec(r.attention_s_per_step), _sec(r.layout_s_per_step),
                 "-" if r.backend == STOCK else _signed_pct(r.overhead_vs_stock), _rel(r.latents_rel_l2_vs_full)]
                for r in [rep.overhead[0], *full, *rep.overhead[1:]]]
        tables.append(Table(f"vsagen overhead: same transformer, stock diffusers processors vs vsagen's (tile fit "
                            f"{fit})", ["configuration", "DiT s/step", "attention s/step", "layout s/step",
                                        f"DiT vs {STOCK}", "latents rel-L2 vs full"], body))
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
        tables.append(Table(title, ["kernel", "pass", "timed at", "ms", f"vs {r0.baseline}"],
                            [[r.kernel, r.kind, "layer 0" if r.layers == 1 else f"mean of {r.layers} layers",
                              f"{r.ms:.3f}", _times(r.speedup_vs_baseline)] for r in rows], keys=2))
    return tables


def _tables(rep: ProfileReport | KernelReport) -> list[Table]:
    return _kernel_tables(rep) if isinstance(rep, KernelReport) else _profile_tables(rep)


def _markdown(rep: ProfileReport | KernelReport) -> str:
    out = []
    for title, head, body, caption, _ in _tables(rep):
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
            d["dit_reused_steps"] = " ".join(map(str, d["dit_reused_steps"]))
            st = d.pop("attention_stages_s_per_step")
            for nested in ("dit_by_expert_s_per_step", "backend_info", "layers", "ranks"):
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


def _widths(head: list[str], body: list[list[str]]) -> tuple[list[int], list[int]]:
    """Each column's natural width (its widest cell on one line, or its header's longest word: headers wrap at
    spaces) and least width (its longest word, header included), in terminal cells."""
    from rich.cells import cell_len

    natural, least = [], []
    for i, h in enumerate(head):
        cells = [row[i] for row in body]
        least.append(max((cell_len(w) for text in [h, *cells] for w in text.split()), default=1))
        natural.append(max([least[-1], *(cell_len(c) for c in cells)]))
    return natural, least


WRAP_MIN = 16  # a column this narrow or narrower is never wrapped to fit beside others (`_split_columns`)


def _split_columns(natural: list[int], least: list[int], width: int, keys: int) -> list[list[tuple[int, int]]]:
    """Columns grouped into tables at most `width` cells wide (Rich's default box: a column of w cells takes w + 3,
    the table one more): each group holds the `keys` first columns (at their natural width, up to a quarter of
    `width` unless their longest word needs more) and then, in order, as many of the others as fit: at their
    natural width, or, for a column of long text (over WRAP_MIN cells, its longest word narrower than its widest
    cell), at half that or more, wrapping at its spaces; a column that does not fit even alone gets what is left (at least its longest word: it wraps).
    A number is one word, so it is never wrapped.

    Returns:
        One [(column index, width)] list per table, in order.
    """
    key_widths = [(i, min(natural[i], max(least[i], width // 4))) for i in range(keys)]

    def taken(cols: list[tuple[int, int]]) -> int:
        return sum(w + 3 for _, w in cols) + 1

    groups: list[list[tuple[int, int]]] = []
    group = list(key_widths)
    for i in range(keys, len(natural)):
        need = natural[i] if natural[i] <= WRAP_MIN else max(least[i], (natural[i] + 1) // 2, WRAP_MIN)
        if len(group) > keys and taken(group) + need + 3 > width:
            groups.append(group)
            group = list(key_widths)
        group.append((i, max(least[i], min(natural[i], width - taken(group) - 3))))
    groups.append(group)
    return groups


def _print_table(con: Any, table: Table) -> None:
    """`table` on the Rich console `con`, split into as many tables as its width needs (`_split_columns`), each
    under its title line; then the caption."""
    from rich.table import Table as RichTable

    natural, least = _widths(table.head, table.body)
    groups = _split_columns(natural, least, con.width, table.keys)
    for n, group in enumerate(groups):
        title = table.title if n == 0 else f"{table.title.split(':', 1)[0]}, continued ({n + 1} of {len(groups)})"
        con.print(title, markup=False)
        t = RichTable()
        for i, w in group:
            t.add_column(table.head[i], justify="left" if i < table.keys else "right", width=w, overflow="fold")
        for row in table.body:
            t.add_row(*(row[i] for i, _ in group))
        con.print(t)
    if table.caption:  # below the table at the console's width (a table-wide caption would break the sha256)
        con.print(table.caption, markup=False)


def render(rep: ProfileReport | KernelReport, fmt: str, width: int | None = None, *, wrap_notes: bool = True) -> str:
    """The report as text in `fmt` ("table" | "markdown" | "csv" | "json"); "table" is Rich's plain-text
    rendering (no colour codes) for a terminal `width` columns wide (default: COLUMNS where set, else the
    terminal's width when stdout is one, else 200); a table wider than that is split into several that fit, no number cut (`_print_table`).
    Its notes follow, wrapped at `width` between words when `wrap_notes` (a terminal), else one line each (a pipe or
    a file: the README promises a note stays one line there, for grep).

    Raises:
        BadInput: an unknown `fmt`.
    """
    if fmt == "json":
        return json.dumps(rep.to_dict(), allow_nan=False) + "\n"
    if fmt == "markdown":
        return _markdown(rep)
    if fmt == "csv":
        return _csv(rep)
    if fmt != "table":
        raise BadInput(f"--format must be one of table, markdown, csv, json, got {fmt!r}")
    import shutil

    from rich.console import Console

    if width is None:  # COLUMNS where set, else the terminal's width, else (a pipe, a file) PIPE_WIDTH (200)
        width = shutil.get_terminal_size(fallback=(PIPE_WIDTH, 24)).columns
    buf = io.StringIO()
    con = Console(file=buf, width=width, color_system=None, force_terminal=False, highlight=False)
    for table in _tables(rep):
        _print_table(con, table)
    import textwrap

    for n in rep.notes:  # wrapped between words, indented under the note's text (as the other commands' notes)
        con.print(textwrap.fill(f"note: {n}", width=width, subsequent_indent=" " * len("note: "),
                                break_long_words=False, break_on_hyphens=False) if wrap_notes else f"note: {n}",
                  markup=False, overflow="ignore", soft_wrap=not wrap_notes)
    return buf.getvalue()


def write_plot(rep: ProfileReport, path: Path, *, overwrite: bool = False) -> None:
    """Bar chart of DiT seconds per step per configuration, split into the attention backend, the tile-order
    layout and the rest of the DiT (one grey "attention not timed" bar where `--compile` put the attention
    inside the graphs), with the speed-up against `full` over each bar. Written atomically in the
    format of `path`'s suffix (.png, .svg, .pdf); matplotlib's object API, no pyplot state.

    Raises:
        BadInput: matplotlib is not installed, or `path` exists and `overwrite` is False.
    """
    from ..media.video import new_figure, write_with

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
