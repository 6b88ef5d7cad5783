"""vsagen.models.tiny: the embedded tiny models: the cache folder (VSAGEN_CACHE > XDG_CACHE_HOME > ~/.cache), a
deterministic build, and `ensure_tiny_checkpoint` (saved once, atomically, marked complete)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from vsagen.models.presets import load_preset
from vsagen.models.tiny import _MARKER, cache_dir, ensure_tiny_checkpoint


def test_tiny_build_is_deterministic():
    from vsagen.models.tiny import build_tiny_pipeline

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
    import vsagen.models.tiny

    assert tiny_dir == vsagen_cache / "tiny-pipeline" and (tiny_dir / _MARKER).is_file()
    assert (tiny_dir / "model_index.json").is_file() and list((tiny_dir / "transformer").glob("*.safetensors"))
    monkeypatch.setattr(vsagen.models.tiny, "build_tiny_pipeline",
                        lambda p: (_ for _ in ()).throw(AssertionError("rebuilt")))
    assert ensure_tiny_checkpoint(load_preset("tiny")) == tiny_dir  # complete: not built again
    # a folder without the marker (an interrupted save) is replaced by a complete one
    root = tmp_path / "root"
    (root / "tiny-pipeline").mkdir(parents=True)
    (root / "tiny-pipeline" / "junk").write_text("half written")
    monkeypatch.undo()
    built = ensure_tiny_checkpoint(load_preset("tiny"), root)
    assert built == root / "tiny-pipeline" and (built / _MARKER).is_file() and not (built / "junk").exists()
    assert sorted(p.name for p in root.iterdir()) == ["tiny-pipeline"]  # no temporary folder left


def test_a_checkpoint_finished_by_another_process_meanwhile_is_kept(tmp_path, monkeypatch):
    """Two ranks of one torchrun launch build the tiny checkpoint at once: the one that finishes second must use the
    first one's checkpoint, not delete it while the first loads from it (it did: rank 0 then found an empty
    text_encoder folder)."""
    import vsagen.models.tiny

    root = tmp_path / "root"
    target = root / "tiny-pipeline"
    real = vsagen.models.tiny.build_tiny_pipeline

    class Racing:
        def __init__(self, preset):
            self.pipe = real(preset)

        def save_pretrained(self, path, **kw):
            self.pipe.save_pretrained(path, **kw)
            shutil.copytree(path, target)  # the other process renames its complete checkpoint into place meanwhile
            (target / _MARKER).write_text("the other process\n")
            (target / "in use").write_text("loading from here")

    monkeypatch.setattr(vsagen.models.tiny, "build_tiny_pipeline", Racing)
    assert ensure_tiny_checkpoint(load_preset("tiny"), root) == target
    assert (target / "in use").is_file() and (target / _MARKER).read_text() == "the other process\n"
    assert sorted(p.name for p in root.iterdir()) == ["tiny-pipeline"]  # no temporary folder left


def test_no_build_under_a_process_group(tmp_path):
    """transformers' save_pretrained writes only on rank 0 of an initialized process group: a tiny checkpoint saved
    then lacked its text encoder's weights (rank 1's copy, with the completion marker). So the build refuses, and
    the CLI builds it before `--ulysses` starts the group (vsagen.models.loading.prepare_model_files)."""
    import socket

    import pytest
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
    try:
        with pytest.raises(RuntimeError, match="before torch.distributed's process group starts"):
            ensure_tiny_checkpoint(load_preset("tiny"), tmp_path)
    finally:
        dist.destroy_process_group()
    assert not (tmp_path / "tiny-pipeline").exists()


def test_a_damaged_checkpoint_is_built_again(tiny_dir, tmp_path):
    """Issue 29: a tiny checkpoint damaged after it was saved (a truncated weight file) was loaded as is, and
    diffusers' failure was blamed on pickle. It is found from the files' headers and built again in its place."""
    import os

    from vsagen.models.tiny import tiny_checkpoint_problem

    root = tmp_path / "root"
    target = shutil.copytree(tiny_dir, root / "tiny-pipeline")
    assert tiny_checkpoint_problem(target) is None
    weights = target / "transformer" / "diffusion_pytorch_model.safetensors"
    whole = weights.stat().st_size
    os.truncate(weights, whole // 2)
    assert "diffusion_pytorch_model.safetensors is damaged or truncated" in tiny_checkpoint_problem(target)
    assert ensure_tiny_checkpoint(load_preset("tiny"), root) == target
    assert tiny_checkpoint_problem(target) is None and weights.stat().st_size == whole
    assert sorted(p.name for p in root.iterdir()) == ["tiny-pipeline"]  # the damaged copy is gone


def test_an_unwritable_cache_is_found_before_anything_loads(tiny_dir, tmp_path, monkeypatch):
    """Issue 29: an unwritable VSAGEN_CACHE exited 1 after loading torch; `check_tiny_cache` (called by the request's
    resolution) says it in one line, naming the folder: a cache under a file, or a folder without write access
    (simulated: the tests may run as root). A whole checkpoint needs no writing; a missing cache is created later, and
    the test leaves nothing behind."""
    import pytest

    import vsagen.models.tiny
    from vsagen.errors import BadInput
    from vsagen.models.tiny import check_tiny_cache

    tiny = load_preset("tiny")
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    with pytest.raises(BadInput, match=f"vsagen cache {a_file}/cache \\(not a folder: {a_file}\\); set VSAGEN"):
        check_tiny_cache(tiny, a_file / "cache")
    check_tiny_cache(tiny, tmp_path / "new" / "cache")
    assert not (tmp_path / "new").exists()  # checked, not created
    with pytest.raises(BadInput) as e:  # no folder can be made in /proc, even by root
        check_tiny_cache(tiny, Path("/proc/vsagen-cache"))
    # a user trial: "(No such file or directory: /proc)", of a /proc that exists but takes no new folder
    assert str(e.value) == ("cannot write the tiny model to the vsagen cache /proc/vsagen-cache (/proc cannot be "
                            "written (a virtual or special file system)); set VSAGEN_CACHE (or XDG_CACHE_HOME) to a "
                            "writable folder")

    def refused(prefix, dir):
        raise PermissionError(13, "Permission denied", str(dir))

    monkeypatch.setattr(vsagen.models.tiny.tempfile, "mkdtemp", refused)
    with pytest.raises(BadInput, match=f"cache {tmp_path}/new/cache \\({tmp_path} cannot be written \\(permission "
                                       "denied\\)\\); set VSAGEN_CACHE"):
        check_tiny_cache(tiny, tmp_path / "new" / "cache")
    check_tiny_cache(tiny, tiny_dir.parent)  # the checkpoint is there whole: nothing to write
