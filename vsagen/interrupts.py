"""How a command ends on Ctrl-C, SIGTERM or SIGHUP (the "ending" signals): as a KeyboardInterrupt that unwinds it,
never in the middle of writing its files.

A Python signal handler that raises runs at whatever bytecode the main thread is at: inside `subprocess.Popen` (an
ffmpeg child started, its `Popen` object lost, the child left writing into a file already removed), inside the
`os.register_at_fork` hooks Popen runs (the exception printed as "Exception ignored in: <function _releaseLock>" and
dropped: the command went on and wrote everything), between creating a temporary file and recording it. So:

* `as_interrupt()` installs a `Guard` as the handler of the ending signals for a command's run: a signal raises
  `SignalInterrupt` where the run is (model loading, denoising: a run is interruptible anywhere), and is recorded.
* While files are written (`hold()`, which `vsagen.media.video.Outputs` takes for its whole lifetime) the guard only
  records; the writer calls `check()` at safe points (between files, between video frames, before the files are
  moved into place), which raises `SignalInterrupt` there. An exception raised after a signal arrived, before
  the files are in place, ends the command as that interrupt (the signal caused it). Once the files are in place
  (`Guard.finish`), a later signal is recorded and dropped: the command completes, prints its result and exits
  0; under `process()` (the console entry point) the ending signals are then ignored until the process exits.
* Without a guard (the library called from Python), `hold()` installs one for the block and hands what it recorded
  to the handlers it replaced once the block is over (after the temporary files are gone).

Only the main thread runs Python signal handlers; elsewhere nothing is installed or held.
"""

from __future__ import annotations

import contextlib
import contextvars
import signal
import threading
from typing import Any, Callable, Iterator

# Ctrl-C, `kill`, a closed terminal.
ENDING_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))

# Set by `process()`: once a guard's files are in place the ending signals stay ignored (the process is ending).
_KEEP_DONE_GUARD = contextvars.ContextVar("vsagen_keep_done_guard", default=False)


class SignalInterrupt(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP as a KeyboardInterrupt that remembers its signal (for the exit code 128 + signum)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = int(signum)


class Guard:
    """The handler of the ending signals during a command (callable as a signal handler).

    Every signal is recorded in `received`. Outside `hold()` and before `done` it raises `SignalInterrupt` at once;
    inside `hold()` it is only recorded, and `check()` raises it at the writer's next safe point; after `done` (the
    command's files are in place) it is recorded and nothing more."""

    def __init__(self, keep: bool = False) -> None:
        self.received: list[int] = []
        self.holding = 0
        self.done = False
        self.keep = keep  # under `process()`: once done, the ending signals are ignored until the process exits

    def __call__(self, signum: int, frame: Any) -> None:
        self.received.append(int(signum))
        if not self.holding and not self.done:
            raise SignalInterrupt(signum)

    def interrupted(self) -> int | None:
        """The first ending signal that arrived (also one whose KeyboardInterrupt a finalizer dropped), or None."""
        return self.received[0] if self.received else None

    def finish(self) -> None:
        """The command's files are in place: a later ending signal no longer interrupts it. A kept guard (under
        `process()`, the console entry point) has the signals it handles ignored outright (SIG_IGN) until the
        process exits: Python resets its own handlers to the default while the interpreter shuts down, and a
        signal then killed the finished command (exit -15 / -2 / -1 instead of 0)."""
        self.done = True
        if self.keep and _in_main_thread():
            for sig in ENDING_SIGNALS:
                if signal.getsignal(sig) is self:
                    signal.signal(sig, signal.SIG_IGN)

    def as_interrupt(self, error: BaseException) -> BaseException:
        """What `error`, raised after an ending signal arrived and before the files were in place, ends the
        command as: that interrupt (the signal is the cause: e.g. Ctrl-C to the process group killed the
        `ffmpeg -version` probe, and imageio then found "no ffmpeg"); otherwise `error` itself."""
        if self.received and not self.done and isinstance(error, Exception):
            interrupt = SignalInterrupt(self.received[0])
            interrupt.__cause__ = error
            return interrupt
        return error

    def check(self) -> None:
        """A safe point: raise `SignalInterrupt` if an ending signal arrived, unless the files are already in place.

        Raises:
            SignalInterrupt: with the first signal's number."""
        if self.received and not self.done:
            raise SignalInterrupt(self.received[0])


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def current_guard() -> Guard | None:
    """The guard handling the ending signals now, or None (none installed, or not the main thread)."""
    if not _in_main_thread():
        return None
    for sig in ENDING_SIGNALS:  # (one of them may be ignored: SIGINT in a shell's background job)
        handler = signal.getsignal(sig)
        if isinstance(handler, Guard):
            return handler
    return None


def _install(guard: Guard) -> dict[int, Any]:
    """Make `guard` the handler of every ending signal not ignored (a `nohup` stays in force); the replaced handlers."""
    previous = {}
    for sig in ENDING_SIGNALS:
        handler = signal.getsignal(sig)
        if handler is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, guard)
    return previous


def _restore(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, signal.SIG_DFL if handler is None else handler)


@contextlib.contextmanager
def as_interrupt() -> Iterator[Callable[[], int | None]]:
    """Within the block, Ctrl-C, SIGTERM and SIGHUP raise `SignalInterrupt` (a KeyboardInterrupt), so an interrupted
    command unwinds: its temporary files are removed and it writes nothing (one line; exit 128 + the signal's
    number, as a shell reports it: 130, 143, 129). While files are written the signal is held to a safe point, and
    once they are in place it no longer interrupts (module docstring). Only in the main thread (elsewhere:
    unchanged).

    Yields `Guard.interrupted`: whether (which) ending signal arrived in the block; a KeyboardInterrupt raised while
    Python runs a finalizer (`__del__`) is printed and dropped, so a command asks it before it writes."""
    if not _in_main_thread():
        yield lambda: None
        return
    guard = Guard(keep=_KEEP_DONE_GUARD.get())
    previous = _install(guard)
    try:
        yield guard.interrupted
    except Exception as e:  # after a signal: that interrupt (`Guard.as_interrupt`)
        converted = guard.as_interrupt(e)
        if converted is e:
            raise
        raise converted from e
    finally:
        if not (guard.done and _KEEP_DONE_GUARD.get()):
            _restore(previous)


@contextlib.contextmanager
def process() -> Iterator[None]:
    """The console entry point's block: once a command's files are in place the ending signals are ignored
    (`Guard.finish`) and stay so after its `as_interrupt` block, until the process exits, so a signal while it
    prints its result or while the interpreter shuts down is dropped (exit 0, the files complete) instead of
    killing it or ending it with "nothing was written"."""
    token = _KEEP_DONE_GUARD.set(True)
    try:
        yield
    finally:
        _KEEP_DONE_GUARD.reset(token)


@contextlib.contextmanager
def hold() -> Iterator[Guard | None]:
    """Hold the ending signals back for the block (files are being written): they are recorded, and `check()`
    raises them at safe points. A signal that arrived before the block (its KeyboardInterrupt dropped by a
    finalizer) raises at once. Without a command's guard, one is installed for the block and the signals it
    recorded go to the replaced handlers when the block ends (after the code inside cleaned up). Yields the guard
    (None outside the main thread: nothing held)."""
    if not _in_main_thread():
        yield None
        return
    guard = current_guard()
    previous = None
    if guard is None:
        guard = Guard()
        previous = _install(guard)
    guard.holding += 1
    try:
        guard.check()
        yield guard
    finally:
        guard.holding -= 1
        if previous is not None:
            _restore(previous)
            for sig in dict.fromkeys(guard.received):  # each once, in arrival order
                if sig in previous:
                    signal.raise_signal(sig)


def check() -> None:
    """A safe point of a writer: raise `SignalInterrupt` for an ending signal held back (`hold`). Nothing outside a
    guard.

    Raises:
        SignalInterrupt: an ending signal arrived and the files are not yet in place."""
    guard = current_guard()
    if guard is not None:
        guard.check()
