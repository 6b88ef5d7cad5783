"""The server's own settings (`vsagen.serve.settings`): loopback by default, a token required anywhere else,
bounds in one line; and through the command line, the refusal before anything loads (exit 2, one line)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from vsagen.cli.app import app
from vsagen.errors import BadInput
from vsagen.serve.settings import DEFAULT_HOST, MAX_QUEUE, TOKEN_ENV, Settings, is_loopback


def test_loopback_names():
    for host in ("127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost", "LOCALHOST "):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "192.168.1.2", "10.0.0.1", "example.org", "127.0.0.1.example.org"):
        assert not is_loopback(host), host


def test_the_defaults_listen_on_loopback_without_a_token():
    s = Settings()
    assert (s.host, s.port, s.token, s.folder, s.queue) == (DEFAULT_HOST, 8000, None, Path("vsagen-serve"), 16)
    assert s.url == "http://127.0.0.1:8000" and Settings(host="::1", port=9).url == "http://[::1]:9"
    assert Settings(host="0.0.0.0", token="abc").token == "abc"
    assert Settings(folder="~/x").folder == Path("~/x").expanduser()


@pytest.mark.parametrize("kwargs,words", [
    ({"host": "0.0.0.0"}, f"--host 0.0.0.0 lets other machines reach the server: give it a token (--token, or the "
                          f"environment variable {TOKEN_ENV}), or keep the default --host 127.0.0.1"),
    ({"port": 0}, "--port must be in [1, 65535], got 0"),
    ({"port": 70000}, "--port must be in [1, 65535], got 70000"),
    ({"queue": 0}, f"--queue must be in [1, {MAX_QUEUE}], got 0"),
    ({"token": ""}, "--token must be one word without spaces"),
    ({"token": "a b"}, "--token must be one word without spaces"),
    ({"host": " "}, "--host is empty"),
])
def test_bad_settings_are_one_line(kwargs, words):
    with pytest.raises(BadInput) as e:
        Settings(**kwargs)
    assert str(e.value).startswith(words)


def test_the_command_refuses_another_host_without_a_token_before_loading(tmp_path, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    res = CliRunner().invoke(app, ["serve", "--model", "tiny", "--host", "0.0.0.0", "--folder", str(tmp_path / "f")])
    assert res.exit_code == 2 and res.stderr.startswith("error: --host 0.0.0.0 lets other machines reach the server")
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "f").exists()
    res = CliRunner().invoke(app, ["serve", "--model", "tiny", "--steps", "0", "--folder", str(tmp_path / "f")])
    assert res.exit_code == 2 and res.stderr == "error: --steps must be in [1, 10000], got 0\n"


def test_a_missing_server_package_is_one_line(monkeypatch):
    import importlib.util

    from vsagen.serve.settings import check_installed

    check_installed()  # (installed here)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvicorn" else real(name, *a))
    with pytest.raises(BadInput, match=r"^vsagen serve needs uvicorn: pip install 'vsagen\[serve\]'$"):
        check_installed()
