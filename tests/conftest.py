"""Shared fixtures: an isolated vsagen cache with the tiny checkpoint, random input factories, and the kernel tests'
helpers (tile selections, oracles, error measures; bottom of the file)."""

from __future__ import annotations

import os

# Kernels run under the Triton interpreter on CPU; it must be set before any @triton.jit decorates.
os.environ.setdefault("TRITON_INTERPRET", "1")

# torch's CPU threads: by default each pytest-xdist worker took every core, so `-n auto` ran two threads per core,
# and the tiny models' thousands of small operations waited on each other's spinning threads: a tiny t2v run took
# 4 s of CPU against 0.6 s on one thread (2-core machine, its cores shared). Each worker takes its share of the cores instead (the
# subprocesses its tests start inherit it; a user's OMP_NUM_THREADS is kept). Set before torch is imported, which
# reads it; only in a worker (xdist names it before it loads this file), since the workers inherit the controller's
# environment.
# Inductor's C++ compiles likewise (torch._inductor.config.compile_threads, read from the environment when that
# module is imported): one per core by default, which on the 2-core machine started a pool of compile processes
# (a fresh interpreter importing torch) beside the worker that already held a core: 46 -> 39 s of CPU for the
# compiled t2v test (tests/test_compile.py, cold caches, 2026-12-07). The same code is compiled, in this process.
if "PYTEST_XDIST_WORKER" in os.environ:
    from vsagen.parallel.spawn import worker_threads  # imports no torch

    _share = str(worker_threads(int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    os.environ.setdefault("OMP_NUM_THREADS", _share)
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", _share)

import math
import re
import shutil
import signal

import numpy as np
import pytest
import torch

# The signal tests (Ctrl-C held while files are written) send SIGINT to this process and expect Python's default
# handler; a suite started as a shell's background job inherits SIGINT ignored (and vsagen, rightly, keeps an ignored
# signal ignored), so six of them failed when `bash .ci/run &` ran in the background. Start from the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


if os.environ.get("TRITON_INTERPRET") == "1":
    from triton_interpreter import apply as _speed_up_the_interpreter  # tests/triton_interpreter.py

    _speed_up_the_interpreter()

# vsagen wraps its notes to COLUMNS when it is set (vsagen.cli.terminal); the tests read whole notes and paths from
# stderr, so a COLUMNS exported by the user's shell, or pytest-xdist's workers (they set COLUMNS=80), broke three of
# them where a temporary path pushed a line past 80 columns. Tests of the wrapping set COLUMNS themselves.
os.environ.pop("COLUMNS", None)


# how xdist shares the tests between workers: tests/scheduling.py
from scheduling import pytest_collection_modifyitems, pytest_xdist_make_scheduler  # noqa: E402,F401
# the gloo processes of the Ulysses and CFG-parallel tests, spawned once for the session: tests/ulysses_worker.py
from ulysses_worker import gloo_runs  # noqa: E402,F401


@pytest.fixture(scope="session")
def vsagen_cache(tmp_path_factory):
    """A private VSAGEN_CACHE for the whole test session (never the user's ~/.cache)."""
    path = tmp_path_factory.mktemp("vsagen-cache")
    old = os.environ.get("VSAGEN_CACHE")
    os.environ["VSAGEN_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("VSAGEN_CACHE", None)
    else:
        os.environ["VSAGEN_CACHE"] = old


def saved_tiny(name: str):
    """Directory of the saved tiny pipeline of preset `name` (built once into the session's VSAGEN_CACHE)."""
    from vsagen.models.presets import load_preset
    from vsagen.models.tiny import ensure_tiny_checkpoint

    return ensure_tiny_checkpoint(load_preset(name))


# One fixture per tiny family, shared by every test file (each checkpoint is built once per session).
@pytest.fixture(scope="session")
def tiny_dir(vsagen_cache):
    return saved_tiny("tiny")


@pytest.fixture(scope="session")
def ti2v_dir(vsagen_cache):
    return saved_tiny("tiny-ti2v")


@pytest.fixture(scope="session")
def a14b_dir(vsagen_cache):
    return saved_tiny("tiny-a14b")


@pytest.fixture(scope="session")
def i2v_dir(vsagen_cache):
    return saved_tiny("tiny-i2v")


@pytest.fixture(scope="session")
def flf2v_dir(vsagen_cache):
    return saved_tiny("tiny-flf2v")


@pytest.fixture(scope="session")
def i2v_a14b_dir(vsagen_cache):
    return saved_tiny("tiny-i2v-a14b")


@pytest.fixture
def tiny_pipe(tiny_dir):
    """A fresh WanPipeline loaded from the tiny checkpoint (float32, CPU)."""
    from diffusers import WanPipeline

    return WanPipeline.from_pretrained(tiny_dir, use_safetensors=True)


def make_transformer(dtype=torch.float32, seed: int = 0):
    """The tiny preset's WanTransformer3DModel with seeded random weights (CPU, eval)."""
    from diffusers import WanTransformer3DModel

    from vsagen.models.presets import load_preset

    torch.manual_seed(seed)
    t = WanTransformer3DModel(**load_preset("tiny").transformer).eval()
    return t if dtype == torch.float32 else t.to(dtype)


def block_gated_checkpoint(tiny_dir, dest, shape=None):
    """A copy of the tiny diffusers checkpoint whose transformer safetensors also hold FastVideo-style block-level
    gates (`blocks.{i}.to_gate_compress.{weight,bias}`, fresh random, `shape` (out, in) if given, else the model's
    (dim, dim)), written into the transformer's own file as FastVideo's published checkpoints store them."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(tiny_dir, dest)
    weights = dest / "transformer" / "diffusion_pytorch_model.safetensors"
    config = json.loads((dest / "transformer" / "config.json").read_text())
    dim = config["num_attention_heads"] * config["attention_head_dim"]
    out_f, in_f = shape or (dim, dim)
    g = torch.Generator().manual_seed(11)
    gates = {}
    for i in range(config["num_layers"]):
        gates[f"blocks.{i}.to_gate_compress.weight"] = torch.randn(out_f, in_f, generator=g) / in_f ** 0.5
        gates[f"blocks.{i}.to_gate_compress.bias"] = torch.randn(out_f, generator=g) * 0.1
    save_file({**load_file(str(weights)), **gates}, str(weights))
    return dest


def write_projections(path, transformer, prefix: str, seed: int = 6) -> dict:
    """A safetensors file at `path` holding a random linear-branch projection (D x D weight, D bias) for every
    layer of `transformer` under `prefix` (with an `{i}` field); returns its tensors."""
    from safetensors.torch import save_file

    attn = transformer.blocks[0].attn1
    d = attn.to_q.weight.shape[0] // attn.heads
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(len(transformer.blocks)):
        tensors[f"{prefix.format(i=i)}.weight"] = torch.randn(d, d, generator=g)
        tensors[f"{prefix.format(i=i)}.bias"] = torch.randn(d, generator=g)
    save_file(tensors, str(path))
    return tensors


def make_qkv(b: int, s: int, h: int, d: int, dtype=torch.float32, seed: int = 0, requires_grad: bool = False):
    """Fresh random q, k, v of shape (B, S, H, D) (never zeros)."""
    g = torch.Generator().manual_seed(seed)
    out = [torch.randn(b, s, h, d, generator=g).to(dtype) for _ in range(3)]
    if requires_grad:
        for t in out:
            t.requires_grad_(True)
    return out


@pytest.fixture
def encoder_frames(monkeypatch):
    """Frames as handed to the mp4 encoder, by output stem: {stem: (F, H, W, 3) uint8}.

    H.264 is lossy; comparing these instead of decoded mp4s keeps a 1-level pixel difference from turning
    into different encoder decisions.
    """
    import vsagen.media.video

    frames: dict = {}
    real_encode, real_stream = vsagen.media.video.encode_mp4, vsagen.media.video.encode_mp4_stream

    def stem(path):  # the encoder writes a temporary `.{stem}.{random}.mp4` beside the target: key by the target
        return path.name[1:].rsplit(".", 2)[0] if path.name.startswith(".") else path.stem

    def capture(f, path, *args):  # compare
        frames[stem(path)] = f.copy()
        real_encode(f, path, *args)

    def capture_stream(chunks, path, *args, **kwargs):  # t2v / i2v: the decode streamed into the encoder
        chunks = [c.copy() for c in chunks]
        frames[stem(path)] = np.concatenate(chunks)
        return real_stream(iter(chunks), path, *args, **kwargs)

    monkeypatch.setattr(vsagen.media.video, "encode_mp4", capture)
    monkeypatch.setattr(vsagen.media.video, "encode_mp4_stream", capture_stream)
    return frames


def cached_locally(hub_id: str) -> bool:
    """Whether the Hugging Face cache holds `hub_id` (tests of the offline error skip then)."""
    try:
        from huggingface_hub import snapshot_download

        snapshot_download(hub_id, local_files_only=True)
        return True
    except Exception:  # noqa: BLE001 - any failure means "not in the local cache"
        return False


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A private, empty Hugging Face cache (`hub.cache`), offline unless a test says otherwise; the hub's answers
    (`HfApi.model_info`) counted in `hub.asked`, never the real hub's (models/test_sources.py,
    decode/test_tiny_files.py)."""
    import huggingface_hub
    import huggingface_hub.constants

    class Hub:
        def __init__(self):
            self.cache, self.asked, self.answer = tmp_path / "hub", [], None

        def store(self, repo: str, folder) -> None:
            """Put `folder` in the cache as `repo`'s main revision."""
            root = self.cache / f"models--{repo.replace('/', '--')}"
            shutil.copytree(folder, root / "snapshots" / ("a" * 40))
            (root / "refs").mkdir()
            (root / "refs" / "main").write_text("a" * 40)

    hub = Hub()

    def model_info(api, repo, timeout=None, **_):
        hub.asked.append(repo)
        if hub.answer is not None:
            raise hub.answer
        return object()

    hub.cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub.cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
    return hub


def assert_one_error_line(stderr: str, stdout: str = "") -> str:
    """The CLI's bad-input contract: exactly one `error: ...` line on stderr, nothing on stdout, no traceback.
    Returns the line."""
    lines = stderr.strip("\n").splitlines()
    assert len(lines) == 1, f"expected one stderr line, got:\n{stderr}"
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in stderr + stdout
    assert stdout == ""
    return lines[0]


def one_error_line(res, *, after_load: bool = False) -> str:
    """`assert_one_error_line` for a typer CliRunner result of bad input: exit code 2, exactly one `error: ...` line
    on stderr, nothing on stdout, no traceback. Returns the line. `after_load`: a refusal that comes once the model
    loaded, where a slow load's status line ("loading MODEL (...)", `vsagen.pipeline.status_after`, after 2 s: a
    loaded machine) may come first; it is left out."""
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    if after_load:
        lines = [x for x in lines if not x.startswith("loading ")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and res.stdout == "", res.output
    assert "Traceback" not in res.output
    return lines[0]


def noise_image(path, size=(48, 40), seed=0):
    """A random-noise RGB image (width, height) saved at `path` (format from the suffix)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path)
    return path


# ------------------------------------------------------------------------------------ kernel test helpers
# Shared by tests/kernels/ (block-sparse attention, tile plans, k2q).

# fp32 inputs, fp32 dots with input_precision="ieee": rounding ~1e-7 relative per operation over at most a few
# hundred keys; measured ~3e-7 relative L2 for out, lse and all gradients (dS = P (dP - delta) cancels a little).
# A masking or indexing error is O(1e-1), so 1e-5 separates the two by four orders of magnitude.
FP32_REL_L2 = 1e-5
# fp16 / bf16 inputs: the eager reference in the same dtype (fp32 softmax, output and gradients rounded to the
# dtype) sets the scale of unavoidable error. The kernel also rounds P and dS to the dtype before the P V,
# dS K and dS^T Q products on the GPU (FlashAttention-2 does the same); that at most doubles the error, so 4x
# the eager error leaves headroom while a real bug (O(1e-1)) stays far outside.
LOWP_FACTOR = 4.0
# Errors are relative L2 against max(||reference||, REF_RMS_FLOOR * sqrt(numel)). With unit-variance inputs
# every output and gradient has RMS of order 0.1..1, except exact cancellations: with one key per query the
# softmax is constant and dq is 0, where the kernel's fp32 dP - delta leaves ~1e-7 noise.
REF_RMS_FLOOR = 0.1
# Garbage written past q2k_cnt in q2k rows: an index far out of range, so reading it would fault or corrupt.
UNUSED = 1_000_000


def rel_l2(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.detach().double(), y.detach().double()
    return float((x - y).norm() / max(float(y.norm()), REF_RMS_FLOOR * math.sqrt(y.numel())))


def random_selection(b: int, h: int, n: int, top_k: int, seed: int, *, partial_counts: bool = False):
    """(q2k (B, H, n, K) int32 ascending, q2k_cnt (B, H, n) int32): K distinct random key tiles per row.

    With partial_counts, q2k_cnt is random in [0, K] (the first row 0, the last K) and entries past it hold
    `UNUSED` garbage.
    """
    g = torch.Generator().manual_seed(seed)
    q2k = torch.sort(torch.rand(b, h, n, n, generator=g).argsort(-1)[..., :top_k], -1).values.to(torch.int32)
    if not partial_counts:
        return q2k, torch.full((b, h, n), top_k, dtype=torch.int32)
    cnt = torch.randint(0, top_k + 1, (b, h, n), generator=g, dtype=torch.int32)
    cnt.view(-1)[0] = 0
    cnt.view(-1)[-1] = top_k
    q2k = q2k.masked_fill(torch.arange(top_k) >= cnt.unsqueeze(-1), UNUSED)
    return q2k, cnt


def tile_map(q2k: torch.Tensor, cnt: torch.Tensor, n_kv: int) -> torch.Tensor:
    """Dense (B, H, Q_TILES, KV_TILES) bool map of the used q2k entries, by loops."""
    b, h, n_q, _ = q2k.shape
    out = torch.zeros(b, h, n_q, n_kv, dtype=torch.bool)
    for bi in range(b):
        for hi in range(h):
            for i in range(n_q):
                for r in range(int(cnt[bi, hi, i])):
                    out[bi, hi, i, int(q2k[bi, hi, i, r])] = True
    return out


def k2q_oracle(q2k: torch.Tensor, cnt: torch.Tensor, n_kv: int) -> list:
    """Slow transpose: lists[b][h][j] = ascending query tiles i whose first cnt[i] q2k entries contain j."""
    b, h, n_q, _ = q2k.shape
    lists = [[[[] for _ in range(n_kv)] for _ in range(h)] for _ in range(b)]
    for bi in range(b):
        for hi in range(h):
            for i in range(n_q):  # ascending i keeps every list sorted
                for r in range(int(cnt[bi, hi, i])):
                    lists[bi][hi][int(q2k[bi, hi, i, r])].append(i)
    return lists


def masked_dense(q, k, v, allowed_tiles, lay, scale=None):
    """float64 attention with a token mask from a (B, H, n, n) tile map; empty rows give out 0 and lse -inf.

    Differentiable without NaN: empty rows attend to everything, then their outputs are replaced by 0.
    """
    tt = lay.token_tile
    mask = allowed_tiles[:, :, tt][:, :, :, tt]  # (B, H, S, S)
    empty = ~mask.any(-1)  # (B, H, S)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    logits = torch.einsum("bshd,bthd->bhst", q.double(), k.double()) * scale
    logits = logits.masked_fill(~(mask | empty.unsqueeze(-1)), float("-inf"))
    lse = torch.logsumexp(logits, -1)
    out = torch.einsum("bhst,bthd->bhsd", torch.softmax(logits, -1), v.double())
    out = out.masked_fill(empty.unsqueeze(-1), 0.0).transpose(1, 2)
    return out, lse.masked_fill(empty, float("-inf"))


@pytest.fixture
def input_checks(monkeypatch):
    """How often the block-sparse kernels' input checks ran from here on: {"check_inputs": n, "check_fp32_bwd": n}
    (`bsa_primitives`'s, counted in every vsagen.kernels module that took them by name; they still check)."""
    import sys

    import vsagen.kernels.block_sparse_attn  # noqa: F401 - every module that takes the checks, imported
    import vsagen.kernels.bsa_forward_ws  # noqa: F401
    import vsagen.kernels.bsa_primitives as primitives
    import vsagen.kernels.sla_star_attn  # noqa: F401

    counts = dict.fromkeys(("check_inputs", "check_fp32_bwd"), 0)
    for name in counts:
        real = getattr(primitives, name)

        def counted(*args, _name=name, _real=real):
            counts[_name] += 1
            return _real(*args)

        for module_name, module in list(sys.modules.items()):
            if module_name.startswith("vsagen.kernels") and getattr(module, name, None) is real:
                monkeypatch.setattr(module, name, counted)
    return counts


def leaves(*xs, dtype=torch.float64):
    return [x.detach().to(dtype).requires_grad_(True) for x in xs]


def kernel_fwd_bwd(q, k, v, q2k, cnt, lay, do, scale=None, dlse=None, tuning=None):
    """block_sparse_attention with autograd (and `tuning`, a KernelTuning or None): (out, lse, dq, dk, dv)."""
    from vsagen.kernels.block_sparse_attn import block_sparse_attention

    q, k, v = leaves(q, k, v, dtype=q.dtype)
    out, lse = block_sparse_attention(q, k, v, q2k, cnt, lay.tile_offsets.to(torch.int32), scale, tuning=tuning)
    grads = [do] if dlse is None else [do, dlse]
    torch.autograd.backward([out, lse][:len(grads)], grads)
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def reference_fwd_bwd(q, k, v, q2k, lay, do, dtype=torch.float64, scale=None, dlse=None):
    """Eager reference (block_sparse_attention_reference) in `dtype` with autograd: (out, lse, dq, dk, dv)."""
    from vsagen.kernels.reference import block_sparse_attention_reference

    q, k, v = leaves(q, k, v, dtype=dtype)
    out, lse = block_sparse_attention_reference(q, k, v, q2k.long(), lay.slots, lay.slot_valid, scale)
    grads = [do.to(dtype)] if dlse is None else [do.to(dtype), dlse.to(lse.dtype)]
    torch.autograd.backward([out, lse][:len(grads)], grads)
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def assert_all_finite(*xs):
    for x in xs:
        assert bool(torch.isfinite(x).all()), "non-finite values in a kernel result"


NAMES = ("out", "lse", "dq", "dk", "dv")


# ------------------------------------------------------------------------------------ attention backend helpers
# Shared by tests/attention/ (full, vsa, spec, ...).

# fp32 attention over a few hundred keys (D = 16) against a float64 softmax: fp32 rounding only (~1e-7
# relative per op); 1e-5 catches any real error.
FP32_ATOL = 1e-5
FP32_RTOL = 1e-5


def attn_ctx(layout, gate, timer):
    """An AttnContext whose backend-owned gate projection returns `gate` (B, S, H, D) as given (or no gate)."""
    from vsagen.attention.base import AttnContext

    params = None if gate is None else (lambda hidden_states: gate.flatten(2))
    return AttnContext(layout=layout, layer=0, expert=None, timer=timer, hidden_states=None, params=params)


def softmax_attention_fp64(q, k, v):
    """(B, S, H, D) -> (B, S, H, D) float64 explicit softmax attention (scale D ** -0.5)."""
    qd, kd, vd = (x.double() for x in (q, k, v))
    p = torch.softmax(torch.einsum("bshd,bthd->bhst", qd, kd) / q.shape[-1] ** 0.5, dim=-1)
    return torch.einsum("bhst,bthd->bshd", p, vd)


# ------------------------------------------------------------------------------------ tiny transformer helpers
# Shared by tests/attention/test_processor.py and tests/attention/test_hooks.py. The tiny Wan transformer (preset
# `tiny`: 2 layers, 2 heads of 16) on CPU with fresh random inputs: the default latent (1..2, 16, 5, 12, 20)
# patchifies to the grid 5 x 6 x 10 = 300 tokens, which has partial tiles in every dimension (12 tiles, 2 of
# them full), so every reorder is exercised with uneven tiles.

# Tile order changes which tokens sit together in the fine stage's padded tiles and the order of the softmax
# sums (fp32, S=300, D=16, 2 layers): observed ~7e-7 on outputs of magnitude ~3; 1e-5 is ~15x that.
TOL_REORDER_FP32 = 1e-5

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


def patched_forward(transformer, backend, inputs, timer=None, mutate=None, fused_prologue="auto"):
    """Output through `patch_transformer` (optionally mutated first); the patch is removed afterwards."""
    from vsagen.attention.hooks import patch_transformer
    from vsagen.timing import Timer

    patch = patch_transformer(transformer, backend, timer or Timer("cpu"), fused_prologue=fused_prologue)
    try:
        if mutate is not None:
            mutate(patch)
        return forward(transformer, inputs)
    finally:
        patch.remove()


def has_partial_tiles(grid) -> bool:
    return any(g % 4 for g in grid)


def patched_output(transformer, backend, inputs):
    """The transformer's output (no grad) with `backend` patched in for one forward, then unpatched; `inputs` is
    (hidden_states, timestep, encoder_hidden_states)."""
    from vsagen.attention.hooks import patch_transformer
    from vsagen.timing import Timer

    patch = patch_transformer(transformer, backend, Timer("cpu"))
    try:
        with torch.no_grad():
            hs, ts, enc = inputs
            return transformer(hidden_states=hs, timestep=ts, encoder_hidden_states=enc, return_dict=False)[0]
    finally:
        patch.remove()


# diffusers name -> original Wan name, written from Wan's own WanModel (wan/modules/model.py): this file's map,
# independent of diffusers' convert_wan_transformer_to_diffusers.
_TOP = {"scale_shift_table": "head.modulation", "proj_out": "head.head", "patch_embedding": "patch_embedding",
        "condition_embedder.time_embedder.linear_1": "time_embedding.0",
        "condition_embedder.time_embedder.linear_2": "time_embedding.2",
        "condition_embedder.text_embedder.linear_1": "text_embedding.0",
        "condition_embedder.text_embedder.linear_2": "text_embedding.2",
        "condition_embedder.time_proj": "time_projection.1"}
_BLOCK = {"scale_shift_table": "modulation", "norm2": "norm3", "ffn.net.0.proj": "ffn.0", "ffn.net.2": "ffn.2"}
_ATTN = {"attn1": "self_attn", "attn2": "cross_attn"}
_PROJ = {"to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "o", "norm_q": "norm_q", "norm_k": "norm_k"}


def original_name(key: str) -> str:
    """The original Wan key of a diffusers WanTransformer3DModel key (text-to-video architecture)."""
    m = re.fullmatch(r"blocks\.(\d+)\.(attn[12])\.(.+)\.(weight|bias)", key)
    if m:
        return f"blocks.{m[1]}.{_ATTN[m[2]]}.{_PROJ[m[3]]}.{m[4]}"
    m = re.fullmatch(r"blocks\.(\d+)\.(.+?)(\.weight|\.bias)?", key)
    if m:
        return f"blocks.{m[1]}.{_BLOCK[m[2]]}{m[3] or ''}"
    m = re.fullmatch(r"(.+?)(\.weight|\.bias)?", key)
    return _TOP[m[1]] + (m[2] or "")


def block_gemm_reference(xq, xs, wq, ws):
    """TurboDiffusion's block-scaled int8 GEMM in float64 (vsagen.quant.int8_linear): the sum over 128-wide K
    blocks of the integer dot times xs[m // 128, kb] * ws[n // 128, kb]; and the sum of the terms' magnitudes (the
    scale of float32's rounding error). Returns two (M, N) float64 tensors."""
    m, k = xq.shape
    n = wq.shape[0]
    ref = torch.zeros(m, n, dtype=torch.float64)
    mag = torch.zeros(m, n, dtype=torch.float64)
    for kb in range(math.ceil(k / 128)):
        sl = slice(kb * 128, (kb + 1) * 128)
        t = xq[:, sl].double() @ wq[:, sl].double().t()
        rows = xs[:, kb].double().repeat_interleave(128)[:m, None]
        t = t * rows * ws[:, kb].double().repeat_interleave(128)[None, :n]
        ref += t
        mag += t.abs()
    return ref, mag
