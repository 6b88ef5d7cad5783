"""`vsagen presets` and `vsagen backends`: the bundled presets and the attention backends, laid out for the
terminal's width (80 columns and narrower keep every value: tables split or fold, text wraps)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable


# height x width, as the run titles' frames x height x width (and --height, --width) order them; a few-step sampler's
# steps are its sigma list's (CFG off, no flow shift: "-"); "attn": the backend a published sparse checkpoint was
# trained for (--attn auto runs it), "auto" otherwise
PRESET_HEADS = ("name", "commands", "HxW", "frames", "steps", "guidance", "flow shift", "fps", "sampler", "attn",
                "weights")


def print_presets() -> None:
    """The bundled model presets and their defaults on stdout, sized to the terminal: one table where it fits, else
    (80 columns) the defaults and the commands and weights as two tables, else a paragraph per preset; to a pipe
    or a file the one table at its own width, each row on one line, and no line ending in spaces (`trimmed`)."""
    from ..models.presets import preset_names
    from .terminal import fit_table, stdout_console, trimmed

    rows, published = [], []
    for name in preset_names():
        row, description = _preset_row(name)
        rows.append(row)
        published += [description] if description is not None else []
    con, wraps = stdout_console()
    unbounded = con.options.update_width(10_000)
    everything = _presets_table(rows, "presets", tuple(range(len(PRESET_HEADS))), compact=False)
    if not wraps:  # a pipe or a file (a new-user trial: `| cat` split words): the one table, each row one line
        con.width = max(con.width, con.measure(everything, options=unbounded).maximum)  # (stdout_console's own)
    narrow = [_presets_table(rows, "presets", (0, 2, 3, 4, 5, 6, 7), compact=True),
              _presets_table(rows, "commands, sampler and attention", (0, 1, 8, 9), compact=True),
              _presets_table(rows, "weights", (0, 10), compact=True)]
    with trimmed(con):  # to a pipe or a file no line ends in spaces (Rich pads the title to the table's width)
        if con.measure(everything, options=unbounded).maximum <= con.width:
            con.print(everything)
        elif all(con.measure(t, options=unbounded).minimum <= con.width for t in narrow):  # 80 columns
            for t in narrow:  # the defaults, then the commands, sampler and attention, then the weights
                con.print(fit_table(t, con.width))  # columns at least their longest word wide: none is split
        else:  # narrower still: a paragraph per preset, wrapped between its fields
            for row in rows:
                con.print(f"{row[0]}: {row[1]}; " + ", ".join(f"{h} {v}" for h, v in zip(PRESET_HEADS[2:10],
                                                                                           row[2:10]))
                          + f"; {row[10]}", markup=False, highlight=False)
        _print_preset_notes(con, wraps, published)


def _preset_row(name: str) -> tuple[tuple[str, ...], str | None]:
    """Preset `name`'s cells, one per `PRESET_HEADS` entry, and "<name>: <description>" for a published sparse /
    distilled checkpoint (one with a trained backend), else None."""
    from ..models.presets import LAST_IMAGE_OPTIONAL, LAST_IMAGE_REQUIRED, load_preset
    from ..request.sampling import parse_sampler

    p = load_preset(name)
    d = p.defaults
    weights = p.hub_id if p.source == "hub" else "built offline (random)"
    if p.transformer_files is not None:  # a transformer published alone: its repository (the rest: hub_id's)
        weights = p.transformer_files[0]
    i2v = {LAST_IMAGE_REQUIRED: "i2v --last-image", LAST_IMAGE_OPTIONAL: "i2v [--last-image]"}.get(p.last_image, "i2v")
    commands = i2v if p.image_to_video else (f"t2v, {i2v}" if p.takes_image else "t2v")
    sampler = parse_sampler(d.sampler)
    guidance = f"{d.guidance:g}" + (f" / {d.guidance_2:g}" if d.guidance_2 is not None else "")
    steps, shift = str(d.steps), f"{d.flow_shift:g}"
    if sampler.renoise:  # its sigmas are used as given: the flow shift applies to nothing
        steps, guidance, shift = str(len(sampler.sigmas)), "off", "-"
    attn, description = "auto", None
    if d.attn is not None:
        sparsity, tile = (d.attention.get(d.attn, {}).get(k) for k in ("sparsity", "tile"))
        # the trained tile where the preset states it (FastVideo's VSA checkpoints: 4x4x4, kept unless named)
        attn = d.attn + (f" {sparsity:g}" if sparsity is not None else "") + (f" {tile}" if tile else "")
        description = f"{name}: {p.description}"
    return (name, commands, f"{d.height}x{d.width}", str(d.frames), steps, guidance, shift, str(d.fps), sampler.text,
            attn, weights), description


def _presets_table(rows: list[tuple[str, ...]], title: str, cols: tuple[int, ...], compact: bool) -> Any:
    """A Rich table of the `cols` columns (indices into `PRESET_HEADS`) of `rows`: boxed, or `compact` (a rule
    under the header, one space between columns). Only the commands (and a header) wrap, by words; anything still
    too wide folds, never cut."""
    from rich import box
    from rich.table import Table

    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD,
              show_edge=not compact, padding=(0, 1, 0, 0) if compact else (0, 1))
    for i in cols:
        head = PRESET_HEADS[i]
        t.add_column(head, justify="left" if head in ("name", "commands", "weights", "sampler", "attn") else "right",
                     no_wrap=head not in ("commands", "flow shift"), overflow="fold")
    for row in rows:
        t.add_row(*(row[i] for i in cols))
    return t


def _print_preset_notes(con: Any, wraps: bool, published: list[str]) -> None:
    """The lines under the presets' table(s) on `con`: what each published checkpoint is, each default negative
    prompt with the presets that run it (CFG runs only), and the legend; each line whole unless `wraps`."""
    from ..models.presets import load_preset, preset_names
    from ..request.sampling import parse_sampler

    for line in published:  # what each published sparse / distilled checkpoint is
        con.print(line, markup=False, highlight=False, soft_wrap=not wraps)
    negatives: dict[str, list[str]] = {}  # each default negative prompt and the presets that run it
    for name in preset_names():
        d = load_preset(name).defaults
        if d.negative_prompt and not parse_sampler(d.sampler).renoise:
            negatives.setdefault(d.negative_prompt, []).append(name)
    for text, names in negatives.items():
        con.print(f"negative prompt of {', '.join(names)} (CFG runs; --negative-prompt replaces it, \"\" for none): "
                  f"{text}", markup=False, highlight=False, soft_wrap=not wraps)
    con.print("vsagen t2v PROMPT --model NAME / vsagen i2v IMAGE PROMPT --model NAME, as the commands column says; "
              "i2v --last-image: needs a last frame; i2v [--last-image]: takes one optionally. flow shift -: a "
              "few-step sampler's sigmas are used as given. attn: the backend the checkpoint was trained with, its "
              "sparsity and VSA cube (TxHxW, the tile option). weights: the hub repository; for a transformer "
              "published alone (TurboWan) its own, the other components from the base model's Wan-AI repository.",
              markup=False, highlight=False, soft_wrap=not wraps)


def print_backends(echo: Callable[[str], None] = print) -> None:
    """The self-attention backends this build provides, through `echo` (a line each): which one runs by default,
    what each is, its implementations and its options (set as NAME:KEY=VALUE), wrapped at the terminal's width."""
    import textwrap

    from rich.console import Console

    from ..attention.auto import auto_picks, auto_rule
    from ..attention.registry import backend_class, backend_names, summary_of, uses_sparsity
    from ..attention.spec import FLAG_OPTIONS, impls_of, option_help, python_options

    width = max(40, Console().width)  # the terminal's (COLUMNS where set)

    def say(text: str, indent: int = 0, hang: int = 2) -> None:
        echo(textwrap.fill(text, width=width, initial_indent=" " * indent,
                                 subsequent_indent=" " * (indent + hang), break_on_hyphens=False,
                                 break_long_words=False))

    say("Self-attention backends, chosen with --attn NAME[:KEY=VALUE[:KEY=VALUE]] (t2v, i2v; profile and compare "
        "take several, comma-separated), e.g. --attn vsa:sparsity=0.9.")
    say(f"Default: --attn auto (t2v, i2v) = {auto_rule()}; the run's notes say which and why.")
    tables = preset_tables()  # the presets' own option defaults, said beside the backends' own
    for name in backend_names():  # the registry's names, in its order (read now: a backend registered late too)
        cls = backend_class(name)  # (the backend modules import no torch until they compute)
        # sparse by other means: a tiled backend without a sparsity (sparse-vdit: its pattern file), or a top-k
        # (sla: key blocks kept per query block)
        topk = any(f.name == "topk" for f in dataclasses.fields(cls.Options))
        kind = ("sparse, takes --sparsity" if uses_sparsity(name) else "sparse, takes topk" if topk else
                "sparse" if cls.tiled else "dense")
        picks = auto_picks(name)
        echo("")
        say(f"{name} ({kind})" + (f" - default: --attn auto runs it {picks}" if picks else ""))
        say(summary_of(cls), indent=2)
        impls = [i for i in impls_of(name) if i != "auto"]
        auto = "impl=auto runs triton on CUDA, torch (the reference) elsewhere"
        if getattr(cls, "auto_fa4", False):
            auto += ("; on an sm90 GPU with FA4 installed in the release of the fa4 extra, a grid of whole 128 / "
                     "256-token cubes runs the fine stage on fa4 (measured faster there) when the run is eager, bf16 /"
                     " fp16, query_rows 64")
        say("implementations: " + (f"{', '.join(impls)}; {auto}" if impls else "one (no impl option)"), indent=2)
        options = option_help(cls.Options)  # others (e.g. vsa's kernel tuning) are set from Python only
        python = python_options(cls.Options)
        if not options:
            say("options: none", indent=2)
        else:
            say("options (KEY=DEFAULT: values; a model's preset may set its own default, said after it):", indent=2)
        pad = max((len(f"{key}={default}") for key, default, _ in options), default=0)
        flag = {option: flag for flag, option in FLAG_OPTIONS.items()}  # sparsity: --sparsity, impl: --attn-impl
        for key, default, values in options:
            also = f" (or {flag[key]})" if key in flag else ""
            presets = preset_defaults(tables, name, key, default)
            said = f"; default from the model's preset for {presets}" if presets else ""
            say(f"{f'{key}={default}':{pad}s}  {values}{also}{said}", indent=4, hang=pad + 2)
        if python:
            say(f"from Python only (vsagen.apply(pipe, {name!r}, KEY=...)): {', '.join(python)}", indent=2)


def preset_tables() -> dict[str, dict[str, dict[str, Any]]]:
    """Every bundled preset's `[attention.<backend>]` option defaults, by preset name."""
    from ..models.presets import load_preset, preset_names

    return {name: load_preset(name).defaults.attention for name in preset_names()}


def preset_defaults(tables: dict[str, dict[str, dict[str, Any]]], backend: str, key: str, default: str) -> str:
    """The presets of `tables` (`preset_tables`) that give option `key` of `backend` another default than
    `default` (its own, as `option_help` writes it), as "name (value), ..." ("" for none); a file the preset ships
    is shown by its path in the presets' folder (`patterns/tiny.json`)."""
    from pathlib import Path

    out = []
    for name, table in tables.items():
        value = table.get(backend, {}).get(key)
        if value is None:
            continue
        if isinstance(value, Path):
            shown = "/".join(value.parts[-2:])
        else:
            shown = f"{value:g}" if isinstance(value, float) else str(value).lower() if isinstance(value, bool) \
                else str(value)
        if shown != default:
            out.append(f"{name} ({shown})")
    return ", ".join(out)
