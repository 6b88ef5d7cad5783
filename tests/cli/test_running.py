"""`vsagen.cli.running`: errors as one line and an exit code, the environment switch, single-process commands."""

from __future__ import annotations

import signal

import pytest
import typer

from vsagen.cli.running import env_switch, from_torch_compile, run_guarded, single_process, torchrun_launch_or_exit
from vsagen.errors import BadInput, RunFailure
from vsagen.interrupts import SignalInterrupt


def _exit_code(fn, capsys) -> tuple[int, str]:
    with pytest.raises(typer.Exit) as e:
        run_guarded(fn, verbose=False)
    return e.value.exit_code, capsys.readouterr().err


def _raise(exc: BaseException):
    def fn() -> None:
        raise exc
    return fn


def test_library_errors_are_one_line_with_their_exit_code(capsys):
    assert _exit_code(_raise(BadInput("no such model 'x'")), capsys) == (2, "error: no such model 'x'\n")
    assert _exit_code(_raise(RunFailure("out of GPU memory")), capsys) == (1, "error: out of GPU memory\n")


def test_verbose_adds_the_traceback_of_a_library_error_and_keeps_its_exit_code(capsys):
    """A new-user trial: `--fps 0 --verbose` exited 1 with a traceback, where bad input is exit 2."""
    with pytest.raises(typer.Exit) as e:
        run_guarded(_raise(BadInput("--fps must be in [1, 240], got 0")), verbose=True)
    err = capsys.readouterr().err
    assert e.value.exit_code == 2 and err.startswith("Traceback (most recent call last)")
    assert err.endswith("error: --fps must be in [1, 240], got 0\n")


def test_other_errors_name_their_type_first_line_and_verbose(capsys):
    code, err = _exit_code(_raise(ValueError("first line\nsecond line")), capsys)
    assert code == 1 and err.count("\n") == 1
    assert err == "error: ValueError: first line (run again with --verbose for the traceback)\n"
    with pytest.raises(ValueError):  # --verbose: the traceback itself
        run_guarded(_raise(ValueError("x")), verbose=True)


def test_interrupts_exit_128_plus_the_signal_and_say_nothing_was_written(capsys):
    assert _exit_code(_raise(KeyboardInterrupt()), capsys) == (130, "error: interrupted; nothing was written\n")
    code, err = _exit_code(_raise(SignalInterrupt(signal.SIGTERM)), capsys)
    assert code == 143 and err == "error: interrupted by SIGTERM; nothing was written\n"


def test_a_closed_stdout_ends_quietly_with_exit_0(capsys):
    """A user trial: `vsagen t2v ... | head -1` exited 1 without a word once its files were written; stdout's reader
    gone (`StdoutClosed`) is no error: exit 0, nothing said."""
    from vsagen.cli.terminal import StdoutClosed

    assert _exit_code(_raise(StdoutClosed("stdout was closed")), capsys) == (0, "")


def test_torch_compile_failures_are_traced_through_the_cause_chain(capsys):
    Dynamo = type("Unsupported", (RuntimeError,), {"__module__": "torch._dynamo.exc"})
    try:
        try:
            raise Dynamo("graph break")
        except RuntimeError as inner:
            raise RuntimeError("backend failed") from inner
    except RuntimeError as outer:
        wrapped = outer
    assert from_torch_compile(wrapped) and not from_torch_compile(RuntimeError("plain"))
    _, err = _exit_code(_raise(wrapped), capsys)
    assert err.rstrip().endswith("it came from torch.compile: try without --compile)")


@pytest.mark.parametrize("value,want", [("", True), ("1", True), ("true", True), ("ON", True), (" yes ", True),
                                        ("0", False), ("false", False), ("off", False), ("No", False)])
def test_env_switch_reads_the_usual_spellings(monkeypatch, value, want):
    monkeypatch.setenv("VSAGEN_TEST_SWITCH", value)
    assert env_switch("VSAGEN_TEST_SWITCH", True) is want


def test_env_switch_warns_and_keeps_the_default_on_anything_else(monkeypatch):
    monkeypatch.setenv("VSAGEN_TEST_SWITCH", "maybe")
    with pytest.warns(RuntimeWarning, match="VSAGEN_TEST_SWITCH='maybe' is not one of .*; keeping off"):
        assert env_switch("VSAGEN_TEST_SWITCH", False) is False


def test_single_process_commands_refuse_a_launch_of_several(monkeypatch, capsys):
    ran: list[bool] = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    code, err = _exit_code(single_process(lambda: ran.append(True)), capsys)
    assert code == 2 and not ran and "runs in 2 processes (torchrun)" in err
    monkeypatch.setenv("WORLD_SIZE", "1")
    run_guarded(single_process(lambda: ran.append(True)), verbose=False)
    assert ran == [True]


def test_a_malformed_launch_environment_is_one_line_exit_2(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "two")
    with pytest.raises(typer.Exit) as e:
        torchrun_launch_or_exit()
    assert e.value.exit_code == 2 and capsys.readouterr().err.startswith("error: RANK='two'")
    monkeypatch.delenv("WORLD_SIZE")
    assert torchrun_launch_or_exit() is None
