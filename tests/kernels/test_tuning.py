"""Tests for kernels/tuning.py: `kernel_tuning`'s per-architecture defaults (faked capabilities, no GPU needed) and
`KernelTuning`'s validation and op-argument round trip."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import vsagen.kernels.tuning as tuning
from vsagen.kernels.tuning import KernelTuning, kernel_tuning, op_args


@pytest.fixture
def fake_gpu(monkeypatch):
    """fake_gpu(major, minor, hip=False): make cuda:0 report that capability (and ROCm when hip), outside the
    interpreter; returns kernel_tuning(cuda:0, 128)."""

    def make(major: int, minor: int, hip: bool = False) -> KernelTuning:
        monkeypatch.setenv("TRITON_INTERPRET", "0")  # read at call time only: the jit kernels are unaffected
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, minor))
        monkeypatch.setattr(torch.version, "hip", "6.2.0" if hip else None)
        return kernel_tuning(torch.device("cuda", 0), 128)

    return make


@pytest.mark.parametrize("major,minor", [(9, 0), (10, 0)])
def test_hopper_and_blackwell_get_tma_and_today_s_h200_defaults(fake_gpu, major, minor):
    t = fake_gpu(major, minor)
    assert t.tma_loads and t.pack_partial_tiles and t.bwd_two_streams and t.score_precision == "tf32"
    assert t.fwd_launch == ((64, 4, 3),)
    assert t.bwd_dq_launch == ((16, 4, 2), (32, 4, 2), (64, 4, 2))
    assert t.bwd_dkdv_launch == ((16, 4, 2), (32, 4, 2), (64, 4, 3))


@pytest.mark.parametrize("major,minor", [(8, 0), (8, 9), (12, 0)])
def test_other_nvidia_gets_pointer_loads(fake_gpu, major, minor):
    t = fake_gpu(major, minor)
    assert not t.tma_loads and t.bwd_two_streams and t.score_precision == "tf32"


def test_pre_ampere_has_no_tf32(fake_gpu):
    assert fake_gpu(7, 5).score_precision == "ieee"


@pytest.mark.parametrize("minor,precision", [(4, "tf32"), (5, "ieee"), (0, "ieee")])
def test_rocm_never_gets_tma_or_a_second_stream(fake_gpu, minor, precision):
    """MI300 reports capability 9.4 through torch.cuda: still no TMA; tf32 only where Triton's AMD backend allows
    it (gfx942)."""
    t = fake_gpu(9, minor, hip=True)
    assert not t.tma_loads and not t.bwd_two_streams and t.score_precision == precision


@pytest.mark.parametrize("minor,arch,kpack", [(4, "rocm-cdna3", None), (5, "rocm-cdna4", 1), (0, "rocm", 1)])
def test_rocm_vsa_on_rocm_takes_its_own_tables_by_itself(fake_gpu, minor, arch, kpack):
    """On a ROCm torch `vsa` already takes the HIP launch tables and options (seed 002's first change); gfx950
    only allows kpack 1 in Triton 3.8."""
    t = fake_gpu(9, minor, hip=True)
    assert tuning.device_arch(torch.device("cuda", 0)) == arch
    assert (t.fwd_launch, t.bwd_dq_launch, t.bwd_dkdv_launch) == tuning.HIP_LAUNCH[arch]
    wide = kernel_tuning(torch.device("cuda", 0), 256)
    assert (wide.fwd_launch, wide.bwd_dq_launch, wide.bwd_dkdv_launch) == tuning.HIP_WIDE_LAUNCH
    assert (wide.hip_fwd, wide.hip_dq, wide.hip_dkdv) == tuning.HIP_WIDE_OPTIONS
    assert (t.hip_fwd, t.hip_dq, t.hip_dkdv) == tuning.HIP_OPTIONS[arch]
    assert all(len(o) == 3 for o in (t.hip_fwd, t.hip_dq, t.hip_dkdv))
    if kpack is not None:
        assert {o[2] for o in (t.hip_fwd, t.hip_dq, t.hip_dkdv)} == {kpack}
    assert t.one_pass_loads == "cached" and t.lean_index  # the lean index walk: every arch's (the H200 kept it)
    r = kernel_tuning(torch.device("cuda", 0), 128, "rocm-vsa")
    assert r == dataclasses.replace(t, one_pass_loads="streaming")  # the hints: rocm-vsa's, on AMD


@pytest.mark.parametrize("major,minor", [(9, 0), (10, 0), (8, 0)])
def test_rocm_vsa_on_nvidia_differs_from_vsa_only_by_what_the_h200_kept(fake_gpu, major, minor):
    vsa = fake_gpu(major, minor)
    rocm = kernel_tuning(torch.device("cuda", 0), 128, "rocm-vsa")
    arch = tuning.device_arch(torch.device("cuda", 0))
    assert rocm == dataclasses.replace(vsa, **tuning.ROCM_VSA_CHANGES.get(arch, {}))
    assert rocm == vsa and vsa.lean_index  # nothing else helped on the H200: rocm-vsa is vsa on NVIDIA
    assert not rocm.hip_fwd and not vsa.hip_fwd  # Triton's NVIDIA backend refuses the HIP option names


def test_unknown_profile_and_arch():
    with pytest.raises(ValueError, match="profile"):
        kernel_tuning("cpu", 64, "fast")
    with pytest.raises(ValueError, match="arch"):
        tuning.arch_tuning("gfx942", 64)


def test_load_hints_and_hip_kwargs():
    t = kernel_tuning("cpu", 64)
    assert tuning.load_hints(t) == {"EVICT": "", "CACHE": ""}
    assert tuning.load_hints(dataclasses.replace(t, one_pass_loads="evict_first")) == {"EVICT": "evict_first",
                                                                                       "CACHE": ""}
    assert tuning.load_hints(dataclasses.replace(t, one_pass_loads="streaming")) == {"EVICT": "", "CACHE": ".cg"}
    cpu = torch.device("cpu")
    assert tuning.hip_kwargs((), cpu) == {}
    assert tuning.hip_kwargs((2, 16, 1), cpu) == {"waves_per_eu": 2, "matrix_instr_nonkdim": 16, "kpack": 1}


def test_hip_options_refused_on_nvidia(monkeypatch):
    """Triton's NVIDIA backend would raise a KeyError on the names: one ValueError naming the field instead; on a
    ROCm torch they pass."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(torch.version, "hip", None)
    with pytest.raises(ValueError, match="hip_.*NVIDIA"):
        tuning.hip_kwargs((1, 16, 2), torch.device("cuda", 0))
    assert tuning.hip_kwargs((), torch.device("cuda", 0)) == {}
    monkeypatch.setattr(torch.version, "hip", "6.2.0")
    assert tuning.hip_kwargs((1, 16, 2), torch.device("cuda", 0))["kpack"] == 2


def test_hip_options_all_three_or_none():
    base = kernel_tuning("cpu", 128)
    with pytest.raises(ValueError, match="all three"):
        dataclasses.replace(base, hip_fwd=(2, 16, 1))
    rocm = tuning.arch_tuning("rocm-cdna3", 128)
    with pytest.raises(ValueError, match="all three"):
        dataclasses.replace(rocm, hip_dq=())
    with pytest.raises(ValueError, match="head_dim"):
        kernel_tuning("cpu", 128.0)


def test_cpu_and_interpreter_defaults(monkeypatch):
    t = kernel_tuning(torch.device("cpu"), 64)
    assert not t.tma_loads and not t.bwd_two_streams and t.pack_partial_tiles
    assert kernel_tuning("cpu", 64) is t  # cached
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert tuning.device_arch(torch.device("cuda", 0)) == "cpu"  # the interpreter: no TMA, no second stream


@pytest.mark.parametrize("d,blk", [(1, 16), (16, 16), (40, 64), (64, 64), (130, 256), (256, 256)])
def test_head_dim_picks_the_launch_row(d, blk):
    t = kernel_tuning("cpu", d)
    assert tuning.block_d(d) == blk
    assert (t.fwd_launch, t.bwd_dq_launch, t.bwd_dkdv_launch) == (
        tuning.FWD_LAUNCH[blk], tuning.BWD_DQ_LAUNCH[blk], tuning.BWD_DKDV_LAUNCH[blk])


def test_head_dim_out_of_range():
    with pytest.raises(ValueError, match="head_dim"):
        kernel_tuning("cpu", 257)


def test_tables_are_immutable():
    with pytest.raises(TypeError):
        tuning.FWD_LAUNCH[128] = ((64, 8, 2),)
    t = kernel_tuning("cpu", 128)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.tma_loads = True


@pytest.mark.parametrize("field,value", [
    ("tma_loads", "sometimes"),  # the old TMA_LOADS modes are gone: a bool now
    ("tma_loads", "on"),
    ("pack_partial_tiles", 1),
    ("bwd_two_streams", None),
    ("score_precision", "fp8"),
    ("fwd_launch", ()),  # no class
    ("fwd_launch", ((16, 4, 3),)),  # no 64 class
    ("bwd_dq_launch", ((32, 4, 2), (16, 4, 2), (64, 4, 2))),  # not ascending
    ("bwd_dq_launch", ((24, 4, 2), (64, 4, 2))),  # not a power of two
    ("bwd_dkdv_launch", ((64, 3, 2),)),  # warps not a power of two
    ("bwd_dkdv_launch", ((64, 4, 0),)),  # no stage
    ("bwd_dkdv_launch", ((64, 4),)),  # not a triple
    ("fwd_launch", 64),  # not a sequence
    ("one_pass_loads", "evict_last"),
    ("lean_index", "yes"),
    ("fwd_warp_specialized", 1),
    ("hip_fwd", (2, 16)),  # not a triple
    ("hip_dq", (2, 24, 1)),  # no such MFMA
    ("hip_dkdv", (1, 16, 4)),  # kpack 1 or 2
    ("hip_fwd", 2),  # not a sequence
])
def test_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(kernel_tuning("cpu", 128), **{field: value})


def test_lists_are_stored_as_tuples_and_op_args_round_trip():
    t = dataclasses.replace(kernel_tuning("cpu", 128), fwd_launch=[[32, 2, 2], [64, 4, 3]], tma_loads=True)
    assert t.fwd_launch == ((32, 2, 2), (64, 4, 3))
    args = op_args(t)
    assert args[:4] == (True, True, False, "tf32") and args[4] == [32, 2, 2, 64, 4, 3]
    assert KernelTuning.from_op_args(*args) == t
    ws = dataclasses.replace(t, fwd_warp_specialized=True)  # the warp-specialized forward's switch crosses too
    assert op_args(ws)[-1] is True and KernelTuning.from_op_args(*op_args(ws)) == ws
    with pytest.raises(ValueError, match="bwd_dq_launch"):
        KernelTuning.from_op_args(*args[:5], [64, 4], args[6])
    rocm = tuning.arch_tuning("rocm-cdna3", 128, "rocm-vsa")
    args = op_args(rocm)
    assert args[7:9] == ("streaming", True) and len(args[9]) == 9
    assert KernelTuning.from_op_args(*args) == rocm
    with pytest.raises(ValueError, match="HIP"):
        KernelTuning.from_op_args(*args[:9], [1, 16])
