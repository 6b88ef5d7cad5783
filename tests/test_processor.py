"""vsagen.attention.processor: the Wan `attn1` processor and the tile-order-once-per-forward hooks.

Everything runs the tiny Wan transformer (preset `tiny`: 2 layers, 2 heads of 16) on CPU with fresh random
inputs. The default latent (1..2, 16, 5, 12, 20) patchifies to the grid 5 x 6 x 10 = 300 tokens, which has
partial tiles in every dimension (12 tiles, 2 of them full), so every reorder is exercised with uneven tiles.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_transformer

from vsagen.attention import make_backend
from vsagen.attention.base import AttnContext
from vsagen.attention.hooks import TiledRope, patch_transformer, time_transformer
from vsagen.attention.processor import VsagenAttnProcessor, apply_rotary
from vsagen.layout import tile_layout
from vsagen.timing import NullTimer, Timer, TimingReport

# `full` through our processor calls the same SDPA on q/k/v built by the same ops as diffusers' processor; the
# only arithmetic that differs in form is RoPE (stack vs strided stores), which rounds identically in fp32.
# 1e-6 leaves room for a different but equally rounded SDPA kernel choice.
TOL_FULL_FP32 = 1e-6
# Tile order changes which tokens sit together in the fine stage's padded tiles and the order of the softmax
# sums (fp32, S=300, D=16, 2 layers): observed ~7e-7 on outputs of magnitude ~3; 1e-5 is ~15x that.
TOL_REORDER_FP32 = 1e-5
# The same comparison in float64: reordering sums only costs ~1e-16 relative per op; observed 0.
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
# apply_rotary vs the complex-number form of the rotation (independent formula): fp32 rounding of 2 products.
TOL_ROPE_COMPLEX_FP32 = 1e-5

LATENT = (16, 5, 12, 20)  # (C, F_lat, H_lat, W_lat) -> grid (5, 6, 10) with patch (1, 2, 2)
GRID = (5, 6, 10)
TEXT_LEN = 9


def make_inputs(batch: int = 2, dtype=torch.float32, seed: int = 1, per_token_timestep: bool = False,
                latent=LATENT):
    """Fresh random transformer inputs (never zeros): hidden_states, timestep, encoder_hidden_states."""
    g = torch.Generator().manual_seed(seed)
    hs = torch.randn(batch, *latent, generator=g).to(dtype)
    if per_token_timestep:
        c, f, h, w = latent
        s = f * (h // 2) * (w // 2)
        ts = torch.rand(batch, s, generator=g) * 999.0 + 0.5  # a different timestep for every token
    else:
        ts = torch.rand(batch, generator=g) * 999.0 + 0.5
    enc = torch.randn(batch, TEXT_LEN, 32, generator=g).to(dtype)
    return hs, ts, enc


def forward(transformer, inputs, grad: bool = False):
    hs, ts, enc = inputs
    with torch.set_grad_enabled(grad):
        return transformer(hidden_states=hs, timestep=ts, encoder_hidden_states=enc, return_dict=False)[0]


def maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def diffusers_rope(x: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor) -> torch.Tensor:
    """diffusers 0.42.1 `WanAttnProcessor.__call__.apply_rotary_emb`, copied verbatim (the oracle;
    `test_diffusers_rope_oracle_is_current` checks the installed diffusers still has these lines)."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos = freqs_cos[..., 0::2]
    sin = freqs_sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


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


def patched_forward(transformer, backend, inputs, timer=None, mutate=None, fused_prologue="auto"):
    """Output through `patch_transformer` (optionally mutated first); the patch is removed afterwards."""
    patch = patch_transformer(transformer, backend, timer or Timer("cpu"), fused_prologue=fused_prologue)
    try:
        if mutate is not None:
            mutate(patch)
        return forward(transformer, inputs)
    finally:
        patch.remove()


def hook_handle(patch, hooks: dict):
    """The handle in `patch.handles` that owns a hook in `hooks` (a module's _forward_hooks / _pre_hooks)."""
    found = [h for h in patch.handles if h.id in hooks]
    assert len(found) == 1, f"expected one patch handle in {hooks}, found {len(found)}"
    return found[0]


def has_partial_tiles(grid) -> bool:
    return any(g % 4 for g in grid)


# --------------------------------------------------------------------------------------------------------------
# full through our processor; remove()


def test_full_processor_equals_stock_and_remove_restores():
    t = make_transformer()
    inputs = make_inputs(batch=2, seed=11)
    assert has_partial_tiles(GRID)
    stock = forward(t, inputs)
    stock_procs = [(b.attn1.processor, b.attn2.processor) for b in t.blocks]

    patch = patch_transformer(t, make_backend("full"), Timer("cpu"))
    assert all(isinstance(b.attn1.processor, VsagenAttnProcessor) for b in t.blocks)
    assert all(b.attn2.processor is p2 for b, (_, p2) in zip(t.blocks, stock_procs)), "attn2 must stay stock"
    ours = forward(t, inputs)
    patch.remove()

    assert ours.shape == stock.shape == (2, *LATENT)
    assert maxdiff(ours, stock) <= TOL_FULL_FP32
    # Stock processors and no hooks left; bitwise the same output as before patching.
    assert all(b.attn1.processor is p1 for b, (p1, _) in zip(t.blocks, stock_procs))
    assert not t._forward_pre_hooks and not t._forward_hooks
    assert not t.rope._forward_hooks and not t.blocks[0]._forward_pre_hooks and not t.proj_out._forward_hooks
    assert patch.handles == []
    assert torch.equal(forward(t, inputs), stock)


def test_tiled_patch_remove_restores_stock_exactly():
    t = make_transformer()
    inputs = make_inputs(batch=1, seed=12)
    stock = forward(t, inputs)
    patched = patched_forward(t, make_backend("vsa", 0.5), inputs)
    assert maxdiff(patched, stock) > NEG_CONTROL_MIN  # sparsity 0.5 really changed something
    assert not t._forward_pre_hooks and not t._forward_hooks and not t.rope._forward_hooks
    assert not t.blocks[0]._forward_pre_hooks and not t.proj_out._forward_hooks
    assert torch.equal(forward(t, inputs), stock)


def test_full_processor_with_fused_qkv_equals_stock():
    t = make_transformer()
    t.fuse_qkv_projections()
    assert all(getattr(b.attn1, "fused_projections", False) for b in t.blocks)
    inputs = make_inputs(batch=2, seed=13)
    stock = forward(t, inputs)
    ours = patched_forward(t, make_backend("full"), inputs)
    assert maxdiff(ours, stock) <= TOL_FULL_FP32


# --------------------------------------------------------------------------------------------------------------
# RoPE


def test_diffusers_rope_oracle_is_current():
    """The RoPE lines copied above (and repeated by vsagen's processor) are those of the installed diffusers."""
    import inspect

    from diffusers.models.transformers.transformer_wan import WanAttnProcessor

    src = " ".join(inspect.getsource(WanAttnProcessor.__call__).split())
    for line in ("x1, x2 = hidden_states.unflatten(-1, (-1, 2)).unbind(-1)", "cos = freqs_cos[..., 0::2]",
                 "sin = freqs_sin[..., 1::2]", "out[..., 0::2] = x1 * cos - x2 * sin",
                 "out[..., 1::2] = x1 * sin + x2 * cos", "return out.type_as(hidden_states)"):
        assert line in src, f"diffusers' WanAttnProcessor changed: {line!r} not found"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_apply_rotary_equals_diffusers_formula(dtype):
    g = torch.Generator().manual_seed(21)
    t = make_transformer()
    cos, sin = t.rope(torch.randn(1, *LATENT, generator=g))  # the real tables: (1, S, 1, D) float32
    assert cos.shape == (1, 300, 1, 16) and cos.dtype == torch.float32
    x = torch.randn(2, 300, 2, 16, generator=g).to(dtype)
    ours = apply_rotary(x, cos, sin)
    ref = diffusers_rope(x, cos, sin)
    assert ours.dtype == dtype and ours.shape == x.shape
    assert torch.equal(ours, ref)  # same arithmetic, same single rounding to x's dtype

    # Random angles, against the rotation written as complex multiplication (an independent formula).
    theta = torch.rand(1, 300, 1, 8, generator=g, dtype=torch.float64) * 20.0 - 10.0
    cos_r = theta.cos().repeat_interleave(2, -1).float()
    sin_r = theta.sin().repeat_interleave(2, -1).float()
    ours = apply_rotary(x, cos_r, sin_r)
    assert torch.equal(ours, diffusers_rope(x, cos_r, sin_r))
    if dtype == torch.float32:
        z = torch.view_as_complex(x.double().unflatten(-1, (-1, 2)).contiguous())
        rot = torch.view_as_real(z * torch.polar(torch.ones_like(theta), theta)).flatten(-2)
        assert maxdiff(ours, rot) <= TOL_ROPE_COMPLEX_FP32


# --------------------------------------------------------------------------------------------------------------
# The fused q/k prologue (kernels/qk_norm_rope.py) inside the processor


@pytest.mark.parametrize("attn,sparsity,fused_qkv", [("full", None, False), ("vsa", 0.0, False),
                                                      ("vsa", 0.5, True)], ids=["full", "vsa-0", "vsa-0.5-fused-qkv"])
def test_fused_prologue_equals_the_eager_prologue(monkeypatch, attn, sparsity, fused_qkv):
    """The processor with the fused norm + RoPE kernel (forced on, under the interpreter) against the same
    processor with diffusers' eager arithmetic: raster RoPE tables (full) and tile-order ones (vsa), with and
    without a fused q/k/v projection (strided q, k rows). fp32 on both sides: differences are rounding only."""
    from vsagen.kernels import qk_norm_rope

    t = make_transformer()
    if fused_qkv:
        t.fuse_qkv_projections()
    inputs = make_inputs(batch=2, seed=71)
    calls = []
    real = qk_norm_rope.rms_norm_rope
    monkeypatch.setattr(qk_norm_rope, "rms_norm_rope", lambda *a: calls.append(1) or real(*a))
    eager = patched_forward(t, make_backend(attn, sparsity), inputs, fused_prologue="off")
    assert calls == []
    fused = patched_forward(t, make_backend(attn, sparsity), inputs, fused_prologue="on")
    assert len(calls) == 2 * len(t.blocks) * 1  # q and k of every attn1, one forward (batch 2 in one call)
    assert maxdiff(fused, eager) <= TOL_REORDER_FP32
    assert eager.abs().max().item() > 0.1


def test_fused_prologue_is_skipped_under_autograd(monkeypatch):
    import vsagen.attention.processor as proc

    t = make_transformer()
    x = torch.randn(1, 4, t.blocks[0].attn1.inner_dim, requires_grad=True)
    rope = (torch.ones(1, 4, 1, 16), torch.zeros(1, 4, 1, 16))
    assert not proc.use_fused_prologue(t.blocks[0].attn1, x, rope, "on")
    with torch.no_grad():
        assert proc.use_fused_prologue(t.blocks[0].attn1, x, rope, "on")
    assert not proc.use_fused_prologue(t.blocks[0].attn1, x.detach(), None, "on")
    assert not proc.use_fused_prologue(t.blocks[0].attn1, x.detach(), rope, "auto")  # CPU tensor: eager under "auto"


# --------------------------------------------------------------------------------------------------------------
# vsa at sparsity 0 == stock full attention


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


# --------------------------------------------------------------------------------------------------------------
# Tile order once per forward == reordering inside each layer; negative controls


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


# --------------------------------------------------------------------------------------------------------------
# Gradient checkpointing


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


# --------------------------------------------------------------------------------------------------------------
# Misuse


def test_processor_raises_without_tile_hooks():
    t = make_transformer()
    inputs = make_inputs(batch=1, seed=71)
    proc = VsagenAttnProcessor(make_backend("vsa", 0.5), Timer("cpu"))
    for b in t.blocks:
        b.attn1.set_processor(proc)
    with pytest.raises(RuntimeError, match="tile"):
        forward(t, inputs)


def test_processor_dense_backend_needs_no_hooks_and_refuses_cross_attention():
    t = make_transformer()
    inputs = make_inputs(batch=1, seed=72)
    stock = forward(t, inputs)
    proc = VsagenAttnProcessor(make_backend("full"), Timer("cpu"))
    for b in t.blocks:
        b.attn1.set_processor(proc)
    assert maxdiff(forward(t, inputs), stock) <= TOL_FULL_FP32
    t.blocks[0].attn2.set_processor(proc)
    with pytest.raises(ValueError, match="self-attention"):
        forward(t, inputs)


# --------------------------------------------------------------------------------------------------------------
# Timing


@pytest.mark.parametrize("attn,sparsity", [("full", None), ("vsa", 0.5)])
def test_timer_regions_per_forward_and_layer(attn, sparsity):
    t = make_transformer()
    inputs = make_inputs(batch=1, seed=81)
    timer = Timer("cpu")
    patch = patch_transformer(t, make_backend(attn, sparsity), timer)
    n_forwards, n_layers = 3, len(t.blocks)
    try:
        for step in range(n_forwards):
            timer.step = step
            forward(t, inputs)
    finally:
        patch.remove()
    timer.step = 99
    forward(t, inputs)  # after remove(): records nothing
    records = timer.finish()
    names = [n for n, _, _ in records]
    assert names.count("dit") == n_forwards
    assert names.count("attn1") == n_forwards * n_layers
    assert names.count("self_attention") == n_forwards * n_layers
    stages = {n for n in names if n.startswith("self_attention/")}
    assert stages == ({"self_attention/coarse", "self_attention/fine"} if attn == "vsa" else set())
    for stage in stages:
        assert names.count(stage) == n_forwards * n_layers
    assert sorted(s for n, s, _ in records if n == "dit") == list(range(n_forwards))  # tagged with the step
    assert all(sec >= 0 for _, _, sec in records)
    total = lambda name: sum(sec for n, _, sec in records if n == name)  # noqa: E731
    assert 0 < total("self_attention") <= total("attn1") <= total("dit")
    report = TimingReport.from_records(records, "cpu")
    assert report.dit_forwards == n_forwards and len(report.dit_per_step_s) == n_forwards
    assert 0 < report.attention_share_of_dit <= 1


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
