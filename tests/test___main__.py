"""`python -m vsagen` (vsagen/__main__.py) is the `vsagen` command: what `torchrun -m vsagen` launches."""

from __future__ import annotations

import subprocess
import sys

import vsagen.__main__ as entry  # importing it runs nothing
from vsagen.cli import main  # the console script (pyproject: vsagen = "vsagen.cli:main")


def test_module_entry_is_the_console_script():
    assert entry.main is main


def test_python_m_vsagen_runs_the_cli():
    ok = subprocess.run([sys.executable, "-m", "vsagen", "--help"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "t2v" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "vsagen", "t2v", "--no-such-flag", "x"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr + bad.stdout


def test_at_exit_the_objects_alive_are_frozen_out_of_the_last_collection():
    """The interpreter's last garbage collection walked every object torch and diffusers made: 1.3 s of a tiny
    `vsagen t2v`'s 6 s went after its files were written. The entry point freezes them (`gc.freeze`) after the
    other exit handlers; a handler registered before it runs after it and sees them frozen."""
    code = ("import atexit, gc, sys\n"
            "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0, flush=True))\n"
            "from vsagen.cli import main\n"
            "sys.argv = ['vsagen', '--help']\n"
            "main()\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "frozen True", res.stdout[-500:]
