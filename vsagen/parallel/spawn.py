"""A multi-process run started by vsagen itself (`--gpus N`, issue 29): torch.distributed's elastic launcher (the
agent behind torchrun: `torch.distributed.launcher.api.elastic_launch`, one host, a standalone c10d rendezvous as
`torchrun --standalone`, no restarts) runs `python -m vsagen ARGS` in N worker processes with RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR and MASTER_PORT set, so that each worker is what `torchrun --nproc_per_node N -m vsagen
ARGS` would start (`launch` reads that environment) and the parent only waits for them.

The terminal shows the workers' own output and nothing of the launcher's: rank 0 prints the notes, the progress
and the result, and on bad input its one `error:` line (the other ranks stay silent, as under torchrun); the
launcher's log lines are held back (shown with `verbose`) and its `ChildFailedError` is caught, so the parent
prints a line of its own only where no worker could (`exit_status`) and exits with the workers' code (2 for bad
input). The workers run in sessions of their own (the agent starts them so), so Ctrl-C at the terminal reaches
the parent alone, and the agent passes the signal (SIGINT, SIGTERM, SIGHUP) on to each worker, which unwinds as
one process does (nothing written; or, its files already in place, it finishes and exits 0), and waits for them
(SIGKILL after `SHUTDOWN_TIMEOUT_S`); the parent then exits with rank 0's code (`signalled_status`). A parent that dies
without passing a signal on (kill -9) takes its workers with it: each has the kernel send it SIGTERM then
(`die_with_agent`, called first by vsagen's entry point).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import tempfile
import uuid
from typing import Callable, Iterator, Mapping, Sequence

from ..interrupts import signal_name

# How long the agent waits for the workers to end after passing them a signal, before it kills them.
SHUTDOWN_TIMEOUT_S = 30
# The signals the agent passes on to the workers (what `vsagen.cli.app` turns into an interrupted run).
FORWARDED = ("SIGTERM", "SIGINT", "SIGHUP")
# Set in each worker's environment: the process id of the agent that started it (`die_with_agent`).
AGENT_PID_ENV = "VSAGEN_AGENT_PID"
# Set in each worker's environment: a folder of the agent's where each worker leaves its exit code (`record_exit`),
# read when a signal stopped the agent (whose launcher then reports no worker's code: `signalled_status`).
EXITS_ENV = "VSAGEN_WORKER_EXITS"
# Linux's prctl option that has the kernel signal a process when the thread that started it ends (<linux/prctl.h>).
_PR_SET_PDEATHSIG = 1


def die_with_agent(env: Mapping[str, str] | None = None) -> bool:
    """In a worker of `run_workers`: have the kernel send this process SIGTERM when its agent dies (Linux's
    `prctl(PR_SET_PDEATHSIG)`), so a parent killed outright (SIGKILL, a crash, a test runner stopped) leaves no
    worker behind: the SIGTERM unwinds the worker as an interrupted run (its temporary files removed, nothing
    written). An agent that died before the call (the worker's parent is no longer `env[AGENT_PID_ENV]`) gets the
    same signal at once. Nothing happens outside such a worker or off Linux.

    Returns:
        True where the death signal was set. `env`: the environment to read (default: this process's)."""
    agent = (os.environ if env is None else env).get(AGENT_PID_ENV, "")
    if not agent.isdigit() or not sys.platform.startswith("linux"):
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        return False
    if os.getppid() != int(agent):  # the agent ended between starting this process and the prctl
        os.kill(os.getpid(), signal.SIGTERM)
    return True


def record_exit(code: int, env: Mapping[str, str] | None = None) -> None:
    """In a worker of `run_workers`: leave this process's exit code in the agent's folder (`EXITS_ENV`) as
    `rank<RANK>`, for `signalled_status`. Nothing happens outside such a worker or where the folder is gone.
    `env`: the environment to read (default: this process's)."""
    env = os.environ if env is None else env
    folder, rank = env.get(EXITS_ENV, ""), env.get("RANK", "")
    if folder and rank.isdigit():
        with contextlib.suppress(OSError):
            with open(os.path.join(folder, f"rank{rank}"), "w") as f:
                f.write(str(code))


def recorded_exits(folder: str) -> dict[int, int]:
    """The exit codes the workers left in `folder` (`record_exit`), by rank; a worker that left none (killed, or
    ended outside vsagen's entry point) is absent."""
    codes = {}
    for name in os.listdir(folder):
        with contextlib.suppress(OSError, ValueError):
            with open(os.path.join(folder, name)) as f:
                codes[int(name.removeprefix("rank"))] = int(f.read())
    return codes


def signalled_status(signum: int, codes: Mapping[int, int]) -> int:
    """The parent's exit code when a signal reached it (and, passed on, every worker) while the workers ran: rank 0's
    own code where it left one, so the run ends as one process would at that point (0 where its files were
    already in place: the signal no longer stops the run, README; 130 / 143 / 129 and its line where it was
    interrupted); else 128 + `signum` (rank 0 ended before saying). The other ranks only follow rank 0."""
    return codes.get(0, 128 + signum)


def worker_threads(processes: int) -> int:
    """CPU threads per worker when OMP_NUM_THREADS is not set: this process's CPUs shared among the `processes`
    (torch would give each all of them, and N workers would then contend for the cores), at least 1."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cpus // processes)


def exit_status(codes: Mapping[int, int]) -> tuple[int, str | None]:
    """What the parent says and returns for workers that failed: (exit code, a line to print, or None where a
    worker printed its own).

    Args:
        codes: each failed worker's exit code by global rank (negative: ended by that signal, as the elastic
            agent reports it).

    Returns:
        The lowest rank's code among the workers that ended on their own error (1..127: the worker printed its
        `error:` line, e.g. 2 for bad input; the others, stopped by the agent afterwards, are not the cause); else
        1 and a line for a worker killed by a signal no one forwards (SIGKILL, SIGSEGV, ...); else the lowest rank's
        interrupted code (128 + the signal), with a line only where no worker got to print one.
    """
    ranks = sorted(codes)
    own = [r for r in ranks if 0 < codes[r] < 128]
    if own:
        return codes[own[0]], None
    forwarded = {int(getattr(signal, s)) for s in FORWARDED if hasattr(signal, s)}
    crashed = [r for r in ranks if codes[r] < 0 and -codes[r] not in forwarded]
    if crashed:
        name = signal_name(-codes[crashed[0]])
        why = " (out of memory?)" if name == "SIGKILL" else ""
        return 1, f"worker rank {crashed[0]} was killed by {name}{why}; the run was stopped"
    handled = [r for r in ranks if codes[r] >= 128]
    if handled:
        return codes[handled[0]], None
    first = ranks[0]
    return 128 - codes[first], f"interrupted by {signal_name(-codes[first])}; nothing was written"


# The loggers of the launcher (the agent, its processes and rendezvous; torch.distributed gives them its own stderr
# handler): held back unless verbose.
LAUNCHER_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher")


@contextlib.contextmanager
def _launcher_quiet(verbose: bool) -> Iterator[None]:
    """Hold back the launcher's log lines (the agent's warnings, its failure summary) unless `verbose`: its
    loggers end in a handler that drops them instead of passing them up to torch.distributed's stderr handler."""
    if verbose:
        yield
        return
    logs = [logging.getLogger(name) for name in LAUNCHER_LOGGERS]
    saved = [(log, log.propagate, logging.NullHandler()) for log in logs]
    for log, _, hold in saved:
        log.addHandler(hold)
        log.propagate = False
    try:
        yield
    finally:
        for log, propagate, hold in saved:
            log.removeHandler(hold)
            log.propagate = propagate


@contextlib.contextmanager
def _restored(env: Mapping[str, str]) -> Iterator[None]:
    """Set `env` in os.environ (the workers inherit it) and restore the environment and the signal handlers the
    agent replaces afterwards (what a caller in the same process, such as a test, would otherwise keep)."""
    names = [s for s in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT") if hasattr(signal, s)]
    handlers = {s: signal.getsignal(getattr(signal, s)) for s in names}
    touched = {k: os.environ.get(k) for k in (*env, "TORCHELASTIC_SIGNALS_TO_HANDLE")}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in touched.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for s, h in handlers.items():
            if h is not None:
                signal.signal(getattr(signal, s), h)


def run_workers(argv: Sequence[str], processes: int, *, prepare: Callable[[], object] = lambda: None,
                verbose: bool = False, err: Callable[[str], None] = lambda m: print(f"error: {m}", file=sys.stderr),
                program: Sequence[str] = ("-m", "vsagen")) -> int:
    """Run `python -m vsagen ARGV` in `processes` workers on this host through the elastic agent and wait for
    them; returns the exit code for this process (0: every worker succeeded).

    Args:
        argv: the command and its options, as `vsagen.cli.shared_options.command_line` gives them (the workers read
            their rank from the environment the agent sets).
        program: what this interpreter runs in each worker before `argv` (vsagen's command line; a test's script).
        processes: N >= 2 workers (local ranks 0..N-1: on CUDA, GPU i for local rank i, `launch.start`).
        prepare: called first, before any worker starts: what the workers would otherwise each build at once (the
            tiny checkpoint, `vsagen.models.loading.prepare_model_files`).
        verbose: let the launcher's own log lines through.
        err: prints a line of the parent's (`exit_status`), without the `error: ` prefix.

    Raises:
        KeyboardInterrupt: Ctrl-C before the workers started (no worker runs).
        ValueError: processes < 2.
    """
    if processes < 2:
        raise ValueError(f"run_workers starts 2 or more processes, got {processes}")
    prepare()
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=processes, run_id=f"vsagen-{uuid.uuid4().hex}", role="vsagen",
        rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", local_addr="127.0.0.1", max_restarts=0,
        logs_specs=DefaultLogsSpecs(log_dir=os.devnull),  # workers print to the terminal; no log or error files
        signals_to_handle=",".join(FORWARDED), shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    exits = tempfile.TemporaryDirectory(prefix="vsagen-exits-")  # each worker's code (`record_exit`)
    env = {AGENT_PID_ENV: str(os.getpid()), EXITS_ENV: exits.name}  # each worker dies with this process
    if "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(worker_threads(processes))
    with exits, _restored(env), _launcher_quiet(verbose):
        try:
            elastic_launch(config, sys.executable)(*program, *argv)
        except ChildFailedError as e:
            code, line = exit_status({rank: f.exitcode for rank, f in e.failures.items()})
            if line is not None:
                err(line)
            return code
        except SignalException as e:  # passed on to the workers, which ended as one process would (rank 0 says so)
            return signalled_status(int(e.sigval), recorded_exits(exits.name))
    return 0
