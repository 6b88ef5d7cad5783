"""LoRAs through diffusers' Wan loader (`vsagen.models.lora`): each format changes the tiny transformer as its
definition says (float64 reference of one layer's product), scale 0 is no LoRA, fused equals unfused, the second
expert's LoRA lands only there, and every refusal is one line that leaves the transformers as they were."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conftest import forward, make_inputs, make_transformer, maxdiff
from lora_files import FORMATS, expected_delta, write_lora
from vsagen.errors import BadInput
from vsagen.models.lora import check_before_load, fetch, load_loras
from vsagen.models.lora_spec import LoraSpec

pytest.importorskip("peft")


def _file(path, scale=1.0, expert=None, fused=True):
    return fetch(LoraSpec(str(path), scale, expert, fused))


def _weights(t) -> dict:
    return {k: v.clone() for k, v in t.state_dict().items()}


@pytest.fixture(scope="module")
def base():
    """The tiny transformer's weights and its output on fresh random inputs (batch 2), without a LoRA."""
    t = make_transformer(seed=3)
    inputs = make_inputs(batch=2, seed=5)
    return _weights(t), inputs, forward(t, inputs)


def _fresh(base):
    t = make_transformer(seed=3)
    t.load_state_dict(base[0])
    return t


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_changes_the_output_by_its_product(base, tmp_path, fmt):
    t = _fresh(base)
    factors = write_lora(tmp_path / f"{fmt}.safetensors", fmt, t, seed=1)
    records, _, _ = load_loras(t, [_file(tmp_path / f"{fmt}.safetensors", scale=0.7)])
    assert type(t.blocks[1].attn2.to_v) is torch.nn.Linear  # fused: no PEFT layer left in the forward
    for name in ("attn1.to_q", "attn2.to_v", "ffn.net.2"):
        got = t.get_submodule(f"blocks.1.{name}").weight.double() - base[0][f"blocks.1.{name}.weight"].double()
        assert maxdiff(got, expected_delta(factors, 1, name, 0.7)) < 1e-6, (fmt, name)
    assert maxdiff(forward(t, base[1]), base[2]) > 1e-3
    assert records == [{"file": str(tmp_path / f"{fmt}.safetensors"), "sha256": records[0]["sha256"], "scale": 0.7,
                        "expert": "both", "components": ["transformer"], "fused": True}]
    assert len(records[0]["sha256"]) == 64


def test_scale_zero_is_no_lora_and_fused_equals_unfused(base, tmp_path):
    path = tmp_path / "l.safetensors"
    write_lora(path, "original", make_transformer(), seed=2)
    t = _fresh(base)
    load_loras(t, [_file(path, scale=0.0)])
    assert torch.equal(forward(t, base[1]), base[2])
    fused, unfused = _fresh(base), _fresh(base)
    load_loras(fused, [_file(path, scale=1.3)])
    load_loras(unfused, [_file(path, scale=1.3, fused=False)])
    assert type(unfused.blocks[0].attn1.to_q) is not torch.nn.Linear  # the PEFT layer stays
    out = forward(fused, base[1])
    assert maxdiff(out, forward(unfused, base[1])) < 1e-5 and maxdiff(out, base[2]) > 1e-3


def test_the_second_expert_s_lora_lands_only_there_and_both_lands_in_each(base, tmp_path):
    path = tmp_path / "l.safetensors"
    write_lora(path, "kohya", make_transformer(), seed=4)
    pipe = SimpleNamespace(transformer=_fresh(base), transformer_2=_fresh(base))
    records, _, _ = load_loras(pipe, [_file(path, expert="2")])
    assert records[0]["components"] == ["transformer_2"]
    assert torch.equal(forward(pipe.transformer, base[1]), base[2])
    assert maxdiff(forward(pipe.transformer_2, base[1]), base[2]) > 1e-3
    both = SimpleNamespace(transformer=_fresh(base), transformer_2=_fresh(base))
    load_loras(both, [_file(path, expert="both")])
    assert maxdiff(forward(both.transformer, base[1]), forward(pipe.transformer_2, base[1])) < 1e-6


def test_two_loras_add_up_at_their_scales(base, tmp_path):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    fa, fb = write_lora(a, "diffusers", make_transformer(), seed=5), write_lora(b, "musubi", make_transformer(), seed=6)
    t = _fresh(base)
    load_loras(t, [_file(a, scale=0.5), _file(b, scale=-1.5)])
    got = t.blocks[0].ffn.net[0].proj.weight.double() - base[0]["blocks.0.ffn.net.0.proj.weight"].double()
    want = expected_delta(fa, 0, "ffn.net.0.proj", 0.5) + expected_delta(fb, 0, "ffn.net.0.proj", -1.5)
    assert maxdiff(got, want) < 1e-6


def _save(path, tensors):
    from safetensors.torch import save_file

    save_file({k: torch.randn(s) for k, s in tensors.items()}, str(path))


@pytest.mark.parametrize("tensors, message", [
    ({"transformer.blocks.0.attn1.to_q.lora_A.weight": (4, 48),
      "transformer.blocks.0.attn1.to_q.lora_B.weight": (32, 4)},
     "blocks.0.attn1.to_q's factors are (4, 48) and (32, 4), and the model's layer is 32 x 32"),
    ({"transformer.blocks.0.norm9.lora_A.weight": (4, 32), "transformer.blocks.0.norm9.lora_B.weight": (32, 4)},
     "blocks.0.norm9 (as diffusers names it) is no linear layer of the model"),
    ({"transformer.blocks.0.attn1.to_q.lora_A.weight": (4, 32)}, "blocks.0.attn1.to_q has lora_B.weight missing"),
    ({"lora_unet_blocks_0_self_attn_q.lora_down.weight": (4, 32), "lora_unet_blocks_0_self_attn_q.lora_up.weight":
      (32, 4), "lora_unet_blocks_0_self_attn_q.alpha": ()}, "diffusers' Wan LoRA loader cannot convert it"),
])
def test_a_lora_that_does_not_fit_is_one_line_and_changes_nothing(base, tmp_path, tensors, message):
    path = tmp_path / "bad.safetensors"
    _save(path, tensors)
    t = _fresh(base)
    with pytest.raises(BadInput) as e:
        load_loras(t, [_file(path)])
    assert message in str(e.value) and "\n" not in str(e.value)
    assert all(torch.equal(v, base[0][k]) for k, v in t.state_dict().items())
    with pytest.raises(BadInput, match="no linear layer|factors are|missing|cannot convert"):  # before any weight
        check_before_load([_file(path)], [("transformer", make_transformer().config)])


def test_expert_two_of_one_transformer_and_mixed_fusing_are_refused(base, tmp_path):
    path = tmp_path / "l.safetensors"
    write_lora(path, "diffusers", make_transformer())
    t = _fresh(base)
    with pytest.raises(BadInput, match="expert=2 names transformer_2, and the model has one transformer"):
        load_loras(t, [_file(path, expert="2")])
    with pytest.raises(BadInput, match="fused and unfused LoRAs on one transformer"):
        load_loras(t, [_file(path), _file(path, fused=False)])
    assert all(torch.equal(v, base[0][k]) for k, v in t.state_dict().items())


def test_the_undo_takes_a_fused_and_an_unfused_lora_out(base, tmp_path):
    path = tmp_path / "l.safetensors"
    write_lora(path, "original", make_transformer(), seed=7)
    for fused in (True, False):
        t = _fresh(base)
        _, undo, _ = load_loras(t, [_file(path, scale=0.9, fused=fused)], undoable=True)
        undo()
        assert type(t.blocks[0].attn1.to_q) is torch.nn.Linear
        assert maxdiff(forward(t, base[1]), base[2]) < 1e-5


def test_a_hub_lora_is_fetched_by_its_file_or_its_repository_s_one_file(tmp_path, monkeypatch):
    import huggingface_hub

    path = tmp_path / "l.safetensors"
    write_lora(path, "diffusers", make_transformer())
    from vsagen.models import sources

    asked = []
    monkeypatch.setattr(sources, "hub_unreachable", lambda repo: None)  # the hub answers
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda repo, name: asked.append((repo, name)) or str(path))
    listing = ["README.md", "l.safetensors", "sub/other.safetensors"]
    monkeypatch.setattr(huggingface_hub, "list_repo_files", lambda repo: listing)
    assert fetch(LoraSpec.parse("owner/repo/sub/l.safetensors")).path == path
    assert fetch(LoraSpec.parse("owner/repo:scale=0.5")).sha256 == fetch(LoraSpec(str(path))).sha256
    assert asked == [("owner/repo", "sub/l.safetensors"), ("owner/repo", "l.safetensors")]
    listing.append("b.safetensors")
    with pytest.raises(BadInput, match=r"^--lora owner/repo: the repository holds 2 top-level .safetensors files "
                                       r"\(l.safetensors, b.safetensors\); name one: owner/repo/FILE.safetensors$"):
        fetch(LoraSpec.parse("owner/repo"))


def test_a_hub_lora_with_the_hub_unreachable_is_one_line(monkeypatch):
    """New-user trial: offline, `--lora some/hubid` ended in httpx's ConnectError, exit 1, after the hub client's
    retries; the probe says it at once, and a connection lost after the probe is one line too."""
    import httpx
    import huggingface_hub

    from vsagen.models import sources

    asked = []
    monkeypatch.setattr(sources, "hub_unreachable", lambda repo: asked.append(repo) or "the hub cannot be reached (x)")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda repo, name: 1 / 0)  # (not asked)
    with pytest.raises(BadInput, match=r"^--lora some/hubid: it is not in the local Hugging Face cache, and the hub "
                                       r"cannot be reached \(x\)$"):
        fetch(LoraSpec.parse("some/hubid"))
    assert asked == ["some/hubid"]

    def unreachable(repo, name):
        raise httpx.ConnectError("[Errno -2] Name or service not known")

    monkeypatch.setattr(sources, "hub_unreachable", lambda repo: None)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", unreachable)
    with pytest.raises(BadInput, match=r"^--lora some/hubid/l.safetensors: it is not in the local Hugging Face cache, "
                                       r"and the hub cannot be reached \(\[Errno -2\] Name or service not known\)$"):
        fetch(LoraSpec.parse("some/hubid/l.safetensors"))
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda repo, name: 1 / 0)
    with pytest.raises(ZeroDivisionError):  # a bug of ours stays a bug (exit 1 with --verbose's traceback)
        fetch(LoraSpec.parse("some/hubid/l.safetensors"))


@pytest.mark.parametrize("fused", [True, False])
def test_a_lora_of_row_scales_is_rescaled_in_place(base, tmp_path, fused):
    path = tmp_path / "l.safetensors"
    write_lora(path, "diffusers", make_transformer(), seed=8)
    t, once = _fresh(base), _fresh(base)
    loaded = load_loras(t, [fetch(LoraSpec.parse(f"{path}:scale=0,1.5" + ("" if fused else ":fused=false")))])
    assert loaded.records[0]["scale"] == [0.0, 1.5] and torch.equal(forward(t, base[1]), base[2])
    load_loras(once, [_file(path, scale=1.5, fused=fused)])
    loaded.rescale(1.5)
    assert maxdiff(forward(t, base[1]), forward(once, base[1])) < 1e-5
    loaded.rescale(0.0)
    assert maxdiff(forward(t, base[1]), base[2]) < 1e-5


def test_without_peft_a_lora_is_one_line_before_the_file_is_read(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "peft", None)  # `import peft` raises ImportError
    with pytest.raises(BadInput, match=r"^--lora needs the peft package, .*: pip install peft$"):
        fetch(LoraSpec(str(tmp_path / "never-read.safetensors")))
