"""Shared fixtures: an isolated vsagen cache with the tiny checkpoint, and random input factories."""

from __future__ import annotations

import os

# Kernels run under the Triton interpreter on CPU; it must be set before any @triton.jit decorates.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch


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
    from vsagen.presets import load_preset
    from vsagen.tiny import ensure_tiny_checkpoint

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

    from vsagen.presets import load_preset

    torch.manual_seed(seed)
    t = WanTransformer3DModel(**load_preset("tiny").transformer).eval()
    return t if dtype == torch.float32 else t.to(dtype)


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
    import vsagen.video

    frames: dict = {}
    real_write = vsagen.video.write_mp4

    def capture(f, path, fps, *, overwrite=False):
        frames[path.stem] = f.copy()
        real_write(f, path, fps, overwrite=overwrite)

    monkeypatch.setattr(vsagen.video, "write_mp4", capture)
    return frames


def cached_locally(hub_id: str) -> bool:
    """Whether the Hugging Face cache holds `hub_id` (tests of the offline error skip then)."""
    try:
        from huggingface_hub import snapshot_download

        snapshot_download(hub_id, local_files_only=True)
        return True
    except Exception:  # noqa: BLE001 - any failure means "not in the local cache"
        return False


def assert_one_error_line(stderr: str, stdout: str = "") -> str:
    """The CLI's bad-input contract: exactly one `error: ...` line on stderr, nothing on stdout, no traceback.
    Returns the line."""
    lines = stderr.strip("\n").splitlines()
    assert len(lines) == 1, f"expected one stderr line, got:\n{stderr}"
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in stderr + stdout
    assert stdout == ""
    return lines[0]
