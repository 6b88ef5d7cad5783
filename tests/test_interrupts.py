"""vsagen.interrupts: Ctrl-C / SIGTERM raise where a run is, are held while files are written (raised at the
writer's safe points), and no longer interrupt once the files are in place; and, end to end, `vsagen t2v` and
`vsagen compare` signalled at several instants around their write (issue 29, item 3): every time either the complete
files and exit 0, or no file, no temporary file, no ffmpeg child, one line and exit 128 + the signal.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from vsagen import interrupts
from vsagen.interrupts import Guard, SignalInterrupt, as_interrupt, check, current_guard, hold, process
from vsagen.media.video import Outputs, encode_mp4, read_mp4


def spin() -> None:
    """Bytecodes for a pending Python signal handler to run at."""
    for _ in range(10_000):
        pass


def test_a_signal_raises_where_the_run_is_and_the_handlers_come_back():
    before = [signal.getsignal(s) for s in interrupts.ENDING_SIGNALS]
    with pytest.raises(SignalInterrupt) as info:
        with as_interrupt() as interrupted:
            assert interrupted() is None and isinstance(current_guard(), Guard)
            os.kill(os.getpid(), signal.SIGTERM)
            spin()
    assert info.value.signum == signal.SIGTERM and isinstance(info.value, KeyboardInterrupt)
    assert [signal.getsignal(s) for s in interrupts.ENDING_SIGNALS] == before and current_guard() is None


def test_held_signals_raise_at_safe_points_only():
    with as_interrupt() as interrupted:
        with pytest.raises(SignalInterrupt) as info:
            with hold():
                os.kill(os.getpid(), signal.SIGINT)
                spin()  # held: no exception here
                reached = True
                check()
        assert reached and info.value.signum == signal.SIGINT and interrupted() == signal.SIGINT


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the drop is the point
def test_a_signal_a_finalizer_dropped_stops_the_write_at_once():
    """A KeyboardInterrupt raised inside `__del__` is printed and dropped by Python: the command went on (the review
    saw compare write everything and exit 0). The guard remembers it; the next hold raises it."""
    import gc

    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)
            spin()

    with as_interrupt() as interrupted:
        Finalized()
        gc.collect()
        assert interrupted() == signal.SIGTERM
        with pytest.raises(SignalInterrupt):
            with Outputs():
                raise AssertionError("the block ran after the interrupt")


def test_once_the_files_are_in_place_a_signal_no_longer_interrupts(tmp_path):
    with as_interrupt() as interrupted:
        with Outputs() as outputs:
            outputs.add(tmp_path / "a.json", lambda tmp: tmp.write_text("{}"))
            outputs.publish()
        os.kill(os.getpid(), signal.SIGTERM)
        spin()  # dropped: the command completes
        check()
        assert interrupted() == signal.SIGTERM
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_a_set_more_follow_leaves_the_signal_interrupting(tmp_path):
    """`--seeds`: a seed's files in place (`Outputs(final=False)`) do not end the interruptible part: a later
    signal stops the command, its line saying the files in place stay (before, every later seed ran to the end)."""
    with pytest.raises(SignalInterrupt) as info:
        with as_interrupt():
            with Outputs(final=False) as outputs:
                outputs.add(tmp_path / "seed1.json", lambda tmp: tmp.write_text("{}"))
                outputs.publish()
            os.kill(os.getpid(), signal.SIGINT)
            spin()
    assert info.value.kept and [p.name for p in tmp_path.iterdir()] == ["seed1.json"]
    assert interrupts.ending_line(info.value.signum, info.value.kept) == (
        "interrupted; nothing more was written (the files already published stay)")
    assert interrupts.ending_line(signal.SIGTERM) == "interrupted by SIGTERM; nothing was written"


def test_the_entry_point_ignores_the_signals_once_the_files_are_in_place():
    """Under `process()` (main), once a command's files are in place the ending signals are ignored (SIG_IGN, which
    Python keeps at shutdown) until the process ends: a signal while the command prints its result or the
    interpreter shuts down is dropped (it killed the process with -15)."""
    before = {s: signal.getsignal(s) for s in interrupts.ENDING_SIGNALS}
    try:
        with process():
            with as_interrupt():
                current_guard().finish()
            assert all(signal.getsignal(s) is signal.SIG_IGN for s in interrupts.ENDING_SIGNALS)
            os.kill(os.getpid(), signal.SIGTERM)
            spin()
            with as_interrupt():  # not done: restored as usual
                pass
            assert all(signal.getsignal(s) is signal.SIG_IGN for s in interrupts.ENDING_SIGNALS)
    finally:
        for s, h in before.items():
            signal.signal(s, h)


# A command under the entry point's `process()` that publishes its file, then gets signals after its block and
# while the interpreter shuts down (a module global's finalizer); the trial's t2v / compare died of them.
LATE_SIGNALS = r"""
import os, signal, sys, time
from pathlib import Path
from vsagen.interrupts import as_interrupt, process
from vsagen.media.video import Outputs

class AtShutdown:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)

with process():
    with as_interrupt():
        with Outputs() as outputs:
            outputs.add(Path(sys.argv[1]), lambda tmp: tmp.write_text("{}"))
            outputs.publish()
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)
    print("result")
late = AtShutdown()
sys.exit(0)
"""


def test_a_signal_after_publication_and_at_shutdown_leaves_exit_0(tmp_path):
    res = subprocess.run([sys.executable, "-c", LATE_SIGNALS, str(tmp_path / "a.json")], capture_output=True,
                         text=True, timeout=60)
    assert (res.returncode, res.stdout, res.stderr) == (0, "result\n", "")
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


@pytest.mark.parametrize("nested", [False, True])
def test_an_error_after_a_held_signal_is_that_interrupt(tmp_path, nested):
    """Ctrl-C to the process group while files are written also kills children of this process (imageio's
    `ffmpeg -version` probe: "No ffmpeg exe could be found", exit 1): an error raised after the signal arrived
    ends the command as that interrupt (130), nothing written; inside `Outputs`, and in a command's block."""

    def fail(tmp):
        os.kill(os.getpid(), signal.SIGINT)
        spin()  # held
        raise RuntimeError("No ffmpeg exe could be found")

    with pytest.raises(SignalInterrupt) as info:
        with as_interrupt():
            if nested:
                with hold():
                    fail(None)
            with Outputs() as outputs:
                outputs.add(tmp_path / "a.mp4", fail)
    assert info.value.signum == signal.SIGINT and isinstance(info.value.__cause__, RuntimeError)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError), as_interrupt():  # no signal: the error stays itself
        raise RuntimeError("no signal")


def test_ffmpeg_found_before_the_write_is_not_probed_again(tmp_path, monkeypatch):
    """`find_ffmpeg` (called before `Outputs`) leaves imageio-ffmpeg's executable resolved: the encode starts no
    `ffmpeg -version` probe that a Ctrl-C to the group could kill."""
    import imageio_ffmpeg._utils as utils
    import numpy as np

    from vsagen.media.video import find_ffmpeg

    exe = find_ffmpeg()
    monkeypatch.setattr(utils, "_is_valid_exe", lambda exe: pytest.fail("ffmpeg probed again"))
    assert utils.get_ffmpeg_exe() == exe
    encode_mp4(np.zeros((2, 16, 16, 3), np.uint8), tmp_path / "a.mp4", 8)
    assert read_mp4(tmp_path / "a.mp4").shape == (2, 16, 16, 3)


def test_without_a_guard_the_hold_hands_the_signal_on_after_cleaning_up(tmp_path):
    """The library called from Python: the signal reaches the caller's handler once the temporaries are gone."""
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda *_: seen.append(sorted(p.name for p in tmp_path.iterdir())))
    try:
        with pytest.raises(SignalInterrupt):
            with Outputs() as outputs:
                outputs.add(tmp_path / "a.mp4", lambda tmp: tmp.write_text("video"))
                os.kill(os.getpid(), signal.SIGTERM)
                spin()
                outputs.add(tmp_path / "a.json", lambda tmp: tmp.write_text("{}"))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert seen == [[]] and list(tmp_path.iterdir()) == []


def test_an_ignored_signal_stays_ignored():
    """`nohup vsagen ...`: SIGHUP ignored before the run stays ignored within it."""
    if not hasattr(signal, "SIGHUP"):
        pytest.skip("no SIGHUP here")
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with as_interrupt():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_a_background_job_ignoring_ctrl_c_still_holds_sigterm(tmp_path):
    """`vsagen t2v ... &` from a script inherits SIGINT ignored: the guard is then found through SIGTERM, so the
    write still holds a SIGTERM to its next safe point (it took its own hold, and raised the signal again after
    the guard's files were in place)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with as_interrupt():
            assert current_guard() is signal.getsignal(signal.SIGTERM)
            with Outputs() as outputs:
                outputs.add(tmp_path / "a.json", lambda tmp: tmp.write_text("{}"))
                os.kill(os.getpid(), signal.SIGTERM)
                spin()
                with pytest.raises(SignalInterrupt):
                    outputs.publish()
            assert list(tmp_path.iterdir()) == []
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_encode_interrupted_between_frames_leaves_no_ffmpeg_and_no_file(tmp_path):
    """A signal during the encode stops it at the next frame; ffmpeg has ended (its output path is in no running
    process's command line) and the temporary file is gone. The issue saw imageio's writer left open on the
    exception, its ffmpeg recreating the removed temporary file (a hidden 261-byte mp4)."""
    import numpy as np

    frames = np.zeros((40, 32, 32, 3), np.uint8)
    with as_interrupt():
        with pytest.raises(SignalInterrupt):
            with Outputs() as outputs:
                outputs.add(tmp_path / "a.mp4", lambda tmp: _encode_with_signal(frames, tmp, at=3))
    assert list(tmp_path.iterdir()) == [] and not _processes_naming(tmp_path)


def test_a_stream_interrupted_between_chunks_leaves_no_ffmpeg_and_no_file(tmp_path):
    """Issue 32: the decode streams into the encoder thread; a SIGTERM while a chunk decodes stops the stream at the
    next safe point: the encoder is stopped, its ffmpeg has ended and the temporary file is gone."""
    import numpy as np

    from vsagen.media.video import encode_mp4_stream

    def chunks():
        for i in range(10):
            if i == 3:
                os.kill(os.getpid(), signal.SIGTERM)  # held by Outputs, raised at the next safe point
            yield np.full((4, 32, 32, 3), 20 * i, np.uint8)

    with as_interrupt():
        with pytest.raises(SignalInterrupt):
            with Outputs() as outputs:
                outputs.add(tmp_path / "a.mp4", lambda tmp: encode_mp4_stream(chunks(), tmp, 8))
    assert list(tmp_path.iterdir()) == [] and not _processes_naming(tmp_path)


def _encode_with_signal(frames, path, at: int) -> None:
    """`encode_mp4`, a SIGTERM sent as frame `at` is handed to ffmpeg."""
    from vsagen.media import video

    real = video._writer

    def writer(*a, **k):
        w = real(*a, **k)
        append, count = w.append_data, [0]

        def append_data(frame):
            count[0] += 1
            if count[0] == at:
                os.kill(os.getpid(), signal.SIGTERM)
            append(frame)

        w.append_data = append_data
        return w

    video._writer = writer
    try:
        encode_mp4(frames, path, 8)
    finally:
        video._writer = real


def _processes_naming(folder: Path) -> list[str]:
    """Command lines of running processes that name `folder` (ffmpeg children name their output file)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(folder) in cmdline and int(entry.name) != os.getpid():
                found.append(cmdline)
    return found


# ----------------------------------------------------------------------------------------------- end to end

# Each case: (command, the stderr line that starts the clock, (least, most) seconds after it, signal). A line before
# the write ("decoding", "PSNR / SSIM": the signal must interrupt); instants across the write, drawn anew each time
# from the range (from the "writing" line: the frames, ffmpeg's start, the encode, the plot, the renames; on this
# 2-core machine, 8 runs at once, t2v took ~0.85 s from that line to its exit and compare ~3.9 s); and a line
# printed once the files are in place ("wrote": the signal must not interrupt).
CASES = [
    ("t2v", "decoding the video", (0.0, 0.0), "SIGTERM"),
    ("t2v", "writing ", (0.0, 0.0), "SIGINT"),
    ("t2v", "writing ", (0.0, 0.4), "SIGTERM"),
    ("t2v", "writing ", (0.2, 1.0), "SIGTERM"),
    ("compare", "PSNR / SSIM of", (0.0, 0.0), "SIGINT"),
    ("compare", "writing ", (0.0, 0.6), "SIGTERM"),
    ("compare", "writing ", (0.4, 4.0), "SIGINT"),
    ("compare", "wrote ", (0.0, 0.0), "SIGTERM"),
]
TINY = ["--model", "tiny", "--frames", "5", "--height", "64", "--width", "64", "--steps", "1"]

# Starting 8 interpreters that each import torch, diffusers and transformers costs ~7 s of CPU apiece on this
# machine; so one process imports them once and forks a `vsagen` process per case, each running the console
# entry point `vsagen.cli.app.main()` with its own argv, folder, signal handlers and ffmpeg children (the interpreter's
# own start and shutdown are the only difference; a late signal's fate at shutdown is tested above). It then sends
# each its signal as its stderr shows the case's line, and reports every exit status and stderr as JSON.
FORKER = r"""
import json, os, signal, sys, threading, time, traceback
cases = json.loads(sys.stdin.read())
import imageio.v2, imageio_ffmpeg, diffusers, transformers  # imports only: no computation before the forks
import vsagen.cli.app, vsagen.commands.compare, vsagen.commands.generate, vsagen.models.loading, vsagen.pipeline
from diffusers import WanPipeline
sys.stdout.flush(); sys.stderr.flush()
runs = []
for folder, argv, line, delay, signame in cases:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.chdir(folder)
        out = os.open(folder + ".stdout", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(out, 1); os.dup2(w, 2)
        sys.argv = ["vsagen", *argv]
        code = 1
        try:
            vsagen.cli.app.main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush(); sys.stderr.flush()
            os._exit(code)
    os.close(w)
    runs.append({"pid": pid, "fd": r, "line": line, "delay": delay, "signum": getattr(signal, signame),
                 "stderr": [], "sent": False})

def watch(run):
    with os.fdopen(run["fd"], errors="replace") as f:
        for text in f:
            run["stderr"].append(text)
            if not run["sent"] and text.startswith(run["line"]):
                time.sleep(run["delay"])
                os.kill(run["pid"], run["signum"])
                run["sent"] = True

threads = [threading.Thread(target=watch, args=(run,)) for run in runs]
for t in threads: t.start()
for t in threads: t.join()  # before any is waited for: a run that ended first is a zombie, and still takes kill
for run in runs:
    run["rc"] = os.waitstatus_to_exitcode(os.waitpid(run["pid"], 0)[1])
print(json.dumps([{"rc": r["rc"], "stderr": "".join(r["stderr"]), "sent": r["sent"]} for r in runs]))
"""


def _default_sigint() -> None:  # a child of a shell's background job inherits SIGINT ignored: a real Ctrl-C here
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def check_outcome(case: tuple, folder: Path, result: dict) -> str:
    """Assert one signalled run's outcome; returns "interrupted" or "complete"."""
    command, line, delay, signame = case
    signum, rc, err = getattr(signal, signame), result["rc"], result["stderr"]
    where = f"{command} +{delay}s after {line!r}, {signame}, exit {rc}:\n{err}"
    assert result["sent"], where
    for bad in ("Traceback", "Exception ignored", "Error opening", "SignalInterrupt"):
        assert bad not in err, where
    assert not _processes_naming(folder), where  # no ffmpeg left behind
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
    if rc == 128 + signum:
        by = "" if signum == signal.SIGINT else f" by {signame}"
        assert err.strip().splitlines()[-1] == f"error: interrupted{by}; nothing was written", where
        assert files == [], f"{files} {where}"  # no file, no hidden temporary file, no folder
        return "interrupted"
    assert rc == 0, where
    if command == "t2v":
        assert files == ["a.json", "a.mp4"], f"{files} {where}"
        assert json.loads((folder / "a.json").read_text())["video"] == "a.mp4"
        assert read_mp4(folder / "a.mp4").shape == (5, 64, 64, 3)
    else:
        report = json.loads((folder / "cmp" / "compare.json").read_text())
        assert ["cmp"] + sorted(report["files"].values()) == files, f"{files} {where}"
        for name in report["files"].values():
            if name.endswith(".mp4"):
                assert read_mp4(folder / name).shape[0] == 5
    return "complete"


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork") or not Path("/proc/self/cmdline").exists(),
                    reason="forks the runs; looks for ffmpeg children in /proc")
def test_a_signal_at_any_instant_of_the_write_leaves_all_or_nothing(vsagen_cache, tiny_dir, tmp_path):
    """Issue 29 item 3: SIGTERM 0.02-0.05 s after the `writing` line left a hidden 261-byte temporary mp4 (an
    ffmpeg child recreating it), printed an `_releaseLock` traceback and exited 130, or (compare) dropped the
    signal and wrote everything, or left ffmpeg running. Here t2v and compare, signalled (SIGTERM and Ctrl-C's
    SIGINT) before and at instants across their write: each ends complete with exit 0, or with nothing left and
    exit 128 + the signal; a signal before the write always interrupts."""
    env = dict(os.environ, VSAGEN_CACHE=str(vsagen_cache), HF_HOME=str(tmp_path / "hf-home"), OMP_NUM_THREADS="1")
    env.pop("COLUMNS", None)
    folders = [tmp_path / f"run{i}" for i in range(len(CASES))]
    cases, drawn = [], []
    for folder, (command, line, (least, most), signame) in zip(folders, CASES):
        folder.mkdir()
        out = ["--out", "a.mp4"] if command == "t2v" else ["--warmup", "0", "--out", "cmp"]
        delay = round(random.uniform(least, most), 3)  # every outcome is checked: any instant must do
        drawn.append((command, line, delay, signame))
        cases.append([str(folder), [command, "a fox", *TINY, *out], line, delay, signame])
    proc = subprocess.run([sys.executable, "-c", FORKER], input=json.dumps(cases), capture_output=True, text=True,
                          env=env, timeout=600, preexec_fn=_default_sigint)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    outcomes = [check_outcome(case, folder, r) for case, folder, r in zip(drawn, folders, results)]
    sure = {case[1]: o for o, case in zip(outcomes, CASES) if case[1] != "writing "}
    assert sure == {"decoding the video": "interrupted", "PSNR / SSIM of": "interrupted", "wrote ": "complete"}
    time.sleep(0.2)  # an ffmpeg that outlived its parent would write now
    for folder in folders:
        assert sorted(p.name for p in folder.iterdir()) in ([], ["a.json", "a.mp4"], ["cmp"])


@pytest.mark.slow
def test_a_signal_during_a_mag_calibration_writes_no_calibration(vsagen_cache, tiny_dir, tmp_path, monkeypatch):
    """A Ctrl-C while a `mag:calibrate=true` run decoded said "interrupted; nothing was written" but left the
    calibration file, written before the decode. It is now written with the video: interrupted, neither file is
    there (nor a temporary one); complete, both, an earlier calibration replaced (without --overwrite)."""
    import vsagen.commands.generate as gen
    from vsagen.cache.install import load_calibration, save_ratios
    from vsagen.commands.generate_config import resolve_generate

    ratios = tmp_path / "cal" / "mag.json"
    save_ratios(ratios, "earlier", 9, {"transformer": [1.0]})
    earlier = ratios.read_text()
    real = gen._frame_chunks

    def signalled(*a, **k):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C as the decode starts (held by Outputs to a safe point)
        yield from real(*a, **k)

    def config():
        return resolve_generate("a fox", model="tiny", frames=5, height=64, width=64, steps=2, warmup=0,
                                device="cpu", cache=f"mag:calibrate=true:file={ratios}", out=str(tmp_path / "v.mp4"))

    monkeypatch.setattr(gen, "_frame_chunks", signalled)
    with as_interrupt():
        with pytest.raises(SignalInterrupt):
            gen.generate(config())
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["cal", "mag.json"] and ratios.read_text() == earlier
    monkeypatch.setattr(gen, "_frame_chunks", real)
    result = gen.generate(config())
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["cal", "mag.json", "v.json", "v.mp4"]
    cal = load_calibration(ratios)
    assert (cal["model"], cal["steps"], cal["sampler"], len(cal["ratios"]["transformer"])) == ("tiny", 2, "default", 2)
    assert any(f"written to {ratios} with the video" in n for n in result.summary["timing"]["notes"])


# ------------------------------------------------------------------------------------------- the signal watcher
# Issue 44 (new-user trial): a Ctrl-C during a real-size CPU step did nothing for minutes (Python runs its signal
# handlers only between bytecodes, and one torch operation was still running), a second Ctrl-C and a SIGTERM did
# nothing either, and the last line named the SIGTERM. Children here block inside one C call that never returns to
# Python by itself (a normal pthread mutex locked twice by one thread), standing for that operation; they say so
# once the main thread waits in it (Linux, glibc: its lock word).

STUCK = r"""
import ctypes, os, subprocess, sys, threading, time
from pathlib import Path
from vsagen import interrupts
from vsagen.cli.running import report_interrupt

libc = ctypes.CDLL(None)

def stuck(seconds=None):
    mutex = ctypes.create_string_buffer(64)  # a zeroed pthread_mutex_t: a normal mutex, unlocked
    libc.pthread_mutex_lock(mutex)
    state = ctypes.c_int.from_buffer(mutex)  # glibc's lock word: 2 once a thread waits on the locked mutex

    def say():  # only once the main thread waits inside the C call (a signal before would reach Python at once)
        while state.value != 2:
            time.sleep(0.001)
        print("in C", file=sys.stderr, flush=True)

    threading.Thread(target=say, daemon=True).start()
    if seconds is None:
        libc.pthread_mutex_lock(mutex)  # locks itself out for good: signals cannot bring it back to Python
    else:  # pthread_mutex_timedlock is not interrupted by signals either; it returns after `seconds`
        deadline = (ctypes.c_long * 2)(int(time.time() + seconds), 0)
        libc.pthread_mutex_timedlock(mutex, deadline)

folder = Path(sys.argv[1])
code = 0
with interrupts.process():
    try:
        with interrupts.as_interrupt():
            if sys.argv[2] == "step":
                (folder / "building").mkdir()  # a temporary folder, as the tiny checkpoint's build makes
                interrupts.remove_on_stop(folder / "building")
                child = subprocess.Popen(["sleep", "60"])  # a child, as an ffmpeg encoder
                print(f"child {child.pid}", file=sys.stderr, flush=True)
                stuck()
            else:
                from vsagen.media.video import Outputs
                with Outputs() as outputs:
                    outputs.add(folder / "a.json", lambda tmp: (tmp.write_text("{"), stuck(3)))
                    outputs.publish()
    except KeyboardInterrupt as e:
        code = report_interrupt(e)
sys.exit(code)
"""


GLIBC = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's pthread mutex, /proc")


def _lines_of(proc: subprocess.Popen):
    """A queue of `proc`'s stderr lines (None at its end), read by a thread."""
    import queue

    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in proc.stderr:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def _next_line(lines, timeout: float = 10.0) -> str | None:
    import queue

    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        raise AssertionError(f"no line within {timeout} s") from None


def _start_stuck(tmp_path, mode: str):
    proc = subprocess.Popen([sys.executable, "-c", STUCK, str(tmp_path), mode], stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint)
    return proc, _lines_of(proc)


@GLIBC
def test_a_signal_during_a_long_operation_says_at_once_and_a_second_stops_now(tmp_path):
    """The first Ctrl-C: a line at once saying when it stops and that a second one stops now; the second signal (a
    SIGTERM): the process ends at once, its child killed, its temporary folder removed, one final line naming the
    FIRST signal, exit 130."""
    proc, lines = _start_stuck(tmp_path, "step")
    try:
        child = int(_next_line(lines).split()[1])
        assert _next_line(lines) == "in C"
        proc.send_signal(signal.SIGINT)
        notice = _next_line(lines, timeout=5)
        assert notice.startswith("Ctrl-C: stopping as soon as the running operation returns") and \
            notice.endswith("press Ctrl-C again to stop now"), notice
        assert proc.poll() is None  # still inside its operation
        proc.send_signal(signal.SIGTERM)
        assert _next_line(lines) == "error: interrupted; nothing was written"
        assert _next_line(lines) is None
        assert proc.wait(timeout=10) == 130
    finally:
        proc.kill()
        proc.wait()
    assert list(tmp_path.iterdir()) == []  # the registered temporary folder is gone
    assert not Path(f"/proc/{child}").exists() or "Z" in (Path(f"/proc/{child}/stat").read_text().split()[2])


@GLIBC
def test_while_files_are_written_a_second_signal_waits_for_the_safe_point(tmp_path):
    """During a write (`hold`) the second signal does not end the process on the spot (its temporary file would
    stay): the writer stops at its next safe point, removes the temporary file and reports the first signal."""
    proc, lines = _start_stuck(tmp_path, "write")
    try:
        assert _next_line(lines) == "in C"
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGINT)
        rest = []
        while (line := _next_line(lines)) is not None:
            rest.append(line)
        # On a loaded machine both signals can be pending at the process's next check; Linux then delivers the
        # lower-numbered SIGINT first, and that one is reported (exit 130): either way, one clean line, no file.
        ends = {"error: interrupted by SIGTERM; nothing was written": 143, "error: interrupted; nothing was written": 130}
        assert rest[-1] in ends, rest
        assert proc.wait(timeout=10) == ends[rest[-1]]
    finally:
        proc.kill()
        proc.wait()
    assert list(tmp_path.iterdir()) == []  # no temporary file, no a.json


def test_two_signals_at_one_check_end_as_the_first():
    """Both signals pending when Python next checks (as after one long C call): the interrupt is the first's (Ctrl-C:
    exit 130), not the one whose handler ran last (SIGTERM, as the trial's final line said)."""
    both = {signal.SIGINT, signal.SIGTERM}
    with pytest.raises(SignalInterrupt) as info:
        with as_interrupt() as interrupted:
            signal.pthread_sigmask(signal.SIG_BLOCK, both)
            try:
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGTERM)
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, both)  # delivered together: both handlers run now
            spin()
    assert info.value.signum == signal.SIGINT and interrupted() == signal.SIGINT


# The console entry point while torch imports (issue 44: a SIGTERM 0.8 s after the start killed it through the
# default action, without a line): `import torch` is made to wait, and says so, before it starts.
SLOW_IMPORT = r"""
import sys, time
import importlib.abc

class SlowTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            print("importing torch", file=sys.stderr, flush=True)
            time.sleep(60)
        return None

sys.meta_path.insert(0, SlowTorch())
import vsagen.cli
sys.argv = ["vsagen", *sys.argv[1:]]
vsagen.cli.main()
"""


def test_sigterm_while_torch_imports_is_the_commands_one_line(vsagen_cache, tmp_path):
    env = dict(os.environ, VSAGEN_CACHE=str(vsagen_cache), HF_HOME=str(tmp_path / "hf"))
    env.pop("COLUMNS", None)
    proc = subprocess.Popen([sys.executable, "-c", SLOW_IMPORT, "t2v", "a fox", "--model", "tiny", "--out",
                             str(tmp_path / "a.mp4")], stderr=subprocess.PIPE, text=True, env=env)
    lines = _lines_of(proc)
    try:
        assert _next_line(lines, timeout=30) == "importing torch"
        proc.send_signal(signal.SIGTERM)
        assert _next_line(lines) == "error: interrupted by SIGTERM; nothing was written"
        assert _next_line(lines) is None and proc.wait(timeout=10) == 143
    finally:
        proc.kill()
        proc.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], ["hf"])


def test_an_interrupt_while_the_command_line_is_parsed_is_one_line(monkeypatch, capsys):
    """Typer turns a KeyboardInterrupt outside the command (while it parses) into a silent exit 130; the entry point
    says the command's line and names the signal (143)."""
    import vsagen.cli.shared_options
    from vsagen.cli import main

    def parse(*_):
        os.kill(os.getpid(), signal.SIGTERM)
        spin()

    monkeypatch.setattr(vsagen.cli.shared_options, "repeated_option", parse)
    monkeypatch.setattr(sys, "argv", ["vsagen", "t2v", "a fox"])
    before = {s: signal.getsignal(s) for s in interrupts.ENDING_SIGNALS}
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 143
    assert capsys.readouterr().err.strip().splitlines() == ["error: interrupted by SIGTERM; nothing was written"]
    assert {s: signal.getsignal(s) for s in interrupts.ENDING_SIGNALS} == before


def test_the_watchers_lines_stand_apart_from_a_progress_bar(capsys):
    """The notice came while the denoising bar was drawn without a newline, and was written onto the bar's line; it
    is written through tqdm (the bar cleared, the line, the bar again), a line of its own."""
    import tqdm

    bar = tqdm.tqdm(total=2, desc="denoising", file=sys.stderr)
    try:
        interrupts._say("Ctrl-C: stopping")
    finally:
        bar.close()
    err = capsys.readouterr().err
    assert "\rCtrl-C: stopping\n" in err and "step/s]Ctrl-C" not in err, repr(err)
