"""The layout of tests/: every module at the root of vsagen/ has tests/test_<module>.py and every module of a room of
the package, vsagen/<room>/<module>.py, has tests/<room>/test_<module>.py, each importing its module (kernels/:
tests/kernels/test_package.py); every room of vsagen/ is in PACKAGES here (or is kernels/ or preset_data/); every
other test file is a feature-level one that tests/README.md names; no two test files share a basename (the test
folders are not packages, so pytest imports every test file by its basename)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
# package -> (its source folder, the folder of its test files)
PACKAGES = {"vsagen": (ROOT / "vsagen", TESTS),
            **{f"vsagen.{room}": (ROOT / "vsagen" / room, TESTS / room)
               for room in ("attention", "cache", "cli", "commands", "decode", "media", "models", "parallel", "quant",
                            "request", "serve", "sparsity")}}


def package_modules() -> list[tuple[str, str]]:
    return [(package, p.stem) for package, (src, _) in PACKAGES.items()
            for p in sorted(src.glob("*.py")) if p.stem != "__init__"]


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (`import a.b`, `from a.b import c` -> a.b and a.b.c)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def test_imported_modules_sees_every_form(tmp_path):
    f = tmp_path / "t.py"
    f.write_text("import vsagen.media.video as v\nfrom vsagen import timing\n\n"
                 "def g():\n    from vsagen.attention.spec import x\n")
    assert {"vsagen.media.video", "vsagen.timing", "vsagen.attention.spec"} <= imported_modules(f)


@pytest.mark.parametrize("package,name", package_modules(), ids=lambda v: v)
def test_every_module_has_a_test_file_that_imports_it(package, name):
    test = PACKAGES[package][1] / f"test_{name}.py"
    where = test.relative_to(ROOT)
    assert test.is_file(), f"{where} is missing (tests of {package}.{name} go there)"
    assert f"{package}.{name}" in imported_modules(test), f"{where} does not import {package}.{name}"


def test_other_test_files_are_named_in_the_readme():
    readme = (TESTS / "README.md").read_text()
    own = {f"test_{name}.py" for _, name in package_modules()}
    for folder in {tests for _, tests in PACKAGES.values()}:
        for test in sorted(folder.glob("test_*.py")):
            if test.name not in own:
                assert test.name in readme, (f"{test.relative_to(ROOT)} tests no module; say what it covers in "
                                             "tests/README.md")


def test_test_file_basenames_are_unique():
    names = [p.name for p in TESTS.rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert not list(TESTS.rglob("__init__.py"))  # rootdir-relative imports (`from conftest import ...`) rely on this


def test_every_room_of_the_package_has_its_test_folder():
    rooms = {p.name for p in (ROOT / "vsagen").iterdir() if (p / "__init__.py").is_file()}
    assert rooms - {"kernels", "preset_data"} == {name.split(".")[1] for name in PACKAGES if name != "vsagen"}
