"""`vsagen.models.pipeline_weights`: a backend's own weights on every expert of a loaded pipeline, the up-front check of
every backend's, and the run note on how many layers got them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import make_transformer
from safetensors.torch import save_file

from vsagen.attention.sla_star import SLAStarAttention
from vsagen.attention.vsa import VSAAttention
from vsagen.attention.weights import layer_params
from vsagen.models.pipeline_weights import attach_weights, check_backend_weights, weights_note
from vsagen.errors import BadInput
from vsagen.models.loading import LoadedModel


def _two_experts(root, gate_layers=None, width=None):
    """A loaded-model stand-in with two tiny experts, each with its own folder under `root` holding fresh random
    block-level VSA gates (for `gate_layers` of its blocks; every block if None; `width` (out, in) if a misfit)."""
    pipe = SimpleNamespace(transformer=make_transformer(seed=1), transformer_2=make_transformer(seed=2))
    gates = {}
    for n, (name, t) in enumerate((("transformer", pipe.transformer), ("transformer_2", pipe.transformer_2))):
        dim = t.config.num_attention_heads * t.config.attention_head_dim
        out_f, in_f = width or (dim, dim)
        g = torch.Generator().manual_seed(20 + n)
        layers = range(len(t.blocks)) if gate_layers is None else gate_layers
        tensors = {f"blocks.{i}.to_gate_compress.{p}": torch.randn(*((out_f, in_f) if p == "weight" else (out_f,)),
                                                                     generator=g) for i in layers
                   for p in ("weight", "bias")}
        (root / name).mkdir(parents=True)
        save_file(tensors, root / name / "model.safetensors")
        gates[name] = tensors
    return LoadedModel(pipe=pipe, random_weights=False, notes=[], weight_root=root), gates


def test_attach_puts_each_experts_own_gates_on_every_layer_and_notes_it(tmp_path):
    model, gates = _two_experts(tmp_path)
    total = len(model.pipe.transformer.blocks) + len(model.pipe.transformer_2.blocks)
    assert attach_weights(model, VSAAttention()) == total == model.weight_layers["vsa"]
    for name in ("transformer", "transformer_2"):
        for i, block in enumerate(getattr(model.pipe, name).blocks):
            assert torch.equal(layer_params(block.attn1, VSAAttention().weights).weight,
                               gates[name][f"blocks.{i}.to_gate_compress.weight"])
    assert model.notes == [f"loaded trained vsa weights (to_gate_compress) for {total} of {total} layers"]


def test_check_reads_every_backend_then_leaves_the_transformers_as_they_were(tmp_path):
    model, _ = _two_experts(tmp_path)
    before = {n: sorted(t.state_dict()) for n, t in (("t", model.pipe.transformer), ("t2", model.pipe.transformer_2))}
    check_backend_weights(model, [VSAAttention(), SLAStarAttention()])
    after = {n: sorted(t.state_dict()) for n, t in (("t", model.pipe.transformer), ("t2", model.pipe.transformer_2))}
    assert after == before and model.weight_layers == {} and model.notes == []


def test_check_refuses_gates_that_do_not_fit_and_still_leaves_nothing_attached(tmp_path):
    model, _ = _two_experts(tmp_path, width=(8, 8))
    with pytest.raises(BadInput, match="shape"):
        check_backend_weights(model, [VSAAttention()])
    for t in (model.pipe.transformer, model.pipe.transformer_2):
        assert all(layer_params(b.attn1, VSAAttention().weights) is None for b in t.blocks)


def test_the_weights_note_says_what_the_layers_without_them_run():
    """A checkpoint holding a backend's weights for some layers only (a new-user trial: gates for 1 of 2 layers ran
    with a note that did not say what the other layer does)."""
    assert weights_note(VSAAttention(), 1, 2) == ("loaded trained vsa weights (to_gate_compress) for 1 of 2 layers; "
                                                  "the other 1 run without them")
    assert weights_note(VSAAttention(), 2, 2) == "loaded trained vsa weights (to_gate_compress) for 2 of 2 layers"
    partial = weights_note(SLAStarAttention(), 29, 30)
    assert partial.startswith("loaded trained sla-star weights (sla_proj_l) for 29 of 30 layers; the other 1 run "
                              "without them (") and "vsa" in partial
