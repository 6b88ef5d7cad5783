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
