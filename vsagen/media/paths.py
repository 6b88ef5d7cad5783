"""Where a command's files go: output paths checked before anything runs (not a folder, not existing without
--overwrite, in a folder that takes new files) and the default output names. Writing them is `vsagen.media.video`'s."""

from __future__ import annotations

import errno
import os
import re
import tempfile
from pathlib import Path

from ..errors import BadInput


def normal_path(path: Path) -> Path:
    """`path` with its `..` steps taken out, as the file system would take them: the folder part resolved
    (`os.path.realpath`: a symlinked folder's `..` is its target's parent; a folder that does not exist yet is
    stepped out of by name), the file name kept (a symlink there is the file replaced, not followed); relative
    again where it lies below the current folder (`a/../b.mp4` -> `b.mp4`). A path without `..`, or whose name is
    `.` / `..` / empty (refused by the checks), is returned unchanged. (A new-user trial: `--out a/../b.mp4` left an
    empty folder `a` behind: its missing parents were created as spelled.)"""
    if ".." not in path.parts or path.name in ("", ".", ".."):
        return path
    folder = Path(os.path.realpath(path.parent))
    if not path.is_absolute():
        here = Path(os.getcwd())
        if folder == here or here in folder.parents:
            folder = folder.relative_to(here)
    return folder / path.name


def check_target(path: Path, overwrite: bool, flag: str) -> None:
    """`path` is not a directory, and (without `overwrite`) does not exist, a dangling symlink included.

    Raises:
        BadInput: naming `flag` (e.g. "--out") as the option to change."""
    if path.is_dir():
        raise BadInput(f"{path} is a folder, where a file is to be written; choose another {flag}")
    if os.path.lexists(path) and not overwrite:  # lexists: a dangling symlink counts as existing
        raise BadInput(f"{path} exists; pass --overwrite to replace it, or choose another {flag}")


def check_folder(folder: Path) -> None:
    """`folder` (or its nearest existing ancestor, where the missing ones would be created) is writable.

    Raises:
        BadInput: not a folder, or it takes no new file (checked by creating one)."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise BadInput(f"cannot write to {folder}: {existing} is not a directory")
    try:  # a real probe: os.access says yes to root even on read-only or virtual file systems
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        where = "the folder" if existing == folder else f"it would be created in {existing}, a folder that"
        raise BadInput(f"cannot write to {folder}: {where} does not take new files ({why_unwritable(e)}); choose "
                       "another folder") from None


def why_unwritable(e: OSError) -> str:
    """Why a folder refused a new file, in words: the errno text of a failed probe misleads where the folder
    exists (a virtual file system such as /proc answers "No such file or directory")."""
    return {errno.EACCES: "permission denied", errno.EPERM: "not permitted", errno.EROFS: "read-only file system",
            errno.ENOSPC: "no space left", errno.EDQUOT: "disk quota exceeded"}.get(
        e.errno, "a virtual or special file system" if e.errno in (errno.ENOENT, errno.EOPNOTSUPP, errno.EINVAL)
        else (e.strerror or str(e)).lower())


def sheet_path(video: Path) -> Path:
    """The contact sheet (`--sheet`) of the mp4 `video`: beside it, same name, `.sheet.png`."""
    return video.with_name(f"{video.stem}.sheet.png")


def default_out(model: str, attn: str, seed: int, overwrite: bool) -> Path:
    """`vsagen-<model>-<attn>-seed<seed>.mp4` in the current folder; without --overwrite an existing one (or its
    JSON or contact sheet) is kept and `-1`, `-2`, ... is appended; with --overwrite the base name is reused (and
    replaced)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(model).name if Path(model).is_dir() else model).strip("-.")
    base = f"vsagen-{stem or 'model'}-{attn}-seed{seed}"
    if overwrite:
        return Path(f"{base}.mp4")
    for i in range(10_000):
        cand = Path(f"{base}{'' if i == 0 else f'-{i}'}.mp4")
        if not any(os.path.lexists(p) for p in (cand, cand.with_suffix(".json"), sheet_path(cand))):
            return cand
    raise BadInput("too many earlier outputs in this folder; pass --out")


def default_folder(model: str, what: str, seed: int, overwrite: bool) -> Path:
    """`vsagen-<model>-<what>-seed<seed>/` in the current folder (compare's output folder), named as `default_out`
    names files: without --overwrite an existing one is kept and `-1`, `-2`, ... is appended; with --overwrite the
    base name is reused (its files replaced)."""
    base = default_out(model, what, seed, True).with_suffix("")
    if overwrite:
        return base
    for i in range(10_000):
        cand = Path(f"{base}{'' if i == 0 else f'-{i}'}")
        if not os.path.lexists(cand):
            return cand
    raise BadInput("too many earlier outputs in this folder; pass --out")
