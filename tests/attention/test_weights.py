"""vsagen.attention.weights: backend-owned per-layer parameters (VSA's trained gate, under its block-level key or the
attn1 alias), one safetensors loader with shapes checked and one error line naming the first mismatch; and the
AttnContext each layer's processor builds."""

from __future__ import annotations

import pytest
import torch
from conftest import make_transformer, patched_output
from safetensors.torch import save_file

from vsagen.attention import VSAAttention, VSAOptions, make_backend
from vsagen.attention.hooks import patch_transformer
from vsagen.attention.weights import (attach_backend_weights, attach_layer_weights, detach_layer_weights,
                                      layer_params, read_layer_tensors)
from vsagen.errors import BadInput
from vsagen.timing import Timer

SPEC = VSAAttention.weights
ATTN1 = "blocks.{}.attn1.to_gate_compress"  # the gate under attn1 (vsagen's earlier key, an alias)
BLOCK = "blocks.{}.to_gate_compress"  # at the block level (FastVideo's published checkpoints; the canonical key)


def gate_tensors(transformer, seed=3, layers=None, bias=True, key=ATTN1):
    """Fresh random gate tensors for every (or the given) layer, keyed as a checkpoint holds them (`key`: ATTN1 or
    BLOCK, the layer as `{}`)."""
    g = torch.Generator().manual_seed(seed)
    out_f, in_f = transformer.blocks[0].attn1.to_q.weight.shape
    out = {}
    for i in layers if layers is not None else range(len(transformer.blocks)):
        out[f"{key.format(i)}.weight"] = torch.randn(out_f, in_f, generator=g)
        if bias:
            out[f"{key.format(i)}.bias"] = torch.randn(out_f, generator=g)
    return out


@pytest.mark.parametrize("key", [BLOCK, ATTN1])
def test_attach_loads_every_layer_from_a_folder(tmp_path, key):
    """Gates under either key (block level, canonical; under attn1, the alias) load the same way, as attn1's
    `to_gate_compress`."""
    t = make_transformer()
    tensors = gate_tensors(t, key=key)
    save_file({"unrelated.weight": torch.ones(2), **tensors}, tmp_path / "model.safetensors")
    assert attach_layer_weights(t, SPEC, tmp_path) == len(t.blocks)
    for i, block in enumerate(t.blocks):
        lin = layer_params(block.attn1, SPEC)
        assert isinstance(lin, torch.nn.Linear) and lin is block.attn1.to_gate_compress
        assert torch.equal(lin.weight, tensors[f"{key.format(i)}.weight"])
        assert torch.equal(lin.bias, tensors[f"{key.format(i)}.bias"])
        assert lin.weight.dtype == block.attn1.to_q.weight.dtype
    assert detach_layer_weights(t, SPEC) == len(t.blocks)
    assert all(layer_params(b.attn1, SPEC) is None for b in t.blocks)


def test_bias_is_optional_and_some_layers_may_lack_a_gate(tmp_path):
    t = make_transformer()
    f = tmp_path / "gates.safetensors"
    save_file(gate_tensors(t, layers=[1], bias=False), f)
    assert attach_layer_weights(t, SPEC, f) == 1
    assert layer_params(t.blocks[0].attn1, SPEC) is None and layer_params(t.blocks[1].attn1, SPEC).bias is None


@pytest.mark.parametrize("key", [BLOCK, ATTN1])
@pytest.mark.parametrize("mutate,needle", [
    (lambda d, k: d.update({f"{k.format(0)}.weight": torch.ones(3, 3)}),
     "{0}.weight has shape [3, 3], this model needs [32, 32]"),
    (lambda d, k: d.update({f"{k.format(1)}.bias": torch.ones(5)}), "{1}.bias has shape [5], this model needs [32]"),
    (lambda d, k: d.update({f"{k.format(7)}.weight": torch.ones(32, 32)}),
     "{7}.weight is for layer 7, but the transformer has 2 blocks"),
    (lambda d, k: d.update({f"{k.format(0)}.scale": torch.ones(32)}), "{0}.scale is not a parameter of this backend"),
    (lambda d, k: d.pop(f"{k.format(1)}.weight"), "{1}.weight is missing"),
])
def test_mismatches_are_one_line_naming_the_first(tmp_path, mutate, needle, key):
    """Under either key the first mismatch is one line naming the tensor as the file stores it (a missing one as
    its layer's scheme would name it); nothing is attached."""
    t = make_transformer()
    tensors = gate_tensors(t, key=key)
    mutate(tensors, key)
    f = tmp_path / "gates.safetensors"
    save_file(tensors, f)
    with pytest.raises(BadInput) as e:
        attach_layer_weights(t, SPEC, f)
    layer = int(needle[1])
    assert key.format(layer) + needle[3:] in str(e.value) and "\n" not in str(e.value)
    assert all(layer_params(b.attn1, SPEC) is None for b in t.blocks)  # nothing attached


@pytest.mark.parametrize("tensors,says", [
    ({"blocks.0.to_gate_compress.weight": torch.ones(32, 32),
      "blocks.0.attn1.to_gate_compress.weight": torch.ones(32, 32)}, "are the same tensor; keep one"),
    ({"blocks.1.to_gate_compress.weight": torch.ones(32, 32), "blocks.1.attn1.to_gate_compress.bias": torch.ones(32)},
     "layer 1 mixes key schemes"),
])
def test_a_checkpoint_with_both_names_for_one_layer_is_refused(tmp_path, tensors, says):
    """A layer's gate under both keys (the same tensor twice, or weight and bias split between them) is refused in
    one line naming both keys, as any mix of key schemes within a layer is; nothing is attached."""
    t = make_transformer()
    save_file(tensors, tmp_path / "diffusion_pytorch_model.safetensors")
    with pytest.raises(BadInput) as e:
        attach_backend_weights(t, VSAAttention(), tmp_path)
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path}: ") and says in msg and "\n" not in msg
    assert all(k in msg for k in tensors)
    assert all(layer_params(b.attn1, SPEC) is None for b in t.blocks)


def test_only_safetensors_are_read(tmp_path):
    f = tmp_path / "gates.bin"
    torch.save({"x": torch.ones(1)}, f)
    with pytest.raises(BadInput, match=".safetensors files only"):
        read_layer_tensors(f, SPEC)
    bad = tmp_path / "broken.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(BadInput, match="cannot read backend weights"):
        read_layer_tensors(bad, SPEC)


def test_missing_source_attaches_nothing(tmp_path):
    t = make_transformer()
    assert attach_layer_weights(t, SPEC, None) == 0
    assert attach_layer_weights(t, SPEC, tmp_path / "absent") == 0


def test_a_named_file_wins_over_the_checkpoint(tmp_path):
    t = make_transformer()
    ckpt = tmp_path / "transformer"
    ckpt.mkdir()
    save_file(gate_tensors(t, seed=1), ckpt / "model.safetensors")
    named = tmp_path / "mine.safetensors"
    mine = gate_tensors(t, seed=2)
    save_file(mine, named)
    backend = VSAAttention(VSAOptions(gate_weights=named))
    assert attach_backend_weights(t, backend, ckpt) == len(t.blocks)
    assert torch.equal(t.blocks[0].attn1.to_gate_compress.weight, mine["blocks.0.attn1.to_gate_compress.weight"])
    assert attach_backend_weights(t, make_backend("full"), ckpt) == 0  # full owns no weights


def test_a_named_file_takes_block_level_gates_in_one_scheme(tmp_path):
    """`gate_weights=FILE` reads FastVideo's block-level keys too; a named file must use one key scheme for every
    layer (block level for one, attn1 for another is refused in one line, nothing attached)."""
    t = make_transformer()
    block = tmp_path / "block.safetensors"
    tensors = gate_tensors(t, key=BLOCK)
    save_file(tensors, block)
    assert attach_backend_weights(t, VSAAttention(VSAOptions(gate_weights=block)), None) == len(t.blocks)
    assert torch.equal(t.blocks[1].attn1.to_gate_compress.bias, tensors["blocks.1.to_gate_compress.bias"])
    detach_layer_weights(t, SPEC)
    mixed = tmp_path / "mixed.safetensors"
    save_file({**gate_tensors(t, layers=[0], key=BLOCK), **gate_tensors(t, layers=[1], key=ATTN1)}, mixed)
    with pytest.raises(BadInput, match="use different key schemes; use one for every layer") as e:
        attach_backend_weights(t, VSAAttention(VSAOptions(gate_weights=mixed)), None)
    assert "\n" not in str(e.value) and all(layer_params(b.attn1, SPEC) is None for b in t.blocks)

def test_gates_change_vsa_output_through_the_processor(tmp_path):
    """The processor hands the layer's gate projection to VSA as ctx.params: with gates the output moves."""
    t = make_transformer()
    g = torch.Generator().manual_seed(5)
    inputs = (torch.randn(1, 16, 5, 12, 20, generator=g), torch.tensor([500.0]), torch.randn(1, 9, 32, generator=g))

    def run():
        return patched_output(t, make_backend("vsa", 0.5, "torch"), inputs)

    plain = run()
    f = tmp_path / "gates.safetensors"
    save_file(gate_tensors(t), f)
    attach_layer_weights(t, SPEC, f)
    assert (run() - plain).abs().max().item() > 1e-3


class RecordingBackend:
    """A dense backend that records the context of every call (not registered: tests only)."""

    name = "recording"
    Options = VSAOptions  # any frozen dataclass
    tiled = True
    tile = (4, 4, 4)
    traceable = False
    weights = None

    def __init__(self):
        self.options = VSAOptions()
        self.calls = []

    def check(self, device, dtype):
        pass

    def describe(self, device=None):
        return {"name": self.name}

    def __call__(self, q, k, v, ctx):
        self.calls.append((ctx.layer, ctx.expert, ctx.step, ctx.timestep, ctx.layout.num_tokens,
                           tuple(ctx.hidden_states.shape)))
        return torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)


def test_every_layer_gets_its_own_context():
    t = make_transformer()
    backend = RecordingBackend()
    timer = Timer("cpu")
    timer.step = 3
    patch = patch_transformer(t, backend, timer, expert="transformer")
    ts = torch.tensor([321.0])
    try:
        with torch.no_grad():
            t(hidden_states=torch.randn(1, 16, 5, 12, 20), timestep=ts, encoder_hidden_states=torch.randn(1, 9, 32),
              return_dict=False)
    finally:
        patch.remove()
    assert [c[0] for c in backend.calls] == list(range(len(t.blocks)))
    assert {c[1] for c in backend.calls} == {"transformer"} and {c[2] for c in backend.calls} == {3}
    assert all(torch.equal(c[3], ts) for c in backend.calls)
    assert {c[4] for c in backend.calls} == {5 * 6 * 10}
    assert {c[5] for c in backend.calls} == {(1, 300, t.blocks[0].attn1.inner_dim)}


@pytest.mark.slow
def test_t2v_loads_a_named_gate_file_and_refuses_a_mismatched_one(vsagen_cache, tiny_dir, tmp_path):
    """`--attn vsa:gate_weights=FILE` end to end on the tiny model: the gates load (a note says so, the JSON records
    the file); a file whose shapes do not fit gives one error line and exit 2, and no video."""
    import json

    from typer.testing import CliRunner

    from vsagen.cli.app import app

    t = make_transformer()
    good, bad = tmp_path / "good.safetensors", tmp_path / "bad.safetensors"
    save_file(gate_tensors(t), good)
    save_file({"blocks.0.attn1.to_gate_compress.weight": torch.ones(4, 4)}, bad)
    common = ["t2v", "a fox", "--model", "tiny", "--steps", "1", "--frames", "5", "--height", "64", "--width", "80",
              "--json"]
    res = CliRunner().invoke(app, [*common, "--attn", f"vsa:gate_weights={good}:impl=torch",
                                   "--out", str(tmp_path / "g.mp4")])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["backend"]["gate_weights"] == str(good)
    assert any("loaded trained vsa weights (to_gate_compress) for 2 of 2 layers" in n for n in data["timing"]["notes"])
    assert (data["backend_weight_layers"], data["layers"]) == (2, 2)  # issue 30: the JSON counts the gate layers
    res = CliRunner().invoke(app, [*common, "--attn", f"vsa:gate_weights={bad}", "--out", str(tmp_path / "b.mp4")])
    assert res.exit_code == 2 and "has shape [4, 4], this model needs [32, 32]" in res.output
    assert not (tmp_path / "b.mp4").exists()


def test_a_named_file_without_the_backends_keys_is_refused_before_loading(tmp_path):
    """A gate file whose keys carry an export prefix ("transformer.blocks.0...") matches nothing: refused when the
    request is resolved (before any model loads), not silently ignored."""
    from vsagen.commands.generate_config import resolve_generate as resolve

    t = make_transformer()
    f = tmp_path / "prefixed.safetensors"
    save_file({f"transformer.{k}": v for k, v in gate_tensors(t).items()}, f)
    with pytest.raises(BadInput, match=r"^--attn vsa: .*holds no blocks\.N\.to_gate_compress\.\* or "
                                       r"blocks\.N\.attn1\.to_gate_compress\.\* tensors"):
        resolve("a fox", model="tiny", attn=f"vsa:gate_weights={f}", out=tmp_path / "v.mp4")
    (tmp_path / "proj.pth").write_bytes(b"x")  # a new-user trial: this line lacked the entry it came from
    with pytest.raises(BadInput, match=r"^--attn sla: .*proj.pth: backend weights are read from .safetensors files"):
        resolve("a fox", model="tiny", attn=f"sla:proj_weights={tmp_path / 'proj.pth'}", out=tmp_path / "v.mp4")
    with pytest.raises(BadInput, match="holds no blocks"):
        attach_backend_weights(t, VSAAttention(VSAOptions(gate_weights=f)), None)
    assert all(layer_params(b.attn1, SPEC) is None for b in t.blocks)


def test_first_layer_key_reads_only_the_names(tmp_path):
    from safetensors.torch import save_file

    from vsagen.attention.vsa import VSAAttention
    from vsagen.attention.weights import first_layer_key

    spec = VSAAttention.weights
    folder = tmp_path / "transformer"
    folder.mkdir()
    assert first_layer_key(folder, spec) is None and first_layer_key(tmp_path / "none", spec) is None
    save_file({"blocks.0.attn1.to_q.weight": torch.zeros(1)}, str(folder / "a.safetensors"))
    assert first_layer_key(folder, spec) is None
    save_file({"blocks.3.attn1.to_gate_compress.bias": torch.zeros(1)}, str(folder / "b.safetensors"))
    assert first_layer_key(folder, spec) == "blocks.3.attn1.to_gate_compress.bias"
    assert first_layer_key(folder, None) is None


def test_attaching_from_the_same_source_again_keeps_what_is_there(tmp_path):
    """Issue 28: attaching is idempotent, so weights attached before the weights were placed (offloading) are kept
    by the run's `vsagen.apply` (counted, not replaced, not removed by its `remove()`); another source replaces."""
    import vsagen

    t = make_transformer()
    f = tmp_path / "gates.safetensors"
    save_file(gate_tensors(t), f)
    assert attach_layer_weights(t, SPEC, f) == len(t.blocks)
    first = [layer_params(b.attn1, SPEC) for b in t.blocks]
    undo = []
    assert attach_layer_weights(t, SPEC, f, undo) == len(t.blocks) and undo == []
    assert [layer_params(b.attn1, SPEC) for b in t.blocks] == first
    with vsagen.apply(t, "vsa", sparsity=0.5, impl="torch", gate_weights=f) as handle:
        assert handle.weight_layers == len(t.blocks)
        assert all(layer_params(b.attn1, SPEC) is m for b, m in zip(t.blocks, first))
    assert all(layer_params(b.attn1, SPEC) is m for b, m in zip(t.blocks, first))  # not the handle's to remove
    other = tmp_path / "other.safetensors"
    save_file(gate_tensors(t, seed=9), other)
    with vsagen.apply(t, "vsa", sparsity=0.5, impl="torch", gate_weights=other):
        assert all(layer_params(b.attn1, SPEC) is not m for b, m in zip(t.blocks, first))
    assert all(layer_params(b.attn1, SPEC) is m for b, m in zip(t.blocks, first))  # put back


def test_t2v_runs_a_block_gated_checkpoint_as_vsa_and_refuses_one_whose_gates_do_not_fit(vsagen_cache, tiny_dir,
                                                                                         tmp_path):
    """End to end on the tiny model in FastVideo's layout (block-level gates in the transformer's own file): `--attn
    auto` runs vsa, the gates load (the JSON's notes count the layers); gates of another size are refused in one
    line, exit 2, before denoising, nothing written."""
    import json

    from typer.testing import CliRunner

    from conftest import block_gated_checkpoint, one_error_line
    from vsagen.cli.app import app

    good = block_gated_checkpoint(tiny_dir, tmp_path / "good")
    bad = block_gated_checkpoint(tiny_dir, tmp_path / "bad", shape=(32, 16))
    common = ["t2v", "a fox", "--steps", "1", "--frames", "5", "--height", "64", "--width", "80", "--json"]
    out = tmp_path / "out"
    out.mkdir()
    res = CliRunner().invoke(app, [*common, "--model", str(good), "--out", str(out / "g.mp4")])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["backend"]["name"] == "vsa" and (out / "g.mp4").exists()
    notes = data["timing"]["notes"]
    assert any(n.startswith("--attn auto chose vsa") for n in notes)
    assert "loaded trained vsa weights (to_gate_compress) for 2 of 2 layers" in notes
    written = sorted(p.name for p in out.iterdir())
    for attn in ("vsa", "auto"):  # auto: refused right after loading, before the run's notes (a new-user trial
        # found the auto note printed ahead of the error)
        res = CliRunner().invoke(app, [*common, "--model", str(bad), "--attn", attn, "--out", str(out / "b.mp4")])
        line = one_error_line(res, after_load=True)
        assert "blocks.0.to_gate_compress.weight has shape [32, 16], this model needs [32, 32]" in line
        assert sorted(p.name for p in out.iterdir()) == written  # nothing of the refused run
