"""vsagen.architecture: the architecture dict read from a loaded Wan transformer equals the one read from its
constructor kwargs (what a backend is told before loading), for every bundled preset's transformer(s)."""

from __future__ import annotations

import pytest
import torch

from vsagen.architecture import ARCH_FIELDS, CONFIG_DEFAULTS, architecture_from_config, architecture_of
from vsagen.models.presets import load_preset, preset_names


@pytest.mark.parametrize("name", [n for n in preset_names() if load_preset(n).source == "tiny"])
def test_loaded_and_predicted_architectures_agree(name):
    from diffusers import WanTransformer3DModel

    p = load_preset(name)
    for kwargs in [p.transformer] + ([p.transformer_2] if p.transformer_2 is not None else []):
        with torch.device("meta"):
            t = WanTransformer3DModel(**kwargs)
        got = architecture_of(t)
        assert tuple(got) == ARCH_FIELDS
        assert got == architecture_from_config(kwargs)


@pytest.mark.parametrize("name", [n for n in preset_names() if load_preset(n).source == "hub"])
def test_real_sizes_from_their_presets(name):
    """Real-size architectures on the meta device (no memory): the loaded transformer's dict is the predicted one."""
    from diffusers import WanTransformer3DModel

    p = load_preset(name)
    with torch.device("meta"):
        t = WanTransformer3DModel(**p.transformer)
    assert architecture_of(t) == architecture_from_config(p.transformer)


def test_missing_fields_take_the_constructor_defaults():
    import inspect

    from diffusers import WanTransformer3DModel

    sig = inspect.signature(WanTransformer3DModel.__init__)
    assert {k: sig.parameters[k].default for k in CONFIG_DEFAULTS} == CONFIG_DEFAULTS
    a = architecture_from_config({"num_layers": 2, "patch_size": None})
    assert a == {"layers": 2, "heads": 40, "head_dim": 128, "in_channels": 16, "ffn_dim": 13824, "patch_size": [1, 2, 2]}


def test_experts_names_each_transformer_of_a_pipeline_in_order():
    from types import SimpleNamespace

    from vsagen.architecture import experts

    one, two = object(), object()
    assert experts(SimpleNamespace(transformer=one)) == [("transformer", one)]
    assert experts(SimpleNamespace(transformer=one, transformer_2=None)) == [("transformer", one)]  # an empty slot
    assert experts(SimpleNamespace(transformer_2=two, transformer=one)) == [("transformer", one), ("transformer_2", two)]
