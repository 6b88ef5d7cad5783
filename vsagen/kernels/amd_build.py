"""AMD build check: compile every Triton kernel that `rocm-vsa` launches for AMD Instinct targets on any machine (no
GPU needed) and read each compiled kernel's resource use from its AMDGCN.

Triton compiles for AMD targets without the hardware (`triton.compile(ASTSource(...),
target=GPUTarget("hip", "gfx942", 64))` returns the ttgir, llir, AMDGCN assembly and hsaco). To compile exactly what
a real run would launch, with the same arguments, specializations and launch options, `capture_builds` replaces
Triton's launch (`JITFunction.run`) while it is active: each launch is bound and specialized as Triton does for the
AMD target and compiled, never run. The launchers themselves then run end to end on small CPU tensors
(`rocm_vsa_builds`: VSA's coarse stage, the block-sparse forward and its backward: delta, dQ, dK/dV, the k2q
transpose and the tile plans), so every kernel and every size-class launch of a tuning is compiled with its own
(num_warps, num_stages) and HIP options (waves_per_eu, matrix_instr_nonkdim, kpack).

Read per kernel: from the AMDGCN metadata the VGPRs (on CDNA3 / CDNA4 the unified count, arch plus accumulation
registers) and of them the AGPRs, SGPRs, scratch bytes (private segment) and VGPR / SGPR spill counts; the LDS bytes
from the compiled kernel's metadata (Triton allocates LDS at launch, so the AMDGCN's fixed group segment is 0); the
waves per SIMD that the registers allow (512 unified VGPRs per lane, allocated in granules of 8, at most 8 waves)
and that the LDS allows; and the
global / buffer loads that carry the non-temporal `nt` bit, which is how a one-pass (streaming) hint
(`KernelTuning.one_pass_loads` "streaming") reaches AMD hardware (Triton's AMD backend drops eviction_policy).

The kernels must be imported without the Triton interpreter (TRITON_INTERPRET unset or 0): under it `@triton.jit`
makes interpreter functions, which cannot be compiled. `python -m vsagen.kernels.amd_build` runs the check in such a
process and prints a table (or JSON with `--json`); the tests call it as a subprocess.

Relies on Triton internals (`runtime.jit.create_function_from_signature`, `JITFunction._pack_args`; checked with
Triton 3.8): another Triton may need this module updated, and says so with a RuntimeError.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import re
import sys

import torch

# Per target: LDS bytes per workgroup / per CU (gfx942 64 KiB, gfx950 160 KiB) and the unified VGPRs per lane.
TARGETS = {"gfx942": {"lds_bytes": 64 * 1024, "vgprs": 512}, "gfx950": {"lds_bytes": 160 * 1024, "vgprs": 512}}
ARCH_OF_TARGET = {"gfx942": "rocm-cdna3", "gfx950": "rocm-cdna4"}  # `tuning.ARCH_DEFAULTS` keys
MAX_WAVES_PER_SIMD = 8
VGPR_GRANULE = 8
SIMDS_PER_CU = 4
_META = {"vgpr": "vgpr_count", "agpr": "agpr_count", "sgpr": "sgpr_count", "vgpr_spill": "vgpr_spill_count",
         "sgpr_spill": "sgpr_spill_count", "lds": "group_segment_fixed_size", "scratch": "private_segment_fixed_size"}
_LOAD = re.compile(r"^\s*(global_load|buffer_load)\w*\s+(.*)$")


@dataclasses.dataclass(frozen=True)
class KernelBuild:
    """One compiled launch: the kernel, its target and launch options, and its resources (bytes, registers)."""

    kernel: str
    target: str
    config: str  # e.g. "BLOCK_M=16 warps=4 stages=1 waves_per_eu=1 nonkdim=16 kpack=2"
    num_warps: int
    vgpr: int
    agpr: int
    sgpr: int
    lds: int
    scratch: int
    vgpr_spill: int
    sgpr_spill: int
    loads: int  # global / buffer load instructions in the AMDGCN
    nt_loads: int  # of which carry the non-temporal bit
    hinted: bool  # whether the launch asked for one-pass hints (EVICT / CACHE constexprs)

    @property
    def waves_per_simd_vgpr(self) -> int:
        """Waves per SIMD that the registers allow (the unified VGPR count in granules of 8, of the 512 per lane)."""
        regs = -(-max(1, self.vgpr) // VGPR_GRANULE) * VGPR_GRANULE
        return min(MAX_WAVES_PER_SIMD, TARGETS[self.target]["vgprs"] // regs)

    @property
    def waves_per_simd_lds(self) -> int:
        """Waves per SIMD that the LDS allows: workgroups per CU times the waves of one, over 4 SIMDs."""
        if self.lds == 0:
            return MAX_WAVES_PER_SIMD
        groups = TARGETS[self.target]["lds_bytes"] // self.lds
        return min(MAX_WAVES_PER_SIMD, groups * self.num_warps // SIMDS_PER_CU)

    def problems(self) -> list[str]:
        """What fails the check: spills, scratch, LDS past the target's limit, a hinted launch with no nt load."""
        out = []
        if self.vgpr_spill or self.sgpr_spill or self.scratch:
            out.append(f"spills (vgpr {self.vgpr_spill}, sgpr {self.sgpr_spill}, scratch {self.scratch} B)")
        if self.lds > TARGETS[self.target]["lds_bytes"]:
            out.append(f"LDS {self.lds} B > {TARGETS[self.target]['lds_bytes']} B")
        if self.hinted and self.nt_loads == 0:
            out.append("one-pass hint asked for but no load carries nt")
        return out


def read_resources(amdgcn: str) -> dict[str, int]:
    """The resource fields of a kernel's AMDGCN metadata (`_META` names -> ints; 0 when absent)."""
    out = {}
    for name, key in _META.items():
        m = re.search(rf"\.{key}:\s+(\d+)", amdgcn)
        out[name] = int(m.group(1)) if m else 0
    return out


def count_loads(amdgcn: str) -> tuple[int, int]:
    """(global / buffer loads, those with the nt bit) in AMDGCN text."""
    loads = nt = 0
    for line in amdgcn.splitlines():
        m = _LOAD.match(line)
        if m:
            loads += 1
            nt += " nt" in f" {m.group(2)} ".replace(",", " ")
    return loads, nt


def _triton_internals():
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource, make_backend
        from triton.runtime.jit import JITFunction, create_function_from_signature
    except ImportError as e:  # pragma: no cover - another Triton
        raise RuntimeError(f"the AMD build check needs Triton's compiler internals (checked with 3.8): {e}") from None
    if not hasattr(JITFunction, "_pack_args"):  # pragma: no cover
        raise RuntimeError("the AMD build check needs JITFunction._pack_args (Triton 3.8)")
    return GPUTarget, ASTSource, make_backend, JITFunction, create_function_from_signature


@contextlib.contextmanager
def capture_builds(target: str, builds: list[KernelBuild]):
    """While active, every Triton launch compiles its kernel for AMD `target` ("gfx942" / "gfx950") and appends a
    KernelBuild to `builds` instead of running; identical launches compile once. Outputs stay uninitialised.

    Raises:
        RuntimeError: under the Triton interpreter (kernels would not be JITFunctions), or a Triton without the
            internals this needs.
    """
    import triton

    from .tuning import interpreting

    if interpreting():
        raise RuntimeError("the AMD build check cannot run under TRITON_INTERPRET=1 (run it in a process without)")
    GPUTarget, ASTSource, make_backend, JITFunction, create_function_from_signature = _triton_internals()
    gpu = GPUTarget("hip", target, 64)
    backend = make_backend(gpu)
    seen: set = set()
    original = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        binder = create_function_from_signature(self.signature, self.params, backend)
        bound, spec, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = self._pack_args(backend, kwargs, bound, spec, options)
        key = (self.fn.__qualname__, repr(signature), repr(sorted(constexprs.items(), key=str)), repr(options))
        if key in seen:
            return None
        seen.add(key)
        compiled = triton.compile(ASTSource(self, signature, constexprs, attrs), target=gpu, options=options.__dict__)
        asm = compiled.asm["amdgcn"]
        named = {k[0] if isinstance(k, tuple) else k: v for k, v in constexprs.items()}
        names = [p.name for p in self.params]
        blocks = " ".join(f"{n}={named[i]}" for i, n in enumerate(names)
                          if i in named and n.startswith("BLOCK") and n != "BLOCK_D")
        config = (f"{blocks} warps={options.num_warps} stages={options.num_stages} waves_per_eu={options.waves_per_eu} "
                  f"nonkdim={options.matrix_instr_nonkdim} kpack={options.kpack}").strip()
        hinted = any(named.get(i) for i, n in enumerate(names) if n in ("EVICT", "CACHE"))
        loads, nt = count_loads(asm)
        res = dict(read_resources(asm), lds=int(compiled.metadata.shared))
        builds.append(KernelBuild(self.fn.__name__, target, config, options.num_warps, **res, loads=loads,
                                  nt_loads=nt, hinted=hinted))
        return None

    JITFunction.run = compile_only
    try:
        yield builds
    finally:
        JITFunction.run = original


def rocm_vsa_builds(target: str, head_dim: int = 128, heads: int = 12, grid=(5, 6, 10),
                    profile: str = "rocm-vsa", tuning=None, backward: bool = True) -> list[KernelBuild]:
    """Compile every kernel `rocm-vsa` launches (coarse stage, forward, backward, k2q, tile plans) for `target`
    with its shipped tuning for that target (`tuning.arch_tuning(arch, head_dim, profile)`, or the `tuning` given),
    on bf16 inputs of `heads` x `head_dim` over a latent `grid` with partial tiles (so the packed loops and every
    size class are built); `backward=False`: the forward's kernels only (coarse stage, tile plans, forward; the
    inputs still require grad). Returns the builds in launch order.

    Raises:
        KeyError: an unknown target; RuntimeError: as `capture_builds`.
    """
    from .block_sparse_attn import block_sparse_attention
    from .coarse import coarse_stage
    from .reference import top_k_from_sparsity
    from .tuning import arch_tuning

    tuning = arch_tuning(ARCH_OF_TARGET[target], head_dim, profile) if tuning is None else tuning
    off = _tile_offsets(grid)
    q, k, v = (torch.randn(1, int(off[-1]), heads, head_dim, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    builds: list[KernelBuild] = []
    with capture_builds(target, builds):
        c = coarse_stage(q.detach(), k.detach(), off, top_k_from_sparsity(0.875, off.numel() - 1), tuning=tuning)
        out, _ = block_sparse_attention(q, k, v, c.q2k, c.q2k_cnt, off, tuning=tuning)
        if backward:
            out.backward(torch.ones_like(out))
    return builds


def _tile_offsets(grid: tuple[int, int, int], tile: int = 4) -> torch.Tensor:
    """(n_tiles + 1,) int32 start of each (4, 4, 4) tile of `grid` in tile order (tiles t, h, w row-major, edge tiles
    partial), as `vsagen.layout.TileLayout.tile_offsets` (kernels import nothing of vsagen's)."""
    import itertools

    per_dim = [[min(tile, g - s) for s in range(0, g, tile)] for g in grid]
    sizes = [a * b * c for a in per_dim[0] for b in per_dim[1] for c in per_dim[2]]
    return torch.tensor([0, *itertools.accumulate(sizes)], dtype=torch.int32)


def _table(builds: list[KernelBuild]) -> str:
    head = ("target", "kernel", "config", "VGPR", "AGPR", "SGPR", "LDS B", "spill", "waves/SIMD vgpr", "lds",
            "nt loads", "status")
    rows = [head]
    for b in builds:
        rows.append((b.target, b.kernel, b.config, b.vgpr, b.agpr, b.sgpr, b.lds, b.vgpr_spill + b.sgpr_spill,
                     b.waves_per_simd_vgpr, b.waves_per_simd_lds, f"{b.nt_loads}/{b.loads}",
                     "; ".join(b.problems()) or "ok"))
    return "\n".join("| " + " | ".join(str(x) for x in r) + " |" for r in rows)


def main(argv: list[str] | None = None) -> int:
    """`python -m vsagen.kernels.amd_build [--targets gfx942,gfx950] [--profile rocm-vsa] [--head-dim 128] [--json]`:
    compile and report; exit 1 when a build has a problem (`KernelBuild.problems`), 2 on bad arguments or when it
    cannot run here (one `error:` line)."""
    ap = argparse.ArgumentParser(prog="python -m vsagen.kernels.amd_build", description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="gfx942,gfx950")
    ap.add_argument("--profile", default="rocm-vsa", choices=("vsa", "rocm-vsa"))
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    from .tuning import arch_tuning, interpreting

    targets = [t for t in args.targets.split(",") if t]
    try:
        if bad := [t for t in targets if t not in TARGETS] or not targets:
            raise ValueError(f"unknown target {', '.join(bad) or '(none)'}; known: {', '.join(TARGETS)}")
        for target in targets:
            arch_tuning(ARCH_OF_TARGET[target], args.head_dim, args.profile)  # the head dim's check
        if interpreting():
            raise RuntimeError("the AMD build check cannot run under TRITON_INTERPRET=1: unset it (or set 0)")
        builds = [b for target in targets
                  for b in rocm_vsa_builds(target, head_dim=args.head_dim, profile=args.profile)]
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([dict(dataclasses.asdict(b), waves_per_simd_vgpr=b.waves_per_simd_vgpr,
                               waves_per_simd_lds=b.waves_per_simd_lds, problems=b.problems()) for b in builds]))
    else:
        print(_table(builds))
    return 1 if any(b.problems() for b in builds) else 0


if __name__ == "__main__":
    sys.exit(main())
