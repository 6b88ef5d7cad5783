"""Text for the terminal: stderr lines (notes, progress) wrapped between words with a hanging indent, and the commands'
Rich tables fitted to the width without cutting a word (titles broken between their " | " fields, a compact style
where the boxed one would fold a word). 80 columns is the width every rendering is tested at.

A report's reader that goes away (`vsagen t2v ... | head -1`) ends the command quietly with exit 0 once its files
are in place: a broken pipe on stdout is `StdoutClosed` (`stdout_console`'s consoles, `trimmed`, `write_stdout`),
which `vsagen.cli.running.run_guarded` and `vsagen.cli.app.main` end with `quiet_stdout`.

Lines to a pipe or a file stay one line each (a log keeps a note on one line, for grep), unless COLUMNS is set: the
command line decides (`stderr_log` for stderr, `stdout_console` for a report on stdout), the functions here take the
width. A report to a pipe or a file is laid out PIPE_WIDTH columns wide (as `vsagen profile`'s).
"""

from __future__ import annotations

import re
import textwrap
from contextlib import contextmanager
from typing import Any, Callable, Iterator

# The width of a report on stdout sent to a pipe or a file (no terminal to fit; COLUMNS unset)
PIPE_WIDTH = 200

# A leading "note: " (or "warning: ", "error: ", ...) label: continuation lines start under the text after it.
_LABEL = re.compile(r"^[a-z][a-z -]{0,14}: ")


def wrap_line(text: str, width: int | None) -> str:
    """`text` wrapped at spaces to lines of at most `width` columns (a word longer than that, e.g. a path, stays
    whole on a line of its own), continuation lines indented under the text after a leading "note: "-style label,
    else by 2; each line of a multi-line text wrapped alone. None: `text` unchanged."""
    if width is None:
        return text
    out = []
    for line in text.split("\n"):
        label = _LABEL.match(line)
        hang = " " * (len(label.group(0)) if label else 2)
        out.append(textwrap.fill(line, width=max(width, 20), subsequent_indent=hang, break_on_hyphens=False,
                                 break_long_words=False) if len(line) > width else line)
    return "\n".join(out)


def stderr_log(columns_set: bool) -> Callable[[str], None]:
    """A function that prints a line on stderr (no markup, no highlighting), wrapped by `wrap_line` at the terminal's
    width when stderr is a terminal or `columns_set` (the COLUMNS environment variable, read by the caller), else
    as one line, on a line of its own while a tqdm bar is drawn there."""
    import sys

    from rich.console import Console
    from tqdm import tqdm

    err = Console(stderr=True)
    width = err.width if err.is_terminal or columns_set else None

    def log(message: str) -> None:
        # an open progress bar (the denoising steps): on a terminal it is cleared first and drawn again after; in a
        # pipe or file (no clearing there) the bar's line is ended first, so the message starts a line of its own
        line = wrap_line(message, width)
        if err.is_terminal:
            with tqdm.external_write_mode(file=sys.stderr):
                err.print(line, markup=False, highlight=False, soft_wrap=True)
            return
        if any(not bar.disable for bar in list(getattr(tqdm, "_instances", ()))):
            sys.stderr.write("\n")
            sys.stderr.flush()
        err.print(line, markup=False, highlight=False, soft_wrap=True)

    return log


class StdoutClosed(Exception):
    """stdout's reader went away while a command printed its report (`vsagen t2v ... | head -1`: a broken pipe).
    Not a failure: the command's files are in place by then; the command ends quietly, exit 0 (`quiet_stdout`)."""


def _stdout_closed() -> None:
    """A stdout console's `on_broken_pipe` (Rich's own exits 1 without a word: a user trial)."""
    raise StdoutClosed("stdout was closed")


def write_stdout(text: str) -> None:
    """Write `text` on stdout and flush it (a JSON line, a rendered report).

    Raises:
        StdoutClosed: stdout's reader went away (a broken pipe)."""
    import sys

    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise StdoutClosed("stdout was closed") from None


def quiet_stdout() -> None:
    """Point stdout's file descriptor at the null device once its reader went away (`StdoutClosed`), so that the
    interpreter's last flush has nowhere to fail (Python's recipe for a closed pipe:
    https://docs.python.org/3/library/signal.html#note-on-sigpipe). A stdout that is no file (a test's capture) is
    left as it is."""
    import os
    import sys

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def stdout_console() -> tuple[Any, bool]:
    """A Rich console for a command's report on stdout, and whether its lines wrap: on a terminal, or with COLUMNS
    set, Rich's own console (the terminal's width, COLUMNS where set) and True; to a pipe or a file a console
    PIPE_WIDTH columns wide (as `vsagen profile`'s report) and False: print each note and each line of text whole
    (`wrap_line(text, None)`, `soft_wrap=True`), one line for grep, as the README promises. Either raises
    `StdoutClosed` where stdout's reader went away."""
    import os
    import sys

    from rich.console import Console

    wraps = "COLUMNS" in os.environ or sys.stdout.isatty()
    con = Console() if wraps else Console(width=PIPE_WIDTH)
    con.on_broken_pipe = _stdout_closed  # (Rich's hook: a method, replaced on this console alone)
    return con, wraps


@contextmanager
def trimmed(con: Any) -> Iterator[None]:
    """What is printed on `con` (a Rich console) inside the block, with no line ending in spaces where `con` is not a
    terminal (a pipe or a file, COLUMNS set or not): the output is captured and each line written without its
    trailing spaces once the block ends (Rich pads a table's title, a compact table's rows and a wrapped line to
    their width; a new-user trial: `vsagen presets | cat -A`). On a terminal the block prints as it goes. A broken
    pipe goes to `con.on_broken_pipe`, as Rich's own writes do."""
    if con.is_terminal:
        yield
        return
    with con.capture() as captured:
        yield
    try:
        con.file.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))
        con.file.flush()
    except BrokenPipeError:
        con.on_broken_pipe()


def print_table(con: Any, table: Any, wraps: bool) -> None:
    """Print `table` (a `rich.table.Table`) on `con` fitted to its width (`fit_table`). `wraps` (`stdout_console`'s):
    its title broken between fields and its caption wrapped at the table's width (a terminal, or COLUMNS set); else
    (a pipe or a file) the title above and the caption below on one line each, whole, however long, as the notes
    are (new-user trials: `vsagen t2v ... | head` broke the title at 80 columns, `vsagen compare ... > f` the
    caption at the table's width). Not on a terminal no line ends in spaces (`trimmed`: Rich pads a caption, a
    compact table's rows and a wrapped line to their width; a user trial: `vsagen search ... | cat`)."""
    title = caption = None
    if not wraps and isinstance(table.title, str) and table.title:
        title, table.title = table.title, None
    if not wraps and isinstance(table.caption, str) and table.caption:
        caption, table.caption = table.caption, None
    with trimmed(con):
        if title is not None:
            con.print(title, markup=False, highlight=False, soft_wrap=True)
        con.print(fit_table(table, con.width))
        if caption is not None:
            con.print(caption, markup=False, highlight=False, soft_wrap=True)


def title_lines(title: str, width: int) -> str:
    """A title of " | "-separated fields in lines of at most `width` columns, broken only between fields (each line
    but the last ends in " |"); a field wider than `width` is left to wrap at its own spaces."""
    fields = title.split(" | ")
    lines = [fields[0]]
    for i, field in enumerate(fields[1:], 2):
        room_for_bar = 2 if i < len(fields) else 0  # a line that another field may follow may end in " |"
        if len(lines[-1]) + 3 + len(field) + room_for_bar <= width:
            lines[-1] += f" | {field}"
        else:
            lines[-1] += " |"
            lines.append(field)
    return "\n".join(lines)


def fit_table(table: Any, width: int) -> Any:
    """`table` (a `rich.table.Table` of text cells) made to fit `width` columns without cutting a word. Where its
    columns at their natural widths (their longest lines) do not fit, each column gets a width of its own (Rich's
    own shrinking narrows the widest column first, below its longest word: `sparse-vd/it`): first its least width
    (its longest word, header included), then what is left goes to the columns that need the least more to reach
    their natural width; where even the least widths do not fit in the table's box, it is restyled compact (a rule
    under the header only, one space between columns). Its title (a string) is taken out and set above it at the
    full `width`, broken between its " | " fields (`title_lines`; Rich wraps a title at the table's own width,
    anywhere). Returns the renderable to print (`table` changed in place, under its title)."""
    from rich import box
    from rich.console import Console, Group
    from rich.measure import Measurement
    from rich.text import Text

    con = Console(width=width)
    unbounded = con.options.update_width(10_000)
    least, natural = [], []
    for column in table.columns:
        sizes = [Measurement.get(con, unbounded, cell) for cell in (column.header, *column.cells)]
        least.append(max(m.minimum for m in sizes))
        natural.append(max(m.maximum for m in sizes))
    n = len(table.columns)
    boxed = 3 * n + 1  # Rich's default: an edge each side, a rule between columns, one space of padding each side
    if n and sum(natural) + boxed > width:
        room = width - boxed
        if sum(least) > room:
            table.box, table.show_edge, table.padding = box.SIMPLE_HEAD, False, (0, 0, 0, 0)
            room = width - (n - 1)  # one space between columns
        widths = list(least)
        left = room - sum(widths)
        if left < 0 and n > 1:  # even the longest words do not fit: the first (label) column folds inside its words
            # (e.g. "dmd:sigmas=1.0,0.75,0.5"), so that Rich does not cut the other columns' numbers instead
            widths[0] = max(6, widths[0] + left)
            table.columns[0].overflow = "fold"
            left = 0
        for i in sorted(range(n), key=lambda i: natural[i] - least[i]):
            more = max(0, min(natural[i] - widths[i], left))
            widths[i] += more
            left -= more
        for column, w in zip(table.columns, widths):
            column.width = w
    if not isinstance(table.title, str) or not table.title:
        return table
    title, table.title = table.title, None
    return Group(Text(title_lines(title, width)), table)
