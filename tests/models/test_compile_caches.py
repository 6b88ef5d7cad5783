"""Issue 47 item 6: torch's on-disk compile caches in vsagen's cache folder, so a second vsagen process compiles
nothing the first compiled; a user's own TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR is kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from vsagen.models.compile_caches import INDUCTOR_VAR, TRITON_VAR, compile_cache_dirs, use_compile_caches

ROOT = Path(__file__).resolve().parents[2]

# One fresh process: vsagen's process setup, then a small torch.compile (a float64 matmul of fresh random inputs with
# odd sizes: Inductor's graph only calls the extern mm, so no C++ is built and the test stays quick), its result
# checked against einsum, and Dynamo's cache counters printed. argv[1] "cli": the setup runs before torch loads, as
# `vsagen.cli.main` runs it; "api": after torch._dynamo is imported (which writes Inductor's default folder into the
# environment), as `vsagen.load_pipeline` may run it.
_COMPILE_ONCE = """
import json, sys
if sys.argv[1] == "api":
    import torch._dynamo
from vsagen.models.compile_caches import use_compile_caches
set_here = use_compile_caches()
import torch
from torch._dynamo.utils import counters

def f(x, y):
    return x @ y.t()

x, y = torch.randn(3, 5, dtype=torch.float64), torch.randn(7, 5, dtype=torch.float64)
out = torch.compile(f, dynamic=False)(x, y)
assert torch.allclose(out, torch.einsum("ik,jk->ij", x, y), rtol=1e-12, atol=1e-12)
print(json.dumps({"set": set_here, "inductor": dict(counters["inductor"]), "aot": dict(counters["aot_autograd"])}))
"""


def _clean_env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in (INDUCTOR_VAR, TRITON_VAR, "TORCHINDUCTOR_FORCE_DISABLE_CACHES", "TORCHINDUCTOR_FX_GRAPH_CACHE",
                        "TORCHINDUCTOR_AUTOGRAD_CACHE")}
    env.update(VSAGEN_CACHE=str(cache), PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def _compile_in_fresh_process(env: dict[str, str], order: str) -> dict:
    res = subprocess.run([sys.executable, "-c", _COMPILE_ONCE, order], capture_output=True, text=True, env=env,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.splitlines()[-1])


@pytest.mark.slow
def test_second_process_finds_the_compiled_graph(tmp_path):
    """The first process (the commands' order) compiles and saves into <VSAGEN_CACHE>/compile/inductor; the second,
    fresh (the Python API's order, torch imported first), loads both AOTAutograd's entry and Inductor's FX graph from
    there (hits, no miss): it generates and compiles nothing."""
    cache = tmp_path / "vsagen-cache"
    env = _clean_env(cache)
    first = _compile_in_fresh_process(env, "cli")
    dirs = compile_cache_dirs(cache)
    assert first["set"] == {k: str(v) for k, v in dirs.items()}
    assert first["inductor"].get("fxgraph_cache_miss") == 1 and not first["inductor"].get("fxgraph_cache_hit")
    assert first["aot"].get("autograd_cache_saved") == 1
    assert any((dirs[INDUCTOR_VAR] / "fxgraph").rglob("*")) and any((dirs[INDUCTOR_VAR] / "aotautograd").iterdir())

    second = _compile_in_fresh_process(env, "api")
    assert second["set"] == first["set"]
    assert second["aot"].get("autograd_cache_hit") == 1 and not second["aot"].get("autograd_cache_miss")
    assert second["inductor"].get("fxgraph_cache_hit") == 1 and not second["inductor"].get("fxgraph_cache_miss")


@pytest.fixture
def env(monkeypatch, tmp_path):
    """A process environment with neither variable set and VSAGEN_CACHE at a fresh folder."""
    monkeypatch.delenv(INDUCTOR_VAR, raising=False)
    monkeypatch.delenv(TRITON_VAR, raising=False)
    monkeypatch.setenv("VSAGEN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_unset_variables_point_into_the_vsagen_cache(env):
    assert use_compile_caches() == {INDUCTOR_VAR: str(env / "compile" / "inductor"),
                                    TRITON_VAR: str(env / "compile" / "triton")}
    assert os.environ[INDUCTOR_VAR] == str(env / "compile" / "inductor")
    assert os.environ[TRITON_VAR] == str(env / "compile" / "triton")
    assert not env.exists()  # nothing made: Inductor and Triton make their folders when they first write


def test_a_users_settings_are_kept(env, monkeypatch, tmp_path):
    monkeypatch.setenv(INDUCTOR_VAR, str(tmp_path / "mine"))
    assert use_compile_caches() == {TRITON_VAR: str(env / "compile" / "triton")}
    assert os.environ[INDUCTOR_VAR] == str(tmp_path / "mine")
    monkeypatch.setenv(TRITON_VAR, str(tmp_path / "my-triton"))
    assert use_compile_caches() == {}
    assert (os.environ[INDUCTOR_VAR], os.environ[TRITON_VAR]) == (str(tmp_path / "mine"), str(tmp_path / "my-triton"))


def test_what_torch_filled_in_itself_is_replaced(env, monkeypatch, tmp_path):
    """Importing torch._dynamo writes Inductor's default folder into the environment, and Inductor's first Triton
    kernel a folder under it: those count as unset (torch's helper stood in for, so that torch need not load here;
    the real one is in the two-process test's second process)."""
    default = tmp_path / "torchinductor_someone"
    monkeypatch.setitem(sys.modules, "torch._inductor.runtime.cache_dir_utils",
                        types.SimpleNamespace(default_cache_dir=lambda: str(default)))
    monkeypatch.setenv(INDUCTOR_VAR, str(default))
    monkeypatch.setenv(TRITON_VAR, str(default / "triton" / "0"))
    assert set(use_compile_caches()) == {INDUCTOR_VAR, TRITON_VAR}
    assert os.environ[TRITON_VAR] == str(env / "compile" / "triton")
    monkeypatch.setenv(INDUCTOR_VAR, str(default) + "-mine")  # beside torch's default, not it: the user's
    monkeypatch.setenv(TRITON_VAR, str(default) + "-mine")
    assert use_compile_caches() == {}


def test_an_unwritable_cache_leaves_torchs_defaults(env, monkeypatch, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    monkeypatch.setenv("VSAGEN_CACHE", str(a_file / "cache"))
    assert use_compile_caches() == {}
    assert INDUCTOR_VAR not in os.environ and TRITON_VAR not in os.environ


def test_every_command_sets_them_before_it_runs(env, monkeypatch):
    """`vsagen.cli.main` (every command, `python -m vsagen`, `vsagen serve`, and the workers it starts, which inherit
    the environment) points the caches before the command runs: here `vsagen --version`."""
    from vsagen.cli import main

    monkeypatch.setattr(sys, "argv", ["vsagen", "--version"])
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 0
    assert os.environ[INDUCTOR_VAR] == str(env / "compile" / "inductor")
    assert os.environ[TRITON_VAR] == str(env / "compile" / "triton")
