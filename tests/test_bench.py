"""vsagen.bench: attention-alone timing shared by `vsagen profile --kernels` and benchmarks/attention.py: shapes,
inputs, the dense SDPA helper, the error measure, the CPU timer and the rows of `time_attention`."""

from __future__ import annotations

import importlib.util
import math
import time
from pathlib import Path

import pytest
import torch

from vsagen.bench import SHAPES, AttentionShape, KernelRow, bench_ms, make_inputs, rel_l2, sdpa


def test_time_attention_rows_and_ratios():
    from vsagen.attention import make_backend
    from vsagen.bench import AttentionShape, time_attention

    shape = AttentionShape("t", (3, 5, 6), heads=2, head_dim=8)
    rows = time_attention(shape, [("full", make_backend("full")), ("vsa", make_backend("vsa", 0.5, "torch"))],
                          device="cpu", dtype=torch.float32, warmup_ms=1, rep_ms=5)
    assert [(r.kernel, r.kind) for r in rows] == [(k, p) for p in ("fwd", "fwd+bwd")
                                                  for k in ("SDPA (torch CPU)", "full", "vsa")]
    for r in rows:
        base = next(b for b in rows if b.kind == r.kind and b.kernel == "SDPA (torch CPU)")
        assert r.ms > 0 and math.isclose(r.speedup_vs_baseline, base.ms / r.ms)
        assert r.tokens == 90 and r.to_dict()["grid"] == [3, 5, 6]


def test_benchmark_script_still_imports():
    """benchmarks/attention.py takes its shapes and helpers from vsagen.bench now."""
    path = Path(__file__).parents[1] / "benchmarks" / "attention.py"
    spec = importlib.util.spec_from_file_location("bench_attention_script", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    from vsagen.bench import SHAPES, AttentionShape

    assert mod.Shape is AttentionShape and mod.SHAPES is SHAPES and set(SHAPES) == {"1.3b", "5b", "14b"}
    assert SHAPES["1.3b"].tokens == 32760
    for name in ("check", "time_shape", "sweep", "sweep_bwd", "profile_fwd_bwd", "probe", "print_table", "main"):
        assert callable(getattr(mod, name))


def test_shapes_count_tokens_and_dense_flops():
    s = AttentionShape("x", (3, 5, 6), heads=2, head_dim=8)
    assert s.tokens == 90 and s.dense_flops() == 4.0 * 90 * 90 * 8 * 2
    assert SHAPES["1.3b"].grid == (21, 30, 52) and SHAPES["1.3b"].heads == 12 and SHAPES["1.3b"].head_dim == 128
    assert SHAPES["14b"].tokens == 21 * 45 * 80


def test_make_inputs_are_seeded_normal_and_shaped():
    s = AttentionShape("x", (2, 4, 4), heads=3, head_dim=16)
    q, k, v = make_inputs(s, seed=1, device="cpu", dtype=torch.float32)
    again = make_inputs(s, seed=1, device="cpu", dtype=torch.float32)
    other = make_inputs(s, seed=2, device="cpu", dtype=torch.float32)
    assert q.shape == k.shape == v.shape == (1, 32, 3, 16) and q.dtype == torch.float32
    assert all(torch.equal(a, b) for a, b in zip((q, k, v), again))
    assert not torch.equal(q, other[0]) and not torch.equal(q, k)
    assert not q.requires_grad
    assert all(x.requires_grad for x in make_inputs(s, 1, True, device="cpu", dtype=torch.float32))
    assert make_inputs(s, 1, device="cpu")[0].dtype == torch.bfloat16


def test_sdpa_is_softmax_attention_in_bshd_layout():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 37, 3, 16, generator=g, dtype=torch.float64) for _ in range(3))
    p = torch.softmax(torch.einsum("bshd,bthd->bhst", q, k) / 4.0, dim=-1)
    want = torch.einsum("bhst,bthd->bshd", p, v)
    got = sdpa(q, k, v)
    assert got.shape == q.shape and got.dtype == q.dtype
    assert (got - want).abs().max().item() < 1e-12
    from torch.nn.attention import SDPBackend

    assert (sdpa(q, k, v, SDPBackend.MATH) - want).abs().max().item() < 1e-12


def test_rel_l2():
    y = torch.tensor([3.0, 4.0])
    assert rel_l2(y, y) == 0.0
    assert rel_l2(torch.tensor([3.0, 5.0]), y) == pytest.approx(1.0 / 5.0)
    assert rel_l2(torch.zeros(2), y) == pytest.approx(1.0)


def test_bench_ms_on_cpu_calls_warmup_and_at_least_min_reps():
    calls = []
    ms = bench_ms(lambda: calls.append(time.perf_counter()) or time.sleep(0.002), device="cpu", warmup_ms=0,
                  rep_ms=0, min_reps=4)
    assert len(calls) == 5  # one untimed warm-up call, then min_reps timed ones
    assert 2.0 <= ms < 1000.0


def test_kernel_row_to_dict_lists_the_grid():
    row = KernelRow("s", "partial", (3, 5, 6), 90, 2, 8, "vsa", "fwd", 1.5, "SDPA (torch CPU)", 2.0)
    d = row.to_dict()
    assert d["grid"] == [3, 5, 6] and d["kernel"] == "vsa" and d["speedup_vs_baseline"] == 2.0


def test_a_backend_is_timed_with_the_parameters_it_asks_for(monkeypatch):
    """sla-star asks to be timed with a random projection of trained size (`bench_params`): its branch runs in the
    benchmark (without it, sla-star would time as vsa); vsa asks for nothing (no gate)."""
    import torch

    from vsagen.attention import resolve_spec
    from vsagen.bench import AttentionShape, time_attention

    seen = []
    sla = resolve_spec("sla-star:impl=torch").build()
    real = type(sla).__call__
    monkeypatch.setattr(type(sla), "__call__", lambda self, q, k, v, ctx: seen.append(ctx.params) or real(self, q, k,
                                                                                                         v, ctx))
    shape = AttentionShape("t", (2, 4, 4), 2, 16)
    rows = time_attention(shape, [("sla", sla)], device="cpu", dtype=torch.float32, warmup_ms=1, rep_ms=1)
    assert {r.kernel for r in rows} >= {"sla"}
    assert seen and all(isinstance(p, torch.nn.Linear) and p.weight.shape == (16, 16) for p in seen)
    assert getattr(resolve_spec("vsa").build(), "bench_params", None) is None


def test_a_backend_whose_layers_differ_is_timed_at_each_layer(tmp_path):
    """`timed_layers`: every (expert, layer) for a backend that records per-layer stats (sparse-vdit), layer 0
    for the others; `time_attention` calls each context in turn (the row's `layers`), and fwd+bwd runs past an
    all-skip layer (its zeros need no gradient)."""
    from vsagen.attention import make_backend
    from vsagen.attention.sparse_vdit import SparseVDiTAttention, SparseVDiTOptions
    from vsagen.bench import LAYER0, timed_layers, time_attention
    from vsagen.sparsity.files import PatternFile, StepRange, save_patterns
    from vsagen.sparsity.patterns import default_catalog

    path = tmp_path / "p.json"
    arch = {"layers": 2, "heads": 2, "head_dim": 8, "in_channels": 16, "ffn_dim": 32, "patch_size": [1, 2, 2]}
    save_patterns(PatternFile(model="hand", architecture=arch, experts=("transformer",), height=96, width=160,
                              frames=9, grid=(3, 5, 6), steps=1, lam=0.0, eps=0.0, prompts=0,
                              modes={m.name: m for m in default_catalog()},
                              ranges=(StepRange(0, 1, {"transformer": (("diagonal", "dense"), ("skip", "skip"))}),)),
                  path)
    svd = SparseVDiTAttention(SparseVDiTOptions(patterns=path, impl="torch"))
    full = make_backend("full")
    assert timed_layers(full, [("transformer", 2)]) == LAYER0
    contexts = timed_layers(svd, [("transformer", 2)])
    assert contexts == (("transformer", 0), ("transformer", 1))
    shape = AttentionShape("t", (3, 5, 6), heads=2, head_dim=8)
    rows = time_attention(shape, [("full", full), ("svd", svd, contexts)], device="cpu", dtype=torch.float32,
                          warmup_ms=1, rep_ms=1)
    assert [(r.kernel, r.kind, r.layers) for r in rows] == [(k, p, n) for p in ("fwd", "fwd+bwd")
                                                            for k, n in (("SDPA (torch CPU)", 1), ("full", 1),
                                                                         ("svd", 2))]
    assert set(svd.layer_stats) == {("transformer", 0), ("transformer", 1)}
    assert svd.layer_stats[("transformer", 1)]["launches"] == 0


def test_benchmark_script_parses_its_sparse_vdit_flags(capsys):
    """benchmarks/attention.py --patterns: a missing file is one error line, exit 2, before any GPU work."""
    path = Path(__file__).parents[1] / "benchmarks" / "attention.py"
    spec = importlib.util.spec_from_file_location("bench_attention_script_svd", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import sys

    for argv, needle in ((["--patterns", "/no/such.json"], "no such file"),
                         (["--patterns-only"], "--patterns-only needs --patterns FILE")):
        old = sys.argv
        sys.argv = ["attention.py", *argv]
        try:
            with pytest.raises(SystemExit) as e:
                mod.main()
        finally:
            sys.argv = old
        assert e.value.code == 2 and needle in capsys.readouterr().err


def test_scaling_script_builds_one_command_per_layout(capsys):
    """benchmarks/ulysses_scaling.py (issue 16): layouts parse to (processes, degree, cfg), the one-GPU run is plain,
    the others go through torchrun with --ulysses / --cfg-parallel; a bad layout is refused."""
    import argparse
    import importlib.util

    path = Path(__file__).parents[1] / "benchmarks" / "ulysses_scaling.py"
    spec = importlib.util.spec_from_file_location("ulysses_scaling", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert [mod.gpus_of(n) for n in ("1", "u4", "cfg", "cfg-u4")] == [(1, 1, False), (4, 4, False), (2, 1, True),
                                                                      (8, 4, True)]
    for bad in ("x", "u0", "cfg-4"):
        with pytest.raises(ValueError, match="layout"):
            mod.gpus_of(bad)
    a = argparse.Namespace(prompt="p", steps=2, warmup=1, seed=0, height=None, width=None, frames=49)
    one = mod.command("wan2.1-t2v-14b", "vsa", "1", Path("o.mp4"), a)
    assert one[1:4] == ["-m", "vsagen", "t2v"] and "--ulysses" not in one and one[one.index("--frames") + 1] == "49"
    many = mod.command("wan2.1-t2v-14b", "vsa", "cfg-u4", Path("o.mp4"), a)
    assert many[1:5] == ["-m", "torch.distributed.run", "--nproc_per_node", "8"]
    assert many[-3:] == ["--ulysses", "4", "--cfg-parallel"] and "--random-weights" in many
    assert mod.per_step({"dit_s": 6.0, "ranks_max": {"dit_s": 9.0}}, "dit_s", 3) == 3.0
    assert mod.per_step({"dit_s": 6.0, "ranks_max": {}}, "dit_s", 3) == 2.0


def test_fastvideo_harness_lists_and_layout_match_the_cube_selection():
    """benchmarks/fastvideo_vsa.py (issue 33) without FastVideo's sdist: for cubes of 64 / 128 / 256 tokens on a grid
    with partial cubes, route A's 64-token lists (here compacted by vsagen's `map_to_lists`, as FastVideo's
    `map_to_index` does) decode to the cube selection's token mask, and the harness's padding, autograd wiring and
    unpadding around a float64 emulation of FastVideo's kernel give the reference's output and gradients."""
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    import fastvideo_vsa as fv

    from vsagen.kernels import reference as ref
    from vsagen.kernels.fa4_block_sparse import map_to_lists
    from vsagen.layout import tile_layout

    class Index:  # FastVideo's index.py contract, in torch
        @staticmethod
        def map_to_index(bmap):
            cnt, idx = map_to_lists(bmap)
            return idx, cnt

    g = torch.Generator().manual_seed(3)
    for tile in fv.TILES.values():
        lay = tile_layout((5, 6, 10), tile)
        n, top_k = lay.num_tiles, max(1, lay.num_tiles // 2)
        q2k = torch.rand(1, 2, n, n, generator=g).argsort(-1)[..., :top_k].sort(-1).values
        cnt = torch.full((1, 2, n), top_k, dtype=torch.int32)
        idx, num = Index.map_to_index(fv.block_map(q2k, cnt, lay))
        assert torch.equal(fv.decoded_mask(idx, num, fv.block_sizes(lay)), fv.cube_mask(q2k, cnt, lay))
        q, k, v = (torch.randn(1, lay.num_tokens, 2, 16, generator=g, dtype=torch.float64, requires_grad=True)
                   for _ in range(3))
        out = fv.fastvideo_fine((fv.KernelEmulation, Index), q, k, v, q2k, cnt, lay)
        want, _ = ref.block_sparse_attention_reference(q, k, v, q2k, lay.slots, lay.slot_valid)
        do = torch.randn(out.shape, generator=g, dtype=torch.float64)
        got = torch.autograd.grad(out, (q, k, v), do)
        exp = torch.autograd.grad(want, (q, k, v), do)
        assert torch.allclose(out, want, atol=1e-12)
        assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(got, exp))


def test_warp_specialized_protocol_model():
    """benchmarks/ws_protocol.py, the CPU model of the warp-specialized forward's barrier protocol (the shipped
    single-consumer kernel `vsagen.kernels.bsa_forward_ws` and the retired two-consumer variants): its random
    interleavings pass, and it catches a release counted once on a shared ring."""
    import random
    import sys

    import pytest

    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    import ws_protocol as proto

    assert proto.main(["--trials", "300"]) == 0
    rng = random.Random(1)
    proto.simulate(2, 2, 1, [5, 5], rng, shared=True)
    with pytest.raises(proto.Violation):
        real = proto.Barrier.__init__
        try:  # every barrier of count 1: a shared ring's buffer released by one consumer only
            proto.Barrier.__init__ = lambda self, count=1: real(self, 1)
            for _ in range(50):
                proto.simulate(2, 2, 0, [6, 6], rng, shared=True)
        finally:
            proto.Barrier.__init__ = real
