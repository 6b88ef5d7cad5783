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


# One interpreter imports torch and triton (what every kernel module needs, ~1 s of CPU each time), then forks a
# child per module, which imports vsagen.kernels.<name> with no vsagen module loaded before it. (A fresh interpreter
# per module cost 28 s of the suite on 2 cores.)
IMPORT_EACH_ALONE = """
import os, sys, traceback
import torch, torch._dynamo, triton, triton.language
assert not [m for m in sys.modules if m.startswith("vsagen")]
failed = []
for name in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            __import__("vsagen.kernels." + name)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    if os.waitpid(pid, 0)[1]:
        failed.append(name)
print("failed:", " ".join(failed))
sys.exit(1 if failed else 0)
"""


def test_each_module_imports_alone():
    """Each vsagen.kernels.<name> imports first, with no vsagen module imported before it (a forked child each)."""
    res = subprocess.run([sys.executable, "-c", IMPORT_EACH_ALONE, *MODULES], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout[-500:] + res.stderr[-3000:]
    assert res.stdout.strip() == "failed:"


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
