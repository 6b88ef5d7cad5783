"""Errors that the CLI turns into one line and an exit code (2: bad input, 1: failure while running), the "did
you mean" of a mistyped name, and a GPU out of memory as a run failure (`out_of_memory_as_failure`)."""

import contextlib
import difflib
from typing import Iterable, Iterator, Sequence


def close_matches(typed: str, names: Iterable[str]) -> list[str]:
    """The names among `names` that `typed`, a name none of them is, may have meant: difflib's close matches of the
    names in lower case (ratio >= 0.7, at most 3, closest first), as click suggests a command for a mistyped one;
    [] when none is close."""
    folded = {n.lower(): n for n in names}
    return [folded[n] for n in difflib.get_close_matches(typed.lower(), list(folded), n=3, cutoff=0.7)]


class VsagenError(Exception):
    """Base class; `exit_code` is what the CLI exits with."""

    exit_code = 1


class BadInput(VsagenError):
    """The user asked for something invalid; nothing was written."""

    exit_code = 2


class ModelNotFound(BadInput):
    """A checkpoint could not be found or loaded from where the user pointed."""


class RunFailure(VsagenError):
    """Something broke while running a valid request."""

    exit_code = 1


@contextlib.contextmanager
def out_of_memory_as_failure(what: str, hints: Sequence[str] = ()) -> Iterator[None]:
    """Turn `torch.cuda.OutOfMemoryError` raised in the body into `RunFailure("out of GPU memory while <what>
    (<torch's first line>); try <hints>")`."""
    import torch

    try:
        yield
    except torch.cuda.OutOfMemoryError as e:
        hint = f"; try {' and '.join(hints)}" if hints else ""
        raise RunFailure(f"out of GPU memory while {what} ({str(e).splitlines()[0]}){hint}") from e
