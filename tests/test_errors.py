"""vsagen.errors: the error classes and the exit codes the CLI turns them into (2: bad input, 1: failure while
running), and that the CLI really exits with them; the "did you mean" of a mistyped name."""

from __future__ import annotations

import pytest
from conftest import assert_one_error_line
from typer.testing import CliRunner

from vsagen.errors import BadInput, ModelNotFound, RunFailure, VsagenError, close_matches


def test_close_matches_are_the_close_names_closest_first_in_any_case():
    names = ["wan2.1-t2v-1.3b", "wan2.1-t2v-14b", "tiny", "tiny-i2v", "Hummingbird-XT"]
    assert close_matches("wan2.1-t2v-1.3", names) == ["wan2.1-t2v-1.3b", "wan2.1-t2v-14b"]
    assert close_matches("WAN2.1-T2V-1.3B", names)[0] == "wan2.1-t2v-1.3b"
    assert close_matches("hummingbird-x", names) == ["Hummingbird-XT"]  # the name as given
    assert close_matches("flux", names) == [] and close_matches("x", []) == []


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
