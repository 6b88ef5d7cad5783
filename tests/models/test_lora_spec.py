"""`--lora` as a value (`vsagen.models.lora_spec`): the options parsed once, each refusal one line naming the
flag, and a file's format read from its safetensors header without torch."""

from __future__ import annotations

import pytest
import torch

from conftest import make_transformer
from lora_files import FORMATS, tiny_lora, write_lora
from vsagen.errors import BadInput
from vsagen.models.lora_spec import LoraSpec, lora_format, parse_loras


@pytest.fixture(scope="module")
def lora(tmp_path_factory):
    return tiny_lora(tmp_path_factory.mktemp("lora"), "diffusers", "style.safetensors")


def test_the_options_are_parsed_once_into_a_spec(lora, monkeypatch):
    monkeypatch.chdir(lora.parent)
    assert LoraSpec.parse("style.safetensors") == LoraSpec(str(lora), 1.0, None, True)
    spec = LoraSpec.parse(f"{lora}:expert=2:scale=-0.25:fused=FALSE")
    assert spec == LoraSpec(str(lora), -0.25, "2", False) and spec.local and spec.components == ("transformer_2",)
    assert spec.text() == f"{lora}:scale=-0.25:expert=2:fused=false" and LoraSpec.parse(spec.text()) == spec
    assert LoraSpec.parse("owner/repo") == LoraSpec("owner/repo")  # no such local file: a hub id
    hub = LoraSpec.parse("owner/repo/sub/l.safetensors:scale=0.5")
    assert (hub.source, hub.scale, hub.local, hub.components) == ("owner/repo/sub/l.safetensors", 0.5, False,
                                                                  ("transformer", "transformer_2"))
    assert parse_loras(None) == () and parse_loras(str(lora)) == (LoraSpec(str(lora)),)
    assert parse_loras([str(lora), f"{lora}:scale=2"])[1].scale == 2.0


@pytest.mark.parametrize("text, message", [
    ("{f}:scale=x", "scale must be a number in [-10, 10], got 'x'"),
    ("{f}:scale=11", "scale must be a number in [-10, 10]"),
    ("{f}:scale=nan", "scale must be a number"),
    ("{f}:expert=3", "expert must be 1 (the high-noise transformer), 2 (transformer_2) or both, got '3'"),
    ("{f}:fused=maybe", "fused must be true or false"),
    ("{f}:rank=4", "unknown option 'rank' (options: scale, expert, fused)"),
    ("{f}:scale=1:scale=2", "scale is given twice"),
    (":scale=1", "names no file"),
    ("missing.safetensors", "--lora missing.safetensors: no such file"),
    ("{d}", "not a file"),
    ("{d}/x.pt", "no such file"),
])
def test_a_bad_value_is_one_line_naming_the_flag(lora, text, message):
    with pytest.raises(BadInput) as e:
        LoraSpec.parse(text.format(f=lora, d=lora.parent))
    assert message in str(e.value) and str(e.value).startswith("--lora") and "\n" not in str(e.value)


def test_a_file_of_another_suffix_is_refused(tmp_path):
    (tmp_path / "l.pt").write_bytes(b"x")
    with pytest.raises(BadInput, match="reads .safetensors files only"):
        LoraSpec.parse(str(tmp_path / "l.pt"))


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_header_tells_the_format(tmp_path, fmt):
    path = tmp_path / f"{fmt}.safetensors"
    write_lora(path, fmt, make_transformer())
    assert lora_format(path, "--lora x", 2) == {"musubi": "original"}.get(fmt, fmt)
    with pytest.raises(BadInput, match="adapts block 1, and the model has 1 blocks: a LoRA for another model"):
        lora_format(path, "--lora x", 1)


def test_a_damaged_file_or_one_of_no_lora_is_one_line(tmp_path, lora):
    from safetensors.torch import save_file

    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(lora.read_bytes()[:40])
    with pytest.raises(BadInput, match=r"^--lora x: cannot read it as safetensors \(.*\): the file is damaged"):
        lora_format(cut, "--lora x", None)
    save_file({"blocks.0.attn1.to_q.weight": torch.randn(3, 2)}, str(tmp_path / "w.safetensors"))
    with pytest.raises(BadInput, match="holds no LoRA that diffusers' Wan loader reads \\(its keys: "
                                       "blocks.0.attn1.to_q.weight;"):
        lora_format(tmp_path / "w.safetensors", "--lora x", None)
