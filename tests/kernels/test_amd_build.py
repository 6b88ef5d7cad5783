"""Tests for kernels/amd_build.py: every kernel `rocm-vsa` launches, compiled for AMD Instinct gfx942 (MI300X /
MI325X) and gfx950 (MI355X) with each shipped HIP config on this CPU machine (`amd_build.main`, what `python -m
vsagen.kernels.amd_build` runs, in a subprocess without the Triton interpreter): no spill, LDS within the target's
limit, the one-pass hints present as `nt` loads in the AMDGCN; and the metadata parsing on known text. The same
subprocess builds the other kernels' AMD targets too (SLA*'s linear branches, the Triton tile expansion), so that
torch and Triton are imported once for all of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from vsagen.kernels import amd_build
from vsagen.kernels.amd_build import KernelBuild, count_loads, read_resources

# One pytest-xdist worker runs the whole file (`--dist loadgroup`, pyproject.toml): the module fixture compiles every
# kernel for AMD once, not in each worker.
pytestmark = pytest.mark.xdist_group("test_amd_build")

# Every kernel a rocm-vsa forward + backward launches (coarse stage, fine forward, backward, k2q, tile plans).
KERNELS = {"_tile_pool_kernel", "_tile_scores_kernel", "_top_k_kernel", "_tile_plan_kernel", "_bsa_fwd_kernel",
           "_k2q_map_kernel", "_k2q_compact_kernel", "_bsa_bwd_preprocess_kernel", "_bsa_bwd_dq_kernel",
           "_bsa_bwd_dkdv_kernel"}
HINTED = {"_bsa_fwd_kernel", "_bsa_bwd_dq_kernel", "_bsa_bwd_dkdv_kernel"}


# SLA*'s linear-branch kernels, compiled for gfx942 (MI300) with bf16 GEMM operands, D = 128: module -> (kernels,
# constexprs). Pointers named like index tensors (q2k, k2q, cnt, off) are int32, the others bf16, `eps` fp32, other
# arguments int32; constexprs a kernel lacks are left out.
LINEAR_KERNELS = {
    "vsagen.kernels.linear_branch": (["_kv_sums_kernel", "_apply_kernel", "_bwd_q_kernel", "_bwd_kv_kernel"],
                                     {"D": 128, "BLOCK_D": 128, "BLOCK": 32, "KIND": 0, "LOWP": True, "IEEE": False,
                                      "ROW_W": True, "ACC": True}),
    "vsagen.kernels.linear_marginal": (["_tile_sums_kernel", "_apply_kernel", "_bwd_q_kernel", "_bwd_k_kernel"],
                                       {"D": 128, "BLOCK_D": 128, "KIND": 0, "LOWP": True, "IEEE": False, "ACC": True,
                                        "PROJ": True, "DB": False}),
}

# One child process (without the interpreter: under it the kernels are not compilable objects) for every AMD build
# of the suite: each process imports torch and Triton anew (about 4 s of CPU). `rocm-vsa` as `python -m
# vsagen.kernels.amd_build --json --profile rocm-vsa` prints it (`main`); `vsa`: its forward's builds for gfx942;
# `linear`: the `v_mfma` instructions in the AMDGCN of each LINEAR_KERNELS kernel (argv[1]), compiled directly
# (REFERENCE.md: Triton compiles for AMD targets on any machine); `tile_expand`: rocm-vsa with tile=4x4x8 / 4x8x8
# launches the Triton tile expansion, captured for both targets.
_ALL_BUILDS = """
import contextlib, io, json, sys
from importlib import import_module
import torch, triton
from triton.backends.compiler import GPUTarget
from vsagen.kernels import amd_build
from vsagen.kernels.tile_expand_triton import expand_to_kernel_tiles_triton
from vsagen.layout import tile_layout
printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    code = amd_build.main(["--json", "--profile", "rocm-vsa"])
vsa = [(b.kernel, b.nt_loads, b.hinted) for b in amd_build.rocm_vsa_builds("gfx942", profile="vsa", backward=False)
       if b.kernel == "_bsa_fwd_kernel"]

def arg_type(name, consts):
    if name in consts:
        return "constexpr"
    if name.endswith("_ptr"):
        return "*i32" if any(t in name for t in ("q2k", "k2q", "cnt", "off")) else "*bf16"
    return "fp32" if name == "eps" else "i32"

linear = {}
for module, (names, consts) in json.loads(sys.argv[1]).items():
    mod = import_module(module)
    for name in names:
        fn = getattr(mod, name)
        src = triton.compiler.ASTSource(fn=fn, signature={n: arg_type(n, consts) for n in fn.arg_names},
                                        constexprs={k: v for k, v in consts.items() if k in fn.arg_names})
        asm = triton.compile(src, target=GPUTarget("hip", "gfx942", 64), options={"num_warps": 8}).asm["amdgcn"]
        linear[f"{module}.{name}"] = asm.count("v_mfma")

lay = tile_layout((5, 6, 10), (4, 8, 8))
q2k = torch.arange(3, dtype=torch.int32).expand(1, 2, lay.num_tiles, 3)
cnt = torch.full((1, 2, lay.num_tiles), 3, dtype=torch.int32)
tile_expand = {}
for target in ("gfx942", "gfx950"):
    builds = []
    with amd_build.capture_builds(target, builds):
        expand_to_kernel_tiles_triton(q2k, cnt, lay.tile_kernel_first, lay.tile_kernel_count,
                                      lay.kernel_tile_of, lay.kernel_tiles_per_tile)
    tile_expand[target] = [(b.kernel, b.problems()) for b in builds]
print(json.dumps({"code": code, "rocm-vsa": json.loads(printed.getvalue()), "vsa": vsa, "linear": linear,
                  "tile_expand": tile_expand}))
"""


@pytest.fixture(scope="module")
def builds():
    env = dict(os.environ, TRITON_INTERPRET="0")
    proc = subprocess.run([sys.executable, "-c", _ALL_BUILDS, json.dumps(LINEAR_KERNELS)], capture_output=True,
                          text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["code"] in (0, 1)  # 1: a build has a problem, which the tests below name
    return out


@pytest.fixture(scope="module")
def rocm_builds(builds):
    return builds["rocm-vsa"]


def test_every_kernel_and_config_compiles_for_both_targets(rocm_builds):
    from vsagen.kernels.tuning import arch_tuning

    for target in amd_build.TARGETS:
        mine = [b for b in rocm_builds if b["target"] == target]
        assert {b["kernel"] for b in mine} == KERNELS, target
        t = arch_tuning(amd_build.ARCH_OF_TARGET[target], 128, "rocm-vsa")
        for kernel, launch, hip in (("_bsa_fwd_kernel", t.fwd_launch, t.hip_fwd),
                                    ("_bsa_bwd_dq_kernel", t.bwd_dq_launch, t.hip_dq),
                                    ("_bsa_bwd_dkdv_kernel", t.bwd_dkdv_launch, t.hip_dkdv)):
            configs = [b["config"] for b in mine if b["kernel"] == kernel]
            assert len(configs) == len(launch), (target, kernel, configs)  # one build per size class
            for (_, warps, stages), config in zip(launch, configs):
                assert f"warps={warps} stages={stages} waves_per_eu={hip[0]} nonkdim={hip[1]}" in config


def test_no_spill_no_lds_overflow_and_the_hints_reach_the_loads(rocm_builds):
    for b in rocm_builds:
        assert b["problems"] == [], (b["target"], b["kernel"], b["config"], b["problems"])
        assert b["vgpr"] > 0 and b["waves_per_simd_vgpr"] >= 1
        assert b["lds"] <= amd_build.TARGETS[b["target"]]["lds_bytes"]
        if b["kernel"] in HINTED:
            assert b["hinted"] and b["nt_loads"] > 0, (b["target"], b["kernel"], b["config"])
        else:
            assert not b["hinted"] and b["nt_loads"] == 0


def test_vsa_profile_emits_no_nt_loads(builds):
    """The nt bits come from the hints: `vsa`'s own kernels for the same targets carry none (forward only)."""
    rows = builds["vsa"]
    assert rows and all(nt == 0 and not hinted for _, nt, hinted in rows)


@pytest.mark.parametrize("module", list(LINEAR_KERNELS))
def test_linear_branch_kernels_build_for_amd_instinct(builds, module):
    """Every kernel of SLA*'s `global` (kernels/linear_branch.py, 32-row blocks) and `marginal`
    (kernels/linear_marginal.py) branches compiles for gfx942 (MI300) with bf16 GEMM operands, D = 128, its GEMMs on
    the matrix cores: the ROCm path builds (no AMD GPU is lent; REFERENCE.md)."""
    names = LINEAR_KERNELS[module][0]
    mfma = {name: builds["linear"][f"{module}.{name}"] for name in names}
    assert all(n > 0 for n in mfma.values()), mfma


def test_tile_expansion_builds_for_amd_instinct(builds):
    """rocm-vsa with tile=4x4x8 / 4x8x8 launches the Triton tile expansion (kernels/tile_expand_triton.py): it
    compiles for gfx942 and gfx950 with no problem (spills, occupancy) that `amd_build` flags."""
    assert builds["tile_expand"] == {"gfx942": [["_expand_kernel", []]], "gfx950": [["_expand_kernel", []]]}


def test_capture_refuses_the_interpreter():
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        with amd_build.capture_builds("gfx942", []):
            pass


AMDGCN = """
    global_load_dwordx4 v[0:3], v[4:5], off
    global_load_dwordx4 v[8:11], v[4:5], off offset:64 nt
    buffer_load_dword v1, v2, s[0:3], 0 offen nt
    ; global_load_dword v9 comment
  - .agpr_count:     24
    .group_segment_fixed_size: 0
    .private_segment_fixed_size: 16
    .sgpr_count:     80
    .sgpr_spill_count: 0
    .vgpr_count:     280
    .vgpr_spill_count: 3
"""


def test_metadata_parsing_and_occupancy():
    assert count_loads(AMDGCN) == (3, 2)
    res = read_resources(AMDGCN)
    assert res == {"vgpr": 280, "agpr": 24, "sgpr": 80, "vgpr_spill": 3, "sgpr_spill": 0, "lds": 0, "scratch": 16}
    b = KernelBuild("k", "gfx942", "", 4, **dict(res, lds=40960), loads=3, nt_loads=0, hinted=True)
    assert b.waves_per_simd_vgpr == 1  # 280 -> 280 of 512 per lane: one wave
    assert b.waves_per_simd_lds == 1  # one 40 KiB workgroup of 4 waves per CU: one wave per SIMD
    assert len(b.problems()) == 2  # spills, and a hint that reached no load
    ok = KernelBuild("k", "gfx950", "", 8, vgpr=128, agpr=0, sgpr=40, lds=81920, scratch=0, vgpr_spill=0,
                     sgpr_spill=0, loads=2, nt_loads=2, hinted=True)
    assert ok.waves_per_simd_vgpr == 4 and ok.waves_per_simd_lds == 4 and ok.problems() == []
    big = KernelBuild("k", "gfx942", "", 4, vgpr=128, agpr=0, sgpr=40, lds=70000, scratch=0, vgpr_spill=0,
                      sgpr_spill=0, loads=2, nt_loads=0, hinted=False)
    assert big.problems() == ["LDS 70000 B > 65536 B"]


@pytest.mark.parametrize("argv,message", [
    (["--targets", "gfx90a"], "unknown target gfx90a"),
    (["--targets", "gfx942", "--head-dim", "300"], "head_dim"),
    (["--targets", "gfx942"], "TRITON_INTERPRET"),  # the tests run under the interpreter
])
def test_command_line_errors_are_one_line_and_exit_2(argv, message, capsys):
    assert amd_build.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]


@pytest.mark.parametrize("grid", [(5, 6, 10), (4, 4, 4), (9, 10, 13), (1, 3, 7)])
def test_tile_offsets_are_the_layouts(grid):
    """amd_build builds its own tile offsets (kernels import nothing of vsagen, issue 28): the layout's, partial tiles
    included."""
    import torch

    from vsagen.layout import tile_layout

    assert torch.equal(amd_build._tile_offsets(grid), tile_layout(grid).tile_offsets.to(torch.int32))
