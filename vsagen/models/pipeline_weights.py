"""The weights an attention backend owns (VSA's trained gates, SLA's `proj_l`, ...) on a loaded pipeline: attached
to every expert from the file the backend's options name or the checkpoint's `<root>/<expert>/` folder, checked up
front for every backend of a command, and the run note that says how many layers got them
(`vsagen.attention.weights` reads and fits the tensors). `model` is a `vsagen.models.loading.LoadedModel`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..architecture import experts


def attach_weights(model: Any, backend: Any) -> int:
    """Attach the weights `backend` owns to every transformer of the pipeline (`vsagen.attention.weights`), from the
    file its options name or the checkpoint's `<root>/<expert>/` folder, and note how many layers got them.

    Raises:
        BadInput: a weights file that cannot be read or whose shapes do not fit the model (one line naming the
            first mismatch).
    """
    from ..attention.weights import attach_backend_weights

    n = sum(attach_backend_weights(t, backend, model.weight_root / name if model.weight_root is not None else None)
            for name, t in experts(model.pipe))
    model.weight_layers[backend.name] = n
    note = weights_note(backend, n, sum(len(t.blocks) for _, t in experts(model.pipe)))
    if note is not None:
        model.notes.append(note)
    return n


def check_backend_weights(model: Any, backends: Sequence[Any]) -> None:
    """Read and check every backend's own weights (a named file, or the checkpoint's tensors) against the loaded
    transformers, then take them off again: each run attaches its backend's, and a misfit is refused before the first
    run starts (and before the run's notes are printed).

    Raises:
        BadInput: a weights file that cannot be read or whose shapes do not fit (`attach_backend_weights`).
    """
    from ..attention.weights import attach_backend_weights

    for backend in backends:
        undo: list[Callable[[], None]] = []
        try:
            for name, t in experts(model.pipe):
                attach_backend_weights(t, backend, model.weight_root / name if model.weight_root is not None else None,
                                       undo)
        finally:
            for restore in reversed(undo):
                restore()


def weights_note(backend: Any, layers: int, total: int) -> str | None:
    """The run note on backend-owned weights: which, and how many of the model's layers got them; with none, the
    backend's `LayerWeights.missing_note` (None for backends without weights, or that need no word then)."""
    if backend.weights is None:
        return None
    if not layers:
        return backend.weights.missing_note
    note = f"loaded trained {backend.name} weights ({backend.weights.attr}) for {layers} of {total} layers"
    if layers < total:  # a checkpoint holding them for some layers only: the others run without
        note += f"; the other {total - layers} run without them" + (
            f" ({backend.weights.missing_note})" if backend.weights.missing_note else "")
    return note
