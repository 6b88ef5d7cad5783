"""vsagen.media.paths: output paths checked before a run (a folder where a file goes, an existing file without
--overwrite, a dangling symlink, an unwritable folder: one line each) and the default output names."""

from __future__ import annotations

from pathlib import Path

import pytest

from vsagen.errors import BadInput
from vsagen.media.formats import check_output
from vsagen.media.paths import (check_folder, check_target, default_folder, default_out, normal_path,
                                sheet_path)


def test_check_target_and_folder(tmp_path):
    check_target(tmp_path / "new.mp4", False, "--out")
    (tmp_path / "old.mp4").write_bytes(b"x")
    with pytest.raises(BadInput, match="exists; pass --overwrite to replace it, or choose another --out"):
        check_target(tmp_path / "old.mp4", False, "--out")
    check_target(tmp_path / "old.mp4", True, "--out")
    (tmp_path / "dangling.mp4").symlink_to(tmp_path / "nowhere")
    with pytest.raises(BadInput, match="exists"):
        check_target(tmp_path / "dangling.mp4", False, "--plot")
    with pytest.raises(BadInput, match="is a folder, where a file is to be written; choose another --out"):
        check_target(tmp_path, True, "--out")
    check_folder(tmp_path / "a" / "b" / "c")  # missing folders under a writable one: fine
    assert not (tmp_path / "a").exists()  # ... and nothing is created by the check
    with pytest.raises(BadInput, match="old.mp4 is not a directory"):
        check_folder(tmp_path / "old.mp4" / "sub")


def test_check_output_gives_the_json_beside_the_mp4(tmp_path):
    assert check_output(tmp_path / "sub" / "v.mp4", False) == tmp_path / "sub" / "v.json"
    for bad, needle in ((tmp_path, "is a folder: use --out"), (tmp_path / "v.avi", "the extension picks the format: .mp4"),
                        (tmp_path / ".mp4", "no file name before .mp4")):
        with pytest.raises(BadInput, match=needle):
            check_output(bad, False)
    (tmp_path / "w.json").write_text("{}")  # the JSON's place is taken: refused as well
    with pytest.raises(BadInput, match="w.json exists"):
        check_output(tmp_path / "w.mp4", False)


def test_default_out_counts_up_past_taken_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert default_out("tiny", "vsa", 3, False) == Path("vsagen-tiny-vsa-seed3.mp4")
    Path("vsagen-tiny-vsa-seed3.json").write_text("{}")
    assert default_out("tiny", "vsa", 3, False) == Path("vsagen-tiny-vsa-seed3-1.mp4")
    assert default_out("tiny", "vsa", 3, True) == Path("vsagen-tiny-vsa-seed3.mp4")
    Path("vsagen-tiny-vsa-seed3-1.sheet.png").write_text("a contact sheet of an earlier run")  # --sheet's file
    assert default_out("tiny", "vsa", 3, False) == Path("vsagen-tiny-vsa-seed3-2.mp4")


def test_the_sheet_goes_beside_the_mp4():
    assert sheet_path(Path("out/v.mp4")) == Path("out/v.sheet.png")
    assert sheet_path(Path("a.b.mp4")) == Path("a.b.sheet.png")


def test_compares_default_folder_counts_up_as_t2vs_files_do(tmp_path, monkeypatch):
    """New-user trial: `vsagen compare` without --out refused its existing default folder where t2v appends -1."""
    monkeypatch.chdir(tmp_path)
    assert default_folder("tiny", "compare", 3, False) == Path("vsagen-tiny-compare-seed3")
    (tmp_path / "vsagen-tiny-compare-seed3").mkdir()
    assert default_folder("tiny", "compare", 3, False) == Path("vsagen-tiny-compare-seed3-1")
    assert default_folder("tiny", "compare", 3, True) == Path("vsagen-tiny-compare-seed3")  # --overwrite: reused


def test_normal_path_takes_out_dot_dot_as_the_file_system_would(tmp_path, monkeypatch):
    """`a/../b.mp4` -> `b.mp4` (a folder `a` need not exist); through a symlinked folder, its target's parent; the
    file name kept (a symlink there is not followed); paths without `..` unchanged; relative stays relative."""
    import os

    monkeypatch.chdir(tmp_path)
    assert normal_path(Path("a/../b.mp4")) == Path("b.mp4")
    assert normal_path(Path("x/y/../z.mp4")) == Path("x/z.mp4")
    assert normal_path(tmp_path / "a" / ".." / "b.mp4") == tmp_path / "b.mp4"
    assert normal_path(Path("./v.mp4")) == Path("v.mp4") and normal_path(Path("a/..")) == Path("a/..")
    (tmp_path / "deep" / "er").mkdir(parents=True)
    os.symlink(tmp_path / "deep" / "er", tmp_path / "link")
    assert normal_path(Path("link/../v.mp4")) == Path("deep/v.mp4")  # where `open` would put it
    os.symlink(tmp_path / "elsewhere.mp4", tmp_path / "named.mp4")
    assert normal_path(Path("a/../named.mp4")) == Path("named.mp4")


def test_an_out_with_dot_dot_is_normalised_before_any_folder_is_made(tmp_path, monkeypatch):
    """`vsagen t2v --out a/../b.mp4`: the run's paths are b.mp4 and b.json, and resolving makes no folder."""
    from vsagen.commands.generate_config import resolve_generate

    monkeypatch.chdir(tmp_path)
    cfg = resolve_generate("a fox", model="tiny", device="cpu", out="a/../b.mp4")
    assert (cfg.out, cfg.json_out) == (Path("b.mp4"), Path("b.json")) and list(tmp_path.iterdir()) == []
