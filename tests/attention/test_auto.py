"""vsagen.attention.auto: `--attn auto` picks the backend whose trained weights a checkpoint holds (sla-star's
branch before vsa's gates), else full, with a note that says which, why and what the alternative is."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from conftest import block_gated_checkpoint
from vsagen.attention.auto import AUTO, checkpoint_root, choose_backend, trained_backend

GATE = "blocks.1.attn1.to_gate_compress.weight"  # vsa's gate under attn1 (an alias)
BLOCK_GATE = "blocks.1.to_gate_compress.weight"  # vsa's gate at the block level (FastVideo's, the canonical key)
PROJ = "blocks.0.attn1.proj_l.weight"
PLAIN = "blocks.0.attn1.to_q.weight"


def checkpoint(root, expert="transformer", keys=(PLAIN,)):
    """A checkpoint folder whose `expert/` holds safetensors tensors under `keys` (only the names matter)."""
    folder = root / expert
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: torch.randn(2, 2) for k in keys}, str(folder / "diffusion_pytorch_model.safetensors"))
    return root


@pytest.mark.parametrize("keys,want", [((PLAIN,), None), ((PLAIN, GATE), "vsa"), ((PLAIN, BLOCK_GATE), "vsa"),
                                       ((PROJ, PLAIN), "sla-star"), ((GATE, PROJ), "sla-star"),
                                       ((BLOCK_GATE, PROJ), "sla-star")])
def test_the_trained_backend_is_found_from_the_weight_names(tmp_path, keys, want):
    root = checkpoint(tmp_path, keys=keys)
    found = trained_backend(root)
    assert (found[0] if found else None) == want
    if found:
        assert found[1].startswith("transformer/ holds blocks.")


def test_the_second_expert_counts_and_unreadable_files_are_skipped(tmp_path):
    checkpoint(tmp_path, keys=(PLAIN,))
    (tmp_path / "transformer" / "broken.safetensors").write_bytes(b"not a safetensors file")
    assert trained_backend(tmp_path) is None
    checkpoint(tmp_path, "transformer_2", keys=(GATE,))
    assert trained_backend(tmp_path) == ("vsa", f"transformer_2/ holds {GATE}")
    assert trained_backend(tmp_path / "missing") is None and trained_backend(None) is None


def test_choose_backend_says_which_why_and_the_alternative(tmp_path):
    gated = checkpoint(tmp_path / "gated", keys=(PLAIN, GATE))
    name, note = choose_backend("dir", str(gated), random_weights=False, device="cpu")
    assert name == "vsa" and note.startswith("--attn auto chose vsa: this checkpoint was trained for it")
    assert GATE in note and "--attn full" in note and "\n" not in note
    # --random-weights: no trained weights of any kind, whatever the folder holds
    assert choose_backend("dir", str(gated), random_weights=True, device="cuda")[0] == "full"
    plain = checkpoint(tmp_path / "plain")
    name, note = choose_backend("dir", str(plain), random_weights=False, device="cuda")
    assert name == "full" and "holds no sparse-attention weights" in note and "--attn vsa" in note
    assert "vsagen compare" in note and "CPU" not in note
    name, note = choose_backend("tiny", "", random_weights=False, device="cpu")
    assert name == "full" and "random weights" in note and "slow torch reference" in note


def test_a_published_presets_backend_stands_in_only_where_the_weights_cannot_tell(tmp_path, monkeypatch):
    """Issue 30: FastWan's preset says vsa; random weights at its size, or its hub id not downloaded, run vsa (the
    note says the preset said so); a readable folder decides by its own weights."""
    trained = ("vsa", "fastwan2.1-t2v-1.3b")
    name, note = choose_backend("hub", "FastVideo/FastWan2.1-T2V-1.3B-Diffusers", True, "cuda", trained)
    assert name == "vsa" and "fastwan2.1-t2v-1.3b was trained for it (its preset says so; random weights)" in note
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    name, note = choose_backend("hub", "FastVideo/FastWan2.1-T2V-1.3B-Diffusers", False, "cuda", trained)
    assert name == "vsa" and "not downloaded yet" in note
    plain = checkpoint(tmp_path / "plain")
    assert choose_backend("dir", str(plain), False, "cuda", trained)[0] == "full"  # its weights say dense
    gated = checkpoint(tmp_path / "gated", keys=(PLAIN, GATE))
    assert choose_backend("dir", str(gated), False, "cuda", ("full", "x"))[0] == "vsa"
    assert choose_backend("tiny", "", False, "cpu", trained)[0] == "full"
    name, note = choose_backend("hub", "amd/HummingbirdXT", True, "cuda", ("full", "hummingbird-xt"))
    assert name == "full" and "hummingbird-xt was trained for it" in note and "--attn full runs" not in note


def test_a_hub_id_is_read_from_the_local_cache_only(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache: nothing there, nothing downloaded
    assert checkpoint_root("hub", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers") is None
    assert checkpoint_root("tiny", "") is None and checkpoint_root("dir", str(tmp_path)) == tmp_path
    name, note = choose_backend("hub", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers", False, "cuda")
    assert name == "full" and "not downloaded yet" in note and "trained with dense attention" not in note
    assert AUTO == "auto"


def test_the_rule_and_the_choices_name_the_weights_auto_looks_for():
    from vsagen.attention.auto import auto_picks, auto_rule

    rule = auto_rule()
    assert rule == ("the backend the checkpoint was trained for: sla if it holds "
                    "blocks.N.self_attn.attn_op.local_attn.proj_l.* (or blocks.N.attn1.attn_impl.proj_l.*), sla-star "
                    "if it holds blocks.N.attn1.proj_l.*, vsa if it holds blocks.N.to_gate_compress.* (or "
                    "blocks.N.attn1.to_gate_compress.*), else full")
    assert "without sparse-attention weights" in auto_picks("full")
    assert auto_picks("vsa") == ("for a checkpoint holding blocks.N.to_gate_compress.* (or "
                                 "blocks.N.attn1.to_gate_compress.*)")
    assert auto_picks("sla-star") == "for a checkpoint holding blocks.N.attn1.proj_l.*"  # sla claims the others
    assert auto_picks("sla").endswith("(or blocks.N.attn1.attn_impl.proj_l.*)")
    assert auto_picks("rocm-vsa") is None and auto_picks("sparse-vdit") is None


def test_the_candidates_are_the_registered_backends_with_a_priority(tmp_path, monkeypatch):
    """Issue 28: auto names no backend but its fallback. Its candidates are read from the registry when it runs:
    the backends with an `auto_priority`, highest first, ties in registry order; one registered later takes part."""
    from vsagen.attention import registry
    from vsagen.attention.auto import FALLBACK, auto_picks, auto_rule, candidates
    from vsagen.attention.base import Backend, LayerWeights

    assert candidates() == ["sla", "sla-star", "vsa"] and FALLBACK == "full"
    assert [registry.REGISTRY[n].auto_priority for n in candidates()] == [3, 2, 1]

    class Gained(Backend):
        name = "gained"
        weights = LayerWeights(key="blocks.{layer}.attn1.gain", attr="gain", shapes=lambda attn: {"weight": (2,)},
                               build=lambda tensors, attn: torch.nn.Identity())
        auto_priority = 5

    monkeypatch.setitem(registry.REGISTRY, "gained", registry.registry_of((*registry._BACKENDS, Gained))["gained"])
    assert candidates() == ["gained", "sla", "sla-star", "vsa"]
    root = checkpoint(tmp_path, keys=(PLAIN, GATE, PROJ, "blocks.0.attn1.gain.weight"))
    assert trained_backend(root) == ("gained", "transformer/ holds blocks.0.attn1.gain.weight")
    assert auto_rule().startswith("the backend the checkpoint was trained for: gained if it holds "
                                  "blocks.N.attn1.gain.*, sla if")
    assert auto_picks("gained") == "for a checkpoint holding blocks.N.attn1.gain.*"
    Gained.auto_priority = 1  # a tie with vsa: the registry's order (vsa first)
    assert candidates() == ["sla", "sla-star", "vsa", "gained"] and trained_backend(root)[0] == "sla-star"


def test_auto_chooses_vsa_for_a_diffusers_checkpoint_with_block_level_gates(vsagen_cache, tiny_dir, tmp_path):
    """FastVideo's VSA checkpoints hold their gates at the block level (`blocks.N.to_gate_compress`): auto runs vsa
    for them (it chose full before), from the folder as from the request."""
    from vsagen.commands.generate_config import resolve_generate

    ckpt = block_gated_checkpoint(tiny_dir, tmp_path / "fastwan")
    name, note = choose_backend("dir", str(ckpt), random_weights=False, device="cpu")
    assert name == "vsa" and "transformer/ holds blocks." in note and ".attn1." not in note
    assert ".to_gate_compress." in note
    cfg = resolve_generate("a fox", model=str(ckpt), device="cpu", out=tmp_path / "v.mp4")
    assert cfg.backend.name == "vsa" and cfg.attn_note == note
