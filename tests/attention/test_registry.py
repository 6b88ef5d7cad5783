"""vsagen.attention.registry (and `make_backend` of vsagen.attention): the registered names, the name Enum,
lookups of unknown names, and building each backend."""

from __future__ import annotations

import pytest

from vsagen.attention import REGISTRY as BACKENDS, make_backend
from vsagen.attention.registry import REGISTRY, BackendName, backend_class, backend_names, uses_sparsity
from vsagen.attention.full import FullAttention
from vsagen.attention.vsa import DEFAULT_SPARSITY, VSAAttention
from vsagen.errors import BadInput


def shipped_backends() -> dict[str, type]:
    """{name: class} of every backend class the package's modules define (a `Backend` with its own `name`), found
    by importing each module of vsagen/attention/: what the repository ships, whether registered or not."""
    import importlib
    import pkgutil

    import vsagen.attention
    from vsagen.attention.base import Backend, BackendWrapper

    found = {}
    for info in pkgutil.iter_modules(vsagen.attention.__path__):
        module = importlib.import_module(f"vsagen.attention.{info.name}")
        for cls in vars(module).values():
            if (isinstance(cls, type) and issubclass(cls, Backend) and cls.__module__ == module.__name__
                    and "name" in vars(cls) and cls is not BackendWrapper):
                found[cls.name] = cls
    return found


# Backends the package builds itself and never offers to `--attn`: the scorer `vsagen search` runs
# (`vsagen.attention.sparse_vdit_search.ModeScorer`, beside the backend whose patterns it finds).
INTERNAL = {"sparse-vdit-search"}


def test_backend_names():
    """The names are the registry's, read from it in `_BACKENDS` order; every backend a module of the package
    defines is registered (issue 44: `sla` was missing from the lists that named the backends, and no test failed)."""
    from vsagen.attention import registry
    from vsagen.attention.registry import backend_at

    assert backend_names() == list(REGISTRY) == list(BACKENDS) == [backend_at(w).name for w in registry._BACKENDS]
    shipped = shipped_backends()
    assert {"full", "vsa", "rocm-vsa", "sla-star", "sla", "sparse-vdit"} <= set(shipped)  # the finder finds them
    assert INTERNAL <= set(shipped) and not INTERNAL & set(REGISTRY)
    shipped = {name: cls for name, cls in shipped.items() if name not in INTERNAL}
    assert shipped == {name: REGISTRY.get(name) for name in shipped}, "a backend module without its registry line"
    assert uses_sparsity("vsa") and not uses_sparsity("full")


def test_the_package_names_every_registered_backend():
    """`vsagen.attention` exports each registered backend's class and Options, read from the registry (no list of
    its own to forget one in)."""
    import vsagen.attention

    for name, cls in REGISTRY.items():
        for x in (cls, cls.Options):
            assert getattr(vsagen.attention, x.__name__) is x and x.__name__ in vsagen.attention.__all__, name
    assert vsagen.attention.SLAAttention.name == "sla" and "SLAOptions" in vsagen.attention.__all__
    with pytest.raises(AttributeError):
        vsagen.attention.NopeAttention  # noqa: B018


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
    for name, cls in REGISTRY.items():
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
    for name, cls in REGISTRY.items():
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


def test_a_backend_is_registered_by_its_place():
    """`_BACKENDS` holds each backend's place ("module:Class"); `registry_of` imports and checks each, and refuses a
    class that is no backend or a priority without weights, as for a class given itself."""
    from vsagen.attention.registry import backend_at, registry_of, summary_of

    assert backend_at(".full:FullAttention") is FullAttention is backend_at("vsagen.attention.full:FullAttention")
    assert registry_of((".vsa:VSAAttention", FullAttention)) == {"vsa": VSAAttention, "full": FullAttention}
    with pytest.raises(TypeError, match="ForwardState is not an attention backend"):
        registry_of((".base:ForwardState",))
    assert summary_of(FullAttention) == summary_of(REGISTRY["full"]) == (
        "Dense self-attention, the baseline every sparse backend is measured against (no options)")


def test_the_registry_and_every_backend_module_import_no_torch():
    """Issue 29 and 44: every backend module imports torch and the kernels inside the methods that compute, so the
    registry imports them all and `vsagen backends`, `vsagen presets` and the checks of `--attn` still answer before
    torch loads (tests/test_listing.py times the listings)."""
    import json
    import subprocess
    import sys

    probe = ("import sys, json\nfrom vsagen.attention import REGISTRY\n"
             "print(json.dumps([sorted(c.__module__ for c in REGISTRY.values()), sorted(m for m in sys.modules "
             "if m.split('.')[0] in ('torch', 'triton', 'diffusers', 'transformers'))]))")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    modules, heavy = json.loads(res.stdout)
    assert heavy == [] and "vsagen.attention.sla" in modules and len(modules) == len(REGISTRY)
