"""Structure of kernels/: every module imports alone, the modules' imports of each other form no cycle, no module
reads the environment at import, and every module has a test file."""

from __future__ import annotations

import ast
import importlib
import pathlib
import subprocess
import sys

import pytest

KERNELS = pathlib.Path(__file__).resolve().parents[2] / "kernels"
MODULES = sorted(p.stem for p in KERNELS.glob("*.py") if p.stem != "__init__")


def sibling_imports(name: str) -> set[str]:
    """The kernels modules that kernels/<name>.py imports anywhere (module level or inside functions)."""
    tree = ast.parse((KERNELS / f"{name}.py").read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                out.add(node.module.split(".")[0])
            else:
                out.update(alias.name for alias in node.names)
        elif isinstance(node, (ast.ImportFrom, ast.Import)):
            names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            out.update(n.split(".")[2] for n in names if n and n.startswith("vsagen.kernels."))
    return out & set(MODULES)


def test_no_import_cycle():
    graph = {m: sibling_imports(m) for m in MODULES}
    state: dict[str, int] = {}  # 1 visiting, 2 done

    def visit(m: str, path: list[str]) -> None:
        if state.get(m) == 2:
            return
        assert state.get(m) != 1, f"import cycle: {' -> '.join(path + [m])}"
        state[m] = 1
        for n in sorted(graph[m]):
            visit(n, path + [m])
        state[m] = 2

    for m in MODULES:
        visit(m, [])
    assert "block_sparse_attn" not in graph["k2q"]  # the old cycle
    assert not graph["reference"] and not graph["tuning"]  # the torch-only leaves


def import_time_nodes(tree: ast.Module):
    """The nodes that run at import: everything but function and lambda bodies (decorators, default values and
    class bodies included)."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            stack.extend(node.decorator_list + node.args.defaults + [d for d in node.args.kw_defaults if d])
        elif not isinstance(node, ast.Lambda):
            stack.extend(ast.iter_child_nodes(node))


@pytest.mark.parametrize("name", MODULES + ["__init__"])
def test_no_environment_read_at_import(name):
    tree = ast.parse((KERNELS / f"{name}.py").read_text())
    for node in import_time_nodes(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb"):
            pytest.fail(f"kernels/{name}.py reads os.{node.attr} at import (line {node.lineno})")
        if isinstance(node, ast.Name) and node.id in ("environ", "getenv"):
            pytest.fail(f"kernels/{name}.py reads {node.id} at import (line {node.lineno})")


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
