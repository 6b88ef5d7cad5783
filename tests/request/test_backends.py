"""vsagen.request.backends: `--attn` entries as specs: one entry (with `auto`) or a list, options by precedence
(entry or flag, never both > the preset's table > the default), entries that are one configuration, `--attn auto`'s
choice; names and implementations read from the registry (a new backend needs no change here)."""

from __future__ import annotations

import pytest

from vsagen.attention import backend_names
from vsagen.attention.spec import impls_of
from vsagen.errors import BadInput
from vsagen.request.backends import (attention_specs, auto_spec, backend_specs, check_entries, known_impls,
                                     split_attn_list)
from vsagen.request.options import AttentionOptions


def test_one_entry_or_a_list():
    assert check_entries(AttentionOptions(attn="auto"), several=False) == ("auto",)
    assert check_entries(AttentionOptions(attn=" vsa:sparsity=0.9 "), several=False) == ("vsa:sparsity=0.9",)
    assert check_entries(AttentionOptions(attn="full,vsa"), several=True) == ("full", "vsa")
    for name in backend_names():
        assert check_entries(AttentionOptions(attn=name), several=False) == (name,)
    with pytest.raises(BadInput, match="this command runs one backend; `vsagen compare` and `vsagen profile` run"):
        check_entries(AttentionOptions(attn="full,vsa"), several=False)
    with pytest.raises(BadInput, match="--attn auto takes no options"):
        check_entries(AttentionOptions(attn="auto:sparsity=0.5"), several=False)
    with pytest.raises(BadInput, match=r"unknown --attn 'nope'; available: " + ", ".join(backend_names())):
        split_attn_list("full,nope")


def test_precedence_and_one_configuration_once():
    tables = {"vsa": {"sparsity": 0.8}}
    full, vsa = attention_specs(("full", "vsa"), AttentionOptions(attn="full,vsa"), tables)
    assert full.name == "full" and vsa.sparsity == 0.8  # the preset's table over the default
    assert attention_specs(("vsa",), AttentionOptions(attn="vsa", sparsity=0.5), tables)[0].sparsity == 0.5  # flag
    assert attention_specs(("vsa:sparsity=0.6",), AttentionOptions(attn="vsa:sparsity=0.6"),
                           tables)[0].sparsity == 0.6  # entry
    with pytest.raises(BadInput, match="once"):  # the flag and the entry both set it
        attention_specs(("vsa:sparsity=0.6",), AttentionOptions(attn="vsa:sparsity=0.6", sparsity=0.5), tables)
    with pytest.raises(BadInput, match=r"--attn lists vsa:sparsity=0.8:impl=auto:tile=4x4x4:query_rows=64 twice "
                                       r"\('vsa' and 'vsa:sparsity=0.8'\)"):
        attention_specs(("vsa", "vsa:sparsity=0.8"), AttentionOptions(attn="vsa,vsa:sparsity=0.8"), tables)


def test_implementations_come_from_the_registry():
    assert set(known_impls()) == {"auto"} | {i for n in backend_names() for i in impls_of(n)}
    with pytest.raises(BadInput, match="--attn-impl cuda is not an implementation any backend has"):
        backend_specs(("vsa",), {}, None, "cuda", "vsa")


def test_auto_chooses_from_the_checkpoint_and_names_the_choice():
    spec, note = auto_spec("tiny", "", AttentionOptions(), {}, random_weights=False, device="cpu")
    assert spec.name == "full" and note.startswith("--attn auto chose full")
    with pytest.raises(BadInput, match=r"\(--attn auto chose full for this checkpoint: name a backend"):
        auto_spec("tiny", "", AttentionOptions(sparsity=0.5), {}, random_weights=False, device="cpu")


def test_a_file_from_the_preset_is_a_note(tmp_path):
    """Issue 29: plain `--attn sparse-vdit` on tiny ran the preset's bundled pattern file without a word."""
    from vsagen.commands.generate_config import resolve_generate

    cfg = resolve_generate("x", model="tiny", attn="sparse-vdit", out=tmp_path / "a.mp4")
    assert cfg.notes[0].startswith("sparse-vdit: patterns=") and "tiny.json is the tiny preset's" in cfg.notes[0]
    assert "--attn sparse-vdit:patterns=FILE names another" in cfg.notes[0]
    named = cfg.backend.options.patterns
    assert resolve_generate("x", model="tiny", attn=f"sparse-vdit:patterns={named}", out=tmp_path / "b.mp4").notes == ()
    assert resolve_generate("x", model="tiny", attn="vsa", out=tmp_path / "c.mp4").notes == ()  # a number: no note
