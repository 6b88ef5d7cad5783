"""`--attn auto` (the default of `vsagen t2v` / `vsagen i2v`): the backend a checkpoint was trained for.

A checkpoint fine-tuned for a sparse backend carries that backend's own per-layer weights in its transformer
folders (`AttentionBackend.weights`): `sla`'s linear-branch projection under TurboDiffusion's or FastVideo's name,
`sla-star`'s under vsagen's (`blocks.N.attn1.proj_l`), or `vsa`'s gate (`blocks.N.to_gate_compress`). The candidates
are the registered backends that declare an `auto_priority` (and so weights), highest first (`candidates()`: sla,
sla-star, vsa); `auto` picks the first whose tensors the checkpoint holds (read from the safetensors headers, no tensor loaded), else `FALLBACK` (`full`): a
checkpoint without such weights was trained with dense attention, and a sparse backend on it trades fidelity for
speed, which the user should choose knowingly. The choice and its reason are returned as a note for the run. No
backend is named here but the fallback (and vsa, in the note's measured speed-up): a new backend with weights takes
part by declaring its `auto_priority`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from .registry import backend_class, backend_names, held_names

AUTO = "auto"
FALLBACK = "full"  # the dense baseline: what a checkpoint without any candidate's weights was trained with
EXPERT_FOLDERS = ("transformer", "transformer_2")


def candidates() -> list[str]:
    """The registered backends `--attn auto` may choose (an `auto_priority` that is not None), highest priority
    first, ties in registry order; read from the registry on each call."""
    named = [(name, backend_class(name).auto_priority) for name in backend_names()]
    return [name for name, priority in sorted((x for x in named if x[1] is not None), key=lambda x: -x[1])]


def checkpoint_root(kind: str, location: str) -> Path | None:
    """The folder holding a checkpoint's `transformer/` (and `transformer_2/`), if it is on this machine: a local
    directory as given, a hub id's snapshot in the local Hugging Face cache (never downloaded here); None for the
    tiny models (built without backend weights) and for a hub id not in the cache."""
    if kind == "dir":
        return Path(location)
    if kind == "hub":
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(location, allow_patterns=[f"{e}/*" for e in EXPERT_FOLDERS],
                                          local_files_only=True))
        except Exception:  # noqa: BLE001 - not in the cache (or no hub library): nothing to read
            return None
    return None


def trained_backend(root: Path | None) -> tuple[str, str] | None:
    """(backend name, "<expert folder>/ holds <key>.*") for the first backend of `candidates()` whose weights a
    checkpoint root holds, or None."""
    from .weights import first_layer_key

    if root is None:
        return None
    for name in candidates():
        spec = backend_class(name).weights
        for expert in EXPERT_FOLDERS:
            key = first_layer_key(root / expert, spec)
            if key is not None:
                return name, f"{expert}/ holds {key}"
    return None


def _backend_in_files(files: Sequence[tuple[str, Sequence[str] | None]]) -> tuple[str, str] | None:
    """(backend name, "<file> holds <key>.*") for the first backend of `candidates()` whose weights one of the files
    holds (by their keys), or None."""
    from .weights import matches_layer_weights

    for name in candidates():
        spec = backend_class(name).weights
        for file, keys in files:
            key = next((k for k in keys or () if matches_layer_weights(k, spec)), None)
            if key is not None:
                return name, f"{file} holds {key.rsplit('.', 1)[0]}.*"
    return None


def unused_weights_note(files: Sequence[tuple[str, Sequence[str] | None]], chosen: Sequence[str]) -> str | None:
    """The run note when transformer files hold a candidate backend's trained weights that none of the `chosen`
    backends (an explicit `--attn`) uses, e.g. TurboDiffusion's proj_l under `--attn vsa`; None when one of them
    uses them, or the files hold none.

    Args:
        files: [(file name, its keys, or None when unread)] (`vsagen.models.transformer_files.auto_evidence`).
        chosen: the backend names the run (or each run of a list) uses.
    """
    from .weights import matches_layer_weights

    found = _backend_in_files(files)
    if found is None:
        return None
    for name in chosen:
        spec = backend_class(name).weights if name in backend_names() else None
        if spec is not None and any(matches_layer_weights(k, spec) for _, keys in files for k in keys or ()):
            return None
    return (f"{found[1]} (trained for {found[0]}): --attn {','.join(chosen)} does not use them; --attn {found[0]} "
            "(or auto) runs the file as trained")


def choose_backend(kind: str, location: str, random_weights: bool, device: str,
                   trained_for: tuple[str, str] | None = None,
                   files: Sequence[tuple[str, Sequence[str] | None]] | None = None) -> tuple[str, str]:
    """The backend `--attn auto` runs, and the run's note saying why and what the alternative is.

    Args:
        kind, location: the model source (`vsagen.models.sources.ModelSource`: "tiny", "dir" or "hub", and its path or
            id).
        random_weights: `--random-weights` (no trained weights of any kind).
        device: "cuda" or "cpu" (the note says that on the CPU the sparse backends run slow torch references).
        trained_for: (backend, model name) of a published checkpoint whose preset names the backend its authors
            run: chosen when the weights cannot tell (random weights at its architecture, or a hub id not downloaded
            yet); the weights, when readable, decide.
        files: when the transformer comes from transformer-only files (`--transformer`, a preset's
            `[transformer_files]`): [(file name, its keys, or None when not downloaded yet)]; they decide instead of
            the checkpoint's folders.

    Returns:
        (name, note): e.g. ("vsa", "--attn auto chose vsa: this checkpoint was trained for it (transformer/ holds
        blocks.0.to_gate_compress.weight); --attn full runs dense attention").
    """
    name, note_on = auto_choice(kind, location, random_weights, trained_for, files)
    return name, note_on(device)


def auto_choice(kind: str, location: str, random_weights: bool, trained_for: tuple[str, str] | None = None,
                files: Sequence[tuple[str, Sequence[str] | None]] | None = None) -> tuple[str, Callable[[str], str]]:
    """`choose_backend` without the device: the backend `--attn auto` runs (the device never decides it), and its
    note as a function of the run's device ("cuda" | "cpu": only the fallback's note speaks of it). A request
    checks the choice before it resolves `--device auto`, whose CUDA query imports torch (seconds), so that a flag
    the choice does not take is refused before anything heavy loads."""
    if files is not None:
        found, unread = _backend_in_files(files), any(keys is None for _, keys in files)
    else:
        root = None if random_weights else checkpoint_root(kind, location)
        found, unread = trained_backend(root), root is None
    if found is not None:
        name, why = found
        note = (f"--attn auto chose {name}: this checkpoint was trained for it ({why}); --attn {FALLBACK} runs "
                "dense attention")
        return name, lambda device: note
    if trained_for is not None and (random_weights or unread) and kind != "tiny":
        name, model = trained_for
        why = "random weights" if random_weights else "not downloaded yet, its weights unread"
        note = (f"--attn auto chose {name}: {model} was trained for it (its preset says so; {why}); "
                + (f"--attn {FALLBACK} runs dense attention" if name != FALLBACK else
                   "a sparse backend on it trades fidelity for speed"))
        return name, lambda device: note
    if files is not None and not unread:
        why = "the transformer file(s) hold no sparse-attention weights (none of a trained backend)"
    elif random_weights or kind == "tiny":
        why = "random weights carry no trained sparse-attention weights"
    elif unread:  # a hub id not in the local cache: its files cannot be read before the download
        why = ("the checkpoint is not downloaded yet, so its weights could not be checked for sparse-attention "
               "parts (download it first, or name the backend)")
    else:
        why = "this checkpoint holds no sparse-attention weights (none of a trained backend: it runs as a dense model)"

    def fallback_note(device: str) -> str:
        # measured on an H200 (BENCHMARKS.md): DiT 1.73x at the 5B, 2.18x at 1.3B 480p, 2.48x at 14B 720p
        speed = ("on a GPU --attn vsa makes the DiT ~1.7-2.5x faster at some loss of fidelity (on this CPU it runs "
                 "a slow torch reference)" if device != "cuda" else
                 "--attn vsa makes the DiT ~1.7-2.5x faster at some loss of fidelity")
        return f"--attn auto chose {FALLBACK}: {why}; {speed}: `vsagen compare` measures both on your prompt"

    return FALLBACK, fallback_note


def _deciding_names(name: str) -> str:
    """The tensor names that make `--attn auto` run candidate `name`, layer written N: its weights' key and aliases
    less those a candidate of higher priority claims first (e.g. sla-star also loads TurboDiffusion's proj_l, but
    auto gives such a checkpoint to sla)."""
    claimed: set[str] = set()
    for other in candidates():
        weights = backend_class(other).weights
        keys = [k for k in (weights.key, *weights.aliases) if k not in claimed]
        if other == name:
            first, *rest = (f"{k.format(layer='N')}.*" for k in keys)
            return first + (f" (or {', '.join(rest)})" if rest else "")
        claimed.update(keys)
    return held_names(backend_class(name).weights)


def auto_rule() -> str:
    """What `--attn auto` does, in one sentence naming the weights it looks for (for `vsagen backends`)."""
    found = ", ".join(f"{name} if it holds {_deciding_names(name)}" for name in candidates())
    return f"the backend the checkpoint was trained for: {found}, else {FALLBACK}"


def auto_picks(name: str) -> str | None:
    """When `--attn auto` runs backend `name`, as a phrase (None: never)."""
    if name in candidates():
        return f"for a checkpoint holding {_deciding_names(name)}"
    if name == FALLBACK:
        return "for a checkpoint without sparse-attention weights (the Wan releases, the tiny models)"
    return None
