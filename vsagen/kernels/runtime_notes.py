"""Run notes the kernels give while they run: a faster kernel that could not run here and what ran instead.

A launcher that falls back (e.g. `bsa_forward_ws`: the warp-specialized Gluon forward failed to compile on this
Triton, so the pipelined Triton forward runs) records one line with `add_note`; each line is kept once per process,
in the order first said. The run layer reads `runtime_notes()` after a run and says the new ones with the run's
other notes (`vsagen t2v` / `profile` / `compare`: `note: ...` on stderr; `vsagen.apply`: the report's `notes`).
No triton import; nothing here reads the environment.
"""

from __future__ import annotations

_NOTES: list[str] = []  # this process's notes, each once, oldest first


def add_note(note: str) -> bool:
    """Keep `note` (one line, no "note:" prefix) for the run layer to say; True where it is new in this process,
    False where it was said before (kept once)."""
    if note in _NOTES:
        return False
    _NOTES.append(note)
    return True


def runtime_notes() -> tuple[str, ...]:
    """Every note the kernels gave in this process, each once, oldest first."""
    return tuple(_NOTES)
