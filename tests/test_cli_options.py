"""vsagen.cli_options: every shared option is a typed Typer option with a help text, and the commands that take it
show that text."""

from __future__ import annotations

import typing

import pytest
import typer
from typer.testing import CliRunner

import vsagen.cli_options as options
from vsagen.cli import app

NAMES = [n for n in dir(options) if n[:1].isupper() and typing.get_origin(getattr(options, n)) is typing.Annotated]


def test_every_shared_option_has_a_help_text():
    assert {"Model", "Attn", "Out", "Ulysses", "CfgParallel"} <= set(NAMES)
    for name in NAMES:
        info = typing.get_args(getattr(options, name))[1]
        assert isinstance(info, typer.models.OptionInfo) and info.help and info.help.strip(), name


@pytest.mark.parametrize("command", ["t2v", "i2v", "profile", "compare", "search"])
def test_the_commands_show_the_shared_texts(command):
    res = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "--model" in res.stdout
    flat = " ".join(res.stdout.split())
    model_help = typing.get_args(options.Model)[1].help
    assert " ".join(model_help.split()) in flat


def test_an_unknown_option_is_offered_only_close_ones():
    """Issue 29: Click compared `--bogus` with the option names dashes included and offered `--out, --verbose`; the
    command line offers the names close to what was typed, without the dashes, or none."""
    from vsagen.cli_options import close_options

    names = ["--height", "--width", "--steps", "--seed", "--out", "--verbose", "--json", "--dtype", "--fps", "-v"]
    assert close_options("--bogus", names) == []
    assert close_options("--hieght", names) == ["--height"]
    assert close_options("--stpes", names) == ["--steps"]
    assert close_options("--sed", names) == ["--seed"]
    assert close_options("--verbos", names) == ["--verbose"]
