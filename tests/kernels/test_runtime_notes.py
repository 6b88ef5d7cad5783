"""`kernels/runtime_notes`: the notes a kernel gives while it runs (e.g. the Gluon forward's fallback), each kept once
per process in the order first said. That they reach the user: tests/test_api.py (apply's report) and
tests/test_pipeline.py (a session's notes after a run)."""

from __future__ import annotations

import vsagen.kernels.runtime_notes as notes


def test_each_note_is_kept_once_in_the_order_first_said(monkeypatch):
    monkeypatch.setattr(notes, "_NOTES", [])
    assert notes.runtime_notes() == ()
    assert notes.add_note("b fell back") and notes.add_note("a fell back")
    assert not notes.add_note("b fell back")  # said before: kept once
    assert notes.runtime_notes() == ("b fell back", "a fell back")
    said = notes.runtime_notes()
    notes.add_note("c")
    assert said == ("b fell back", "a fell back")  # a copy, not the live list
