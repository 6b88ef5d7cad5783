"""How a `vsagen` command runs: its errors as one line and an exit code, torchrun launches and `--gpus` workers, and
the decorator that gives a Typer command the shared request options (interface layer, beside `vsagen.cli.app`).

Library errors (`VsagenError`) become one line on stderr and exit code 2 (bad input) or 1 (failure while running);
tracebacks appear only with --verbose. The environment (torchrun's variables, `VSAGEN_FUSED_BLOCKS`) is read here,
at the command-line boundary, once per command.
"""

from __future__ import annotations

import inspect
import os
import signal
import typing
import warnings
from typing import Any, Callable

import typer

from ..errors import VsagenError
from ..request.options import RequestOptions
from .shared_options import SHARED
from .terminal import StdoutClosed, quiet_stdout


def env_switch(name: str, default: bool) -> bool:
    """A boolean environment switch: 1/true/on/yes or 0/false/off/no (any case); anything else warns and keeps
    `default`. Read here, at the command-line boundary, once per command (never at import): the library takes the
    value as a parameter."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in ("1", "true", "on", "yes"):
        return True
    if value in ("0", "false", "off", "no"):
        return False
    warnings.warn(f"{name}={value!r} is not one of 1/true/on/yes or 0/false/off/no; keeping "
                  f"{'on' if default else 'off'}", RuntimeWarning, stacklevel=2)
    return default


# The one switch of a code path read from the environment (for experiments): VSAGEN_FUSED_BLOCKS=0 turns off
# vsagen.blocks' compiled elementwise regions in eager CUDA runs (the run's `fused_blocks` setting).
FUSED_BLOCKS_ENV = "VSAGEN_FUSED_BLOCKS"


def err(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)


def from_torch_compile(e: BaseException) -> bool:
    """Whether `e` (or an exception it was raised from) comes out of torch._dynamo / torch._inductor."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if type(e).__module__.startswith(("torch._dynamo", "torch._inductor")):
            return True
        e = e.__cause__ or e.__context__
    return False


# How long a rank other than 0 of a launch waits, after its own error, for rank 0 to report (`linger`).
LINGER_S = 5.0


def linger(code: int) -> None:
    """A rank other than 0 of a launch failed: wait up to LINGER_S for rank 0 to fail the same way and print the
    line (torchrun ends the other ranks with SIGTERM once one exits, so leaving first could cut rank 0 off before
    it prints). A SIGTERM meanwhile ends this process with `code`, silently; returning means rank 0 did not end,
    so this rank's error is its own."""
    import time

    previous = signal.signal(signal.SIGTERM, lambda *_: os._exit(code))
    try:
        time.sleep(LINGER_S)
    finally:
        signal.signal(signal.SIGTERM, previous)


def report_interrupt(e: KeyboardInterrupt, speaks: bool = True) -> int:
    """The one line of a command an ending signal stopped, naming its first signal (`vsagen.interrupts.ending_line`;
    said once, also when the signal watcher ends the process meanwhile) where `speaks`; returns the exit code, 128 +
    the signal: 130 for Ctrl-C (a plain KeyboardInterrupt too), 143 for SIGTERM, 129 for SIGHUP."""
    from ..interrupts import ending_line, last_word

    signum = int(getattr(e, "signum", signal.SIGINT))
    if speaks:
        last_word(lambda: err(ending_line(signum, bool(getattr(e, "kept", False)))))
    return 128 + signum


def run_guarded(fn, verbose: bool, rank: int = 0) -> None:
    """Call fn(); map errors to one line and an exit code. A rank other than 0 of a launch prints its line only
    when rank 0 did not end meanwhile (`linger`), prefixed with its rank. stdout's reader gone while the report
    printed (`StdoutClosed`: `vsagen t2v ... | head -1`, the files in place) ends quietly, exit 0."""

    def report(msg: str, code: int) -> None:
        if rank != 0:
            linger(code)
            msg = f"rank {rank}: {msg}"
        err(msg)

    try:
        fn()
    except StdoutClosed:  # a user trial: exit 1 without a word (Rich's own handling), the files written
        quiet_stdout()
        raise typer.Exit(0) from None
    except VsagenError as e:
        if verbose:  # the traceback too, but the exit code stays the error's (2: bad input)
            import traceback

            traceback.print_exc()
        report(str(e), e.exit_code)
        raise typer.Exit(e.exit_code) from None
    except KeyboardInterrupt as e:
        raise typer.Exit(report_interrupt(e, rank == 0)) from None
    except (typer.Exit, typer.Abort):
        raise
    except Exception as e:  # noqa: BLE001 - the user gets one line; --verbose shows the traceback
        if verbose:
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        # torch.compile's own failures (dynamo, inductor, its C++ / Triton toolchains) name neither vsagen nor
        # --compile; say which option brought them in
        hint = "; it came from torch.compile: try without --compile" if from_torch_compile(e) else ""
        report(f"{type(e).__name__}: {first} (run again with --verbose for the traceback{hint})", 1)
        raise typer.Exit(1) from None


def check_model_available(cfg: Any) -> None:
    """A resolved request's model can be loaded as far as the Hugging Face cache and hub say, before torch imports
    (`vsagen.models.check_hub_files`: an uncached hub id offline is one line at once, not after the load began), and
    so can the published tiny VAE decoder `--vae tiny` reads (`vsagen.decode.tiny_files.check_tiny_vae`).

    Raises:
        ModelNotFound: see `check_hub_files`, `check_tiny_vae`."""
    from ..decode.tiny_files import check_tiny_vae
    from ..models.sources import check_hub_files

    check_hub_files(cfg.source, cfg.model, random_weights=cfg.random_weights,
                    transformer_files=bool(cfg.transformer_files))
    for vae in cfg.vae_decoders or (cfg.vae_decoder,):  # (compare: every --vae entry)
        check_tiny_vae(vae, cfg.source, cfg.random_weights)


def torchrun_launch_or_exit():
    """torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK) as a `Launch`, or None outside a launcher; read here,
    at the command-line boundary. Malformed: one error line, exit 2."""
    from ..errors import BadInput
    from ..parallel.launch import torchrun_launch

    try:
        return torchrun_launch(os.environ)
    except BadInput as e:
        err(str(e))
        raise typer.Exit(e.exit_code) from None


def single_process(run):
    """`run` refused under a launch of several processes (torchrun): `compare` and `search` have no `--ulysses`, and
    every rank would run and write the same files."""

    def guarded() -> None:
        from ..errors import BadInput
        from ..parallel.launch import torchrun_launch

        launch = torchrun_launch(os.environ)
        if launch is not None and launch.world_size > 1:
            raise BadInput(f"this command runs in {launch.world_size} processes (torchrun), but only t2v, i2v and "
                           "profile split a run (--ulysses, --cfg-parallel): start one process")
        run()

    return guarded


def request_command(keywords: tuple[str, ...], **overrides: tuple[Any, Any]) -> Callable[[Callable], Callable]:
    """Decorator of a Typer command that runs a Wan pipeline: add the shared options `keywords` to its signature
    (declared once in `vsagen.cli.shared_options.SHARED`; `overrides` gives a command its own declaration and default of
    one, e.g. profile's `--steps`), and call it with one `options=RequestOptions` built from them
    (`vsagen.request.options.request_options`: each group checks its values; a bad one is one error line, exit 2).
    The run's `fused_blocks` setting comes from the environment (`FUSED_BLOCKS_ENV`), read here once per command."""

    def wrap(fn: Callable) -> Callable:
        hints = typing.get_type_hints(fn, include_extras=True)
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints[p.name])
               for p in inspect.signature(fn).parameters.values() if p.name != "options"]
        shared = [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, annotation=overrides.get(k, SHARED[k])[0],
                                    default=overrides.get(k, SHARED[k])[1]) for k in keywords]

        def command(**kwargs: Any) -> None:
            flags = {k: kwargs.pop(k) for k in keywords}
            launch = torchrun_launch_or_exit()
            built: list[RequestOptions] = []

            def build() -> None:
                from ..request.options import request_options

                built.append(request_options(**flags, fused_blocks=env_switch(FUSED_BLOCKS_ENV, True)))

            run_guarded(build, kwargs.get("verbose", False), rank=0 if launch is None else launch.rank)
            fn(**kwargs, options=built[0])

        command.__name__, command.__qualname__, command.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
        last = [p for p in own if p.name in ("json_out", "verbose")]  # the output switches end the list
        params = [p for p in own if p not in last] + shared + last
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return wrap


def ran_in_workers(cfg: Any, launch: Any, verbose: bool) -> bool:
    """`--gpus N` (N > 1) outside a launcher: run this command in N workers started here (`vsagen.parallel.spawn`)
    after the request was checked; True once they succeeded, typer.Exit with their code if not. False: this process
    runs the command (one process, or a worker of a launch)."""
    if launch is not None or (cfg.gpus or 1) < 2:
        return False
    from ..models.loading import prepare_model_files
    from ..parallel.spawn import run_workers
    from .shared_options import command_line

    code = run_workers(command_line(), cfg.gpus, prepare=lambda: prepare_model_files(cfg), verbose=verbose, err=err)
    if code:
        raise typer.Exit(code)
    return True
