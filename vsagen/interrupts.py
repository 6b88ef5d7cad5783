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

* Python runs a signal handler only between bytecodes: while the main thread is inside one long C call (a torch
  operation on the CPU at a real size takes minutes) a signal does nothing visible. So under `process()` (the
  console entry point) a watcher thread hears the ending signals the moment they arrive (`signal.set_wakeup_fd`):
  when the main thread has not acted on the first within `NOTICE_AFTER_S`, it says at once when the command stops
  and that a second signal stops it now; a second signal (outside a write) ends the process at once: its children
  killed, the temporary files registered with `remove_on_stop` removed, the one final line printed (naming the first
  signal), exit 128 + its number. Nothing the command publishes has been written then (`hold()` keeps it out).
* The interrupt always names the FIRST signal (Ctrl-C, then SIGTERM: "interrupted", exit 130), however many
  arrived before Python ran its handlers.

Only the main thread runs Python signal handlers; elsewhere nothing is installed or held.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

# Ctrl-C, `kill`, a closed terminal.
ENDING_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))

# Set by `process()`: once a guard's files are in place the ending signals stay ignored (the process is ending).
_KEEP_DONE_GUARD = contextvars.ContextVar("vsagen_keep_done_guard", default=False)

# How long the watcher (`process()`) gives the main thread to act on a signal before it says the command is busy in
# one long operation (seconds): a command running Python stops within microseconds and prints only its final line.
NOTICE_AFTER_S = 0.3


def signal_name(signum: int) -> str:
    """"SIGTERM" for 15; "signal N" for a number the platform does not name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def ending_line(signum: int, kept: bool = False) -> str:
    """The one line (without "error: ") an interrupted command ends with; exit code 128 + `signum`. `kept`: sets of
    its files were already in place (`--seeds`' finished seeds, `Guard.published`), and stay."""
    by = "" if signum == signal.SIGINT else f" by {signal_name(signum)}"
    return f"interrupted{by}; " + ("nothing more was written (the files already published stay)" if kept
                                   else "nothing was written")


class SignalInterrupt(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP as a KeyboardInterrupt that remembers its signal (for the exit code 128 + signum)."""

    def __init__(self, signum: int, kept: bool = False) -> None:
        super().__init__(signum)
        self.signum = int(signum)
        self.kept = kept  # files the command published earlier stay (`ending_line`)


class Guard:
    """The handler of the ending signals during a command (callable as a signal handler).

    Every signal is recorded in `received`. Outside `hold()` and before `done` it raises `SignalInterrupt` at once;
    inside `hold()` it is only recorded, and `check()` raises it at the writer's next safe point; after `done` (the
    command's files are in place) it is recorded and nothing more."""

    def __init__(self, keep: bool = False) -> None:
        self.received: list[int] = []
        self.holding = 0
        self.done = False
        self.raised = False  # a SignalInterrupt was raised (the main thread is unwinding)
        self.arrived: list[int] = []  # in the order they arrived, as `process()`'s watcher heard them
        self.keep = keep  # under `process()`: once done, the ending signals are ignored until the process exits
        self.kept = False  # a set of files is in place and more follow (`published`)

    def __call__(self, signum: int, frame: Any) -> None:
        self.received.append(int(signum))
        if not self.holding and not self.done:
            self.raised = True
            raise SignalInterrupt(self.first(), self.kept)

    def first(self) -> int:
        """The signal that names the interrupt: the first to arrive. Python runs every pending handler at one check,
        in the order of their numbers (a Ctrl-C and a SIGTERM that both arrived during one long C call ended as the
        SIGTERM, the last handler's exception): the watcher's order of arrival where it heard them."""
        return self.arrived[0] if self.arrived else self.received[0]

    def interrupted(self) -> int | None:
        """The first ending signal that arrived (also one whose KeyboardInterrupt a finalizer dropped), or None."""
        return self.first() if self.received else None

    def published(self, final: bool = True) -> None:
        """A set of the command's files is in place: the last (`final`), then `finish`; else more follow (`--seeds`:
        the next seed's files), and an ending signal still interrupts the command, its line saying the files already
        in place stay (`ending_line`)."""
        if final:
            self.finish()
        else:
            self.kept = True

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
            interrupt = SignalInterrupt(self.first(), self.kept)
            interrupt.__cause__ = error
            return interrupt
        return error

    def check(self) -> None:
        """A safe point: raise `SignalInterrupt` if an ending signal arrived, unless the files are already in place.

        Raises:
            SignalInterrupt: with the first signal's number."""
        if self.received and not self.done:
            self.raised = True
            raise SignalInterrupt(self.first(), self.kept)


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
    unchanged). Under `process()` the block takes the process's guard (and its watcher) instead of its own.

    Yields `Guard.interrupted`: whether (which) ending signal arrived in the block; a KeyboardInterrupt raised while
    Python runs a finalizer (`__del__`) is printed and dropped, so a command asks it before it writes."""
    if not _in_main_thread():
        yield lambda: None
        return
    outer = current_guard()
    own = not (_KEEP_DONE_GUARD.get() and outer is not None and outer.keep)
    guard = Guard(keep=_KEEP_DONE_GUARD.get()) if own else outer
    previous = _install(guard) if own else {}
    try:
        yield guard.interrupted
    except Exception as e:  # after a signal: that interrupt (`Guard.as_interrupt`)
        converted = guard.as_interrupt(e)
        if converted is e:
            raise
        raise converted from e
    finally:
        if own and not (guard.done and _KEEP_DONE_GUARD.get()):
            _restore(previous)


# The files and folders a stop-now exit removes (`remove_on_stop`), and the lock of the command's final line
# (`last_word`): the main thread reporting its interrupt, or the watcher ending the process, prints it, never both.
_ON_STOP: list[Path] = []
_LAST_WORD = threading.Lock()
_last: dict[str, Any] = {"watcher": None, "said": False}


def remove_on_stop(path: Path) -> Callable[[], None]:
    """Have a stop-now exit (a second signal, `process()`) remove `path`, a file or folder this process writes
    outside `hold()` (the tiny checkpoint being built, a temporary folder); returns the call that forgets it."""
    _ON_STOP.append(Path(path))
    return lambda: _ON_STOP.remove(Path(path)) if Path(path) in _ON_STOP else None


def last_word(say: Callable[[], None]) -> None:
    """Print the command's final line through `say()`, unless the watcher of `process()` is ending the process with
    its own (a second signal meanwhile): one final line, whichever thread gets there first."""
    with _LAST_WORD:
        if not _last["said"]:
            say()
            _last["said"] = _last["watcher"] is not None


def _children() -> list[int]:
    """This process's children (Linux: /proc/self/task/*/children), e.g. an ffmpeg encoder; [] elsewhere."""
    pids: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path("/proc/self/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                pids += [int(p) for p in (task / "children").read_text().split()]
    return pids


def _say(text: str) -> None:
    """`text` as a line of its own on stderr, also while a progress bar is drawn there (the denoising bar: tqdm
    clears it, writes the line and draws it again)."""
    tqdm = sys.modules.get("tqdm")
    with contextlib.suppress(Exception):  # stderr closed or gone: nothing to say it to
        if tqdm is not None:
            tqdm.tqdm.write(text, file=sys.stderr)
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()


class _Watcher:
    """The thread that hears the ending signals as they arrive, through `signal.set_wakeup_fd` (written by Python's
    C-level handler at once, whatever the main thread is doing), for `process()`'s guard: the notice when the main
    thread does not act on the first signal, the stop-now exit on the second (module docstring)."""

    def __init__(self, guard: Guard, speaks: bool) -> None:
        self.guard, self.speaks = guard, speaks
        self._read, self._write = os.pipe()  # non-inheritable: an exec'd child (ffmpeg) holds neither end
        os.set_blocking(self._write, False)
        self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._listen, name="vsagen-signal-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop hearing the signals (the wakeup fd as it was before) and end the thread."""
        signal.set_wakeup_fd(self._previous_fd)
        with contextlib.suppress(OSError):
            os.write(self._write, b"\0")
        self._thread.join(timeout=5)
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _listen(self) -> None:
        while True:
            try:
                data = os.read(self._read, 64)
            except OSError:
                return
            for signum in data:
                if signum == 0:  # `stop`
                    return
                self._heard(signum)
            if not data:
                return

    def _heard(self, signum: int) -> None:
        guard = self.guard
        if signum not in ENDING_SIGNALS or signal.getsignal(signum) is not guard or guard.done:
            return  # another handler in force (a launcher's), or the files are in place: not this guard's
        guard.arrived.append(signum)
        if len(guard.arrived) == 1:
            timer = threading.Timer(NOTICE_AFTER_S, self._notice)
            timer.daemon = True
            timer.start()
        elif not guard.holding:  # while files are written the writer stops at its next safe point
            self._stop_now()

    def _notice(self) -> None:
        guard, first = self.guard, self.guard.arrived[0]
        if guard.raised or guard.done or len(guard.arrived) > 1 or not self.speaks:
            return  # the main thread acted (it is unwinding), or the files are in place, or it stops now
        who = "Ctrl-C" if first == signal.SIGINT else signal_name(first)
        if guard.holding:
            _say(f"{who}: stopping at the write's next safe point (the next decoded chunk or frame); nothing will "
                 "be written")
            return
        again = "press Ctrl-C again" if first == signal.SIGINT else f"send {who} (or Ctrl-C) again"
        _say(f"{who}: stopping as soon as the running operation returns (on the CPU one operation of a real-size "
             f"model takes minutes); {again} to stop now")

    def _stop_now(self) -> None:
        """End the process at once: children killed, registered temporaries removed, one final line, exit 128 + the
        first signal. Never returns."""
        first = self.guard.first()
        _LAST_WORD.acquire()  # kept: the main thread prints no line of its own after this one
        for pid in _children():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)  # gone before its output file is removed (ffmpeg would write it again)
        for path in list(_ON_STOP):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()
        if self.speaks and not _last["said"]:
            _say(f"error: {ending_line(first, self.guard.kept)}")
        os._exit(128 + int(first))


def _forget_watcher_in_child() -> None:
    """A forked child (multiprocessing) must not write its signals into its parent's watcher."""
    if _last["watcher"] is not None:
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)
        _last["watcher"] = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_watcher_in_child)


@contextlib.contextmanager
def process(speaks: bool = True) -> Iterator[Guard | None]:
    """The console entry point's block. From its first line the ending signals end the command as an interrupt
    (one line, exit 128 + the signal), also while it imports torch (the default action killed it silently); a
    watcher hears them as they arrive (the notice, the stop-now exit: module docstring). Once a command's files are
    in place the ending signals are ignored (`Guard.finish`) and stay so after its `as_interrupt` block, until the
    process exits, so a signal while it prints its result or while the interpreter shuts down is dropped (exit 0,
    the files complete) instead of killing it or ending it with "nothing was written". `speaks`: the watcher prints
    (False for the ranks of a launch other than rank 0, as their interrupts print nothing). Yields the process's
    guard (None outside the main thread)."""
    token = _KEEP_DONE_GUARD.set(True)
    guard, previous, watcher = None, {}, None
    if _in_main_thread():
        guard = Guard(keep=True)
        previous = _install(guard)
        watcher = _Watcher(guard, speaks)
        _last.update(watcher=watcher, said=False)
    try:
        yield guard
    finally:
        if watcher is not None:
            watcher.stop()
            _last.update(watcher=None, said=False)
            if not guard.done:
                _restore(previous)
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
