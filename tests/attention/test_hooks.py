"""vsagen.attention.hooks: tile order once per transformer forward (RoPE tables, hidden states, per-token
timestep, restore), `patch_transformer` / `remove`, the DiT timing hooks (`time_transformer`), `TiledRope`, and
gradients through the hooks (checkpointing, a run after inference mode).

Everything runs the tiny Wan transformer on CPU with fresh random inputs (conftest's tiny transformer helpers:
grid 5 x 6 x 10 with partial tiles). The oracle `PerLayerReorderProcessor` reorders inside every layer instead.
"""

from __future__ import annotations

import pytest
import torch
from conftest import (GRID, LATENT, TOL_REORDER_FP32, diffusers_rope, forward, make_inputs, make_transformer,
                      maxdiff, patched_forward)

from vsagen.attention import make_backend
from vsagen.attention.base import AttnContext
from vsagen.attention.hooks import TiledRope, patch_transformer, time_transformer
from vsagen.layout import tile_layout
from vsagen.timing import NullTimer, Timer

# One pytest-xdist worker runs the whole file (`--dist loadgroup`, pyproject.toml): the module fixture computes the
# references once, not in each worker.
pytestmark = pytest.mark.xdist_group("test_hooks")

# The same comparison as TOL_REORDER_FP32 in float64: reordering sums only costs ~1e-16 relative per op; observed 0.
TOL_REORDER_FP64 = 1e-12
# Tile order once vs reorder per layer: identical tokens in identical tile order reach the backend; only the
# projections run on permuted rows (matmul rounding per row is order-independent). Observed 0; allow fp32 noise.
TOL_SAME_TILES_FP32 = 1e-5
# A broken reorder (RoPE, hidden states, restore, timestep) moves whole tokens: errors of order 4e-2 .. 3
# (REFERENCE.md). A control must miss the tolerance above by this much to count as caught.
NEG_CONTROL_MIN = 1e-2
# Gradient checkpointing re-runs the same ops on the same inputs: the recomputed activations are bitwise
# equal, so the input gradients should agree to fp32 noise from a different accumulation order at most.
TOL_GRAD = 1e-5


class PerLayerReorderProcessor:
    """Independent oracle: raster-order q/k/v per layer, permuted into tile order around the backend call.

    Built from diffusers' processor math (projections, RMS norm across heads, interleaved RoPE) and the tile
    permutation of the grid; it needs no hooks, so it runs inside the stock transformer.
    """

    def __init__(self, backend, grid):
        self.backend = backend
        self.layout = tile_layout(grid)

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        assert encoder_hidden_states is None and attention_mask is None
        q = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (attn.heads, -1))
        k = attn.norm_k(attn.to_k(hidden_states)).unflatten(2, (attn.heads, -1))
        v = attn.to_v(hidden_states).unflatten(2, (attn.heads, -1))
        q, k = diffusers_rope(q, *rotary_emb), diffusers_rope(k, *rotary_emb)
        perm, inv = self.layout.perm, self.layout.inv_perm
        assert torch.equal(perm[inv], torch.arange(perm.numel()))
        out = self.backend(q[:, perm], k[:, perm], v[:, perm], AttnContext(self.layout, 0, None, NullTimer()))
        out = out[:, inv].flatten(2, 3).type_as(q)
        return attn.to_out[1](attn.to_out[0](out))


def per_layer_reference(transformer, backend, inputs, grid=GRID):
    """Output of the stock transformer whose attn1 processors reorder per layer (restored afterwards)."""
    old = [b.attn1.processor for b in transformer.blocks]
    proc = PerLayerReorderProcessor(backend, grid)
    try:
        for b in transformer.blocks:
            b.attn1.set_processor(proc)
        return forward(transformer, inputs)
    finally:
        for b, p in zip(transformer.blocks, old):
            b.attn1.set_processor(p)


def hook_handle(patch, hooks: dict):
    """The handle in `patch.handles` that owns a hook in `hooks` (a module's _forward_hooks / _pre_hooks)."""
    found = [h for h in patch.handles if h.id in hooks]
    assert len(found) == 1, f"expected one patch handle in {hooks}, found {len(found)}"
    return found[0]


def test_tiled_patch_remove_restores_stock_exactly():
    t = make_transformer()
    inputs = make_inputs(batch=1, seed=12)
    stock = forward(t, inputs)
    patched = patched_forward(t, make_backend("vsa", 0.5), inputs)
    assert maxdiff(patched, stock) > NEG_CONTROL_MIN  # sparsity 0.5 really changed something
    assert not t._forward_pre_hooks and not t._forward_hooks and not t.rope._forward_hooks
    assert not t.blocks[0]._forward_pre_hooks and not t.proj_out._forward_hooks
    assert torch.equal(forward(t, inputs), stock)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, TOL_REORDER_FP32), (torch.float64, TOL_REORDER_FP64)],
                         ids=["fp32", "fp64"])
def test_vsa_sparsity0_equals_stock(dtype, tol):
    t = make_transformer(dtype)
    inputs = make_inputs(batch=2, dtype=dtype, seed=31)
    stock = forward(t, inputs)
    ours = patched_forward(t, make_backend("vsa", 0.0), inputs)
    assert ours.dtype == stock.dtype == dtype
    assert maxdiff(ours, stock) <= tol
    assert stock.abs().max().item() > 0.1  # a real signal, not a degenerate output


def test_vsa_sparsity0_equals_stock_full_tiles_grid():
    """A grid of whole tiles (4 x 8 x 8) as the crop plan makes it, batch 1."""
    latent = (16, 4, 16, 16)
    t = make_transformer()
    inputs = make_inputs(batch=1, seed=32, latent=latent)
    stock = forward(t, inputs)
    ours = patched_forward(t, make_backend("vsa", 0.0), inputs)
    assert maxdiff(ours, stock) <= TOL_REORDER_FP32


@pytest.fixture(scope="module")
def sparse_case():
    """Transformer, inputs and the two references shared by the tile-order tests (computed once)."""
    t = make_transformer(seed=3)
    inputs = make_inputs(batch=2, seed=41)
    stock = forward(t, inputs)
    per_layer = per_layer_reference(t, make_backend("vsa", 0.5), inputs)
    return t, inputs, stock, per_layer


def test_tile_order_once_equals_per_layer_reorder(sparse_case):
    t, inputs, stock, per_layer = sparse_case
    once = patched_forward(t, make_backend("vsa", 0.5), inputs)
    assert maxdiff(once, per_layer) <= TOL_SAME_TILES_FP32
    # Sparsity 0.5 must matter, else the comparison above would not test the tile order of the selection.
    assert maxdiff(per_layer, stock) > NEG_CONTROL_MIN


def test_per_layer_reference_at_sparsity0_equals_stock(sparse_case):
    """Sanity of the oracle itself: with every tile kept it is full attention."""
    t, inputs, stock, _ = sparse_case
    assert maxdiff(per_layer_reference(t, make_backend("vsa", 0.0), inputs), stock) <= TOL_REORDER_FP32


def _skip_rope_reorder(patch):
    """Replace the RoPE hook by one that passes raster-order tables on (with the layout, so nothing raises)."""
    t = patch.transformer
    h = hook_handle(patch, t.rope._forward_hooks)
    h.remove()
    patch.handles.remove(h)

    def raster_rope(module, args, output):
        layout = tile_layout((args[0].shape[2], args[0].shape[3] // 2, args[0].shape[4] // 2))
        return TiledRope(output[0], output[1], layout)

    patch.handles.append(t.rope.register_forward_hook(raster_rope))


def _skip_hidden_reorder(patch):
    h = hook_handle(patch, patch.transformer.blocks[0]._forward_pre_hooks)
    h.remove()
    patch.handles.remove(h)


def _skip_restore(patch):
    h = hook_handle(patch, patch.transformer.proj_out._forward_hooks)
    h.remove()
    patch.handles.remove(h)


@pytest.mark.parametrize("mutate", [_skip_rope_reorder, _skip_hidden_reorder, _skip_restore],
                         ids=["rope-reorder", "hidden-reorder", "restore"])
def test_negative_controls_are_caught(sparse_case, mutate):
    t, inputs, stock, per_layer = sparse_case
    # The comparison of the tile-order test (vsa 0.5 vs per-layer reorder) ...
    broken = patched_forward(t, make_backend("vsa", 0.5), inputs, mutate=mutate)
    assert maxdiff(broken, per_layer) > NEG_CONTROL_MIN
    # ... and of the sparsity-0 test (where only the ordering can matter) must both fail by a wide margin.
    broken0 = patched_forward(t, make_backend("vsa", 0.0), inputs, mutate=mutate)
    assert maxdiff(broken0, stock) > NEG_CONTROL_MIN
    # The unmutated patch still passes on the same transformer afterwards (the mutation was undone).
    assert maxdiff(patched_forward(t, make_backend("vsa", 0.0), inputs), stock) <= TOL_REORDER_FP32


def test_per_token_timestep_is_reordered():
    """Wan2.2-5B style (B, S) timestep, a different value per token: temb must come out in tile order."""
    t = make_transformer(seed=4)
    hs, ts, enc = make_inputs(batch=2, seed=51, per_token_timestep=True)
    assert ts.shape == (2, 300) and ts.unique().numel() == ts.numel()
    stock = forward(t, (hs, ts, enc))
    ours = patched_forward(t, make_backend("vsa", 0.0), (hs, ts, enc))
    assert maxdiff(ours, stock) <= TOL_REORDER_FP32
    # Positional call (timestep as args[1]) takes the same path.
    patch = patch_transformer(t, make_backend("vsa", 0.0), Timer("cpu"))
    try:
        with torch.no_grad():
            positional = t(hs, ts, enc, return_dict=False)[0]
    finally:
        patch.remove()
    assert maxdiff(positional, stock) <= TOL_REORDER_FP32
    # Negative control: skipping the timestep reorder. Feeding the patch the timestep in inverse tile order makes
    # the hook's reorder produce the raster-order timestep, i.e. exactly what a missing reorder would do.
    layout = tile_layout(GRID)
    skipped = patched_forward(t, make_backend("vsa", 0.0), (hs, layout.to_raster(ts, dim=1), enc))
    assert maxdiff(skipped, stock) > NEG_CONTROL_MIN


def _input_and_weight_grads(t, inputs, timer=None):
    hs, ts, enc = inputs
    hs = hs.clone().requires_grad_(True)
    g = torch.Generator().manual_seed(61)
    w = torch.randn(2, *LATENT, generator=g)
    patch = patch_transformer(t, make_backend("vsa", 0.5), timer or Timer("cpu"))
    try:
        t.zero_grad(set_to_none=True)
        with torch.enable_grad():
            out = forward(t, (hs, ts, enc), grad=True)
            (out * w).sum().backward()
    finally:
        patch.remove()
    return out.detach(), hs.grad.detach(), t.blocks[0].attn1.to_q.weight.grad.detach().clone()


@pytest.mark.parametrize("reentrant", [False, True], ids=["diffusers-default", "reentrant"])
def test_gradient_checkpointing_gives_same_gradients(reentrant):
    t = make_transformer(seed=5)
    inputs = make_inputs(batch=2, seed=62)
    timer_plain = Timer("cpu")
    out0, gx0, gw0 = _input_and_weight_grads(t, inputs, timer_plain)

    if reentrant:
        import torch.utils.checkpoint as ckpt

        t.enable_gradient_checkpointing(
            lambda module, *args: ckpt.checkpoint(module.__call__, *args, use_reentrant=True))
    else:
        t.enable_gradient_checkpointing()
    assert t.gradient_checkpointing
    timer_ckpt = Timer("cpu")
    out1, gx1, gw1 = _input_and_weight_grads(t, inputs, timer_ckpt)

    n_layers = len(t.blocks)
    count = lambda timer, name: sum(1 for n, _, _ in timer.finish() if n == name)  # noqa: E731
    assert count(timer_plain, "attn1") == n_layers
    assert count(timer_ckpt, "attn1") == 2 * n_layers, "blocks were not re-run: checkpointing not in effect"
    assert maxdiff(out1, out0) <= TOL_GRAD
    assert torch.isfinite(gx0).all() and gx0.abs().max() > 0 and gw0.abs().max() > 0
    assert maxdiff(gx1, gx0) <= TOL_GRAD
    assert maxdiff(gw1, gw0) <= TOL_GRAD * max(1.0, gw0.abs().max().item())


def test_autograd_after_a_run_in_inference_mode():
    """`tile_layout` caches its index tensors for the whole process. A generation (which runs under
    torch.inference_mode) must not leave inference tensors in that cache: a later grad-enabled forward on the
    same grid would fail with "Inference tensors cannot be saved for backward"."""
    tile_layout.cache_clear()  # make this test independent of which test built the layout first
    t = make_transformer(seed=6)
    inputs = make_inputs(batch=1, seed=63)
    with torch.inference_mode():
        patched_forward(t, make_backend("vsa", 0.5), inputs)  # builds and caches the layout in inference mode
    assert not tile_layout(GRID).perm.is_inference()
    hs, ts, enc = inputs
    hs = hs.clone().requires_grad_(True)
    patch = patch_transformer(t, make_backend("vsa", 0.5), Timer("cpu"))
    try:
        with torch.enable_grad():
            forward(t, (hs, ts, enc), grad=True).square().sum().backward()
    finally:
        patch.remove()
    assert torch.isfinite(hs.grad).all() and hs.grad.abs().max() > 0


@pytest.mark.parametrize("attn,sparsity,per_token", [("full", None, False), ("vsa", 0.5, False), ("vsa", 0.5, True)])
def test_layout_region_times_every_reorder(attn, sparsity, per_token):
    """Tiled backends: one "layout" region per reorder (RoPE tables, hidden states into blocks[0], restore after
    proj_out, and the per-token timestep when there is one), none for raster backends; all inside "dit"."""
    t = make_transformer()
    timer = Timer("cpu")
    patch = patch_transformer(t, make_backend(attn, sparsity), timer)
    try:
        forward(t, make_inputs(batch=1, seed=82, per_token_timestep=per_token))
    finally:
        patch.remove()
    records = timer.finish()
    names = [n for n, _, _ in records]
    assert names.count("layout") == (0 if attn == "full" else 4 if per_token else 3)
    total = lambda name: sum(sec for n, _, sec in records if n == name)  # noqa: E731
    assert total("layout") <= total("dit")


def test_time_transformer_times_stock_processors_only():
    """`time_transformer` records one "dit" (and "dit/<expert>") region per forward and nothing else; the
    stock processors stay in place and the output is the unpatched transformer's, bitwise."""
    t = make_transformer()
    inputs = make_inputs(batch=1, seed=83)
    stock = [b.attn1.processor for b in t.blocks]
    want = forward(t, inputs)
    timer = Timer("cpu")
    patch = time_transformer(t, timer, expert="transformer")
    try:
        assert [b.attn1.processor for b in t.blocks] == stock
        timer.step = 0
        got = forward(t, inputs)
    finally:
        patch.remove()
    forward(t, inputs)  # after remove(): records nothing
    assert torch.equal(got, want)
    assert [b.attn1.processor for b in t.blocks] == stock
    assert sorted(n for n, _, _ in timer.finish()) == ["dit", "dit/transformer"]


def test_tiled_rope_survives_send_to_device():
    """Group offloading moves every block's arguments with accelerate's send_to_device: the tile layout must
    travel with the RoPE tables (a plain tuple subclass would be rebuilt from a generator and fail)."""
    from accelerate.utils import send_to_device

    from vsagen.attention.hooks import TiledRope
    from vsagen.layout import tile_layout

    layout = tile_layout((2, 4, 4))
    cos, sin = torch.randn(1, 32, 1, 8), torch.randn(1, 32, 1, 8)
    moved = send_to_device((torch.zeros(1), TiledRope(cos, sin, layout)), torch.device("cpu"), non_blocking=True)
    rope = moved[1]
    assert isinstance(rope, TiledRope) and rope.layout is layout
    assert torch.equal(rope[0], cos) and torch.equal(rope[1], sin)
