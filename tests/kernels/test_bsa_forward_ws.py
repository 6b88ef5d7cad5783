"""`kernels/bsa_forward_ws`: the warp-specialized Gluon forward. Gluon does not run under the Triton interpreter, so
here: the kernel compiles for sm_90a (Hopper) at each head dim without spilling, where it may run (`ws_unsupported`,
`ws_forward_pays`), and `bsa_fwd` falls back to the pipelined kernel wherever it cannot (same numbers as without the
request, checked against a float64 reference). Its numbers on a GPU: benchmarks/fwd_ws.py."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import types

import pytest
import torch

import vsagen.kernels.reference as ref
import vsagen.kernels.bsa_forward_ws as ws
import vsagen.kernels.runtime_notes as notes
from vsagen.kernels.bsa_forward import bsa_fwd
from vsagen.kernels.tuning import kernel_tuning
from vsagen.layout import tile_layout

needs_gluon = pytest.mark.skipif(not ws.have_gluon(), reason="this Triton has no Gluon")


# Compiled in a child process without TRITON_INTERPRET (conftest sets it; under the interpreter gluon.jit makes
# interpreted functions, not compilable ones). Prints one JSON object per (head dim, dtype).
_COMPILE = r"""
import json, os, re, subprocess, sys, tempfile
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime.jit import mangle_type
import vsagen.kernels.bsa_forward_ws as ws

tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
for head_dim, dt in json.loads(sys.argv[1]):
    dtype = getattr(torch, dt)
    el = "bf16" if dtype == torch.bfloat16 else "fp16"
    x = torch.empty(640, 2 * head_dim, dtype=dtype)
    desc = mangle_type(TensorDescriptor(x, [640, 2 * head_dim], [2 * head_dim, 1], [64, head_dim],
                                        ws._smem_layout(head_dim, dtype)))
    kernel = ws._bsa_fwd_ws_kernel
    params = [p.name for p in kernel.params]
    types = [desc, desc, desc, "*" + el, "*fp32", "*i32", "*i32", "*i32"] + ["i32"] * 12 + ["fp32"]
    consts = {"HEAD_DIM": head_dim, "STAGES": ws.STAGES, "num_warps": 4}
    sig = dict(zip(params, types)) | {k: "constexpr" for k in consts}
    src = GluonASTSource(kernel, sig, {(params.index(k),): v for k, v in consts.items()})
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "maxnreg": ws.MAX_REGS})
    use = None
    if os.path.exists(tool):
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(c.asm["cubin"])
            f.flush()
            text = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", text)
        use = dict(zip(("reg", "stack", "shared", "local"), map(int, m.groups())))
    ptx = c.asm["ptx"]
    print(json.dumps(dict(head_dim=head_dim, warps=c.metadata.num_warps, shared=c.metadata.shared, use=use,
                          wgmma="wgmma.mma_async" in ptx, tma="cp.async.bulk.tensor" in ptx,
                          mbarrier="mbarrier" in ptx)))
"""
CASES = [(128, "bfloat16"), (64, "float16")]


@pytest.fixture(scope="module")
def compiled():
    """The kernel compiled for sm_90a by this Triton (no GPU needed) at each of CASES, with the launcher's
    constexprs and launch options (integer arguments unspecialized)."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    res = subprocess.run([sys.executable, "-c", _COMPILE, json.dumps(CASES)], capture_output=True, text=True,
                         env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return [json.loads(line) for line in res.stdout.splitlines()]


@needs_gluon
def test_compiles_for_sm90_without_spills(compiled):
    assert [c["head_dim"] for c in compiled] == [d for d, _ in CASES]
    for c in compiled:
        assert c["warps"] == 8  # one consumer warpgroup + the producer warp (padded to a warpgroup)
        # the ring and the query tile; two CTAs per SM at D = 128 (228 KB of shared memory per SM, 1 KB each kept)
        tiles = (1 + 2 * ws.STAGES) * 64 * c["head_dim"] * 2
        assert tiles <= c["shared"] < tiles + 1024
        assert 2 * (c["shared"] + 1024) <= 228 * 1024
        assert c["wgmma"] and c["tma"] and c["mbarrier"]
        if c["use"] is not None:  # cuobjdump bundled with this Triton
            assert c["use"]["local"] == 0 and c["use"]["stack"] == 0 and c["use"]["reg"] <= ws.MAX_REGS


def test_unsupported_off_hopper():
    q = torch.randn(1, 64, 2, 128, dtype=torch.bfloat16)
    assert "NVIDIA GPU" in ws.ws_unsupported(q, q, q)


def test_pays_where_measured_faster():
    assert ws.ws_forward_pays(256, False) and ws.ws_forward_pays(256, True)
    assert ws.ws_forward_pays(64, True) and ws.ws_forward_pays(128, True)  # whole cubes
    assert not ws.ws_forward_pays(64, False) and not ws.ws_forward_pays(128, False)  # partial ones: packed


def test_launcher_refuses_where_it_cannot_run():
    q = torch.randn(1, 80, 2, 64, dtype=torch.bfloat16)
    offs = torch.tensor([0, 64, 80], dtype=torch.int32)
    q2k = torch.tensor([[[[0, 1], [1, 0]]] * 2], dtype=torch.int32)
    cnt = torch.full((1, 2, 2), 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="bsa_fwd_ws: not an NVIDIA GPU"):
        ws.bsa_fwd_ws(q, q, q, q2k, cnt, offs)
    with pytest.raises(ValueError, match="int32"):  # the contract's checks first (int64 indices)
        ws.bsa_fwd_ws(q, q, q, q2k.long(), cnt, offs)


def test_bsa_fwd_runs_the_pipelined_kernel_where_the_ws_one_cannot():
    """A tuning asking for the warp-specialized forward on a device where it cannot run (the interpreter here) gets
    the pipelined kernel: the same bits as without the request, and VSA's fine stage against float64 (partial
    tiles, batch 2, an empty row)."""
    lay = tile_layout((5, 6, 7), (4, 4, 4))  # partial tiles on every axis
    n, b, h, d = lay.num_tiles, 2, 2, 32
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(b, lay.num_tokens, h, d, generator=g) for _ in range(3))
    top_k = 3
    q2k = torch.stack([torch.randperm(n, generator=g)[:top_k].sort().values for _ in range(b * h * n)])
    q2k = q2k.view(b, h, n, top_k).to(torch.int32)
    cnt = torch.full((b, h, n), top_k, dtype=torch.int32)
    cnt[1, 0, 2] = 0  # an empty row: output 0, lse -inf
    plain = kernel_tuning(q.device, d)
    asked = dataclasses.replace(plain, fwd_warp_specialized=True)
    out, lse = bsa_fwd(q, k, v, q2k, cnt, lay.tile_offsets_i32, tuning=asked)
    out0, lse0 = bsa_fwd(q, k, v, q2k, cnt, lay.tile_offsets_i32, tuning=plain)
    assert torch.equal(out, out0) and torch.equal(lse, lse0)
    want, want_lse = ref.block_sparse_attention_reference(*(x.double() for x in (q, k, v)), q2k.long(), lay.slots,
                                                          lay.slot_valid)
    empty = lay.token_tile == 2  # query tile 2's tokens, whose row of batch 1 head 0 selected nothing
    want[1, empty, 0] = 0
    want_lse[1, 0, empty] = float("-inf")
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse.double(), want_lse, atol=2e-5, rtol=2e-5)


def test_index_operands_give_the_kernel_unit_stride_rows():
    """The kernel walks a q2k row, a count row and the offsets as runs: strided views come back as copies with unit
    stride and the same values; tensors already so are passed as they are."""
    q2k = torch.randint(0, 9, (2, 3, 9, 5), dtype=torch.int32)
    cnt = torch.randint(0, 6, (2, 9, 3), dtype=torch.int32).transpose(1, 2)  # (B, H, n) with stride 3 on n
    offs = torch.arange(0, 640, 64, dtype=torch.int32)[::2]  # stride 2
    got_q2k, got_cnt, got_offs = ws.index_operands(q2k.transpose(2, 3).contiguous().transpose(2, 3), cnt, offs)
    for got, want in ((got_q2k, q2k), (got_cnt, cnt), (got_offs, offs)):
        assert torch.equal(got, want) and got.stride(-1) == 1
    same = ws.index_operands(q2k, cnt.contiguous(), offs.contiguous())
    assert same[0] is q2k


def test_bsa_fwd_dispatches_on_the_switch(monkeypatch):
    """Where the kernel can run (stood in here), `bsa_fwd` hands the call to it exactly when the tuning asks, with
    the call's operands, and returns its result."""
    lay = tile_layout((4, 4, 9), (4, 4, 4))
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, lay.num_tokens, 2, 16, generator=g) for _ in range(3))
    n = lay.num_tiles
    q2k = torch.arange(n, dtype=torch.int32).expand(1, 2, n, n).contiguous()
    cnt = torch.full((1, 2, n), n, dtype=torch.int32)
    calls = []
    sentinel = (torch.zeros_like(q), torch.zeros(1, 2, lay.num_tokens))

    def stand_in(*args, **kwargs):
        calls.append(args)
        return sentinel

    monkeypatch.setattr(ws, "ws_unsupported", lambda q, k, v: None)
    monkeypatch.setattr(ws, "launch_ws", stand_in)
    plain = kernel_tuning(q.device, 16)
    assert bsa_fwd(q, k, v, q2k, cnt, lay.tile_offsets_i32, 0.3,
                   tuning=dataclasses.replace(plain, fwd_warp_specialized=True)) is sentinel
    assert len(calls) == 1 and calls[0][:6] == (q, k, v, q2k, cnt, lay.tile_offsets_i32) and calls[0][6] == 0.3
    out, _ = bsa_fwd(q, k, v, q2k, cnt, lay.tile_offsets_i32, tuning=plain)
    assert len(calls) == 1 and out.abs().sum() > 0  # not asked: the pipelined kernel


def test_a_triton_whose_warp_specialize_takes_other_arguments_has_no_usable_gluon(monkeypatch):
    """Triton 3.5's `warp_specialize(default_args, default_partition, worker_args, ...)` would not compile the
    kernel: `have_gluon` says no there, so `bsa_fwd` keeps the pipelined kernel instead of failing."""
    if not ws.have_gluon():
        pytest.skip("this Triton has no Gluon")
    from triton.experimental.gluon import language as gl

    def old_api(default_args, default_partition, worker_args, worker_partitions, worker_num_warps,
                worker_num_regs, _semantic=None, _generator=None):
        raise AssertionError("not called")

    ws.have_gluon.cache_clear()
    monkeypatch.setattr(gl, "warp_specialize", old_api)
    try:
        assert not ws.have_gluon()
    finally:
        monkeypatch.undo()
        ws.have_gluon.cache_clear()
    assert ws.have_gluon()


def _small_case(seed: int):
    """q, k, v (1, S, 2, 16) bf16 (the kernel's dtypes) on a layout with partial tiles, full q2k rows, the offsets."""
    lay = tile_layout((4, 4, 9), (4, 4, 4))
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, lay.num_tokens, 2, 16, generator=g).to(torch.bfloat16) for _ in range(3))
    n = lay.num_tiles
    q2k = torch.arange(n, dtype=torch.int32).expand(1, 2, n, n).contiguous()
    return q, k, v, q2k, torch.full((1, 2, n), n, dtype=torch.int32), lay.tile_offsets_i32


class _FailingKernel:
    """Stands in for the Gluon kernel where its compile fails, as Triton 3.9 failed on the removed
    `async_copy_global_to_shared`: a CompilationError whose cause is the API's own error. Counts its launches."""

    def __init__(self, error=None):
        self.launches = 0
        self.error = error

    def __getitem__(self, grid):
        return self.launch

    def launch(self, *args, **kwargs):
        import ast

        from triton.compiler.errors import CompilationError

        self.launches += 1
        if self.error is not None:
            raise self.error
        src = "tma.async_copy_global_to_shared(q_desc, coord, bar, smem)"
        try:
            raise RuntimeError("async_copy_global_to_shared has been removed; call async_load instead")
        except RuntimeError as inner:
            raise CompilationError(src, ast.parse(src).body[0], None) from inner


@needs_gluon
def test_a_gluon_kernel_that_fails_to_compile_falls_back_to_the_pipelined_one_with_a_note(monkeypatch):
    """Issue 44: a Triton whose Gluon API the checks accept but the compile refuses ran `vsa` into a crash. Now
    `bsa_fwd` runs the pipelined kernel (the same bits as without the request), says why once as a run note, and
    does not try the Gluon kernel again in this process (`ws_unsupported` names the failure)."""
    monkeypatch.setattr(notes, "_NOTES", [])
    monkeypatch.setattr(ws, "FAILED", [])
    real_unsupported = ws.ws_unsupported
    # where the kernel can run (stood in) until it failed; then the real reason, which names the failure first
    monkeypatch.setattr(ws, "ws_unsupported", lambda q, k, v: real_unsupported(q, k, v) if ws.FAILED else None)
    kernel = _FailingKernel()
    monkeypatch.setattr(ws, "_bsa_fwd_ws_kernel", kernel)
    q, k, v, q2k, cnt, offs = _small_case(5)
    plain = kernel_tuning(q.device, 16)
    asked = dataclasses.replace(plain, fwd_warp_specialized=True)
    want, want_lse = bsa_fwd(q, k, v, q2k, cnt, offs, tuning=plain)
    for _ in range(2):
        out, lse = bsa_fwd(q, k, v, q2k, cnt, offs, tuning=asked)
        assert torch.equal(out, want) and torch.equal(lse, want_lse)
    assert kernel.launches == 1  # tried once, then not again
    said = notes.runtime_notes()
    assert len(said) == 1 and "warp-specialized Gluon forward" in said[0] and "pipelined Triton forward" in said[0]
    assert "RuntimeError: async_copy_global_to_shared has been removed; call async_load instead" in said[0]
    assert "failed on this Triton earlier" in real_unsupported(q, k, v)


@needs_gluon
def test_out_of_memory_in_the_gluon_launch_is_raised_not_taken_for_a_compile_failure(monkeypatch):
    monkeypatch.setattr(notes, "_NOTES", [])
    monkeypatch.setattr(ws, "FAILED", [])
    monkeypatch.setattr(ws, "ws_unsupported", lambda q, k, v: None)
    monkeypatch.setattr(ws, "_bsa_fwd_ws_kernel", _FailingKernel(torch.OutOfMemoryError("out of memory")))
    q, k, v, q2k, cnt, offs = _small_case(6)
    asked = dataclasses.replace(kernel_tuning(q.device, 16), fwd_warp_specialized=True)
    with pytest.raises(torch.OutOfMemoryError):
        bsa_fwd(q, k, v, q2k, cnt, offs, tuning=asked)
    assert ws.FAILED == [] and notes.runtime_notes() == ()


def test_the_api_check_follows_the_calls_not_the_version(monkeypatch):
    """Issue 44: Triton 3.9 removed `tma.async_copy_global_to_shared` (a stand-in that raises "call async_load
    instead" is left under the old name); the kernel calls `async_load` where it exists, the old name only where it
    does not (3.6), and `have_gluon` says no where neither takes the kernel's arguments."""
    from triton.experimental.gluon.language.nvidia.hopper import tma

    def async_load(tensor_desc, coord, barrier, result, pred=True, _semantic=None):
        pass

    def async_copy_global_to_shared(*args, _semantic=None, **kwargs):  # 3.9's stand-in for the removed name
        raise RuntimeError("call async_load instead")

    new = types.SimpleNamespace(async_load=async_load, async_copy_global_to_shared=async_copy_global_to_shared)
    assert ws.tma_load(new) is async_load
    assert ws.tma_load(types.SimpleNamespace(async_copy_global_to_shared=async_load)) is async_load  # 3.6
    assert ws._accepts(async_load, 4, ()) and not ws._accepts(async_copy_global_to_shared, 4, ())
    if not ws.have_gluon():
        pytest.skip("this Triton has no Gluon")
    assert ws.missing_gluon_api() == []
    ws.have_gluon.cache_clear()
    monkeypatch.delattr(tma, "async_load", raising=False)
    monkeypatch.setattr(tma, "async_copy_global_to_shared", async_copy_global_to_shared)
    try:
        assert ws.missing_gluon_api() == ["tma.tma_load"] and not ws.have_gluon()
    finally:
        monkeypatch.undo()
        ws.have_gluon.cache_clear()
    assert ws.have_gluon()
