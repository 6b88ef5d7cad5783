"""`vsagen download PRESET`: exactly the hub files a preset's run reads (`vsagen.models.hub_files`), into the Hugging
Face cache through huggingface_hub (`hf_hub_download`, its progress bar per file), their sizes and the total said
first; `--dry-run` lists them from the hub's metadata without downloading. The hub's address is huggingface_hub's
(`HF_ENDPOINT`), the cache its own (`HF_HOME` / `HF_HUB_CACHE`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import BadInput
from ..models.hub_files import HubFile, Listing, preset_files


@dataclass(frozen=True)
class DownloadPlan:
    """What `vsagen download` fetches: the preset, its files (with sizes, in bytes), the commit of each repository
    they come from, and which files the cache already holds."""

    preset: str
    files: tuple[HubFile, ...]
    commits: dict[str, str]
    cached: frozenset[tuple[str, str]]

    @property
    def total(self) -> int:
        return sum(f.size or 0 for f in self.files)

    @property
    def to_fetch(self) -> int:
        """Bytes not in the cache yet."""
        return sum(f.size or 0 for f in self.files if (f.repo, f.path) not in self.cached)


def size_text(n: int) -> str:
    """`n` bytes in words: B, KB, MB, GB (powers of 1000, as the hub shows sizes), three significant digits."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def _hub_error(e: Exception, repo: str) -> BadInput:
    """A huggingface_hub failure as one line: offline, unreachable, gated, not found, or what it said."""
    from huggingface_hub import errors

    name = type(e).__name__
    if isinstance(e, errors.OfflineModeIsEnabled):
        why = "HF_HUB_OFFLINE is set (unset it to download)"
    elif isinstance(e, errors.GatedRepoError):
        why = "the repository is gated: accept its terms on the hub and log in (`hf auth login`)"
    elif isinstance(e, errors.RepositoryNotFoundError):
        why = "no such repository, or it is private (log in with `hf auth login`)"
    elif isinstance(e, errors.HfHubHTTPError):
        why = str(e).strip().splitlines()[0][:120]
    elif "connect" in name.lower() or "timeout" in name.lower() or isinstance(e, OSError):
        why = f"the hub cannot be reached ({str(e).strip().splitlines()[0][:100] if str(e).strip() else name})"
    else:
        raise e
    return BadInput(f"cannot download {repo}: {why}")


def _hub(repo: str) -> tuple[str, Listing, dict[str, Any]]:
    """A repository's commit, files with sizes and `model_index.json` (None-free: {} where it has none), from the
    hub's metadata (`model_info(files_metadata=True)`) and the index's own text (not cached).

    Raises:
        BadInput: see `_hub_error`."""
    from huggingface_hub import HfApi, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    try:
        info = HfApi().model_info(repo, files_metadata=True)
        listing = {s.rfilename: s.size for s in info.siblings or []}
        index: dict[str, Any] = {}
        if "model_index.json" in listing:
            response = get_session().get(hf_hub_url(repo, "model_index.json", revision=info.sha),
                                         headers=build_hf_headers(), follow_redirects=True)
            hf_raise_for_status(response)
            index = json.loads(response.text)
    except BadInput:
        raise
    except Exception as e:  # noqa: BLE001 - each kind becomes its line in _hub_error (others re-raised there)
        raise _hub_error(e, repo) from None
    return info.sha, listing, index


def plan_download(preset_name: str) -> DownloadPlan:
    """The files `vsagen download PRESET` fetches, with their sizes and what the cache already holds.

    Raises:
        BadInput: an unknown preset, the hub unreachable, offline, gated, or lacking a file the preset names (one
            line each). A tiny preset (built offline) gives a plan without files."""
    from huggingface_hub import try_to_load_from_cache

    from ..models.presets import load_preset

    preset = load_preset(preset_name)
    if preset.source != "hub":  # built offline: an empty plan, which says so
        return DownloadPlan(preset_name, (), {}, frozenset())
    seen: dict[str, tuple[str, Listing, dict[str, Any]]] = {}

    def hub(repo: str) -> tuple[str, Listing, dict[str, Any]]:
        if repo not in seen:
            seen[repo] = _hub(repo)
        return seen[repo]

    try:
        files = preset_files(preset, lambda r: hub(r)[1], lambda r: hub(r)[2])
    except ValueError as e:
        raise BadInput(f"vsagen download {preset_name}: {e}") from None
    commits = {repo: got[0] for repo, got in seen.items()}
    cached = frozenset((f.repo, f.path) for f in files
                       if isinstance(try_to_load_from_cache(f.repo, f.path, revision=commits[f.repo]), str))
    return DownloadPlan(preset_name, tuple(files), commits, cached)


def plan_lines(plan: DownloadPlan) -> list[str]:
    """The plan in words: the total first, then one line per file (size, repository/path, "cached" where the cache
    holds it)."""
    if not plan.files:
        return [f"{plan.preset}: built offline by vsagen (random weights, in its own cache): nothing to download"]
    repos = sorted({f.repo for f in plan.files})
    lines = [f"{plan.preset}: {len(plan.files)} files, {size_text(plan.total)} from {', '.join(repos)}"
             + (f" ({size_text(plan.to_fetch)} not in the cache yet)" if plan.cached else "")]
    width = max(len(size_text(f.size or 0)) for f in plan.files)
    for f in plan.files:
        lines.append(f"  {size_text(f.size or 0):>{width}}  {f.repo}/{f.path}"
                     + ("  (cached)" if (f.repo, f.path) in plan.cached else ""))
    return lines


def download(plan: DownloadPlan, log: Callable[[str], None] = lambda m: None) -> list[Path]:
    """Fetch every file of `plan` into the Hugging Face cache at each repository's `main` (the plan's commit,
    unless it moved meanwhile; huggingface_hub's progress bar per file; a cached file is not fetched again) and
    return their paths there. The `main` ref is written with them, so later runs find the files offline.

    Raises:
        BadInput: see `_hub_error` (what was fetched before stays in the cache)."""
    from huggingface_hub import hf_hub_download

    paths = []
    for f in plan.files:
        try:
            paths.append(Path(hf_hub_download(f.repo, f.path)))
        except Exception as e:  # noqa: BLE001 - each kind becomes its line in _hub_error (others re-raised there)
            raise _hub_error(e, f.repo) from None
    if paths:
        log(f"{plan.preset}: {len(paths)} files in the Hugging Face cache ({size_text(plan.total)})")
    return paths
