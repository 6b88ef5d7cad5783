"""Structure of kernels/: every module imports alone, every module has a test file, the public names resolve. (No
import cycle and nothing read from the environment at import: tests/test_imports.py, for the whole package.)"""

from __future__ import annotations

import importlib
import pathlib
import subprocess
import sys

import pytest

KERNELS = pathlib.Path(__file__).resolve().parents[2] / "vsagen" / "kernels"
MODULES = sorted(p.stem for p in KERNELS.glob("*.py") if p.stem != "__init__")


def test_each_module_imports_alone():
    """A fresh interpreter per module imports vsagen.kernels.<name> first, with nothing imported before it (all
    started at once: each pays the torch import)."""
    procs = {name: subprocess.Popen([sys.executable, "-c", f"import vsagen.kernels.{name}"], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for name in MODULES}
    failed = {}
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=300)
        if proc.returncode:
            failed[name] = err[-1500:]
    assert not failed, failed


@pytest.mark.parametrize("name", MODULES)
def test_every_module_has_a_test_file(name):
    test = pathlib.Path(__file__).parent / f"test_{name}.py"
    assert test.exists(), f"tests/kernels/test_{name}.py is missing"
    assert f"vsagen.kernels.{name}" in test.read_text(), f"tests/kernels/test_{name}.py does not import it"


def test_public_names_resolve():
    kernels = importlib.import_module("vsagen.kernels")
    for name in kernels.__all__:
        assert getattr(kernels, name) is not None, name
    bsa = importlib.import_module("vsagen.kernels.block_sparse_attn")
    for name in ("bsa_fwd", "bsa_bwd", "use_tma", "interpreting", "BLOCK", "build_k2q", "block_sparse_attention"):
        assert hasattr(bsa, name), name
