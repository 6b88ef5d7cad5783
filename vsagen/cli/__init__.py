"""The command line (the interface layer): the Typer app and its commands' signatures (`app`), how a command runs
(`running`: errors as one line and an exit code, torchrun launches and `--gpus` workers, the decorator that gives a
command the shared request options), `vsagen serve`'s command function (`serving`), the options every command
declares alike (`shared_options`), `vsagen presets`
and `vsagen backends` (`listing`), and text fitted to the terminal (`terminal`). What a command does is
`vsagen.commands`'; nothing below this package imports it.

`main` is the `vsagen` console script (pyproject's `vsagen = "vsagen.cli:main"`) and `python -m vsagen`; it imports
the app when called, so importing this package stays light.
"""

from __future__ import annotations


def main() -> None:
    """Run the `vsagen` command line on `sys.argv` (`vsagen.cli.app.main`); exits with the command's code."""
    from .app import main as run

    run()
