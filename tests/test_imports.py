"""The package's import structure: no import cycle among vsagen's modules (kernels included), and nothing decided by
an environment variable or a device query when a module is imported (issue 11: tuning and switches are data passed
down; the only environment override is read by the command line, once per command)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"vsagen": ROOT / "vsagen"}


def modules() -> dict[str, Path]:
    out = {}
    for pkg, folder in PACKAGES.items():
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
# or of a layer below, anywhere in the file (top level or inside a function). Every module belongs to one layer.
LAYERS = (
    ("kernels", ("vsagen.kernels",)),
    ("primitives", ("vsagen.errors", "vsagen.interrupts", "vsagen.architecture", "vsagen.layout", "vsagen.timing",
                    "vsagen.video", "vsagen.sheet", "vsagen.image", "vsagen.metrics", "vsagen.blocks", "vsagen.bench",
                    "vsagen.samplers", "vsagen.cache", "vsagen.cache_hooks",
                    "vsagen.attention",
                    "vsagen.sparsity", "vsagen.parallel")),
    ("request", ("vsagen.request", "vsagen.presets", "vsagen.models", "vsagen.checkpoint_layouts", "vsagen.tiny",
                 "vsagen.paths", "vsagen.transformer_files")),
    ("run", ("vsagen.api", "vsagen.pipeline", "vsagen.compiling", "vsagen.backend_weights", "vsagen.loading",
             "vsagen.estimate", "vsagen.decode_stream", "vsagen.light_vae", "vsagen.light_vae_attach")),
    ("commands", ("vsagen.commands",)),
    ("interface", ("vsagen", "vsagen.__main__", "vsagen.cli", "vsagen.cli_run", "vsagen.cli_options", "vsagen.listing",
                   "vsagen.terminal")),
)


def layer_of(name: str) -> int:
    """The index in LAYERS of module `name`: the layer of its longest matching prefix (a package or the module)."""
    best = max(((len(p), i) for i, (_, prefixes) in enumerate(LAYERS) for p in prefixes
                if name == p or name.startswith(p + ".")), default=None)
    assert best is not None, f"{name} belongs to no layer: add it to LAYERS (and docs/internals.md)"
    return best[1]


def test_layer_of_takes_the_longest_prefix():
    assert [layer_of(n) for n in ("vsagen.kernels.coarse", "vsagen.attention.vsa", "vsagen.request.resolve",
                                  "vsagen.pipeline", "vsagen.commands.profile", "vsagen.cli", "vsagen")] == \
        [0, 1, 2, 3, 4, 5, 5]


def test_no_module_imports_a_layer_above_it():
    """Issue 28: the primitives (attention/, sparsity/, parallel/, kernels/, layout, timing, video, image, ...) import
    no request, run or command module; requests import no run module; the run layer no command."""
    files = modules()
    wrong = []
    for name, path in sorted(files.items()):
        mine = layer_of(name)
        for dep in sorted(imported(name, path, files)):
            if layer_of(dep) > mine:
                wrong.append(f"{name} ({LAYERS[mine][0]}) imports {dep} ({LAYERS[layer_of(dep)][0]})")
    assert not wrong, "\n".join(wrong)
