"""vsagen.sparsity.patterns: every pattern kind's compiled q2k table against the pair-by-pair oracle on tile grids
of latent grids with partial tiles, the table's contract (rows ascending, counts, unused entries), the densities
against direct counts (token density at the true token counts of partial tiles), validation, and the spec round
trip."""

from __future__ import annotations

import pytest
import torch

from vsagen.layout import tile_layout
from vsagen.sparsity.patterns import (KINDS, Pattern, block_density, block_map, default_catalog, dense, diagonal,
                                      mixed, multi_diagonal, oracle_block_map, q2k_table, skip, token_density,
                                      vertical_stripe)

# Latent grids with partial tiles in some or all dims (and one single-token grid); their tile grids are small, so
# two larger tile grids (given directly) exercise radii and stripe spacings that the small ones saturate.
GRIDS = [(5, 6, 10), (9, 7, 13), (3, 4, 4), (1, 1, 1), (13, 9, 6)]
TILE_GRIDS = [tile_layout(g).tiles_per_dim for g in GRIDS] + [(2, 5, 6), (3, 4, 7)]

PATTERNS = [
    dense(), skip(),
    diagonal(0), diagonal(1), diagonal(3),
    multi_diagonal(0), multi_diagonal(2),
    vertical_stripe(1, 0), vertical_stripe(2, 0),  # slabs only
    vertical_stripe(0, 1), vertical_stripe(0, 3), vertical_stripe(0, 16),  # every only
    vertical_stripe(1, 4),
    mixed(diagonal(1), vertical_stripe(1, 5)),
    mixed(diagonal(0), multi_diagonal(1), vertical_stripe(0, 7)),
    mixed(skip(), diagonal(2)), mixed(dense(), skip()),
    *default_catalog(),
]


def pattern_id(p: Pattern) -> str:
    return f"{p.name}-{p.key()}".replace(" ", "")


def expand(q2k: torch.Tensor, cnt: torch.Tensor, n: int) -> torch.Tensor:
    """The block map a q2k table lists, by loops over the used entries."""
    out = torch.zeros(q2k.shape[0], n, dtype=torch.bool)
    for i in range(q2k.shape[0]):
        for r in range(int(cnt[i])):
            out[i, int(q2k[i, r])] = True
    return out


@pytest.mark.parametrize("tiles", TILE_GRIDS, ids=str)
@pytest.mark.parametrize("pattern", PATTERNS, ids=pattern_id)
def test_q2k_table_is_the_oracle(pattern, tiles):
    n = tiles[0] * tiles[1] * tiles[2]
    oracle = oracle_block_map(pattern, tiles)
    q2k, cnt = q2k_table(pattern, tiles)
    assert q2k.dtype == torch.int32 and cnt.dtype == torch.int32 and q2k.device.type == "cpu"
    assert q2k.is_contiguous() and cnt.is_contiguous()
    assert cnt.shape == (n,) and q2k.shape == (n, max(1, int(oracle.sum(1).max())))
    assert torch.equal(cnt, oracle.sum(1).to(torch.int32))
    assert torch.equal(expand(q2k, cnt, n), oracle)
    used = torch.arange(q2k.shape[1]) < cnt[:, None]
    assert bool((q2k[~used] == 0).all())  # the rest is 0, never read
    assert bool(((q2k >= 0) & (q2k < n)).all())
    for i in range(n):
        row = q2k[i, :int(cnt[i])]
        assert bool((row[1:] > row[:-1]).all()), f"row {i} not strictly ascending: {row.tolist()}"
    # the vectorized map is the same set
    assert torch.equal(block_map(pattern, tiles), oracle)


@pytest.mark.parametrize("tiles", TILE_GRIDS[:3], ids=str)
def test_skip_has_zero_counts_and_dense_lists_everything(tiles):
    n = tiles[0] * tiles[1] * tiles[2]
    q2k, cnt = q2k_table(skip(), tiles)
    assert q2k.shape == (n, 1) and int(cnt.abs().sum()) == 0
    q2k, cnt = q2k_table(dense(), tiles)
    assert bool((cnt == n).all()) and torch.equal(q2k, torch.arange(n, dtype=torch.int32).expand(n, n))


def test_tables_follow_the_definition_not_the_name():
    """One definition under two names compiles to one table; the cache does not confuse grids."""
    a, b = q2k_table(diagonal(1, name="a"), (2, 5, 6)), q2k_table(diagonal(1, name="b"), (2, 5, 6))
    assert a[0] is b[0] and a[1] is b[1]
    assert q2k_table(diagonal(1), (2, 6, 5))[0].shape[0] == 60
    assert not torch.equal(expand(*q2k_table(diagonal(1), (2, 6, 5)), 60), expand(*a, 60))


def test_tables_built_under_inference_mode_serve_autograd():
    with torch.inference_mode():
        q2k, _ = q2k_table(diagonal(2), (3, 3, 5))
    assert not q2k.is_inference()


def test_hand_checked_small_cases():
    """A few maps written out by hand on the (1, 2, 3) tile grid (tiles 0..5, h = i // 3, w = i % 3)."""
    tiles = (1, 2, 3)
    d0 = block_map(diagonal(0), tiles)
    assert torch.equal(d0, torch.eye(6, dtype=torch.bool))
    d1 = block_map(diagonal(1), tiles)
    assert d1[0].tolist() == [True, True, False, True, True, False]
    vs = block_map(vertical_stripe(0, 4), tiles)  # in-slab indices 0 and 4 for every query
    assert vs.tolist() == [[True, False, False, False, True, False]] * 6
    # two slabs: slabs=1 is the first slab's 6 tiles; multi-diagonal(0) is the same place in both slabs
    assert block_map(vertical_stripe(1, 0), (2, 2, 3)).sum(1).tolist() == [6] * 12
    md = block_map(multi_diagonal(0), (2, 2, 3))
    assert md[1].nonzero().flatten().tolist() == [1, 7]


@pytest.mark.parametrize("grid", GRIDS, ids=str)
@pytest.mark.parametrize("pattern", [dense(), skip(), diagonal(0), diagonal(1), multi_diagonal(1),
                                     vertical_stripe(1, 0), vertical_stripe(0, 2),
                                     mixed(diagonal(1), vertical_stripe(0, 3))], ids=pattern_id)
def test_densities_are_direct_counts(pattern, grid):
    lay = tile_layout(grid)
    tiles = lay.tiles_per_dim
    oracle = oracle_block_map(pattern, tiles)
    assert block_density(pattern, tiles) == pytest.approx(float(oracle.sum()) / oracle.numel(), abs=1e-12)
    # token density: the token-level mask through the layout (partial tiles hold fewer tokens)
    tt = lay.token_tile
    tokens = oracle[tt][:, tt]
    want = float(tokens.sum()) / lay.num_tokens ** 2
    assert token_density(pattern, lay.tile_sizes, tiles) == pytest.approx(want, abs=1e-12)


def test_token_density_weighs_partial_tiles():
    """On a grid with partial tiles the token density differs from the block density (a diagonal(0) over tiles of
    unequal sizes: sum of squares of the sizes over the square of their sum)."""
    lay = tile_layout((5, 6, 10))
    sizes = lay.tile_sizes.double()
    want = float((sizes ** 2).sum() / sizes.sum() ** 2)
    assert token_density(diagonal(0), lay.tile_sizes, lay.tiles_per_dim) == pytest.approx(want, abs=1e-12)
    assert want != pytest.approx(block_density(diagonal(0), lay.tiles_per_dim))
    assert token_density(dense(), lay.tile_sizes, lay.tiles_per_dim) == pytest.approx(1.0)
    assert token_density(skip(), lay.tile_sizes, lay.tiles_per_dim) == 0.0


def test_default_catalog_densities_at_wan_480p():
    """The catalog docstring's densities at the Wan2.1-1.3B 480p tile grid (6, 8, 13)."""
    got = {p.name: round(100 * block_density(p, (6, 8, 13)), 1) for p in default_catalog()}
    assert got == {"dense": 100.0, "skip": 0.0, "diagonal": 5.4, "multi-diagonal": 18.5, "vertical-stripe": 22.3,
                   "mixed": 26.4}


@pytest.mark.parametrize("kwargs,match", [
    (dict(name="x", kind="sparse"), "unknown pattern kind"),
    (dict(name="x", kind="diagonal", radius=-1), "radius must be an integer >= 0"),
    (dict(name="x", kind="multi-diagonal", radius=1.5), "radius must be an integer"),
    (dict(name="x", kind="diagonal", radius=True), "radius must be an integer"),
    (dict(name="x", kind="vertical-stripe", slabs=-2, every=1), "slabs must be"),
    (dict(name="x", kind="vertical-stripe", slabs=1, every=-1), "every must be"),
    (dict(name="x", kind="dense", radius=1), "dense takes no radius"),
    (dict(name="x", kind="skip", every=2), "skip takes no every"),
    (dict(name="x", kind="diagonal", radius=1, slabs=1), "diagonal takes no slabs"),
    (dict(name="x", kind="vertical-stripe", slabs=1, radius=2), "vertical-stripe takes no radius"),
    (dict(name="x", kind="mixed", radius=1, parts=(dense(),)), "mixed takes no radius"),
    (dict(name="x", kind="vertical-stripe"), "needs slabs >= 1 or every >= 1"),
    (dict(name="x", kind="mixed"), "mixed needs one or more parts"),
    (dict(name="x", kind="mixed", parts=(mixed(dense()),)), "none of them mixed"),
    (dict(name="x", kind="diagonal", radius=1, parts=(dense(),)), "only mixed takes parts"),
    (dict(name="two words", kind="dense"), "one word"),
    (dict(name="", kind="dense"), "one word"),
    (dict(name="x", kind="mixed", parts=("diagonal",)), "parts must be patterns"),
])
def test_pattern_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Pattern(**kwargs)


def test_mixed_parts_may_be_a_list():
    """A list of parts is kept as a tuple (the pattern stays hashable, its key and spec unchanged)."""
    p = Pattern("m", "mixed", parts=[diagonal(1), vertical_stripe(1, 2)])
    assert p.parts == (diagonal(1), vertical_stripe(1, 2))
    assert hash(p) == hash(mixed(diagonal(1), vertical_stripe(1, 2), name="m"))


@pytest.mark.parametrize("pattern", PATTERNS, ids=pattern_id)
def test_spec_round_trip(pattern):
    import json

    spec = json.loads(json.dumps(pattern.spec()))
    back = Pattern.from_spec(pattern.name, spec)
    assert back == pattern and back.key() == pattern.key() and back.spec() == pattern.spec()
    assert set(spec) <= {"kind", "radius", "slabs", "every", "parts"} and spec["kind"] in KINDS


def test_spec_shapes():
    assert dense().spec() == {"kind": "dense"}
    assert diagonal(2).spec() == {"kind": "diagonal", "radius": 2}
    assert vertical_stripe(1, 0).spec() == {"kind": "vertical-stripe", "slabs": 1, "every": 0}
    assert mixed(diagonal(0, name="d"), skip()).spec() == {
        "kind": "mixed", "parts": [{"name": "d", "kind": "diagonal", "radius": 0}, {"name": "skip", "kind": "skip"}]}


@pytest.mark.parametrize("spec,match", [
    ("diagonal", "an object with a \"kind\""),
    ({"radius": 1}, "an object with a \"kind\""),
    ({"kind": "diagonal", "radius": 1, "width": 2}, "unknown field"),
    ({"kind": "mixed", "parts": {"kind": "dense"}}, "parts must be a list"),
    ({"kind": "mixed", "parts": ["dense"]}, "an object with a \"kind\""),
    ({"kind": "mixed", "parts": [{"kind": "mixed", "parts": [{"kind": "dense"}]}]}, "none of them mixed"),
    ({"kind": "diagonal", "radius": "3"}, "radius must be an integer"),
    ({"kind": "blur"}, "unknown pattern kind"),
])
def test_from_spec_refuses(spec, match):
    with pytest.raises(ValueError, match=match):
        Pattern.from_spec("m", spec)
