"""`--lora` resolved against the model and `--quant` (`vsagen.request.loras`), before anything loads: the expert
filled in, the file's header checked, what cannot run refused in one line."""

from __future__ import annotations

import pytest

from conftest import make_transformer
from lora_files import tiny_lora, write_lora
from vsagen.errors import BadInput
from vsagen.models.lora_spec import LoraSpec
from vsagen.models.sources import resolve_model
from vsagen.request.loras import resolve_loras
from vsagen.request.options import request_options
from vsagen.request.resolve import resolve


@pytest.fixture(scope="module")
def lora(tmp_path_factory):
    return tiny_lora(tmp_path_factory.mktemp("lora"), "kohya", "l.safetensors")


def test_the_expert_is_every_expert_of_the_model_where_not_given(vsagen_cache, lora):
    one = resolve(resolve_model("tiny"), request_options(lora=[f"{lora}:scale=0.5"]), prompt="p")
    assert one.loras == (LoraSpec(str(lora), 0.5, "1", True),)
    two = resolve(resolve_model("tiny-a14b"), request_options(lora=[str(lora), f"{lora}:expert=2"]), prompt="p")
    assert [s.expert for s in two.loras] == ["both", "2"]
    assert resolve(resolve_model("tiny"), request_options(), prompt="p").loras == ()


@pytest.mark.parametrize("flags, message", [
    ({"lora": ["{f}:expert=2"]}, "--lora {f}: expert=2 names transformer_2, and --model tiny has one transformer"),
    ({"lora": ["{f}:expert=both"]}, "expert=both names transformer_2"),
    ({"lora": ["{f}:fused=false"], "quant": "int8", "device": "cpu"},
     "--lora {f}:fused=false keeps PEFT layers around the linears that --quant int8 swaps"),
])
def test_what_cannot_run_is_refused_before_loading(vsagen_cache, lora, flags, message):
    flags = {k: [v.format(f=lora) for v in val] if k == "lora" else val for k, val in flags.items()}
    with pytest.raises(BadInput) as e:
        resolve(resolve_model("tiny"), request_options(model="tiny", **flags), prompt="p")
    assert message.format(f=lora) in str(e.value) and "\n" not in str(e.value)


def test_a_file_for_a_larger_model_is_refused_by_its_header(vsagen_cache, tmp_path):
    path = tmp_path / "big.safetensors"
    write_lora(path, "original", make_transformer(), blocks=3)
    with pytest.raises(BadInput, match="adapts block 2, and the model has 2 blocks"):
        resolve_loras((LoraSpec(str(path)),), resolve_model("tiny"), "tiny", "none", False)


def test_rows_over_scales_are_compare_s_and_of_one_lora(vsagen_cache, lora):
    listed = LoraSpec.parse(f"{lora}:scale=0, 0.5,1")
    assert (listed.scale, listed.scales) == (0.0, (0.0, 0.5, 1.0)) and listed.text().endswith(":scale=0,0.5,1")
    with pytest.raises(BadInput, match=r":scale=0,0.5,1: one scale per run; vsagen compare runs a row per scale$"):
        resolve(resolve_model("tiny"), request_options(model="tiny", lora=[listed]), prompt="p")
    src = resolve_model("tiny")
    assert resolve_loras((listed,), src, "tiny", "none", False, several=True)[0].scales == (0.0, 0.5, 1.0)
    with pytest.raises(BadInput, match="rows over the scales of one LoRA"):
        resolve_loras((listed, listed), src, "tiny", "none", False, several=True)
    with pytest.raises(BadInput, match="a scale is listed twice"):
        LoraSpec.parse(f"{lora}:scale=1,1")
