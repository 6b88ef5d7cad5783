"""vsagen.attention.sparse_vdit: the backend (torch impl, and the Triton impl under the interpreter) against a per-head
float64 reference built from the oracle masks (`oracle_block_map` through the layout's token_tile), mixed modes in
one layer, batch 2, grids with partial tiles; skip heads and all-skip layers give exact zeros, an all-dense layer
is SDPA; gradients through the Triton impl; the options, check(), bind() and check_grid; and `vsagen t2v --attn
sparse-vdit:patterns=FILE` on the tiny model (runs, another architecture, another size, remap)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

from conftest import (FP32_ATOL, FP32_REL_L2, FP32_RTOL, attn_ctx, leaves, make_qkv, make_transformer, masked_dense,
                      rel_l2)
from vsagen.attention.base import Backend
from vsagen.attention.sparse_vdit import SparseVDiTAttention, SparseVDiTOptions
from vsagen.errors import BadInput
from vsagen.kernels.tuning import kernel_tuning
from vsagen.layout import tile_layout
from vsagen.sparsity.files import PatternFile, StepRange, file_hash, save_patterns
from vsagen.sparsity.patterns import (dense, diagonal, mixed, multi_diagonal, oracle_block_map, q2k_table,
                                      skip, vertical_stripe)
from vsagen.timing import NullTimer, Timer

D = 16
# The tiny preset's transformer (vsagen/preset_data/tiny.toml [transformer]): 2 layers of 2 heads of 16, 16 input channels.
TINY_ARCH = {"layers": 2, "heads": 2, "head_dim": 16, "in_channels": 16, "ffn_dim": 32, "patch_size": [1, 2, 2]}

# One layer whose heads run different modes (dense, skip, local, global, unions) in one call.
MIXED_HEADS = (dense(), skip(), diagonal(1), vertical_stripe(1, 3), multi_diagonal(0),
               mixed(diagonal(0), vertical_stripe(0, 5)))
# The Triton impl runs under the interpreter (seconds per call): fewer heads, small grids with partial tiles in
# every dim (tile grids (1, 2, 2) and (2, 1, 3), so diagonal, multi-diagonal and stripes differ on the second).
TRITON_HEADS = (dense(), skip(), diagonal(0), vertical_stripe(0, 3), mixed(multi_diagonal(0), vertical_stripe(1, 0)))
TRITON_GRIDS = [(3, 5, 7), (5, 4, 9)]


def reference(q, k, v, modes, lay):
    """float64 attention, head h under the oracle mask of modes[h] (token level through lay.token_tile); rows
    without a key give 0. Differentiable (`masked_dense`)."""
    tiles = torch.stack([oracle_block_map(p, lay.tiles_per_dim) for p in modes])  # (H, n, n)
    return masked_dense(q, k, v, tiles.expand(q.shape[0], -1, -1, -1), lay)[0]


def backend(impl="torch", **kw) -> SparseVDiTAttention:
    return SparseVDiTAttention(SparseVDiTOptions(impl=impl, **kw))


@pytest.mark.parametrize("grid", [(5, 6, 10), (9, 7, 13), (13, 9, 6), (3, 5, 7)], ids=str)
def test_torch_impl_is_the_oracle_reference(grid):
    lay = tile_layout(grid)
    q, k, v = make_qkv(2, lay.num_tokens, len(MIXED_HEADS), D, seed=31)
    got = backend("torch").attend(q, k, v, MIXED_HEADS, lay)
    assert got.shape == q.shape and got.dtype == q.dtype
    want = reference(q, k, v, MIXED_HEADS, lay)
    torch.testing.assert_close(got.double(), want, atol=FP32_ATOL, rtol=FP32_RTOL)
    assert bool((got[:, :, 1] == 0).all())  # the skip head, exactly
    assert not torch.equal(got[0], got[1])  # batch elements are their own


@pytest.mark.parametrize("grid,sdpa_heads", [(TRITON_GRIDS[0], True), (TRITON_GRIDS[1], True),
                                             (TRITON_GRIDS[1], False)], ids=str)
def test_triton_impl_forward_and_backward_are_the_oracle_reference(grid, sdpa_heads):
    """With sdpa_heads the dense and vertical-stripe heads run SDPA over their keys (3 calls: the kernel, SDPA over
    every key, SDPA over the stripe's keys), without it all in one kernel launch; either way the oracle's result."""
    lay = tile_layout(grid)
    h = len(TRITON_HEADS)
    q, k, v = make_qkv(2, lay.num_tokens, h, D, seed=32)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(33))
    qg, kg, vg = leaves(q, k, v, dtype=torch.float32)
    be = backend("triton", sdpa_heads=sdpa_heads)
    got = be.attend(qg, kg, vg, TRITON_HEADS, lay)
    got.backward(do)
    rq, rk, rv = leaves(q, k, v)
    want = reference(rq, rk, rv, TRITON_HEADS, lay)
    want.backward(do.double())
    assert got.shape == q.shape and got.dtype == torch.float32
    torch.testing.assert_close(got.detach().double(), want.detach(), atol=FP32_ATOL, rtol=FP32_RTOL)
    for name, g, r in (("dq", qg.grad, rq.grad), ("dk", kg.grad, rk.grad), ("dv", vg.grad, rv.grad)):
        assert bool(torch.isfinite(g).all()), name
        assert rel_l2(g, r) < FP32_REL_L2, (name, rel_l2(g, r))
        assert bool((g[:, :, 1] == 0).all()), f"{name} of the skip head"
    assert bool((got[:, :, 1] == 0).all())
    stats = be.layer_stats[(None, -1)]
    # on the first grid (one temporal slab) the mixed head's stripe is every tile: dense, so an SDPA head too
    want = ((3, 3) if grid == TRITON_GRIDS[0] else (3, 2)) if sdpa_heads else (1, 0)
    assert (stats["launches"], stats["sdpa_heads"]) == want


def test_layer_plan_routes_shared_list_heads_to_sdpa():
    """Heads whose tiles all share a key list go to SDPA, grouped by list, with their kernel rows emptied; a layer of
    such heads and skips launches no kernel and still gives the oracle's result (zeros for the skip head)."""
    lay = tile_layout((5, 4, 9))  # tiles (2, 1, 3): partial tiles in every dim
    tiles = lay.tiles_per_dim
    be = backend("triton")
    modes = (vertical_stripe(0, 2), diagonal(0), dense(), vertical_stripe(0, 2, "again"), skip())
    q2k, cnt, groups, sdpa = be.layer_plan(modes, lay, torch.device("cpu"))
    assert [h.tolist() for h, _ in sdpa] == [[0, 3], [2]]
    stripe = q2k_table(vertical_stripe(0, 2), tiles)[0][0].tolist()[:int(q2k_table(vertical_stripe(0, 2), tiles)[1][0])]
    want_rows = torch.cat([torch.arange(int(lay.tile_offsets[t]), int(lay.tile_offsets[t + 1])) for t in stripe])
    assert torch.equal(sdpa[0][1], want_rows) and sdpa[1][1] is None  # dense: every key, no gather
    assert cnt[0, [0, 2, 3, 4]].sum() == 0 and torch.equal(cnt[0, 1], q2k_table(diagonal(0), tiles)[1])
    assert be.layer_plan(modes, lay, torch.device("cpu"))[3] is sdpa  # cached
    assert backend("triton", sdpa_heads=False).layer_plan(modes, lay, torch.device("cpu"))[3] == ()
    only = (dense(), skip(), vertical_stripe(1, 0))
    assert be.layer_plan(only, lay, torch.device("cpu"))[0] is None
    q, k, v = make_qkv(2, lay.num_tokens, 3, D, seed=39)
    got = be.attend(q, k, v, only, lay)
    torch.testing.assert_close(got.double(), reference(q, k, v, only, lay), atol=FP32_ATOL, rtol=FP32_RTOL)
    assert bool((got[:, :, 1] == 0).all()) and be.layer_stats[(None, -1)]["launches"] == 2


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_all_skip_layer_is_zeros_and_launches_nothing(impl):
    lay = tile_layout((5, 6, 10))
    q, k, v = make_qkv(2, lay.num_tokens, 3, D, seed=34)
    be = backend(impl)
    got = be.attend(q, k, v, (skip(), skip("off"), skip()), lay)
    assert got.shape == q.shape and got.dtype == q.dtype and bool((got == 0).all())
    assert be.layer_stats[(None, -1)]["launches"] == 0 and be.layer_stats[(None, -1)]["density"] == 0.0


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_all_dense_layer_is_sdpa(impl, monkeypatch):
    lay = tile_layout((5, 6, 10))
    q, k, v = make_qkv(2, lay.num_tokens, 2, D, seed=35)
    import vsagen.kernels.block_sparse_attn as bsa

    monkeypatch.setattr(bsa, "block_sparse_attention", None)  # an all-dense layer never reaches the kernels
    got = backend(impl).attend(q, k, v, (dense(), dense("full")), lay)
    sdpa = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v))).transpose(1, 2)
    torch.testing.assert_close(got, sdpa, atol=0, rtol=0)
    torch.testing.assert_close(got.double(), reference(q, k, v, (dense(), dense()), lay), atol=FP32_ATOL,
                               rtol=FP32_RTOL)


def test_layer_table_fuses_the_heads():
    lay = tile_layout((8, 4, 12))
    tiles = lay.tiles_per_dim
    assert tiles == (2, 1, 3)
    be = backend("triton")
    modes = (skip(), diagonal(0), vertical_stripe(1, 2), dense())
    q2k, cnt, groups = be.layer_table(modes, lay, torch.device("cpu"))
    assert q2k.shape == (1, 4, 6, 6) and cnt.shape == (1, 4, 6) and q2k.dtype == cnt.dtype == torch.int32
    for h, p in enumerate(modes):
        t, c = q2k_table(p, tiles)
        assert torch.equal(cnt[0, h], c) and torch.equal(q2k[0, h, :, :t.shape[1]], t)
        assert bool((q2k[0, h, :, t.shape[1]:] == 0).all())
    assert be.layer_table(modes, lay, torch.device("cpu"))[0] is q2k  # cached
    # query groups: every row of every head in one program; the vertical-stripe and dense heads' tiles share a list
    assert groups is not None and groups.shape[1] == 2 + be.options.query_block // 8
    assert int(((groups[:, 2:] & 15)).sum()) == 4 * lay.num_tokens


def test_layer_tables_cached_under_inference_mode_serve_a_backward():
    """`generate` runs under inference_mode: a table cached then must still be saved for a later backward (it was an
    inference tensor, and the backward refused it)."""
    be = backend("triton")
    modes = (diagonal(0), vertical_stripe(0, 3))
    with torch.inference_mode():
        q2k, cnt, _ = be.layer_table(modes, tile_layout((3, 5, 7)), torch.device("cpu"))
    assert not q2k.is_inference() and not cnt.is_inference()
    lay = tile_layout((3, 5, 7))
    q, k, v = make_qkv(1, lay.num_tokens, 2, D, seed=36, requires_grad=True)
    be.attend(q, k, v, modes, lay).sum().backward()
    assert bool(torch.isfinite(q.grad).all()) and float(q.grad.abs().sum()) > 0


# ------------------------------------------------------------------------------------------- files and calls


def tiny_file(path, *, grid=(5, 6, 10), size=(96, 160, 17), arch=None, steps=4) -> PatternFile:
    """A hand-made pattern file for the tiny model (two step ranges, every kind used), saved at `path`."""
    modes = {"dense": dense(), "skip": skip(), "diag": diagonal(1, name="diag"),
             "stripe": vertical_stripe(1, 3, name="stripe"),
             "both": mixed(diagonal(0), vertical_stripe(0, 2), name="both"), "md": multi_diagonal(0, name="md")}
    arch = dict(TINY_ARCH if arch is None else arch)
    heads = arch["heads"]
    layers = arch["layers"]
    assert steps >= 2  # two step ranges
    early = tuple(tuple(("dense", "skip", "diag", "stripe")[(i + j) % 4] for j in range(heads)) for i in range(layers))
    late = tuple(tuple(("both", "md", "skip")[(i + j) % 3] for j in range(heads)) for i in range(layers))
    pf = PatternFile(model="tiny", architecture=arch, experts=("transformer",), height=size[0], width=size[1],
                     frames=size[2], grid=tuple(grid), steps=steps, lam=0.1, eps=0.01, prompts=1, modes=modes,
                     ranges=(StepRange(0, 1, {"transformer": early}), StepRange(1, steps, {"transformer": late})))
    save_patterns(pf, path, overwrite=True)
    return pf


def test_call_takes_the_layer_and_step_modes_from_the_file(tmp_path):
    path = tmp_path / "p.json"
    pf = tiny_file(path)
    lay = tile_layout((5, 6, 10))
    be = SparseVDiTAttention(SparseVDiTOptions(patterns=path, impl="torch"))
    q, k, v = make_qkv(2, lay.num_tokens, 2, D, seed=37)
    from vsagen.attention.base import AttnContext

    for layer, step in [(0, 0), (1, 0), (0, 2), (1, 3)]:
        timer = Timer("cpu")
        timer.step = step
        got = be(q, k, v, AttnContext(layout=lay, layer=layer, expert="transformer", timer=timer))
        modes = pf.layer_modes("transformer", layer, step)
        assert [p.name for p in modes] == [p.name for p in be.file.layer_modes(None, layer, step)]
        torch.testing.assert_close(got.double(), reference(q, k, v, modes, lay), atol=FP32_ATOL, rtol=FP32_RTOL)
        assert [name for name, _, _ in timer.finish()] == ["self_attention/fine"]
    with pytest.raises(BadInput, match="2 heads per layer, this model 3"):
        be(*make_qkv(1, lay.num_tokens, 3, D), attn_ctx(lay, None, NullTimer()))
    with pytest.raises(RuntimeError, match="TileLayout"):
        be(q, k, v, attn_ctx(None, None, NullTimer()))


def test_a_run_of_another_step_count_takes_the_file_steps_by_fraction(tmp_path):
    path = tmp_path / "p.json"
    pf = tiny_file(path, steps=4)  # step 0: the early range, steps 1-3 the late one
    lay = tile_layout((5, 6, 10))
    q, k, v = make_qkv(1, lay.num_tokens, 2, D, seed=39)
    be = SparseVDiTAttention(SparseVDiTOptions(patterns=path, impl="torch"))
    assert be.check_steps(4) is None and "steps_mapped_from" not in be.describe()
    note = be.check_steps(8)
    assert note is not None and "4-step pattern file" in note and "8-step run" in note and "\n" not in note
    assert be.describe()["steps_mapped_from"] == 4 and be.describe()["run_steps"] == 8
    from vsagen.attention.base import AttnContext

    for step, file_step in [(1, 0), (2, 1), (7, 3)]:  # step 1 of 8 is the file's step 0 (early), not 1 (late)
        timer = Timer("cpu")
        timer.step = step
        got = be(q, k, v, AttnContext(layout=lay, layer=0, expert="transformer", timer=timer))
        torch.testing.assert_close(got.double(), reference(q, k, v, pf.layer_modes(None, 0, file_step), lay),
                                   atol=FP32_ATOL, rtol=FP32_RTOL)
    one_range = tmp_path / "one.json"
    save_patterns(dataclasses.replace(pf, ranges=(StepRange(0, 4, pf.ranges[0].heads),)), one_range)
    assert SparseVDiTAttention(SparseVDiTOptions(patterns=one_range)).check_steps(8) is None  # nothing to map


def test_call_refuses_another_grid_unless_remap(tmp_path):
    path = tmp_path / "p.json"
    tiny_file(path)
    lay = tile_layout((3, 5, 7))
    q, k, v = make_qkv(1, lay.num_tokens, 2, D, seed=38)
    with pytest.raises(BadInput, match="remap=true") as info:
        SparseVDiTAttention(SparseVDiTOptions(patterns=path))(q, k, v, attn_ctx(lay, None, NullTimer()))
    assert "\n" not in str(info.value) and "3x5x7" in str(info.value)
    be = SparseVDiTAttention(SparseVDiTOptions(patterns=path, remap=True, impl="torch"))
    got = be(q, k, v, attn_ctx(lay, None, NullTimer()))  # outside a loop (step -1): the first range's modes
    torch.testing.assert_close(got.double(), reference(q, k, v, be.file.layer_modes(None, 0, 0), lay),
                               atol=FP32_ATOL, rtol=FP32_RTOL)
    be.check_grid((5, 6, 10))


def test_options_and_check(tmp_path, monkeypatch):
    with pytest.raises(BadInput, match="no such file") as info:
        SparseVDiTOptions(patterns=tmp_path / "none.json")
    assert "\n" not in str(info.value)
    with pytest.raises(BadInput, match="is a folder"):
        SparseVDiTOptions(patterns=tmp_path)  # a directory
    for bad, match in [(dict(impl="cuda"), "impl must be one of"), (dict(remap="yes"), "remap must be"),
                       (dict(tuning={"tma_loads": False}), "KernelTuning")]:
        with pytest.raises(BadInput, match=match):
            SparseVDiTOptions(**bad)
    SparseVDiTOptions(tuning=kernel_tuning("cpu", D))
    cpu = torch.device("cpu")
    with pytest.raises(BadInput, match="needs a pattern file"):
        SparseVDiTAttention().check(cpu, torch.float32)
    lay = tile_layout((3, 5, 7))
    with pytest.raises(BadInput, match="needs a pattern file"):
        SparseVDiTAttention()(*make_qkv(1, lay.num_tokens, 2, D), attn_ctx(lay, None, NullTimer()))
    path = tmp_path / "p.json"
    tiny_file(path)
    for impl in ("auto", "torch", "triton"):
        SparseVDiTAttention(SparseVDiTOptions(patterns=path, impl=impl)).check(cpu, torch.float32)  # interpreter on
    import vsagen.kernels.tuning

    monkeypatch.setattr(vsagen.kernels.tuning, "interpreting", lambda: False)
    with pytest.raises(BadInput, match=r"impl=triton\) needs a CUDA device") as info:
        SparseVDiTAttention(SparseVDiTOptions(patterns=path, impl="triton")).check(cpu, torch.float32)
    assert "\n" not in str(info.value)
    for impl in ("auto", "torch"):  # auto is the torch impl on a CPU
        be = SparseVDiTAttention(SparseVDiTOptions(patterns=path, impl=impl))
        be.check(cpu, torch.float32)
        assert be.resolved_impl(cpu) == "torch"
    SparseVDiTAttention(SparseVDiTOptions(patterns=path, impl="triton")).check(torch.device("cuda"), torch.bfloat16)


def test_a_broken_file_is_refused_when_the_backend_is_built(tmp_path):
    path = tmp_path / "p.json"
    path.write_text("{\"format\": \"vsagen-sparse-vdit\", \"version\": 2}")
    with pytest.raises(BadInput, match="version 2"):
        SparseVDiTAttention(SparseVDiTOptions(patterns=path))


def test_bind_refuses_another_architecture(tmp_path):
    t = make_transformer()
    ok = tmp_path / "ok.json"
    tiny_file(ok)
    be = SparseVDiTAttention(SparseVDiTOptions(patterns=ok))
    be.bind(t, "transformer")
    be.bind(t, None)
    with pytest.raises(BadInput, match="covers transformer, not this pipeline's transformer_2"):
        be.bind(t, "transformer_2")
    for key, other in [("heads", 4), ("layers", 3), ("in_channels", 48)]:
        path = tmp_path / f"{key}.json"
        tiny_file(path, arch={**TINY_ARCH, key: other})
        with pytest.raises(BadInput, match=f"searched on tiny .*{key} {other} vs {TINY_ARCH[key]}") as info:
            SparseVDiTAttention(SparseVDiTOptions(patterns=path)).bind(t, "transformer")
        assert "\n" not in str(info.value)
    SparseVDiTAttention().bind(t, "transformer")  # no file: nothing to check (check() refuses it)


def test_describe_names_the_file(tmp_path):
    path = tmp_path / "p.json"
    pf = tiny_file(path)
    d = SparseVDiTAttention(SparseVDiTOptions(patterns=path)).describe(torch.device("cpu"))
    assert d["name"] == "sparse-vdit" and d["patterns"] == str(path) and d["patterns_sha256"] == file_hash(path)
    assert d["modes"] == pf.mode_counts() and d["density"] == round(pf.density(), 6) and d["impl_ran"] == "torch"
    assert d["remap"] is False and d["patterns_model"] == "tiny"


# ------------------------------------------------------------------------------------------------ the CLI
# 5 frames of 64 x 80 (one step): the post-patch grid (2, 4, 5); the preset's default size is (5, 6, 10).
SMALL = ["--frames", "5", "--height", "64", "--width", "80", "--steps", "1"]
SMALL_GRID, SMALL_SIZE = (2, 4, 5), (64, 80, 5)


def t2v(tmp_path, attn: str, out: str):
    from typer.testing import CliRunner

    from vsagen.cli.app import app

    return CliRunner().invoke(app, ["t2v", "a fox", "--model", "tiny", *SMALL, "--attn", attn,
                                    "--out", str(tmp_path / out), "--json"])


def error_line_after_notes(res) -> str:
    """Bad input found once the model is loaded (bind, the grid check): exit 2, nothing on stdout, no traceback,
    exactly one `error: ...` line on stderr, the last one; the lines before it are the load's `note: ...` lines."""
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert res.stdout == "" and "Traceback" not in res.output, res.output
    assert lines and lines[-1].startswith("error: ") and all(ln.startswith("note: ") for ln in lines[:-1]), res.stderr
    return lines[-1]


@pytest.mark.slow
def test_t2v_runs_a_pattern_file_and_records_it(vsagen_cache, tiny_dir, tmp_path):
    path = tmp_path / "tiny.json"
    tiny_file(path, grid=SMALL_GRID, size=SMALL_SIZE, steps=2)
    res = t2v(tmp_path, f"sparse-vdit:patterns={path}", "a.mp4")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data == json.loads((tmp_path / "a.json").read_text())
    assert (tmp_path / "a.mp4").stat().st_size > 0
    assert data["attn"] == "sparse-vdit" and data["denoised"]["grid"] == list(SMALL_GRID)
    assert data["backend"]["patterns"] == str(path) and data["backend"]["patterns_sha256"] == file_hash(path)
    assert data["backend"]["remap"] is False and data["backend"]["impl_ran"] == "torch"
    assert data["timing"]["self_attention_stages_s"].get("fine", 0) > 0
    # the file has 2 steps in 2 ranges, the run 1: mapped by fraction, and said so
    assert data["backend"]["steps_mapped_from"] == 2 and data["backend"]["run_steps"] == 1
    assert any("2-step pattern file" in n for n in data["timing"]["notes"]), data["timing"]["notes"]
    assert "note: sparse-vdit: 2-step pattern file" in res.stderr
    assert not any("was searched on" in n for n in data["timing"]["notes"])  # searched on this model (tiny)
    # The same file said to be searched on another model of this architecture: it runs, with a note (the run said
    # nothing before; a new-user trial)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**json.loads(path.read_text()), "model": "wan2.1-t2v-1.3b"}))
    res = t2v(tmp_path, f"sparse-vdit:patterns={other}", "b.mp4")
    assert res.exit_code == 0, res.output
    assert any(f"{other} was searched on wan2.1-t2v-1.3b, this run is tiny" in n
               for n in json.loads(res.stdout)["timing"]["notes"])


@pytest.mark.slow
def test_t2v_refuses_a_file_of_another_architecture_or_size(vsagen_cache, tiny_dir, tmp_path):
    other_arch = tmp_path / "heads4.json"
    tiny_file(other_arch, grid=SMALL_GRID, size=SMALL_SIZE, arch={**TINY_ARCH, "heads": 4})
    line = error_line_after_notes(t2v(tmp_path, f"sparse-vdit:patterns={other_arch}", "b.mp4"))
    assert "searched on tiny" in line and "heads 4 vs 2" in line, line
    other_size = tmp_path / "default-size.json"
    tiny_file(other_size)  # searched at the preset's default size, grid (5, 6, 10)
    line = error_line_after_notes(t2v(tmp_path, f"sparse-vdit:patterns={other_size}", "c.mp4"))
    assert "5x6x10" in line and "2x4x5" in line and "remap=true" in line, line
    assert not list(tmp_path.glob("*.mp4"))
    res = t2v(tmp_path, f"sparse-vdit:patterns={other_size}:remap=true", "d.mp4")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["backend"]["remap"] is True and (tmp_path / "d.mp4").stat().st_size > 0


class _OracleBackend(Backend):
    """A test backend: every head of every layer under the oracle mask of the file's mode, in float64."""

    name = "oracle"
    tiled = True
    traceable = False

    def __init__(self, file, use_file=True):
        super().__init__()
        self.file, self.use_file = file, use_file

    def __call__(self, q, k, v, ctx):
        modes = self.file.layer_modes(ctx.expert, ctx.layer, ctx.step) if self.use_file else (dense(),) * q.shape[2]
        return reference(q.double(), k.double(), v.double(), modes, ctx.layout).to(q.dtype)


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_inference_with_the_searched_tiny_file_equals_the_oracle_reference(impl):
    """The tiny transformer with `sparse-vdit` and the file `vsagen search` wrote for tiny (vsagen/preset_data/patterns/tiny.json)
    equals, at its size, the same transformer whose every head runs the file's mode as an oracle-mask float64
    attention; a dense-everywhere control differs (the file's modes matter)."""
    import vsagen
    from vsagen.models.presets import load_preset
    from vsagen.sparsity.files import load_patterns

    path = load_preset("tiny").defaults.attention["sparse-vdit"]["patterns"]
    pf = load_patterns(path)
    assert set(pf.modes[n].kind for r in pf.ranges for layer in r.heads["transformer"] for n in layer) - {"dense"}
    dtype = torch.float64 if impl == "torch" else torch.float32  # the kernels take bf16 / fp16 / fp32
    t = make_transformer(dtype)
    g = torch.Generator().manual_seed(41)
    f, h, w = pf.grid[0], pf.grid[1] * 2, pf.grid[2] * 2  # latent size of the grid (patch (1, 2, 2))
    x = torch.randn(1, 16, f, h, w, generator=g, dtype=dtype)
    text = torch.randn(1, 8, 32, generator=g, dtype=dtype)
    args = dict(hidden_states=x, timestep=torch.tensor([700.0], dtype=dtype), encoder_hidden_states=text,
                return_dict=False)

    def run(backend):
        with vsagen.apply(t, backend, fused_prologue="off"), torch.no_grad():
            return t(**args)[0]

    got = run(SparseVDiTAttention(SparseVDiTOptions(patterns=path, impl=impl)))
    want = run(_OracleBackend(pf))
    tol = dict(atol=1e-9, rtol=1e-9) if impl == "torch" else dict(atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got, want, **tol)
    assert rel_l2(run(_OracleBackend(pf, use_file=False)), want) > 1e-3


def test_triton_impl_refuses_fp64_in_check(tmp_path):
    """fp64 reached the kernels' ValueError mid-run; check() says it up front (one BadInput line)."""
    from vsagen.models.presets import load_preset

    path = load_preset("tiny").defaults.attention["sparse-vdit"]["patterns"]
    with pytest.raises(BadInput, match="impl=torch"):
        backend("triton", patterns=path).check(torch.device("cpu"), torch.float64)
    backend("torch", patterns=path).check(torch.device("cpu"), torch.float64)


def test_bind_refuses_a_file_for_other_experts(tmp_path):
    """A two-expert file (tiny-a14b's) on a one-expert pipeline ran silently with its first expert's modes; the
    pipeline's experts must be the file's."""
    from vsagen.models.presets import load_preset

    t = make_transformer()
    two = SparseVDiTAttention(SparseVDiTOptions(patterns=load_preset("tiny-a14b").defaults.attention["sparse-vdit"][
        "patterns"]))
    with pytest.raises(BadInput, match="covers transformer, transformer_2, this pipeline has transformer:"):
        two.bind(t, "transformer", experts=["transformer"])
    ok = tmp_path / "ok.json"
    tiny_file(ok)
    one = SparseVDiTAttention(SparseVDiTOptions(patterns=ok))
    one.bind(t, "transformer", experts=["transformer"])
    one.bind(t, None, experts=[None])  # a bare transformer
    with pytest.raises(BadInput, match="covers transformer, this pipeline has transformer, transformer_2"):
        one.bind(t, "transformer", experts=["transformer", "transformer_2"])


def test_patterns_option_paths(tmp_path, monkeypatch):
    """Relative paths are recorded resolved (the run's JSON sits elsewhere); empty and folder paths say so."""
    path = tmp_path / "p.json"
    tiny_file(path)
    monkeypatch.chdir(tmp_path)
    assert SparseVDiTOptions(patterns="p.json").patterns == path.resolve()
    with pytest.raises(BadInput, match="patterns is empty"):
        SparseVDiTOptions(patterns="")
    (tmp_path / "d.json").mkdir()
    with pytest.raises(BadInput, match="is a folder"):
        SparseVDiTOptions(patterns="d.json")


def test_describe_after_a_remapped_grid_gives_the_density_there(tmp_path):
    path = tmp_path / "p.json"
    pf = tiny_file(path)  # grid (5, 6, 10)
    be = SparseVDiTAttention(SparseVDiTOptions(patterns=path, remap=True))
    be.check_grid((5, 8, 8))
    d = be.describe()
    assert d["remapped_from"] == [5, 6, 10] and d["grid"] == [5, 8, 8]
    assert d["density_on_grid"] == round(pf.density((2, 2, 2)), 6)
    be.check_grid(tuple(pf.grid))
    assert "remapped_from" not in be.describe()


def test_prepare_takes_the_run_and_apply_prepares_with_the_grid_and_steps(tmp_path):
    """Issue 28: the backend meets a run in `prepare` (experts' architectures, grid, steps), called by `vsagen.apply`;
    a refused run leaves the transformer unpatched; the per-layer rows come back through `report`, reset per run."""
    import vsagen
    from vsagen.architecture import architecture_from_config, architecture_of
    from vsagen.attention.base import Expert, RunInfo
    from vsagen.models.presets import load_preset

    path = tmp_path / "p.json"
    tiny_file(path, steps=4)
    t = make_transformer()
    cpu = torch.device("cpu")
    be = SparseVDiTAttention(SparseVDiTOptions(patterns=path, impl="torch"))
    predicted = RunInfo(cpu, torch.float32, (Expert("transformer", architecture_from_config(
        load_preset("tiny").transformer)),), (5, 6, 10), 4, predicted=True)
    assert be.prepare(predicted) == ()
    assert be.prepare(dataclasses.replace(predicted, model="tiny")) == ()  # the model the file was searched on
    # Another model of the same architecture runs, with a note (a new-user trial read the docs as promising a
    # refusal, and the run said nothing)
    other, = be.prepare(dataclasses.replace(predicted, model="my-finetune"))
    assert f"{path} was searched on tiny, this run is my-finetune" in other and "vsagen search --model my-finetune" \
        in other
    notes = be.prepare(RunInfo(cpu, torch.float32, (Expert("transformer", architecture_of(t)),), (5, 6, 10), 8))
    assert len(notes) == 1 and "4-step pattern file" in notes[0] and "8-step run" in notes[0]
    for bad, match in [(dict(grid=(5, 6, 12)), "searched at"),
                       (dict(experts=(Expert("transformer", {**architecture_of(t), "heads": 4}),)), "searched on"),
                       (dict(experts=(Expert("transformer", architecture_of(t)), Expert("transformer_2",
                                                                                        architecture_of(t)))),
                        "covers transformer")]:
        run = RunInfo(cpu, torch.float32, **{"experts": (Expert("transformer", architecture_of(t)),), **bad})
        with pytest.raises(BadInput, match=match):
            be.prepare(run)
    with pytest.raises(BadInput, match="searched at"):
        vsagen.apply(t, be, grid=(5, 6, 12))
    assert type(t.blocks[0].attn1.processor).__name__ != "VsagenAttnProcessor"  # refused before patching
    lay = tile_layout((5, 6, 10))
    q, k, v = make_qkv(1, lay.num_tokens, 2, D, seed=41)
    be(q, k, v, dataclasses.replace(attn_ctx(lay, None, NullTimer()), layer=1, expert="transformer"))
    rows = be.report().layers
    assert [(r["expert"], r["layer"]) for r in rows] == [("transformer", 1)] and rows[0]["heads"] == 2
    with vsagen.apply(t, be, grid=(5, 6, 10), steps=4) as handle:
        assert handle.notes == () and be.report().layers == ()  # a new run: the rows start again
