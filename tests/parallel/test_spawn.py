"""vsagen.parallel.spawn: the workers of `--gpus N` started through torch's elastic agent. Here with small Python
scripts as the workers' program (no model: a second or two each): the parent's exit code and line from the workers'
codes, nothing of the launcher's on the terminal, the parent's signals passed on to every worker and no worker
left behind, and the parent's environment and signal handlers as they were. `vsagen t2v --gpus 2` itself runs in
`test_launch.py`."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from vsagen.parallel.spawn import (AGENT_PID_ENV, EXITS_ENV, die_with_agent, exit_status, record_exit, recorded_exits,
                                   run_workers, signalled_status, worker_threads)

SIGTERM, SIGINT, SIGKILL = int(signal.SIGTERM), int(signal.SIGINT), int(signal.SIGKILL)


def test_exit_status_takes_the_cause_not_the_workers_the_agent_stopped():
    # rank 0 refused (its own line), rank 1 was stopped by the agent: 2, nothing more to say
    assert exit_status({0: 2, 1: -SIGTERM}) == (2, None)
    assert exit_status({0: 143, 1: 1}) == (1, None)  # rank 1 failed (and said so); rank 0 was interrupted after
    assert exit_status({1: 2, 0: 2}) == (2, None)
    # a worker killed outright printed nothing: the parent says which, and fails
    code, line = exit_status({0: 143, 1: -SIGKILL})
    assert code == 1 and line == "worker rank 1 was killed by SIGKILL (out of memory?); the run was stopped"
    assert exit_status({0: -int(signal.SIGSEGV)})[1].startswith("worker rank 0 was killed by SIGSEGV")
    # interrupted: rank 0 said so itself (130 / 143), or died of the signal before it could
    assert exit_status({0: 130, 1: 130}) == (130, None)
    assert exit_status({0: -SIGTERM, 1: -SIGTERM}) == (143, "interrupted by SIGTERM; nothing was written")


def test_a_signalled_run_ends_with_rank_0_s_own_code():
    # rank 0's files were in place when the signal came: it finished (exit 0), as one process does; rank 1 follows
    assert signalled_status(SIGINT, {0: 0, 1: 130}) == 0
    assert signalled_status(SIGTERM, {0: 143, 1: 143}) == 143  # interrupted before: its own line and code
    assert signalled_status(SIGINT, {1: 130}) == 130 and signalled_status(SIGTERM, {}) == 143  # rank 0 left none


def test_workers_leave_their_exit_codes_for_the_agent(tmp_path):
    record_exit(0, {EXITS_ENV: str(tmp_path), "RANK": "0"})
    record_exit(130, {EXITS_ENV: str(tmp_path), "RANK": "1"})
    record_exit(2, {"RANK": "2"})  # not a worker of run_workers: nothing
    record_exit(2, {EXITS_ENV: str(tmp_path / "gone"), "RANK": "3"})  # the agent's folder gone: nothing, no error
    assert recorded_exits(str(tmp_path)) == {0: 0, 1: 130}


def test_a_signal_after_rank_0_finished_gives_0_in_the_parent(tmp_path, monkeypatch):
    """The agent stopped by Ctrl-C (its launcher raises SignalException, reporting no worker's code) once rank 0
    had finished (files in place, exit 0) and rank 1 was interrupted: the parent exits 0, as one process does;
    rank 0 interrupted too: 130. (The workers here are the launcher's stand-in, in this process.)"""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.launcher import api

    for rank0, want in ((0, 0), (130, 130)):
        def launch(config, entrypoint, rank0=rank0):
            def workers(*args):
                for rank, code in ((0, rank0), (1, 130)):
                    record_exit(code, {**os.environ, "RANK": str(rank)})
                raise SignalException("Process got signal: 2", sigval=signal.SIGINT)
            return workers

        monkeypatch.setattr(api, "elastic_launch", launch)
        assert run_workers(["t2v"], 2) == want
        assert EXITS_ENV not in os.environ


def test_worker_threads_share_the_cpus():
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert worker_threads(2) == max(1, cpus // 2) and worker_threads(10_000) == 1


def test_run_workers_needs_two_processes():
    with pytest.raises(ValueError, match="2 or more"):
        run_workers(["t2v"], 1)


# A worker: says it is ready (a file named by its rank and pid), then does what argv[1] says: exit with a code on
# rank 0 (after one error line), or wait for a signal, which it records before it exits 128 + the signal.
WORKER = textwrap.dedent("""
    import os, signal, sys, time
    rank, folder, what = int(os.environ["RANK"]), sys.argv[2], sys.argv[1]
    def stop(signum, frame):
        with open(os.path.join(folder, f"rank{rank}.got{signum}"), "a") as f:
            f.write("x")
        sys.exit(128 + signum)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, stop)
    open(os.path.join(folder, f"rank{rank}.pid{os.getpid()}.threads{os.environ.get('OMP_NUM_THREADS')}"), "w").close()
    if what == "ok":
        sys.exit(0)
    if what.startswith("exit") and rank == 0:
        print("error: bad input", file=sys.stderr, flush=True)
        sys.exit(int(what[4:]))
    time.sleep(60)
""")


def test_a_worker_failure_is_its_own_line_and_code_and_the_parent_is_left_as_it_was(tmp_path, capfd):
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    env = dict(os.environ)
    assert run_workers(["exit2", str(tmp_path)], 2, program=["-c", WORKER]) == 2
    out, err = capfd.readouterr()
    assert err.strip().splitlines() == ["error: bad input"] and out == ""  # no agent log, no ChildFailedError
    assert {p.name.split(".")[0] for p in tmp_path.iterdir()} >= {"rank0", "rank1"}
    assert {s: signal.getsignal(s) for s in handlers} == handlers and dict(os.environ) == env
    prepared = []
    assert run_workers(["ok", str(tmp_path)], 2, program=["-c", WORKER], prepare=lambda: prepared.append(1)) == 0
    assert prepared == [1]


PARENT = textwrap.dedent("""
    import sys
    from vsagen.parallel.spawn import run_workers
    sys.exit(run_workers(["wait", sys.argv[1]], 2, program=["-c", sys.argv[2]]))
""")


def _parent_env(temp: Path, env: dict | None = None) -> dict:
    """The environment of a PARENT process: its temporary folders (run_workers' `vsagen-exits-*`) in `temp`, made
    here, so that one a killed parent cannot remove is the test's to remove, not left in /tmp (a user trial found
    an empty /tmp/vsagen-exits-* after the suite)."""
    temp.mkdir()
    return {**(os.environ if env is None else env), "TMPDIR": str(temp)}


def _pids(folder: Path) -> list[int]:
    return [int(p.name.split(".")[1][3:]) for p in folder.glob("rank*.pid*")]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()


def test_a_signal_to_the_parent_reaches_every_worker_once_and_none_is_left(tmp_path):
    """SIGTERM, and SIGINT as Ctrl-C sends it (two parents at once): the workers run in sessions of their own (a
    terminal's Ctrl-C reaches the parent only); the parent passes the signal on, each worker gets it once and ends,
    and the parent exits 128 + the signal, printing nothing."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    runs = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        folder = tmp_path / sig.name
        folder.mkdir()
        runs[sig] = folder, subprocess.Popen([sys.executable, "-c", PARENT, str(folder), WORKER], cwd=folder,
                                             env=_parent_env(tmp_path / f"temp-{sig.name}", env),
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    for sig, (folder, parent) in runs.items():
        while len(_pids(folder)) < 2 and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.05)
        pids = _pids(folder)
        assert len(pids) == 2, parent.communicate(timeout=60)
        assert all(os.getpgid(p) != os.getpgid(parent.pid) for p in pids)  # out of the terminal's process group
        parent.send_signal(sig)
    for sig, (folder, parent) in runs.items():
        out, err = parent.communicate(timeout=60)
        assert parent.returncode == 128 + int(sig), err
        got = sorted((p.name, p.read_text()) for p in folder.glob("rank*.got*"))
        assert got == [(f"rank0.got{int(sig)}", "x"), (f"rank1.got{int(sig)}", "x")], got
        assert not [p for p in _pids(folder) if _alive(p)]
        assert out == "" and err == "", err
        threads = {p.name.rsplit("threads", 1)[1] for p in folder.glob("rank*.pid*")}
        assert threads == {str(worker_threads(2))}  # OMP_NUM_THREADS set for the workers where it was not
        assert list((tmp_path / f"temp-{sig.name}").iterdir()) == []  # its exit codes' folder removed


# The worker above as `vsagen`'s entry point starts: first `die_with_agent` (`vsagen.cli.app.main`).
DYING_WORKER = "from vsagen.parallel.spawn import die_with_agent; die_with_agent()\n" + WORKER


def test_workers_end_when_their_agent_is_killed_outright(tmp_path):
    """kill -9 of the parent (no signal to pass on): the kernel sends each worker SIGTERM (`die_with_agent`), which
    it handles and ends; none is left running (without it they slept on as orphans, 2026-12-07)."""
    temp = tmp_path / "temp"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path), DYING_WORKER], cwd=tmp_path,
                              env=_parent_env(temp), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(_pids(tmp_path)) < 2 and time.monotonic() < deadline and parent.poll() is None:
        time.sleep(0.05)
    pids = _pids(tmp_path)
    assert len(pids) == 2, parent.communicate(timeout=60)
    parent.kill()
    parent.communicate(timeout=60)
    deadline = time.monotonic() + 20
    while [p for p in pids if _alive(p)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if _alive(p)]
    got = sorted(p.name for p in tmp_path.glob("rank*.got*"))
    assert got == [f"rank0.got{SIGTERM}", f"rank1.got{SIGTERM}"], got
    left = [p.name for p in temp.iterdir()]  # a parent killed outright cannot remove its exit codes' folder
    assert len(left) == 1 and left[0].startswith("vsagen-exits-"), left
    shutil.rmtree(temp)


def test_die_with_agent_acts_only_in_a_worker_and_signals_at_once_where_the_agent_is_gone():
    assert die_with_agent({}) is False and die_with_agent({AGENT_PID_ENV: "x"}) is False
    code = ("import os, signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda s, f: sys.exit(7))\n"
            "from vsagen.parallel.spawn import die_with_agent\n"
            "print(die_with_agent({'%s': str(os.getppid() + 1)}), flush=True)\n"
            "time.sleep(30)\n" % AGENT_PID_ENV)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 7, res.stderr  # the parent named is not its parent: SIGTERM at once


def test_the_vsagen_entry_point_calls_die_with_agent(monkeypatch):
    import vsagen.parallel.spawn as spawn
    from vsagen.cli import app as cli_app

    called = []
    monkeypatch.setattr(spawn, "die_with_agent", lambda: called.append(1))
    monkeypatch.setattr(spawn, "record_exit", lambda code: called.append(("exit", code)))
    monkeypatch.setattr(sys, "argv", ["vsagen", "backends"])
    with pytest.raises(SystemExit) as e:
        cli_app.main()
    assert e.value.code == 0 and called == [1, ("exit", 0)]  # and it leaves its code for a --gpus agent
