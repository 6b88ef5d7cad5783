"""vsagen.attention.vsa: options validation, VSA on CPU against `full` (sparsity 0) and the eager reference,
the gate (a trained block-level gate through the processor against an independent float64 computation), and VSA's
timer regions."""

from __future__ import annotations

import math

import pytest
import torch

import vsagen.kernels.reference as ref
from conftest import FP32_ATOL, FP32_RTOL, attn_ctx as ctx, make_qkv, softmax_attention_fp64
from vsagen.attention import make_backend
from vsagen.attention.spec import resolve_spec
from vsagen.attention.full import FullAttention
from vsagen.attention.vsa import VSAAttention, VSAOptions
from vsagen.errors import BadInput
from vsagen.layout import tile_layout
from vsagen.timing import NullTimer, Timer

# VSA at sparsity 0 against `full` (both fp32, different kernels and summation orders): same bound.
DENSE_ATOL = 1e-5
DENSE_RTOL = 1e-5

B, H, D = 2, 3, 16


@pytest.mark.parametrize("sparsity", [1.0, -0.1, 2.0, float("nan")])
def test_vsa_rejects_bad_sparsity(sparsity):
    with pytest.raises(BadInput, match="sparsity"):
        VSAAttention(VSAOptions(sparsity))
    with pytest.raises(BadInput, match="sparsity"):
        make_backend("vsa", sparsity)


@pytest.mark.parametrize("grid", [(3, 5, 7), (5, 6, 10)])
def test_vsa_sparsity_zero_equals_full(grid):
    lay = tile_layout(grid)
    assert lay.num_full_tiles < lay.num_tiles
    q, k, v = make_qkv(B, lay.num_tokens, H, D, seed=21)
    qt, kt, vt = lay.to_tiles(q), lay.to_tiles(k), lay.to_tiles(v)
    got = VSAAttention(VSAOptions(0.0))(qt, kt, vt, ctx(lay, None, NullTimer()))
    want = FullAttention()(qt, kt, vt, ctx(None, None, NullTimer()))
    assert got.shape == qt.shape and got.dtype == qt.dtype
    torch.testing.assert_close(got, want, atol=DENSE_ATOL, rtol=DENSE_RTOL)
    torch.testing.assert_close(lay.to_raster(got).double(), softmax_attention_fp64(q, k, v),
                               atol=FP32_ATOL, rtol=FP32_RTOL)


@pytest.mark.parametrize("with_gate", [False, True])
@pytest.mark.parametrize("grid,sparsity,top_k", [((6, 9, 5), 0.5, 6), ((5, 6, 10), 0.75, 3),
                                                  ((5, 6, 10), 0.875, 2), ((9, 13, 5), 0.875, 3)])
def test_vsa_matches_reference(with_gate, grid, sparsity, top_k):
    """The backend is the eager reference at K = ceil((1 - sparsity) * n_tiles), gate included."""
    lay = tile_layout(grid)
    q, k, v = make_qkv(B, lay.num_tokens, H, D, seed=22)
    gate = torch.rand(B, lay.num_tokens, H, D, generator=torch.Generator().manual_seed(23)) if with_gate else None
    got = VSAAttention(VSAOptions(sparsity))(q, k, v, ctx(lay, gate, NullTimer()))
    want, _ = ref.vsa_reference(q, k, v, token_tile=lay.token_tile, tile_sizes=lay.tile_sizes, slots=lay.slots,
                                slot_valid=lay.slot_valid, top_k=top_k, gate=gate)
    torch.testing.assert_close(got, want, atol=FP32_ATOL, rtol=FP32_RTOL)


@pytest.mark.parametrize("with_gate", [False, True])
def test_vsa_records_timer_regions(with_gate):
    lay = tile_layout((3, 5, 7))
    q, k, v = make_qkv(1, lay.num_tokens, 2, 8, seed=24)
    gate = torch.rand_like(q) if with_gate else None
    timer = Timer("cpu")
    out = VSAAttention()(q, k, v, ctx(lay, gate, timer))
    assert bool(torch.isfinite(out).all())
    records = timer.finish()
    names = [name for name, _, _ in records]
    assert names.count("self_attention/coarse") == 1
    assert names.count("self_attention/fine") == 1
    assert all(sec >= 0.0 for _, _, sec in records)


def test_vsa_needs_layout():
    q, k, v = make_qkv(1, 8, 2, 8, seed=25)
    with pytest.raises(RuntimeError, match="TileLayout"):
        VSAAttention()(q, k, v, ctx(None, None, NullTimer()))


def test_vsa_check_accepts_cpu_and_cuda():
    vsa = VSAAttention()
    for dev in (torch.device("cpu"), torch.device("cuda")):
        for dtype in (torch.float32, torch.bfloat16):
            vsa.check(dev, dtype)


# ------------------------------------------------------------------ a block-level gate through the processor
# FastVideo's VSA checkpoints store the gate at the block level (`blocks.{i}.to_gate_compress`), a Linear(dim, dim) on
# the block's modulated norm1 output (attn1's input), split per head, no sigmoid: out = out_s + gate * out_c.

def _tile_of_raster_token(grid):
    """(S,) the (4,4,4) cube of each raster-order token of `grid` (any numbering: selection does not depend on it)."""
    t, h, w = torch.meshgrid(*(torch.arange(n) for n in grid), indexing="ij")
    nh, nw = -(-grid[1] // 4), -(-grid[2] // 4)
    return ((t // 4) * nh * nw + (h // 4) * nw + w // 4).flatten()


def _gated_vsa_fp64(q, k, v, x, weight, bias, grid, sparsity):
    """An independent float64 VSA with a gate, raster order: q, k, v (B, S, H, D), x (B, S, C) the attn1 input.
    Fine: dense softmax attention masked to the key tiles whose tile-mean scores are each query tile's top K =
    ceil((1 - sparsity) n_tiles). Coarse: softmax attention of the tile means, broadcast to each tile's tokens."""
    tile = _tile_of_raster_token(grid)
    n = int(tile.max()) + 1
    member = torch.nn.functional.one_hot(tile, n).double()  # (S, n)
    mean = lambda y: torch.einsum("sn,bshd->bnhd", member, y) / member.sum(0)[None, :, None, None]  # noqa: E731
    scale = q.shape[-1] ** -0.5
    tile_scores = torch.einsum("bnhd,bmhd->bhnm", mean(q), mean(k)) * scale
    top = tile_scores.topk(math.ceil((1 - sparsity) * n), dim=-1).indices  # (B, H, n, K)
    keep = torch.zeros_like(tile_scores, dtype=torch.bool).scatter_(-1, top, True)  # (B, H, n query, n key tiles)
    allowed = keep[:, :, tile][:, :, :, tile]  # (B, H, S, S)
    logits = (torch.einsum("bshd,bthd->bhst", q, k) * scale).masked_fill(~allowed, float("-inf"))
    out_s = torch.einsum("bhst,bthd->bshd", logits.softmax(-1), v)
    out_c = torch.einsum("bhnm,bmhd->bnhd", tile_scores.softmax(-1), mean(v))[:, tile]
    gate = (x @ weight.T + bias).unflatten(-1, q.shape[2:])
    return out_s + gate * out_c, gate * out_c


def test_a_block_level_gate_adds_the_gated_coarse_output_through_the_processor(tmp_path):
    """A float64 tiny transformer whose checkpoint folder holds block-level gates (batch 2, grid 5x6x10: partial
    tiles): each layer's VSA output is out_s + gate(attn1 input) * out_c of the independent computation above,
    attn1's input is the block's modulated norm1 output, and a zero gate gives exactly the ungated output."""
    from safetensors.torch import save_file

    from vsagen.attention.base import BackendWrapper
    from vsagen.attention.weights import attach_backend_weights
    from conftest import make_transformer, patched_output

    class Recorder(BackendWrapper):
        def __call__(self, q, k, v, ctx):
            out = self.inner(q, k, v, ctx)
            calls.append((ctx.layer, ctx.layout, q, k, v, ctx.hidden_states, out))
            return out

    t = make_transformer(torch.float64, seed=4)
    dim, layers = t.config.num_attention_heads * t.config.attention_head_dim, len(t.blocks)
    g = torch.Generator().manual_seed(31)
    gates = {}
    for i in range(layers):
        gates[f"blocks.{i}.to_gate_compress.weight"] = torch.randn(dim, dim, generator=g, dtype=torch.float64) / 4
        gates[f"blocks.{i}.to_gate_compress.bias"] = torch.randn(dim, generator=g, dtype=torch.float64)
    folder = tmp_path / "transformer"
    folder.mkdir()
    save_file({**gates, "blocks.0.attn1.to_q.weight": t.blocks[0].attn1.to_q.weight.detach().clone()},
              str(folder / "diffusion_pytorch_model.safetensors"))
    vsa = VSAAttention(VSAOptions(sparsity=0.5, impl="torch"))
    assert attach_backend_weights(t, vsa, folder) == layers
    inputs = (torch.randn(2, 16, 5, 12, 20, generator=g, dtype=torch.float64), torch.tensor([500.0, 120.0]),
              torch.randn(2, 9, 32, generator=g, dtype=torch.float64))
    norm1_inputs = {}
    hooks = [m.register_forward_pre_hook(lambda _, args, i=i, n=n: norm1_inputs.setdefault(i, {}).__setitem__(n, args))
             for i, b in enumerate(t.blocks) for n, m in (("block", b), ("norm1", b.norm1))]  # tile order: norm1's
    calls = []
    try:
        gated = patched_output(t, Recorder(vsa), inputs)
    finally:
        for h in hooks:
            h.remove()
    assert [c[0] for c in calls] == list(range(layers))
    for layer, layout, q, k, v, x, out in calls:
        assert layout.grid == (5, 6, 10) and layout.num_full_tiles < layout.num_tiles and q.dtype == torch.float64
        # attn1's input is the block's modulated norm1 output (diffusers' WanTransformerBlock, as FastVideo's)
        block_in, temb = norm1_inputs[layer]["norm1"][0], norm1_inputs[layer]["block"][2]  # block(x, enc, temb, rope)
        # (diffusers keeps norm1 and temb in float32, as FastVideo does, also in a float64 model)
        shift, scale = (t.blocks[layer].scale_shift_table + temb.float()).chunk(6, dim=1)[:2]
        norm1 = torch.nn.functional.layer_norm(block_in.float(), (dim,), eps=1e-6) * (1 + scale) + shift
        torch.testing.assert_close(x, norm1, atol=1e-12, rtol=1e-12)
        raster = [layout.to_raster(y) for y in (q, k, v, x, out)]
        want, gated_part = _gated_vsa_fp64(*raster[:4], gates[f"blocks.{layer}.to_gate_compress.weight"],
                                           gates[f"blocks.{layer}.to_gate_compress.bias"], layout.grid, 0.5)
        assert gated_part.abs().mean() > 0.05 * want.abs().mean()  # the gate's part is no rounding-size term
        torch.testing.assert_close(raster[4], want, atol=1e-10, rtol=1e-10)

    zero = tmp_path / "zero" / "transformer"
    zero.mkdir(parents=True)
    save_file({k: torch.zeros_like(x) for k, x in gates.items()}, str(zero / "gates.safetensors"))
    assert attach_backend_weights(t, vsa, zero) == layers
    zero_gated = patched_output(t, vsa, inputs)
    for b in t.blocks:
        del b.attn1.to_gate_compress
    ungated = patched_output(t, vsa, inputs)
    assert torch.equal(zero_gated, ungated) and not torch.allclose(gated, ungated)


# ------------------------------------------------------------------ issue 33: the tile (cube) as an option
# VSA over cubes of 64, 128 and 256 tokens (FastVideo's VSA tile volumes: 4x4x4, 4x4x8, 4x8x8): the coarse stage pools,
# scores and selects cubes of the option's shape; the fine stage runs the selected cubes as 64-token kernel tiles.

def _vsa_tile_fp64(q, k, v, lay, sparsity, gate=None, coarse_grad=True):
    """An independent float64 VSA over the layout's cubes (tile order): cube means over the true tokens, top
    K = ceil((1 - sparsity) n_cubes) key cubes per query cube, softmax attention masked to those cubes' tokens, plus
    gate * the coarse attention of the cube means broadcast to each cube's tokens. `coarse_grad=False`: the coarse
    term is computed from detached q, k, v (same values; q, k, v's gradients are the fine stage's only)."""
    cube = lay.token_tile
    n = lay.num_tiles
    member = torch.nn.functional.one_hot(cube, n).double()
    mean = lambda y: torch.einsum("sn,bshd->bnhd", member, y.double()) / member.sum(0)[None, :, None, None]  # noqa: E731
    scale = q.shape[-1] ** -0.5
    scores = torch.einsum("bnhd,bmhd->bhnm", mean(q), mean(k)) * scale
    top = scores.topk(math.ceil((1 - sparsity) * n), dim=-1).indices
    keep = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, top, True)
    allowed = keep[:, :, cube][:, :, :, cube]
    logits = (torch.einsum("bshd,bthd->bhst", q.double(), k.double()) * scale).masked_fill(~allowed, float("-inf"))
    out = torch.einsum("bhst,bthd->bshd", logits.softmax(-1), v.double())
    if gate is not None:
        s_c, v_c = (scores, mean(v)) if coarse_grad else (scores.detach(), mean(v.detach()))
        out = out + gate.double() * torch.einsum("bhnm,bmhd->bnhd", s_c.softmax(-1), v_c)[:, cube]
    return out


# (impl, tile, grid, head dim, gate, query_rows): batch 2; partial cubes on every axis (a whole cube and a partial one
# along each: 2 x 2 x 2 cubes, the fewest the interpreter can run with both kinds on every axis), but on (4, 8, 16).
# The Triton fine stage runs 64-token kernel tiles whatever the cube (the cube shape only changes the expanded lists),
# and the gate is added after it (with a gate the coarse stage also pools v). Two Triton cases are left out as paths
# the others run: ungated 4x8x8 on (5, 9, 9) at D 64 (4x8x8 on 2 x 2 x 2 partial cubes with query rows 64: the
# (5, 9, 12) case; the ungated coarse stage: the (4, 8, 16) and (5, 5, 9) cases, at D 64) and gated 4x4x8 on
# (5, 6, 10) at D 128 (the same case at D 64 is the first Triton one; gated at D 128 with query rows 64: the 4x8x8
# and 4x4x4 cases, on partial cubes).
TILE_CASES = [
    ("torch", "4x4x8", (5, 6, 10), 64, True, 64), ("triton", "4x4x8", (5, 6, 10), 64, True, 64),
    ("torch", "4x8x8", (5, 9, 12), 128, True, 64), ("triton", "4x8x8", (5, 9, 12), 128, True, 64),
    ("torch", "4x4x4", (5, 5, 7), 128, True, 64), ("triton", "4x4x4", (5, 5, 7), 128, True, 64),
    ("torch", "4x8x8", (4, 8, 16), 64, False, 64), ("triton", "4x8x8", (4, 8, 16), 64, False, 64),
    ("triton", "4x4x8", (5, 5, 9), 64, False, 64),
    ("triton", "4x4x8", (5, 5, 9), 64, False, 128), ("triton", "4x8x8", (5, 9, 12), 128, True, 128),
]


@pytest.mark.parametrize("impl,tile,grid,d,gated,rows", TILE_CASES)
def test_vsa_tile_option_matches_float64_forward_and_backward(impl, tile, grid, d, gated, rows):
    """Every tile shape, both implementations (Triton under the interpreter; query rows 64 and 128): forward and
    backward against an independent float64 VSA over the cubes, with and without the gate."""
    backend = VSAAttention(VSAOptions(sparsity=0.5, impl=impl, tile=tile, query_rows=rows))
    lay = tile_layout(grid, backend.tile)
    assert lay.tile == tuple(int(x) for x in tile.split("x"))
    assert lay.num_tiles == (2 if grid == (4, 8, 16) else 8)
    q, k, v = make_qkv(2, lay.num_tokens, 2, d, seed=31, requires_grad=True)
    gate = torch.rand(2, lay.num_tokens, 2, d, generator=torch.Generator().manual_seed(32)) if gated else None
    out = backend(q, k, v, ctx(lay, gate, NullTimer()))
    qd, kd, vd = (x.detach().double().requires_grad_(True) for x in (q, k, v))
    # the selection is discrete (no gradient through it); the gated coarse output carries no gradient in the Triton
    # path (`coarse_stage` is detached) and does in the torch one: Triton's gradients are the fine stage's, against
    # the reference with its coarse term detached (same forward value)
    want = _vsa_tile_fp64(qd, kd, vd, lay, 0.5, gate, coarse_grad=impl == "torch")
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=2e-5)
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(33))
    out.backward(do)
    want.backward(do.double())
    for got, ref_grad in ((q.grad, qd.grad), (k.grad, kd.grad), (v.grad, vd.grad)):
        torch.testing.assert_close(got.double(), ref_grad, atol=5e-5, rtol=5e-5)


# Triton's 4x8x8 at D 16 left out: the same kernels, grid and lists as its 4x8x8 case at D 128, and D 16 in its
# 4x4x8 case.
@pytest.mark.parametrize("impl,tile,d", [("torch", "4x4x8", 16), ("triton", "4x4x8", 16), ("torch", "4x8x8", 16),
                                         ("torch", "4x8x8", 128), ("triton", "4x8x8", 128)])
def test_vsa_tile_every_cube_selected_equals_full(impl, tile, d):
    backend = VSAAttention(VSAOptions(sparsity=0.0, impl=impl, tile=tile))
    lay = tile_layout((5, 6, 10), backend.tile)
    q, k, v = make_qkv(2, lay.num_tokens, 3, d, seed=36)
    out = backend(q, k, v, ctx(lay, None, NullTimer()))
    torch.testing.assert_close(out.double(), softmax_attention_fp64(q, k, v), atol=DENSE_ATOL, rtol=DENSE_RTOL)


def test_vsa_tile_top_k_counts_cubes_of_the_tile():
    """K = ceil((1 - sparsity) * cubes) of the option's shape: at 87.5% a 4x8x8 grid of 16 cubes keeps 2 per row."""
    backend = VSAAttention(VSAOptions(sparsity=0.875, impl="torch", tile="4x8x8"))
    lay = tile_layout((8, 16, 16), backend.tile)
    assert lay.num_tiles == 8
    q, k, v = make_qkv(1, lay.num_tokens, 2, 8, seed=37)
    _, q2k = backend.attend(q, k, v, lay, None, NullTimer())
    assert q2k.shape == (1, 2, 8, 1)
    assert backend.describe(torch.device("cpu"))["tile"] == "4x8x8"


@pytest.mark.parametrize("text,needle", [("3x4x4", "power of two"), ("4x4x2", "holds 32 tokens"),
                                         ("4x4", "write it as TxHxW"), ("4x4x-8", "power of two of at least 1"),
                                         ("0x4x4", "power of two of at least 1"),
                                         ("axbxc", "write it as TxHxW"), ("4x8x16", "holds 512 tokens")])
def test_vsa_refuses_a_tile_that_is_not_a_cube_it_runs(text, needle):
    with pytest.raises(BadInput, match=needle):
        VSAOptions(tile=text)


def test_vsa_refuses_query_rows_it_cannot_run():
    with pytest.raises(BadInput, match="needs a tile of 128 or 256 tokens"):
        VSAOptions(query_rows=128)
    with pytest.raises(BadInput, match="query_rows must be 64 or 128"):
        VSAOptions(tile="4x4x8", query_rows=32)
    assert VSAOptions(tile="4x8x8", query_rows=128).query_rows == 128


@pytest.mark.parametrize("tile,device,dtype,needle", [
    ("4x4x4", "cuda", torch.bfloat16, "multiple of 128 tokens"),  # the tile refuses before the device is looked at
    ("4x4x8", "cpu", torch.bfloat16, "NVIDIA CUDA GPUs only; this run is on cpu"),
])
def test_vsa_impl_fa4_is_refused_where_it_cannot_run(tile, device, dtype, needle):
    backend = VSAAttention(VSAOptions(impl="fa4", tile=tile))
    with pytest.raises(BadInput, match=rf"impl fa4 \(--attn-impl fa4 or vsa:impl=fa4\): .*{needle}"):
        backend.check(torch.device(device), dtype)


def test_vsa_takes_a_tile_as_python_gives_it():
    assert VSAOptions(tile=(4, 4, 8)).tile == VSAOptions(tile=[4, 4, 8]).tile == VSAOptions(tile=" 4X4x8 ").tile == "4x4x8"


AUTO_FA4_CASES = [  # (backend, tile, grid, dtype, FA4 expected): FA4 only for vsa on whole cubes, bf16 / fp16
    ("vsa", "4x4x8", (8, 8, 16), torch.bfloat16, True),     # every cube whole: FA4, no padding
    ("vsa", "4x8x8", (4, 16, 8), torch.float16, True),
    ("vsa", "4x4x8", (5, 5, 9), torch.bfloat16, False),     # partial cubes: FA4 would pad them; Triton
    ("vsa", "4x4x4", (4, 8, 8), torch.bfloat16, False),     # 64-token cubes: FA4 cannot serve them on sm90
    ("vsa", "4x4x8", (4, 8, 16), torch.float32, False),     # FA4 runs bf16 / fp16 only
    ("rocm-vsa", "4x4x8", (4, 8, 16), torch.bfloat16, False),  # runs the ROCm seed's kernel changes, always
    ("sla-star", "4x8x8", (4, 16, 8), torch.bfloat16, False),  # its branch was measured beside vsagen's kernels
]


@pytest.mark.parametrize("name,tile,grid,dtype,fa4_expected", AUTO_FA4_CASES)
def test_vsa_impl_auto_runs_fa4_only_where_it_was_measured_faster(monkeypatch, name, tile, grid, dtype, fa4_expected):
    """impl auto on a (stand-in) sm90 GPU with FA4: the fine stage goes to FA4 on grids of whole 128 / 256-token
    cubes and stays on vsagen's Triton kernels elsewhere; either way the output is VSA's (float64 reference) and
    `describe` says which engine ran."""
    from fa4_fake import FakeFA4

    fake = FakeFA4().install(monkeypatch)
    backend = make_backend(name, sparsity=0.5, tile=tile)
    vsa = getattr(backend, "_vsa", backend)  # sla-star's sparse part is a VSAAttention of its own
    monkeypatch.setattr(vsa, "resolved_impl", lambda device: "triton")  # as on CUDA; the tensors stay on CPU
    lay = tile_layout(grid, backend.tile)
    q, k, v = (x.to(dtype) for x in make_qkv(2, lay.num_tokens, 2, 16, seed=41))
    out = backend(q, k, v, ctx(lay, None, NullTimer()))
    assert bool(fake.calls) is fa4_expected
    want = _vsa_tile_fp64(*(x.double() for x in (q, k, v)), lay, 0.5)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), want, atol=tol, rtol=tol)
    monkeypatch.undo()  # describe's own resolved_impl: "triton" on CUDA, then what the calls ran
    assert backend.describe(torch.device("cuda"))["impl_ran"] == ("fa4" if fa4_expected else "triton")


def test_vsa_impl_auto_keeps_triton_for_triton_options_and_other_gpus(monkeypatch):
    """query_rows=128 (a Triton-only choice), an sm100 GPU (FA4 not measured there) and an FA4 release other than
    the one the adapter follows keep the Triton fine stage."""
    from fa4_fake import FakeFA4

    FakeFA4().install(monkeypatch)
    lay = tile_layout((8, 8, 16), (4, 4, 8))
    q = make_qkv(1, lay.num_tokens, 2, 16, seed=42)[0].to(torch.bfloat16)
    assert VSAAttention(VSAOptions(tile="4x4x8")).auto_engine(q, lay) == "fa4"
    assert VSAAttention(VSAOptions(tile="4x4x8", query_rows=128)).auto_engine(q, lay) == "triton"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    assert VSAAttention(VSAOptions(tile="4x4x8")).auto_engine(q, lay) == "triton"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr("vsagen.kernels.fa4_block_sparse.fa4_version", lambda: "4.0.0")  # not the measured release
    assert VSAAttention(VSAOptions(tile="4x4x8")).auto_engine(q, lay) == "triton"


def test_vsa_impl_auto_says_the_engine_of_the_latest_run(monkeypatch):
    """One backend run on two grids (profile --tile-fit crop,partial): `describe` after each says that run's engine."""
    from fa4_fake import FakeFA4

    FakeFA4().install(monkeypatch)
    backend = VSAAttention(VSAOptions(sparsity=0.5, tile="4x4x8"))
    monkeypatch.setattr(backend, "resolved_impl", lambda device: "triton")  # as on CUDA
    for grid, engine in (((4, 8, 16), "fa4"), ((5, 5, 9), "triton"), ((4, 8, 16), "fa4")):
        lay = tile_layout(grid, backend.tile)
        q, k, v = (x.to(torch.bfloat16) for x in make_qkv(1, lay.num_tokens, 2, 16, seed=43))
        backend(q, k, v, ctx(lay, None, NullTimer()))
        assert backend._ran == engine
    monkeypatch.undo()
    assert backend.describe(torch.device("cuda"))["impl_ran"] == "fa4"
    assert backend.describe(torch.device("cpu"))["impl_ran"] == "torch"  # a CPU run never reaches the engines


def test_vsa_says_when_query_rows_has_no_effect():
    """query_rows sets the Triton fine stage's programs: with the torch reference a run gets a note saying it is
    ignored; with Triton (or the default 64) none."""
    from vsagen.attention.base import RunInfo

    run = RunInfo(device=torch.device("cpu"), dtype=torch.float32)
    notes = VSAAttention(VSAOptions(tile="4x4x8", query_rows=128, impl="torch")).prepare(run)
    assert notes == ("vsa: query_rows=128 has no effect with the torch reference (impl torch): it sets the programs "
                     "of the Triton fine stage (impl triton, on CUDA)",)
    assert VSAAttention(VSAOptions(tile="4x4x8", query_rows=128, impl="triton")).prepare(run) == ()  # interpreter
    assert VSAAttention(VSAOptions(tile="4x4x8", impl="torch")).prepare(run) == ()


WS_CASES = [  # (backend, options, grid, warp-specialized forward asked): where it measured faster on the H100
    ("vsa", {"tile": "4x8x8"}, (5, 9, 17), True),     # 256-token cubes, partial ones too
    ("vsa", {"tile": "4x8x8"}, (4, 16, 8), True),     # ... and whole
    ("vsa", {"tile": "4x4x4"}, (8, 8, 16), True),     # 64-token cubes, every one whole
    ("vsa", {"tile": "4x4x4"}, (5, 9, 17), False),    # partial 64-token cubes: the pipelined kernel packs them
    ("vsa", {"tile": "4x4x8"}, (8, 8, 16), True),     # 128-token cubes, every one whole
    ("vsa", {"tile": "4x4x8"}, (5, 9, 17), False),    # partial 128-token cubes: about even, the pipelined kernel
    ("vsa", {"tile": "4x8x8", "query_rows": 128}, (5, 9, 17), False),  # the grouped kernel
    ("rocm-vsa", {"tile": "4x8x8"}, (5, 9, 17), False),  # the ROCm seed's tuning, always
    ("sla-star", {"tile": "4x8x8"}, (5, 9, 17), False),  # measured with the pipelined forward
]


@pytest.mark.parametrize("name,options,grid,asked", WS_CASES)
def test_vsa_asks_for_the_warp_specialized_forward_where_it_measured_faster(name, options, grid, asked):
    """`fine_tuning` turns the warp-specialized forward on in the default sm_90 tuning only for the cubes where it
    measured faster, and only for `vsa`; a tuning given as an option, or one without TMA loads, is kept as it is."""
    from vsagen.kernels.tuning import arch_tuning

    backend = make_backend(name, sparsity=0.5, **options)
    vsa = getattr(backend, "_vsa", backend)
    lay = tile_layout(grid, backend.tile)
    sm90 = arch_tuning("sm90", 128, vsa.kernel_profile)
    assert vsa.fine_tuning(sm90, lay).fwd_warp_specialized is asked
    assert vsa.fine_tuning(sm90, lay) is vsa.fine_tuning(sm90, lay)  # one object per tuning (cached)
    assert not vsa.fine_tuning(arch_tuning("nvidia", 128), lay).fwd_warp_specialized  # pointer loads: no TMA
    given = VSAAttention(VSAOptions(sparsity=0.5, tuning=sm90, **options))
    assert given.fine_tuning(sm90, lay) is sm90


def test_vsa_says_which_forward_kernel_ran(monkeypatch):
    """On a GPU `describe` names the Triton forward that ran; where the warp-specialized one cannot run (here: the
    interpreter) it is the pipelined one, and the output is VSA's."""
    from vsagen.kernels.tuning import arch_tuning

    backend = VSAAttention(VSAOptions(sparsity=0.5, tile="4x8x8"))
    monkeypatch.setattr(backend, "resolved_impl", lambda device: "triton")
    monkeypatch.setattr(backend, "tuning", lambda q: arch_tuning("sm90", q.shape[-1]))  # asks for it
    lay = tile_layout((5, 9, 9), backend.tile)  # partial 256-token cubes (WS_CASES' first)
    q, k, v = (x.to(torch.bfloat16) for x in make_qkv(1, lay.num_tokens, 2, 16, seed=44))
    out = backend(q, k, v, ctx(lay, None, NullTimer()))
    want = _vsa_tile_fp64(*(x.double() for x in (q, k, v)), lay, 0.5)
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)
    monkeypatch.undo()
    assert backend.describe(torch.device("cuda"))["fine_kernel"] == "pipelined"
    assert "fine_kernel" not in backend.describe(torch.device("cpu"))
    # where the kernel runs (stood in: the pipelined kernel's numbers under its name), describe says so
    import vsagen.kernels.bsa_forward_ws as ws
    from vsagen.kernels.bsa_forward import bsa_fwd

    ran = []
    monkeypatch.setattr(backend, "resolved_impl", lambda device: "triton")
    monkeypatch.setattr(backend, "tuning", lambda q: arch_tuning("sm90", q.shape[-1]))
    monkeypatch.setattr(ws, "ws_unsupported", lambda q, k, v: None)
    monkeypatch.setattr(ws, "launch_ws", lambda *a: ran.append(1) or bsa_fwd(*a))
    torch.testing.assert_close(backend(q, k, v, ctx(lay, None, NullTimer())), out, atol=0, rtol=0)
    assert ran == [1]
    monkeypatch.undo()
    assert backend.describe(torch.device("cuda"))["fine_kernel"] == "warp-specialized"
    # where it fails to compile in the call (stood in), the pipelined kernel ran, and describe says so (issue 44)
    import vsagen.kernels.runtime_notes as notes

    def compile_fails(*args):
        raise RuntimeError("PassManager::run failed")

    real_unsupported = ws.ws_unsupported
    monkeypatch.setattr(notes, "_NOTES", [])
    monkeypatch.setattr(ws, "FAILED", [])
    monkeypatch.setattr(backend, "resolved_impl", lambda device: "triton")
    monkeypatch.setattr(backend, "tuning", lambda q: arch_tuning("sm90", q.shape[-1]))
    monkeypatch.setattr(ws, "ws_unsupported", lambda q, k, v: real_unsupported(q, k, v) if ws.FAILED else None)
    monkeypatch.setattr(ws, "launch_ws", compile_fails)
    torch.testing.assert_close(backend(q, k, v, ctx(lay, None, NullTimer())), out, atol=0, rtol=0)
    assert backend.describe(torch.device("cuda"))["fine_kernel"] == "pipelined"
    assert len(notes.runtime_notes()) == 1 and "PassManager::run failed" in notes.runtime_notes()[0]


def test_vsa_fine_tuning_traces_without_a_graph_break():
    """`--compile` traces `fine_tuning` inside the attention (fullgraph): the first call, which builds the flagged
    tuning, and a later one both trace, and the switch reaches the custom ops' arguments."""
    from vsagen.kernels.tuning import arch_tuning, op_args

    backend = VSAAttention(VSAOptions(sparsity=0.5, tile="4x8x8"))
    lay = tile_layout((5, 9, 17), backend.tile)
    sm90 = arch_tuning("sm90", 128)

    def f(x):
        return x + float(op_args(backend.fine_tuning(sm90, lay))[-1])

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    assert compiled(torch.zeros(2)).tolist() == [1.0, 1.0]
    assert compiled(torch.zeros(2)).tolist() == [1.0, 1.0]
    assert list(backend._ws_tunings) == [sm90]


@pytest.mark.parametrize("tile,rows,grid", [("4x4x4", 64, (4, 5, 6)), ("4x4x8", 128, (4, 5, 9))])
def test_vsa_int8_precision_within_band_and_impls_agree(tile, rows, grid):
    """precision=int8 (the 8-bit fine stage, scales per 64-token kernel tile): within 8-bit's band of the float64
    VSA and visibly quantized; the Triton kernels (interpreter, query rows 64 and 128) close to the torch formulas
    (tile plans walk partial tiles packed: another fp8 rounding order)."""
    lay = tile_layout(grid, tuple(int(x) for x in tile.split("x")))
    q, k, v = make_qkv(2, lay.num_tokens, 1, 16, seed=51)
    outs = {}
    for impl in ("torch", "triton"):
        backend = VSAAttention(VSAOptions(sparsity=0.5, impl=impl, tile=tile, query_rows=rows, precision="int8"))
        outs[impl] = backend(q, k, v, ctx(lay, None, NullTimer()))
        assert backend.describe()["precision"] == "int8"
    want = _vsa_tile_fp64(q, k, v, lay, 0.5)
    err = float((outs["torch"].double() - want).norm() / want.norm())
    assert 3e-3 < err < 4.5e-2, err
    assert float((outs["triton"] - outs["torch"]).norm() / outs["torch"].norm()) < 2e-2  # measured 1.1e-2


def test_vsa_int8_precision_refusals_and_auto_engine():
    with pytest.raises(BadInput, match="not FA4's"):
        VSAOptions(precision="int8", impl="fa4")
    with pytest.raises(BadInput, match="precision must be one of bf16, int8"):
        VSAOptions(precision="int4")
    backend = VSAAttention(VSAOptions(precision="int8"))
    assert backend.auto_engine(torch.zeros(1, 1, 1, 16, dtype=torch.bfloat16), tile_layout((4, 8, 16), (4, 8, 8))) \
        == "triton"
    lay = tile_layout((4, 4, 4))
    q, k, v = make_qkv(1, lay.num_tokens, 1, 16, seed=52, requires_grad=True)
    with pytest.raises(ValueError, match="forward only"):
        VSAAttention(VSAOptions(precision="int8", impl="torch"))(q, k, v, ctx(lay, None, NullTimer()))


def test_t2v_with_vsa_int8_records_the_precision(vsagen_cache, tiny_dir, tmp_path):
    """`vsagen t2v --model tiny --attn vsa:precision=int8` on the CPU (the torch formulas): a video, and the run
    JSON's backend says which precision the fine stage ran in."""
    import json

    from typer.testing import CliRunner

    from vsagen.cli.app import app

    res = CliRunner().invoke(app, ["t2v", "a fox", "--model", "tiny", "--steps", "1", "--frames", "5", "--height",
                                   "64", "--width", "80", "--json", "--attn", "vsa:precision=int8",
                                   "--out", str(tmp_path / "a.mp4")])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["backend"]["precision"] == "int8" and data["backend"]["impl_ran"] == "torch"
    assert (tmp_path / "a.mp4").stat().st_size > 0
    # said, not only recorded (a new-user trial: the CPU run gave no sign that the 8-bit kernels did not run)
    note = next(n for n in data["timing"]["notes"] if "precision=int8 with impl torch" in n)
    assert "float32 torch ops" in note and "not its speed" in note and f"note: {note}" in res.stderr


def test_vsa_topk_count_tokens_is_the_reference_at_fastvideos_earlier_count():
    """`topk_count=tokens` (FastVideo's count before its PR #1517): on a grid of partial cubes the backend is the
    eager reference at K = ceil((1 - s) tokens / 64), fewer than today's count; the run JSON says so."""
    lay = tile_layout((5, 6, 10))  # 300 tokens in 12 cubes, most partial
    backend = resolve_spec("vsa:topk_count=tokens:impl=torch:sparsity=0.5").build()
    assert (backend.top_k(lay), ref.top_k_from_sparsity(0.5, lay.num_tiles)) == (3, 6)
    q, k, v = make_qkv(B, lay.num_tokens, H, D, seed=41)
    gate = torch.rand(B, lay.num_tokens, H, D, generator=torch.Generator().manual_seed(42))
    got, q2k = backend.attend(q, k, v, lay, gate, NullTimer())
    want, _ = ref.vsa_reference(q.double(), k.double(), v.double(), token_tile=lay.token_tile,
                                tile_sizes=lay.tile_sizes, slots=lay.slots, slot_valid=lay.slot_valid, top_k=3,
                                gate=gate.double())
    assert q2k.shape == (B, H, lay.num_tiles, 3)
    torch.testing.assert_close(got.double(), want, atol=FP32_ATOL, rtol=FP32_RTOL)
    assert backend.describe()["topk_count"] == "tokens" and "topk_count" not in make_backend("vsa").describe()
    with pytest.raises(BadInput, match="topk_count must be one of tiles, tokens"):
        resolve_spec("vsa:topk_count=padded")


def test_fastvideo_presets_count_top_k_as_their_checkpoints_were_trained():
    """FastWan2.1-1.3B at 480x832x81 (its default size; 21x30x52 post-patch): 103 kept cubes of 624 with its
    preset's count (FastVideo's before PR #1517), 125 counted today's way (`vsa:topk_count=tiles`)."""
    from vsagen.models.presets import load_preset
    from vsagen.models.sources import resolve_model
    from vsagen.request.plans import preset_plan

    src = resolve_model("fastwan2.1-t2v-1.3b")
    d = src.preset.defaults
    lay = tile_layout(tuple(preset_plan(src, d.frames, d.height, d.width, "partial").grid))
    table = d.attention["vsa"]
    assert (d.frames, d.height, d.width, lay.num_tokens, lay.num_tiles) == (81, 480, 832, 32760, 624)
    assert VSAAttention(VSAOptions(**table)).top_k(lay) == 103
    assert VSAAttention(VSAOptions(**{**table, "topk_count": "tiles"})).top_k(lay) == 125
    # FastWan2.2-TI2V-5B (VSA) at 704x1280x121: 31x22x40 post-patch, 86 kept cubes of 480 (96 counted by tiles)
    src = resolve_model("fastwan2.2-ti2v-5b-vsa")
    d = src.preset.defaults
    lay = tile_layout(tuple(preset_plan(src, d.frames, d.height, d.width, "partial").grid))
    table = d.attention["vsa"]
    assert (lay.num_tokens, lay.num_tiles) == (27280, 480)
    assert VSAAttention(VSAOptions(**table)).top_k(lay) == math.ceil(0.2 * 27280 / 64) == 86
    assert VSAAttention(VSAOptions(**{**table, "topk_count": "tiles"})).top_k(lay) == 96
    for name in ("fastwan2.1-t2v-1.3b", "fastwan2.1-t2v-14b-480p", "wan2.1-vsa-t2v-14b-720p", "fastwan2.2-ti2v-5b-vsa"):
        tables = load_preset(name).defaults.attention
        assert tables["vsa"]["topk_count"] == tables["rocm-vsa"]["topk_count"] == "tokens"
