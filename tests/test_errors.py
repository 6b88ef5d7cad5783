"""vsagen.errors: the error classes and the exit codes the CLI turns them into (2: bad input, 1: failure while
running), and that the CLI really exits with them."""

from __future__ import annotations

import pytest
from conftest import assert_one_error_line
from typer.testing import CliRunner

from vsagen.errors import BadInput, ModelNotFound, RunFailure, VsagenError


@pytest.mark.parametrize("cls,code", [(VsagenError, 1), (BadInput, 2), (ModelNotFound, 2), (RunFailure, 1)])
def test_exit_codes(cls, code):
    assert cls.exit_code == code
    err = cls("something specific")
    assert err.exit_code == code and str(err) == "something specific"
    assert isinstance(err, VsagenError) and isinstance(err, Exception)


def test_hierarchy():
    assert issubclass(ModelNotFound, BadInput)  # a missing model is bad input: exit 2, nothing written
    assert not issubclass(RunFailure, BadInput) and not issubclass(BadInput, RunFailure)
    with pytest.raises(BadInput):
        raise ModelNotFound("x")
    with pytest.raises(VsagenError):
        raise RunFailure("x")


@pytest.mark.parametrize("cls", [BadInput, ModelNotFound, RunFailure])
def test_the_cli_exits_with_the_class_exit_code(monkeypatch, tmp_path, cls):
    from vsagen.cli.app import app

    def fail(cfg, **kwargs):
        raise cls(f"{cls.__name__} from the library")

    monkeypatch.setattr("vsagen.commands.generate.generate", fail)
    res = CliRunner().invoke(app, ["t2v", "a fox", "--model", "tiny", "--device", "cpu",
                                   "--out", str(tmp_path / "v.mp4")])
    assert res.exit_code == cls.exit_code
    assert assert_one_error_line(res.stderr, res.stdout) == f"error: {cls.__name__} from the library"
