"""vsagen.tiny: the embedded tiny models: the cache folder (VSAGEN_CACHE > XDG_CACHE_HOME > ~/.cache), a
deterministic build, and `ensure_tiny_checkpoint` (saved once, atomically, marked complete)."""

from __future__ import annotations

from pathlib import Path

import torch

from vsagen.presets import load_preset
from vsagen.tiny import _MARKER, cache_dir, ensure_tiny_checkpoint


def test_tiny_build_is_deterministic():
    from vsagen.tiny import build_tiny_pipeline

    p = load_preset("tiny-a14b")
    a, b = build_tiny_pipeline(p), build_tiny_pipeline(p)
    for name in ("transformer", "transformer_2", "vae"):
        sa, sb = getattr(a, name).state_dict(), getattr(b, name).state_dict()
        assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_cache_folder_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("VSAGEN_CACHE", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.setenv("VSAGEN_CACHE", "")  # empty: not set
    assert cache_dir() == tmp_path / "xdg" / "vsagen"
    monkeypatch.delenv("VSAGEN_CACHE")
    assert cache_dir() == tmp_path / "xdg" / "vsagen"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert cache_dir() == tmp_path / "home" / ".cache" / "vsagen"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "vsagen" == tmp_path / "home" / ".cache" / "vsagen"


def test_ensure_tiny_checkpoint_builds_once_into_the_cache(vsagen_cache, tiny_dir, tmp_path, monkeypatch):
    import vsagen.tiny

    assert tiny_dir == vsagen_cache / "tiny-pipeline" and (tiny_dir / _MARKER).is_file()
    assert (tiny_dir / "model_index.json").is_file() and list((tiny_dir / "transformer").glob("*.safetensors"))
    monkeypatch.setattr(vsagen.tiny, "build_tiny_pipeline", lambda p: (_ for _ in ()).throw(AssertionError("rebuilt")))
    assert ensure_tiny_checkpoint(load_preset("tiny")) == tiny_dir  # complete: not built again
    # a folder without the marker (an interrupted save) is replaced by a complete one
    root = tmp_path / "root"
    (root / "tiny-pipeline").mkdir(parents=True)
    (root / "tiny-pipeline" / "junk").write_text("half written")
    monkeypatch.undo()
    built = ensure_tiny_checkpoint(load_preset("tiny"), root)
    assert built == root / "tiny-pipeline" and (built / _MARKER).is_file() and not (built / "junk").exists()
    assert sorted(p.name for p in root.iterdir()) == ["tiny-pipeline"]  # no temporary folder left
