"""The package's import structure: no import cycle among vsagen's modules (kernels included), and nothing decided by
an environment variable or a device query when a module is imported (issue 11: tuning and switches are data passed
down; the only environment override is read by the command line, once per command)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"vsagen": ROOT / "vsagen"}


def modules(packages: dict[str, Path] = PACKAGES) -> dict[str, Path]:
    """Every module of `packages` (name -> its folder) by dotted name, each with its file."""
    out = {}
    for pkg, folder in packages.items():
        for f in sorted(folder.rglob("*.py")):
            rel = f.relative_to(folder).with_suffix("")
            parts = [] if rel.name == "__init__" else [rel.name]
            parts = list(rel.parent.parts) + parts
            name = ".".join([pkg, *parts])
            out[name] = f
    return out


def _is_package(name: str, files: dict[str, Path]) -> bool:
    return files[name].name == "__init__.py"


def imported(name: str, path: Path, files: dict[str, Path]) -> set[str]:
    """vsagen modules that module `name` imports anywhere (top level or inside functions), resolved; imports of
    its own ancestor packages are left out (a package is initialised before its submodules run, so those never
    form a cycle)."""
    tree = ast.parse(path.read_text())
    base = name if _is_package(name, files) else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                pkg = base
                for _ in range(node.level - 1):
                    pkg = pkg.rpartition(".")[0]
                mod = f"{pkg}.{mod}" if mod else pkg
            found.add(mod)
            found |= {f"{mod}.{a.name}" for a in node.names}
    return {m for m in found if m in files and m != name and not name.startswith(m + ".")}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a path [a, b, ..., a], or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (found := dfs(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := dfs(n)):
            return found
    return None


def test_find_cycle_sees_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_cycle():
    """Counting imports inside functions too: kernels/block_sparse_attn.py and kernels/k2q.py imported each other
    lazily before issue 11."""
    files = modules()
    cycle = find_cycle({n: imported(n, p, files) for n, p in files.items()})
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_top_level_folder_of_the_checkout_is_a_package():
    """`python -m pytest` (the README's test command) puts the checkout on sys.path, so a folder at its top that
    Python can import hides an installed package of the same name: a top-level `kernels/` hid the Hugging Face
    `kernels` package that transformers 5.25 installs, and diffusers failed to import in every test that built a
    model (CI, 2026-12-03). Everything importable lives under vsagen/."""
    importable = sorted(p.name for p in ROOT.iterdir()
                        if p.is_dir() and p.name.isidentifier() and p.name != "vsagen"
                        and ((p / "__init__.py").is_file() or any(p.glob("*.py"))))
    # tests/ and benchmarks/ hold scripts and test modules, no __init__.py: only a namespace package, which any
    # installed package of the same name wins over
    assert [n for n in importable if (ROOT / n / "__init__.py").is_file()] == []


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


READS = ("environ", "environb", "getenv", "get_device_capability", "is_available", "device_count")


@pytest.mark.parametrize("name", sorted(modules()))
def test_nothing_is_decided_at_import(name):
    """No top-level statement of the module reads the environment or queries the device."""
    path = modules()[name]
    for sub in import_time_nodes(ast.parse(path.read_text())):
        attr = sub.attr if isinstance(sub, ast.Attribute) else (sub.id if isinstance(sub, ast.Name) else None)
        assert attr not in READS, f"{path.relative_to(ROOT)}:{sub.lineno} reads {attr} at import"


# The layers of vsagen, bottom to top (docs/internals.md, "Layers"): a module imports only modules of its own layer
# or of a layer below, anywhere in the file (top level or inside a function). Every module belongs to one layer: a
# name covers that module and, for a package, everything under it, except the root package `vsagen`, which names only
# vsagen/__init__.py (so a new module at the root must be placed here). The longest name wins: a room of the package
# may put one module on another layer than the room's (the loader of models runs a request, above the models).
LAYERS = (
    ("kernels", ("vsagen.kernels",)),
    ("base", ("vsagen.errors", "vsagen.interrupts", "vsagen.architecture", "vsagen.layout", "vsagen.timing",
              "vsagen.blocks", "vsagen.samplers", "vsagen.wrapping")),
    ("media", ("vsagen.media",)),
    ("sparsity", ("vsagen.sparsity",)),
    ("parallel", ("vsagen.parallel",)),
    ("quant", ("vsagen.quant",)),
    ("attention", ("vsagen.attention", "vsagen.bench")),
    ("caching", ("vsagen.cache",)),
    ("models", ("vsagen.models", "vsagen.preset_data")),
    ("decode", ("vsagen.decode",)),
    ("request", ("vsagen.request",)),
    ("run", ("vsagen.api", "vsagen.pipeline", "vsagen.compiling", "vsagen.estimate", "vsagen.models.loading",
             "vsagen.models.python_loader", "vsagen.models.pipeline_weights")),
    ("commands", ("vsagen.commands",)),
    ("interface", ("vsagen", "vsagen.__main__", "vsagen.cli", "vsagen.serve")),
)


def layer_of(name: str, layers: tuple = LAYERS) -> int | None:
    """The index in `layers` of module `name` (the layer of its longest matching name), or None for a module that
    belongs to no layer."""
    def covers(p: str) -> bool:
        return name == p or (p != "vsagen" and name.startswith(p + "."))

    best = max(((len(p), i) for i, (_, prefixes) in enumerate(layers) for p in prefixes if covers(p)), default=None)
    return None if best is None else best[1]


def layering_faults(files: dict[str, Path], layers: tuple = LAYERS) -> list[str]:
    """One line per module of `files` in no layer of `layers` and per import of a module from a layer above its own."""
    wrong = [f"{name} belongs to no layer: add it to LAYERS (and docs/internals.md)"
             for name in sorted(files) if layer_of(name, layers) is None]
    for name, path in sorted(files.items()):
        mine = layer_of(name, layers)
        for dep in sorted(imported(name, path, files)):
            theirs = layer_of(dep, layers)
            if mine is not None and theirs is not None and theirs > mine:
                wrong.append(f"{name} ({layers[mine][0]}) imports {dep} ({layers[theirs][0]})")
    return wrong


def test_layer_of_takes_the_longest_name():
    names = ("vsagen.kernels.coarse", "vsagen.layout", "vsagen.media.video", "vsagen.sparsity.files",
             "vsagen.parallel.launch", "vsagen.attention.vsa", "vsagen.cache.install", "vsagen.models.presets",
             "vsagen.decode.stream", "vsagen.request.resolve", "vsagen.pipeline", "vsagen.commands.profile",
             "vsagen.cli.app", "vsagen")
    assert [LAYERS[layer_of(n)][0] for n in names] == [
        "kernels", "base", "media", "sparsity", "parallel", "attention", "caching", "models", "decode", "request",
        "run", "commands", "interface", "interface"]
    assert layer_of("vsagen.new_module") is None  # the root package names only itself


def _plant(root: Path, files: dict[str, str]) -> dict[str, Path]:
    """A synthetic vsagen/ under `root`: {relative path: source}, every folder a package; its module map."""
    for rel, text in files.items():
        path = root / "vsagen" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        for folder in [path.parent, *path.parent.parents]:
            if folder == root:
                break
            (folder / "__init__.py").touch()
    return modules({"vsagen": root / "vsagen"})


def test_the_check_catches_the_upward_imports_it_was_written_for(tmp_path):
    """Issue 44's four imports from a lower layer up, planted in a synthetic package: the pattern search imported
    attention, the Ulysses wrapper's module attention's base while the processor imported it back, the model sources
    the request's options, CFG parallel the method wrapper of attention's hooks. Each is one line; the imports the
    layers allow (the processor importing down, the request importing models, the loader of the models room, a layer
    above the room's, importing the request) are none; an unplaced module is one."""
    files = _plant(tmp_path, {
        "attention/base.py": "",
        "attention/hooks.py": "def wrap_method(): ...\n",
        "attention/processor.py": "from ..parallel.ulysses import UlyssesAttention\n",
        "sparsity/scoring.py": "def f():\n    from ..attention.base import Backend\n",
        "parallel/ulysses.py": "from ..attention.base import BackendWrapper\n",
        "parallel/cfg.py": "def g():\n    import vsagen.attention.hooks\n",
        "models/sources.py": "from ..request.options import DEFAULT_MODEL\n",
        "models/loading.py": "from ..request.resolve import Request\n",
        "request/options.py": "from ..models.sources import ModelSource\n",
        "request/resolve.py": "",
        "stray.py": "",
    })
    assert layering_faults(files) == [
        "vsagen.stray belongs to no layer: add it to LAYERS (and docs/internals.md)",
        "vsagen.models.sources (models) imports vsagen.request.options (request)",
        "vsagen.parallel.cfg (parallel) imports vsagen.attention.hooks (attention)",
        "vsagen.parallel.ulysses (parallel) imports vsagen.attention.base (attention)",
        "vsagen.sparsity.scoring (sparsity) imports vsagen.attention.base (attention)",
    ]


def test_no_module_imports_a_layer_above_it():
    """Issues 28 and 44: no module imports one of a layer above its own (LAYERS, bottom to top: kernels, base, media,
    sparsity, parallel, attention, caching, models, decode, request, run, commands, interface), and every module
    has its layer."""
    faults = layering_faults(modules())
    assert not faults, "\n".join(faults)


def test_the_package_root_holds_at_most_15_modules():
    """Issue 44: the root holds the public API, the orchestrator and the small primitives every layer shares; the
    rest lives in rooms (cli/, models/, decode/, cache/, media/, ...)."""
    root = sorted(p.name for p in (ROOT / "vsagen").glob("*.py"))
    assert len(root) <= 15, root


def test_every_package_is_installed_and_says_what_belongs_there():
    """Every folder of vsagen/ is a package that pyproject.toml installs, its __init__.py a docstring saying what
    belongs there."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = [p for p in sorted((ROOT / "vsagen").rglob("*")) if p.is_dir() and p.name != "__pycache__"
               and any(p.glob("*.py"))]
    for folder in folders:
        init = folder / "__init__.py"
        name = ".".join(folder.relative_to(ROOT).parts)
        assert init.is_file(), f"{folder.relative_to(ROOT)} has modules but no __init__.py"
        assert name in listed, f"{name} is missing from pyproject.toml's packages"
        assert ast.get_docstring(ast.parse(init.read_text())), f"{init.relative_to(ROOT)} has no docstring"
