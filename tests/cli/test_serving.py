"""vsagen.cli.serving: `vsagen serve`'s command function as the app registers it (its options in the help), and the
refusals of its own flags before anything loads (--ray-address without --ray: one line, exit 2, no folder made)."""

from __future__ import annotations

from typer.testing import CliRunner

from vsagen.cli import serving
from vsagen.cli.app import app


def test_the_app_runs_this_serve_with_its_ray_options():
    (command,) = [c.callback for c in app.registered_commands if c.callback.__name__ == "serve"]
    assert command.__doc__ is serving.serve.__doc__  # (request_command's wrapper of this function)
    res = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    for option in ("--host", "--port", "--token", "--folder", "--queue", "--ray", "--replicas", "--ray-address"):
        assert option in res.stdout, option


def test_a_ray_address_without_ray_is_one_line_before_anything_loads(tmp_path):
    res = CliRunner().invoke(app, ["serve", "--model", "tiny", "--ray-address", "auto", "--folder",
                                   str(tmp_path / "f")])
    assert res.exit_code == 2 and res.stderr.startswith("error: --ray-address takes --ray") and \
        res.stderr.count("\n") == 1, res.stderr
    assert not (tmp_path / "f").exists()
