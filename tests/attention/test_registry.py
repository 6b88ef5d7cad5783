"""vsagen.attention.registry (and `make_backend` of vsagen.attention): the registered names, the name Enum,
lookups of unknown names, and building each backend."""

from __future__ import annotations

import pytest

from vsagen.attention import REGISTRY as BACKENDS, make_backend
from vsagen.attention.registry import REGISTRY, BackendName, backend_class, backend_names, uses_sparsity
from vsagen.attention.full import FullAttention
from vsagen.attention.vsa import DEFAULT_SPARSITY, VSAAttention
from vsagen.errors import BadInput


# The backends this repository ships: registered, whatever else is (a new backend adds a name, breaking nothing here).
SHIPPED = {"full", "vsa", "rocm-vsa", "sla-star", "sparse-vdit"}


def test_backend_names():
    """The names are the registry's, read from it in `_BACKENDS` order; the shipped backends are among them."""
    from vsagen.attention import registry

    assert backend_names() == list(REGISTRY) == list(BACKENDS) == [cls.name for cls in registry._BACKENDS]
    assert SHIPPED <= set(backend_names())
    assert uses_sparsity("vsa") and not uses_sparsity("full")


def test_make_backend_unknown_lists_names():
    with pytest.raises(BadInput) as info:
        make_backend("nope")
    msg = str(info.value)
    assert "nope" in msg
    for name in backend_names():
        assert name in msg


def test_make_backend_rejects_sparsity_for_dense():
    with pytest.raises(BadInput, match="sparsity"):
        make_backend("full", 0.5)


def test_make_backend_builds_each():
    full = make_backend("full")
    assert isinstance(full, FullAttention) and full.name == "full" and not full.tiled
    assert full.describe() == {"name": "full"}
    vsa = make_backend("vsa")
    assert isinstance(vsa, VSAAttention) and vsa.tiled and vsa.weights is not None
    assert vsa.sparsity == DEFAULT_SPARSITY == 0.875
    assert make_backend("vsa", 0.5).describe()["sparsity"] == 0.5


def test_enum_is_the_registry():
    assert [m.value for m in BackendName] == backend_names() == list(REGISTRY)
    assert BackendName("vsa") == "vsa" and isinstance(BackendName.VSA, str)


def test_backend_class_takes_a_name_or_an_enum_member():
    from vsagen.attention.registry import LazyBackend

    for name, entry in REGISTRY.items():
        cls = entry.load() if isinstance(entry, LazyBackend) else entry
        assert backend_class(name) is cls
        assert backend_class(BackendName(name)) is cls
        assert cls.name == name
        # every registered class declares a frozen Options dataclass whose defaults build an instance
        options = cls.Options()
        assert cls(options).name == name
    assert backend_class("full") is FullAttention and backend_class(BackendName.VSA) is VSAAttention


@pytest.mark.parametrize("name", ["", "Full", "vsa ", "sdpa", "flash"])
def test_backend_class_refuses_unknown_names_listing_the_known_ones(name):
    with pytest.raises(BadInput) as info:
        backend_class(name)
    msg = str(info.value)
    assert repr(name) in msg and "available: full, vsa" in msg and "\n" not in msg
    assert info.value.exit_code == 2
    with pytest.raises(BadInput):
        uses_sparsity(name)


def test_uses_sparsity_reads_the_options_fields():
    for name, cls in REGISTRY.items():  # a class, or the entry that stands for it: the same Options
        assert uses_sparsity(name) == ("sparsity" in cls.Options.__dataclass_fields__)
    assert uses_sparsity(BackendName.VSA) and not uses_sparsity(BackendName.FULL)


def test_the_registry_checks_a_class_has_every_protocol_member():
    """Issue 28: the registry's validation is the one place that probes a backend's members; a class built on
    `Backend` has them all, one that is not is refused at registration, and `vsagen.apply` refuses such an object."""
    from vsagen.attention.base import PROTOCOL_MEMBERS, Backend
    from vsagen.attention.registry import check_backend_class, missing_members

    class Mine(Backend):
        name = "mine"

    assert check_backend_class(Mine) is Mine and missing_members(Mine()) == []

    class Half:
        name = "half"
        tiled = traceable = False

        def __call__(self, q, k, v, ctx):
            return q

    assert set(missing_members(Half)) == set(PROTOCOL_MEMBERS) - {"name", "tiled", "traceable", "__call__"}
    with pytest.raises(TypeError, match="Half is not an attention backend: it lacks Options"):
        check_backend_class(Half)
    for name in REGISTRY:
        assert missing_members(backend_class(name)) == []


def test_the_registry_refuses_two_backends_of_one_name_and_a_priority_without_weights():
    """`registry_of` (what `REGISTRY` is built with) refuses a second class under a taken name (a subclass that
    kept its parent's) and an `auto_priority` on a backend without weights (auto chooses by weights)."""
    from vsagen.attention import registry
    from vsagen.attention.registry import check_backend_class, registry_of

    class Copy(VSAAttention):  # forgot to set its own name
        pass

    with pytest.raises(TypeError, match="Copy and VSAAttention are both registered as 'vsa'"):
        registry_of((*registry._BACKENDS, Copy))

    class Eager(FullAttention):
        name = "eager"
        auto_priority = 3

    with pytest.raises(TypeError, match="only a backend with weights has one"):
        check_backend_class(Eager)
    Eager.auto_priority = True  # a bool is not a priority
    Eager.weights = VSAAttention.weights
    with pytest.raises(TypeError, match="must be None or an int"):
        check_backend_class(Eager)
    assert registry_of(registry._BACKENDS) == REGISTRY


def test_every_shipped_entry_agrees_with_its_class():
    """Issue 29: the shipped backends are registered as `LazyBackend` entries (listings and checks answer without
    torch); each entry's name, Options, tiling, auto priority, weights key, file option and aliases, and description
    are the class's own, which `load` checks when it imports the class."""
    from vsagen.attention.registry import LazyBackend, WeightsRef, backend_facts, summary_of

    for name, entry in REGISTRY.items():
        assert isinstance(entry, LazyBackend) and backend_facts(name) is entry
        cls = entry.load()
        assert (cls.name, cls.Options, cls.tiled, cls.auto_priority) == (name, entry.Options, entry.tiled,
                                                                         entry.auto_priority)
        weights = None if cls.weights is None else WeightsRef(cls.weights.key, cls.weights.file_option,
                                                              cls.weights.aliases)
        assert weights == entry.weights and summary_of(cls) == entry.summary
    assert summary_of(FullAttention) == summary_of(REGISTRY["full"]) == (
        "Dense self-attention, the baseline every sparse backend is measured against (no options)")


def test_an_entry_that_differs_from_its_class_is_refused_when_loaded():
    from vsagen.attention.registry import LazyBackend

    wrong = LazyBackend("vsa", "vsagen.attention.vsa:VSAAttention", REGISTRY["vsa"].Options, "VSA", tiled=False)
    with pytest.raises(TypeError, match="differs from its registry entry in tiled, auto_priority, weights, summary"):
        wrong.load()
    with pytest.raises(TypeError, match="only a backend with weights has one"):
        registry_of_one(LazyBackend("x", "vsagen.attention.full:FullAttention", REGISTRY["full"].Options, "x",
                                    auto_priority=1))


def registry_of_one(entry):
    from vsagen.attention.registry import registry_of

    return registry_of((entry,))
