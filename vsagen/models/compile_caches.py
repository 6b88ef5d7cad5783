"""torch's on-disk compile caches kept in vsagen's cache folder, so that a second vsagen process compiles nothing
the first one compiled (issue 47).

Two environment variables say where compiled code lives, and both are read when code is first compiled, not when
torch or Triton is imported (torch 2.11 / 2.13: `torch._inductor.runtime.cache_dir_utils.cache_dir`, Triton 3.6 / 3.9:
`triton.knobs.cache.dir`):

* `TORCHINDUCTOR_CACHE_DIR`: Inductor's FX graph cache (`fxgraph/`, the generated code of a graph keyed by the graph,
  its input shapes / strides / dtypes / devices, the Inductor config and torch's own sources;
  `torch._inductor.config.fx_graph_cache`, on by default) and AOTAutograd's cache (`aotautograd/`, the joint graph
  handed to Inductor; `torch._functorch.config.enable_autograd_cache`, on by default), with the C++ / Python modules
  they load. Inductor's Triton kernels are bundled into the FX graph cache entries
  (`bundle_triton_into_fx_graph_cache`, on by default outside Meta).
* `TRITON_CACHE_DIR`: Triton's compiled kernels (cubins keyed by the kernel's source, its constants and
  signature, the GPU target and Triton's version): vsagen's own Triton kernels, and Inductor's once loaded.

`use_compile_caches` points each into `<vsagen cache>/compile/` unless the user chose it. Dynamo's bytecode
tracing is not cached across processes: each process traces its compiled functions again, then finds the graphs
compiled (a cache hit skips AOTAutograd's tracing and Inductor's code generation and compilation).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .tiny import cache_dir, write_problem

INDUCTOR_VAR = "TORCHINDUCTOR_CACHE_DIR"
TRITON_VAR = "TRITON_CACHE_DIR"


def compile_cache_dirs(root: Path | None = None) -> dict[str, Path]:
    """Where vsagen keeps torch's compile caches: environment variable -> folder under `root` (default
    `cache_dir()`: $VSAGEN_CACHE, else $XDG_CACHE_HOME/vsagen, else ~/.cache/vsagen)."""
    base = (cache_dir() if root is None else root) / "compile"
    return {INDUCTOR_VAR: base / "inductor", TRITON_VAR: base / "triton"}


def _torch_filled(var: str, value: str) -> bool:
    """Whether `value` of `var` is what torch wrote there itself rather than the user: importing `torch._dynamo`
    sets TORCHINDUCTOR_CACHE_DIR to Inductor's default (/tmp/torchinductor_<user>), and Inductor's first Triton
    kernel sets TRITON_CACHE_DIR to a folder under it. Only possible once Inductor's cache helpers are imported."""
    utils = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    if utils is None:
        return False
    default = os.path.abspath(utils.default_cache_dir())
    value = os.path.abspath(value)
    return value == default if var == INDUCTOR_VAR else value.startswith(default + os.sep)


def use_compile_caches(root: Path | None = None) -> dict[str, str]:
    """Point torch's on-disk compile caches (Inductor's and Triton's) into vsagen's cache folder, for this process
    and the processes it starts; called by every `vsagen` command (`vsagen.cli.main`, before torch is imported), by
    `vsagen.load_pipeline` and by `vsagen.apply`.

    Each variable of `compile_cache_dirs(root)` is set only where the user has not set it: a value already in the
    environment is kept, unless torch put it there itself (`_torch_filled`: its default under the temporary folder,
    which the Python API may find once torch._dynamo is imported). Nothing is set where the vsagen cache folder
    cannot be written (`write_problem`): torch's defaults apply then. No folder is created here (Inductor and
    Triton create theirs when they first write).

    Args:
        root: vsagen's cache folder (default `cache_dir()`).

    Returns:
        The variables this call set, with their values (empty when the user's or torch's settings stand).
    """
    environ = os.environ
    root = cache_dir() if root is None else root
    wanted = {var: folder for var, folder in compile_cache_dirs(root).items()
              if not environ.get(var) or _torch_filled(var, environ[var])}
    if not wanted or write_problem(root) is not None:
        return {}
    for var, folder in wanted.items():
        environ[var] = str(folder)
    return {var: str(folder) for var, folder in wanted.items()}
