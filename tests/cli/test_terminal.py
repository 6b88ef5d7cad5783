"""vsagen.cli.terminal at 80 columns (issue 29, item 10): stderr notes wrapped between words with a hanging indent (one
line each to a pipe without COLUMNS), titles broken between their fields, and the compare and search tables fitted
without a word cut (`sparse-vd/it`, `multi-diag/onal` before); and a t2v run at COLUMNS=80 end to end. To a pipe or
a file (`stdout_console`) search's and compare's reports are 200 columns wide, search's notes one line each."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from vsagen.cli.app import app
from vsagen.cli.terminal import (PIPE_WIDTH, StdoutClosed, fit_table, print_table, stderr_log, stdout_console,
                                 title_lines, trimmed, wrap_line, write_stdout)

# The tiny model's --attn auto note (as `vsagen t2v --model tiny` says it): 250 characters
NOTE = ("note: --attn auto chose full: random weights carry no trained sparse-attention weights; on a GPU --attn vsa "
        "makes the DiT ~1.7-2.5x faster at some loss of fidelity (on this CPU it runs a slow torch reference): "
        "`vsagen compare` measures both on your prompt")


def words_kept(original: str, wrapped: str) -> bool:
    return original.split() == wrapped.split()


def test_a_long_note_wraps_between_words_under_its_text():
    text = wrap_line(NOTE, 80)
    lines = text.splitlines()
    assert len(lines) == 4 and all(len(line) <= 80 for line in lines) and words_kept(NOTE, text)
    assert lines[0].startswith("note: --attn") and all(line.startswith(" " * 6 + line.strip()) for line in lines[1:])
    assert "1.7-2.5x" in text and "sparse-attention" in text  # hyphens are no break points
    assert wrap_line(NOTE, None) == NOTE and wrap_line("short", 80) == "short"
    path = "writing /" + "a" * 100 + "/v.mp4 and v.json"
    assert wrap_line(path, 80).splitlines() == ["writing", "  /" + "a" * 100 + "/v.mp4", "  and v.json"]
    two = wrap_line("first line\n" + NOTE, 80).splitlines()
    assert two[0] == "first line" and two[1].startswith("note: ")


def test_stderr_lines_wrap_with_columns_and_stay_whole_to_a_pipe(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    stderr_log(columns_set=True)(NOTE)
    wrapped = capsys.readouterr().err
    assert max(len(line) for line in wrapped.splitlines()) <= 80 and len(wrapped.splitlines()) == 4
    stderr_log(columns_set=False)(NOTE)  # stderr is no terminal under pytest: a pipe, one line
    assert capsys.readouterr().err == NOTE + "\n"


def test_title_lines_break_between_fields_only():
    title = ("tiny | attn vsa (sparsity 0.5) | torch reference (slow: the Triton kernels run on CUDA) | 5x64x64 | "
             "1 step | cpu fp32")
    lines = title_lines(title, 80).splitlines()
    assert lines == ["tiny | attn vsa (sparsity 0.5) |",
                     "torch reference (slow: the Triton kernels run on CUDA) | 5x64x64 | 1 step |", "cpu fp32"]
    assert title_lines(title, 200) == title
    # A field that fills the line to 79 or 80 columns leaves no room for the " |" that ends it: it went to the next
    # line, and Rich wrapped the bar onto a line of its own (new-user trial: `--attn sparse-vdit` on the tiny model)
    title = ("tiny | attn sparse-vdit | torch reference (slow: the Triton kernels run on CUDA) | 17x96x160 | 4 steps | "
             "cpu fp32")
    for width in (78, 79, 80, 81, 82):
        lines = title_lines(title, width).splitlines()
        assert all(len(line) <= width for line in lines) and " | ".join(lines).replace("| |", "|") == title, lines


NUMBER = re.compile(r"[-+]?\d[\w.%+-]*")  # 0.8, 6.41e-04, +529.9%, 1.00x


def rendered(renderable, width=80) -> list[str]:
    con = Console(file=io.StringIO(), width=width, color_system=None)
    con.print(renderable)
    return con.file.getvalue().splitlines()


def test_the_compare_table_keeps_every_word_at_80_columns():
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "commands"))
    from test_compare_render import report, row

    from vsagen.commands.compare_render import rich_table

    rep = report()
    rep.rows.append(row("sparse-vdit", 23.456789, [0.123456, 0.654321]))
    lines = rendered(fit_table(rich_table(rep), 80))  # nine columns (DiT s/video and s/step): compact at 80
    assert max(map(len, lines)) <= 80, lines
    assert any(re.match(r"sparse-vdit +1\.000 +0\.5000 ", line) for line in lines), lines
    assert lines[0] == "tiny | 5x64x128 | 2 steps after 0 warm-up | CFG 5 | cpu fp32 | reference full"
    # labels with options: one option a line, in a compact table where the boxed one cannot hold the words
    rep.rows += [row("sparse-vdit:patterns=tiny.json", 2.5, [0.1, 0.2]),
                 row("sla-star:scope=marginal 0.875", 123.456789, [0.123456, 0.654321])]
    lines = rendered(fit_table(rich_table(rep), 80))
    assert max(map(len, lines)) <= 80
    body = lines[next(i for i, line in enumerate(lines) if line.startswith("─")) + 1:]  # under the header's rule
    cells = [line.split()[0] for line in body if line.strip() and not line.startswith(" ")]  # the first column
    assert cells[:7] == ["full", "vsa", "sparse-vdit", "sparse-vdit:", "patterns=tiny.json", "sla-star:",
                         "scope=marginal"], lines
    # the worst layer may go on under its layer (nine columns), never cut within a word
    assert any("123.46" in line for line in lines) and any(line.endswith(" 6.5e-01") for line in lines)
    wide = rendered(fit_table(rich_table(report()), 200), 200)
    assert "┃ backend   ┃" in "\n".join(wide)  # room enough: the boxed table at its natural widths


def test_a_label_longer_than_the_room_folds_and_no_number_is_cut():
    """A run label with a long option list (a sampler's sigma list) left no room even for the compact table: Rich
    then cut the numbers ("34.5" for 34.56, "2.3e-0" for 2.3e-01; a new-user trial). The label column folds inside
    its words instead."""
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "commands"))
    from test_compare_render import report, row

    from vsagen.commands.compare_render import rich_table

    rep = report()
    rep.rows.append(row("vsa/dmd:sigmas=1.0,0.9375,0.875,0.8125,0.75,0.6875,0.625,0.5625,0.5", 34.56789,
                        [0.123456, 0.654321]))
    table = rich_table(rep)
    numbers = {n for column in table.columns[1:] for cell in column._cells for n in NUMBER.findall(str(cell))}
    lines = rendered(fit_table(table, 80))
    text = "\n".join(lines)
    assert max(map(len, lines)) <= 80 and "…" not in text, lines
    assert numbers and not [n for n in numbers if n not in text], (numbers, lines)


def test_the_search_table_keeps_every_mode_name_whole_at_80_columns():
    from vsagen.commands.search import SearchResult, summary_renderables
    from vsagen.sparsity.files import PatternFile, StepRange
    from vsagen.sparsity.patterns import default_catalog

    modes = {p.name: p for p in default_catalog()}
    names = list(modes)
    heads = tuple(tuple(names[(layer + h) % len(names)] for h in range(4)) for layer in range(2))
    for experts, n in ((("transformer",), 1), (("transformer", "transformer_2"), 2)):
        pf = PatternFile(model="tiny", architecture={}, experts=experts, height=96, width=160, frames=17,
                         grid=(5, 6, 10), steps=n, lam=0.5, eps=1.0, prompts=1, modes=modes,
                         ranges=tuple(StepRange(i, i + 1, {e: heads for e in experts}) for i in range(n)))
        table = summary_renderables(SearchResult(Path("p.json"), pf, [], 1, 1.0, 0.5))[0]
        lines = rendered(fit_table(table, 80))
        assert max(map(len, lines)) <= 80, lines
        words = {w for line in lines for w in line.replace("┃", " ").replace("│", " ").split()}
        assert {"multi-", "diagonal", "vertical-", "stripe", "density", "dense", "mixed"} <= words, lines
        if len(experts) > 1:
            assert "transformer_2" in words


def test_a_report_to_a_pipe_is_profile_s_width_and_stays_unwrapped(monkeypatch):
    """stdout is no terminal under pytest: without COLUMNS a pipe or a file, 200 columns (profile's width) and no
    wrapping; with COLUMNS (or on a terminal) Rich's own console at that width, wrapping."""
    monkeypatch.delenv("COLUMNS", raising=False)
    con, wraps = stdout_console()
    assert (con.width, wraps, PIPE_WIDTH) == (200, False, 200)
    monkeypatch.setenv("COLUMNS", "80")
    con, wraps = stdout_console()
    assert (con.width, wraps) == (80, True)


def search_summary(monkeypatch, tmp_path, columns: str | None) -> list[str]:
    """`vsagen search`'s stdout, its search replaced by a result with a long note: the lines (COLUMNS as given)."""
    from vsagen.commands.search import SearchResult
    from vsagen.sparsity.files import PatternFile, StepRange
    from vsagen.sparsity.patterns import default_catalog

    modes = {p.name: p for p in default_catalog()}
    heads = (("dense", "skip"), ("diagonal", "mixed"))
    pf = PatternFile(model="tiny", architecture={}, experts=("transformer",), height=96, width=160, frames=17,
                     grid=(5, 6, 10), steps=1, lam=0.5, eps=1.0, prompts=1, modes=modes,
                     ranges=(StepRange(0, 1, {"transformer": heads}),))
    out = tmp_path / "p.json"
    monkeypatch.setattr("vsagen.commands.search.search", lambda cfg, **kw: SearchResult(
        out, pf, [NOTE.removeprefix("note: ")], 16, 15.7, 0.5))
    res = CliRunner().invoke(app, ["search", "--model", "tiny", "--prompt", "a red fox", "--out", str(out)],
                             env={"COLUMNS": columns})
    assert res.exit_code == 0, res.output
    return res.stdout.splitlines()


def test_search_notes_stay_one_line_to_a_pipe_and_wrap_with_columns(monkeypatch, tmp_path):
    """A new-user trial: `vsagen search ... > s.out` wrapped its note and its `patterns:` line at 80 columns in the
    file (the README promises one line each there, for grep)."""
    lines = search_summary(monkeypatch, tmp_path, None)
    assert NOTE in lines
    run_them = [line for line in lines if line.startswith("patterns: ")]
    assert len(run_them) == 1 and run_them[0].endswith(f"run them with --attn sparse-vdit:patterns={tmp_path}/p.json")
    assert any(line.startswith("overall block density") and "expected attention speed-up" in line for line in lines)
    lines = search_summary(monkeypatch, tmp_path, "80")  # as on a terminal: wrapped under the note's text
    assert NOTE not in lines and all(len(line) <= 80 or len(line.split()) == 1 for line in lines), lines
    first = next(i for i, line in enumerate(lines) if line.startswith("note: "))
    assert lines[first + 1].startswith(" " * 6)


def test_compare_to_a_pipe_is_200_columns_and_keeps_labels_whole(monkeypatch, tmp_path):
    """A new-user trial: `vsagen compare ... > c.out` laid the table out at 80 columns, so a sampler's label split
    mid-token (`sigmas=1.0,0.756757,0` / `.521739`); to a pipe or a file it gets profile's 200 columns."""
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "commands"))
    from test_compare_render import report, row

    label = "vsa/dmd:sigmas=1.0,0.756757,0.521739,0.3125"
    rep = report()
    rep.rows.append(row(label, 34.56789, [0.123456, 0.654321]))
    rep.files = {"csv": str(tmp_path / "cmp" / "compare.csv"), "json": str(tmp_path / "cmp" / "compare.json")}
    monkeypatch.setattr("vsagen.commands.compare.compare", lambda cfg, **kw: rep)
    args = ["compare", "x", "--model", "tiny", "--attn", "full,vsa", "--out", str(tmp_path / "cmp")]
    res = CliRunner().invoke(app, args, env={"COLUMNS": None})
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    options = label.split(":")[1]  # a label's options go on a line of their own (`rich_table`), whole at 200
    assert any(options in line.split() for line in lines), lines
    assert max(map(len, lines)) <= PIPE_WIDTH and "compare.csv, compare.json)" in lines[-1]
    res = CliRunner().invoke(app, args, env={"COLUMNS": "80"})  # as on a terminal: 80 columns, the label folds
    assert res.exit_code == 0, res.output
    assert max(map(len, res.stdout.splitlines())) <= 80 and options not in res.stdout


def test_captions_stay_one_line_to_a_pipe_and_no_line_ends_in_a_space(monkeypatch, tmp_path):
    """User trials: `vsagen compare ... > f` wrapped the "speed-up: ... PSNR / SSIM ..." caption at the table's width
    over 2-3 lines, padding them with spaces; `vsagen search ... | cat` ended its "searched at ..." caption in 5
    spaces. To a pipe or a file each caption is one line; there and with COLUMNS no stdout line ends in a space."""
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "commands"))
    from test_compare_render import report

    from vsagen.commands.compare_render import rich_table

    rep = report()
    rep.files = {"csv": str(tmp_path / "cmp" / "compare.csv")}
    caption = rich_table(rep).caption
    assert len(caption) > 120  # wider than the table: Rich wrapped it
    monkeypatch.setattr("vsagen.commands.compare.compare", lambda cfg, **kw: rep)
    args = ["compare", "x", "--model", "tiny", "--attn", "full,vsa", "--out", str(tmp_path / "cmp")]
    for columns in (None, "80"):
        res = CliRunner().invoke(app, args, env={"COLUMNS": columns})
        assert res.exit_code == 0, res.output
        lines = res.stdout.splitlines()
        assert not [line for line in lines if line.endswith(" ")], lines
        assert (caption in lines) == (columns is None), lines
    searched = "searched at 17x96x160 (grid 5x6x10), 1 step, 1 prompt, lam 0.5, eps 1"
    lines = search_summary(monkeypatch, tmp_path, None)
    assert searched in lines and not [line for line in lines if line.endswith(" ")], lines
    lines = search_summary(monkeypatch, tmp_path, "80")
    assert not [line for line in lines if line.endswith(" ")], lines


@pytest.mark.slow
def test_t2v_at_80_columns(vsagen_cache, tiny_dir, tmp_path):
    """The title breaks between fields (it wrapped inside "(slow: the Triton ...)" before), a note longer than a
    line wraps between words, every line fits."""
    res = CliRunner().invoke(app, ["t2v", "a prompt", "--model", "tiny", "--attn", "vsa", "--sparsity", "0.5",
                                   "--frames", "5", "--height", "64", "--width", "64", "--steps", "1", "--guidance",
                                   "1", "--negative-prompt", "blurry", "--out", str(tmp_path / "v.mp4")],
                             env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    out = res.stdout.splitlines()
    assert out[:2] == ["tiny | attn vsa (sparsity 0.5) |",
                       "torch reference (slow: the Triton kernels run on CUDA) | 5x64x64 | 1 step |"], out
    note = [line for line in res.stderr.splitlines() if not line.startswith(("\r", "denoising"))]
    first = next(i for i, line in enumerate(note) if line.startswith("note: --negative-prompt"))
    assert note[first + 1].startswith(" " * 6) and len(note[first]) <= 80
    assert max(len(line) for line in out) <= 80


def test_a_title_stays_one_line_to_a_pipe_and_breaks_between_fields_on_a_terminal():
    """A new-user trial: `vsagen t2v ... | head` broke the title at 80 columns. To a pipe or a file (`wraps` False)
    the title is one line however long (here over PIPE_WIDTH), the table still fitted; wrapping, as before."""
    from rich.table import Table

    title = " | ".join(["tiny", "attn vsa (sparsity 0.5)", "torch reference (slow: the Triton kernels run on CUDA)",
                        "5x64x64", "1 step"] + [f"field {i} of a long title" for i in range(8)])
    assert len(title) > PIPE_WIDTH

    def printed(width: int, wraps: bool) -> list[str]:
        table = Table("backend", "DiT s/step", title=title)
        table.add_row("vsa", "1.23")
        con = Console(file=io.StringIO(), width=width)
        print_table(con, table, wraps)
        return con.file.getvalue().splitlines()

    lines = printed(PIPE_WIDTH, False)
    assert lines[0] == title and max(map(len, lines[1:])) <= PIPE_WIDTH and any("1.23" in x for x in lines)
    lines = printed(80, True)
    broken = title_lines(title, 80).splitlines()
    assert len(broken) > 1 and lines[:len(broken)] == broken and max(map(len, lines)) <= 80


@pytest.mark.slow
def test_t2v_title_is_one_line_to_a_pipe(vsagen_cache, tiny_dir, tmp_path):
    """`vsagen t2v x --model tiny --attn vsa | head`: the title (over 80 columns) on the first line, whole."""
    res = CliRunner().invoke(app, ["t2v", "a prompt", "--model", "tiny", "--attn", "vsa", "--frames", "5", "--height",
                                   "64", "--width", "64", "--steps", "1", "--out", str(tmp_path / "v.mp4")],
                             env={"COLUMNS": None})
    assert res.exit_code == 0, res.output
    first = res.stdout.splitlines()[0]
    assert first.startswith("tiny | attn vsa") and first.endswith(" | cpu fp32") and len(first) > 80, first
    assert "torch reference (slow: the Triton kernels run on CUDA) | 5x64x64 | 1 step" in first


def test_a_note_during_a_progress_bar_starts_its_own_line_in_a_pipe(capsys):
    """A new-user trial: notes logged while the denoising bar was open landed on the bar's line in a pipe, so
    `grep '^note'` missed them."""
    import sys

    from tqdm import tqdm

    from vsagen.cli.terminal import stderr_log

    log = stderr_log(False)
    for i in tqdm(range(3), desc="denoising", file=sys.stderr):
        if i == 1:
            log("note: in the middle")
    log("note: after")
    lines = capsys.readouterr().err.split("\n")
    assert "note: in the middle" in lines and "note: after" in lines


def test_one_pipe_width_for_every_report():
    from vsagen.cli import terminal
    from vsagen.commands import profile_render

    assert terminal.PIPE_WIDTH == profile_render.PIPE_WIDTH == 200


def test_trimmed_cuts_trailing_spaces_off_a_pipe_only():
    """`trimmed`: not a terminal, each line without its trailing spaces (a table's title is padded to its width);
    on a terminal the output goes as Rich writes it."""
    from rich.table import Table

    def table() -> Table:
        t = Table(title="t", title_justify="left")
        t.add_column("a long header")
        return t

    for terminal in (False, True):
        out = io.StringIO()
        con = Console(file=out, width=40, force_terminal=terminal, color_system=None)
        with trimmed(con):
            con.print(table())
        lines = out.getvalue().splitlines()
        assert lines[0] == ("t" if not terminal else "t" + " " * (len(lines[1]) - 1))
        assert any(line.endswith(" ") for line in lines) == terminal


def test_a_broken_pipe_on_stdout_is_stdout_closed(monkeypatch):
    """stdout's reader gone (`| head -1`): each way a report reaches stdout raises `StdoutClosed` (Rich's own
    handling exited 1 without a word), which the commands end quietly with exit 0 (`run_guarded`, `main`)."""
    import sys

    class Closed(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", Closed())
    for columns in (None, "80"):
        if columns is None:
            monkeypatch.delenv("COLUMNS", raising=False)
        else:
            monkeypatch.setenv("COLUMNS", columns)
        con, _ = stdout_console()
        with pytest.raises(StdoutClosed):
            con.print("a line")
        with pytest.raises(StdoutClosed), trimmed(con):
            con.print("a line")
    with pytest.raises(StdoutClosed):
        write_stdout("{}\n")
