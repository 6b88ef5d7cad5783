"""vsagen.attention.base: the backend protocol's values: `AttnContext` (step and timestep read through the timer and
the forward state), `ForwardState`, `NoOptions`, `LayerWeights`, and the Options helpers `option_names` /
`options_dict`; and that every registered backend has the attributes the protocol names."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from vsagen.attention.base import (AttentionBackend, AttnContext, ForwardState, LayerWeights, NoOptions,
                                   option_names, options_dict)
from vsagen.attention.registry import REGISTRY, backend_class
from vsagen.attention.vsa import VSAOptions
from vsagen.layout import tile_layout
from vsagen.timing import NullTimer, Timer


def test_context_step_follows_the_timer():
    timer = Timer("cpu")
    ctx = AttnContext(layout=None, layer=3, expert="transformer_2", timer=timer)
    assert ctx.step == -1  # outside the denoising loop
    for step in (0, 7, 41):
        timer.step = step
        assert ctx.step == step  # read through, not copied at construction
    assert (ctx.layer, ctx.expert, ctx.hidden_states, ctx.params) == (3, "transformer_2", None, None)


def test_context_timestep_is_read_from_the_forward_state():
    g = torch.Generator().manual_seed(4)
    assert AttnContext(None, 0, None, NullTimer()).timestep is None  # outside a patched transformer
    state = ForwardState()
    ctx = AttnContext(None, 0, None, NullTimer(), forward=state)
    assert state.timestep is None and ctx.timestep is None
    for shape in ((2,), (2, 300)):  # one timestep per sample, or one per token
        ts = torch.rand(*shape, generator=g) * 999.0
        state.timestep = ts  # set by the transformer's pre-hook before every forward
        assert ctx.timestep is ts


def test_context_is_frozen_and_compares_without_the_forward_state():
    lay = tile_layout((3, 5, 7))
    timer = NullTimer()
    a = AttnContext(lay, 1, None, timer, forward=ForwardState())
    b = AttnContext(lay, 1, None, timer, forward=ForwardState(torch.ones(1)))
    assert a == b  # the per-forward state is not part of a context's identity
    assert a != AttnContext(lay, 2, None, timer)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.layer = 5


def test_no_options_is_an_empty_frozen_dataclass():
    assert option_names(NoOptions) == [] and options_dict(NoOptions()) == {}
    assert NoOptions() == NoOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        NoOptions().x = 1


def test_option_names_in_declaration_order():
    assert option_names(VSAOptions) == ["sparsity", "impl", "tile", "query_rows", "gate_weights", "precision",
                                        "topk_count", "tuning", "dense_steps", "dense_layers",
                                        "min_tokens"]  # the shared knobs last

    @dataclasses.dataclass(frozen=True)
    class Opts:
        zeta: int = 1
        alpha: str = "a"
        mid: float | None = None

    assert option_names(Opts) == ["zeta", "alpha", "mid"]


def test_options_dict_leaves_out_none_and_stringifies_non_scalars(tmp_path):
    @dataclasses.dataclass(frozen=True)
    class Opts:
        flag: bool = True
        count: int = 3
        ratio: float = 0.25
        label: str = "x"
        path: Path | None = None
        pair: tuple = (1, 2)

    assert options_dict(Opts()) == {"flag": True, "count": 3, "ratio": 0.25, "label": "x", "pair": "(1, 2)"}
    got = options_dict(Opts(path=tmp_path / "g.safetensors"))
    assert got["path"] == str(tmp_path / "g.safetensors") and isinstance(got["path"], str)
    assert options_dict(VSAOptions(0.5, "torch")) == {"sparsity": 0.5, "impl": "torch", "tile": "4x4x4",
                                                        "query_rows": 64, "precision": "bf16",
                                                        "topk_count": "tiles"}


def test_layer_weights_key_formats_per_layer():
    spec = LayerWeights(key="blocks.{layer}.attn1.gate", attr="gate", shapes=lambda attn: {"weight": (4, 4)},
                        build=lambda tensors, attn: torch.nn.Identity())
    assert spec.key.format(layer=11) == "blocks.11.attn1.gate"
    assert spec.optional == () and spec.file_option is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.attr = "other"


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_registered_backends_have_the_protocol_attributes(name):
    cls = backend_class(name)
    backend = cls(cls.Options())
    for attr in ("name", "Options", "tiled", "traceable", "weights", "options"):
        assert hasattr(backend, attr), attr
    assert isinstance(backend.tiled, bool) and isinstance(backend.traceable, bool)
    assert backend.weights is None or isinstance(backend.weights, LayerWeights)
    assert dataclasses.is_dataclass(cls.Options) and cls.Options.__dataclass_params__.frozen
    assert backend.describe()["name"] == name
    for method in ("check", "describe", "__call__"):
        assert callable(getattr(backend, method))
    # issue 28: the protocol declares every member a caller uses (per_layer and bench_params were probed with getattr;
    # auto_priority: what `--attn auto` reads, instead of a list of names in auto.py)
    assert set(AttentionBackend.__annotations__) == {"name", "Options", "tiled", "tile", "traceable", "weights",
                                                     "options", "per_layer", "bench_params", "auto_priority"}


def test_backend_defaults_and_the_wrapper_delegate_every_member():
    """Issue 28: `Backend` gives the optional members their defaults (prepare checks the device, report carries
    describe, no per-layer rows, no bench parameters); `BackendWrapper` answers every member with its inner
    backend's."""
    import torch

    from vsagen.attention.base import Backend, BackendReport, BackendWrapper, RunInfo
    from vsagen.attention.vsa import VSAAttention, VSAOptions

    seen = []

    class Mine(Backend):
        name = "mine"

        def check(self, device, dtype):
            seen.append((device.type, dtype))

    m = Mine()
    run = RunInfo(torch.device("cpu"), torch.float32, grid=(1, 2, 3), steps=2)
    assert m.prepare(run) == () and seen == [("cpu", torch.float32)]
    assert m.report() == BackendReport({"name": "mine"}) and m.bench_params is None and not m.per_layer
    inner = VSAAttention(VSAOptions(sparsity=0.5, impl="torch"))
    w = BackendWrapper(inner)
    assert (w.name, w.options, w.tiled, w.traceable, w.weights, w.per_layer, w.bench_params) == \
        (inner.name, inner.options, inner.tiled, inner.traceable, inner.weights, inner.per_layer, inner.bench_params)
    assert m.auto_priority is None and w.auto_priority == inner.auto_priority == 1
    assert w.describe(torch.device("cpu")) == inner.describe(torch.device("cpu"))
    assert w.report(torch.device("cpu")).info["impl_ran"] == "torch" and w.prepare(run) == ()
