"""Sparse-vDiT's static attention patterns as small named predicates over the tile grid (seed 003, arXiv 2506.03065).

Sparse-vDiT observes that a video DiT's attention heads fall into a few structured patterns that follow the layer
and head rather than the prompt: diagonal (local, within a frame), multi-diagonal (the same place in the other
frames), vertical stripe (a few keys every query attends to), and unions of them; some heads can be skipped. vsagen
states each pattern over the (4, 4, 4) tile grid of the post-patch latent grid (`vsagen.layout`), so it runs on
the same block-sparse kernels as `vsa`: a predicate on (query tile, key tile) coordinates, compiled once per
(tile grid, pattern) to a q2k index table (`q2k_table`).

Coordinates: tile (t, h, w) of a grid of (NT, NH, NW) tiles has index (t * NH + h) * NW + w (the tile order).
A temporal slab is the set of tiles that share t (4 latent frames).

Patterns (each a `Pattern`, written in files and reports by `Pattern.name` and described by `Pattern.spec()`):

    dense                  every key tile
    skip                   no key tile: the head's output is zero and costs nothing
    diagonal(r)            key tiles of the query's own slab within Chebyshev radius r in (h, w)
    multi-diagonal(r)      key tiles within radius r in (h, w), in every slab
    vertical-stripe(s, e)  the global key tiles, the same for every query tile: every tile of the first s slabs,
                           plus, in every slab, the tiles whose index within the slab (h * NW + w) is a multiple
                           of e (e = 0: none)
    mixed(a, b, ...)       the union of its parts

Radius and stripe set are parameters of a pattern in tile units, so a pattern has one density on a given grid and
a file searched at one size can be compiled on another grid (`vsagen.sparsity.files`, remap).

Every pattern has a second, independent implementation: `oracle_block_map` evaluates the definition above tile
pair by tile pair in plain Python (the tests compare the compiled tables against it on grids with partial tiles).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a table is built: the catalog and pattern files read without it
    import torch

KINDS = ("dense", "skip", "diagonal", "multi-diagonal", "vertical-stripe", "mixed")


@dataclass(frozen=True)
class Pattern:
    """One static attention pattern over the tile grid (see the module docstring for each kind).

    Attributes:
        name: how files and reports call it (a short word: "diagonal", "dense", "mixed", ...).
        kind: one of `KINDS`.
        radius: diagonal / multi-diagonal: Chebyshev radius in tiles over (h, w), >= 0.
        slabs: vertical-stripe: how many leading temporal slabs are global keys, >= 0.
        every: vertical-stripe: spacing of the global key tiles within each slab (0: none), >= 0.
        parts: mixed: the patterns whose union it is (at least one, none of them mixed).

    Raises:
        ValueError: an unknown kind, a negative or non-integer parameter, a parameter the kind does not take, a
            vertical stripe with no key tile, or a mixed pattern without parts.
    """

    name: str
    kind: str
    radius: int = 0
    slabs: int = 0
    every: int = 0
    parts: tuple["Pattern", ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown pattern kind {self.kind!r}; kinds: {', '.join(KINDS)}")
        if not isinstance(self.name, str) or not self.name.strip() or any(c.isspace() for c in self.name):
            raise ValueError(f"a pattern name is one word, got {self.name!r}")
        for field_name in ("radius", "slabs", "every"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"pattern {self.name!r}: {field_name} must be an integer >= 0, got {value!r}")
        takes = {"diagonal": ("radius",), "multi-diagonal": ("radius",), "vertical-stripe": ("slabs", "every")}
        for field_name in ("radius", "slabs", "every"):
            if getattr(self, field_name) and field_name not in takes.get(self.kind, ()):
                raise ValueError(f"pattern {self.name!r}: {self.kind} takes no {field_name}")
        if self.kind == "vertical-stripe" and self.slabs == 0 and self.every == 0:
            raise ValueError(f"pattern {self.name!r}: a vertical stripe needs slabs >= 1 or every >= 1")
        if not isinstance(self.parts, tuple):  # a list of parts: kept as a tuple (the pattern stays hashable)
            object.__setattr__(self, "parts", tuple(self.parts))
        if not all(isinstance(p, Pattern) for p in self.parts):
            raise ValueError(f"pattern {self.name!r}: parts must be patterns, got {self.parts!r}")
        if self.kind == "mixed":
            if not self.parts or any(p.kind == "mixed" for p in self.parts):
                raise ValueError(f"pattern {self.name!r}: mixed needs one or more parts, none of them mixed")
        elif self.parts:
            raise ValueError(f"pattern {self.name!r}: only mixed takes parts")

    def spec(self) -> dict[str, Any]:
        """JSON-ready definition: {"kind", and the kind's parameters; mixed: "parts" as specs}."""
        d: dict[str, Any] = {"kind": self.kind}
        if self.kind in ("diagonal", "multi-diagonal"):
            d["radius"] = self.radius
        elif self.kind == "vertical-stripe":
            d["slabs"], d["every"] = self.slabs, self.every
        elif self.kind == "mixed":
            d["parts"] = [{"name": p.name, **p.spec()} for p in self.parts]
        return d

    @classmethod
    def from_spec(cls, name: str, spec: Any) -> "Pattern":
        """The pattern `name` defined by `spec` (as `spec()` writes it).

        Raises:
            ValueError: a spec that is not such a mapping, or one `Pattern` refuses.
        """
        if not isinstance(spec, dict) or "kind" not in spec:
            raise ValueError(f"pattern {name!r}: a definition is an object with a \"kind\", got {spec!r}")
        known = {"kind", "radius", "slabs", "every", "parts", "name"}
        extra = sorted(set(spec) - known)
        if extra:
            raise ValueError(f"pattern {name!r}: unknown field(s) {', '.join(extra)}")
        parts = spec.get("parts", ())
        if not isinstance(parts, (list, tuple)):
            raise ValueError(f"pattern {name!r}: parts must be a list")
        built = tuple(cls.from_spec(str(p.get("name", p.get("kind", "?"))) if isinstance(p, dict) else "?", p)
                      for p in parts)
        return cls(name=name, kind=spec["kind"], radius=spec.get("radius", 0), slabs=spec.get("slabs", 0),
                   every=spec.get("every", 0), parts=built)

    def key(self) -> tuple:
        """A hashable identity of the definition (the name left out): two patterns with one key compile alike."""
        return (self.kind, self.radius, self.slabs, self.every, tuple(p.key() for p in self.parts))


# --------------------------------------------------------------------------------------------- factories


def dense(name: str = "dense") -> Pattern:
    """Every key tile (density 1)."""
    return Pattern(name, "dense")


def skip(name: str = "skip") -> Pattern:
    """No key tile: zero output, no compute (density 0)."""
    return Pattern(name, "skip")


def diagonal(radius: int = 3, name: str = "diagonal") -> Pattern:
    """Key tiles of the query tile's own temporal slab within Chebyshev radius `radius` (tiles) over (h, w)."""
    return Pattern(name, "diagonal", radius=radius)


def multi_diagonal(radius: int = 2, name: str = "multi-diagonal") -> Pattern:
    """Key tiles within radius `radius` over (h, w) in every temporal slab (the same place in the other frames)."""
    return Pattern(name, "multi-diagonal", radius=radius)


def vertical_stripe(slabs: int = 1, every: int = 16, name: str = "vertical-stripe") -> Pattern:
    """The global key tiles: all tiles of the first `slabs` slabs, plus every `every`-th tile of each slab."""
    return Pattern(name, "vertical-stripe", slabs=slabs, every=every)


def mixed(*parts: Pattern, name: str = "mixed") -> Pattern:
    """The union of `parts` (none of them mixed)."""
    return Pattern(name, "mixed", parts=tuple(parts))


def default_catalog() -> tuple[Pattern, ...]:
    """The modes `vsagen search` scores, after the paper's five (dense, diagonal, multi-diagonal, vertical stripe,
    mixed) plus skip. Block densities at the Wan2.1-1.3B 480p tile grid (6, 8, 13): diagonal (radius 3) 5.4%,
    multi-diagonal (radius 2) 18.5%, vertical-stripe (first slab, every 16th tile) 22.3%, mixed (their diagonal and
    vertical stripe) 26.4% (`block_density`)."""
    d = diagonal(3)
    vs = vertical_stripe(1, 16)
    return (dense(), skip(), d, multi_diagonal(2), vs, mixed(d, vs))


# ----------------------------------------------------------------------------------------- compilation


def _coords(tiles: tuple[int, int, int], device: torch.device | str = "cpu") -> tuple[torch.Tensor, ...]:
    import torch

    nt, nh, nw = tiles
    idx = torch.arange(nt * nh * nw, device=device)
    return idx // (nh * nw), (idx // nw) % nh, idx % nw, idx % (nh * nw)


def block_map(pattern: Pattern, tiles: tuple[int, int, int], device: torch.device | str = "cpu") -> torch.Tensor:
    """The pattern's (n_tiles, n_tiles) bool block map over a tile grid: [i, j] says query tile i attends to key
    tile j (vectorized; `oracle_block_map` is the independent check).

    Args:
        pattern: the pattern.
        tiles: (NT, NH, NW) tiles per dim (`TileLayout.tiles_per_dim`).
    """
    import torch

    t, h, w, in_slab = _coords(tiles, device)
    n = t.numel()
    kind = pattern.kind
    if kind == "dense":
        return torch.ones(n, n, dtype=torch.bool, device=device)
    if kind == "skip":
        return torch.zeros(n, n, dtype=torch.bool, device=device)
    if kind in ("diagonal", "multi-diagonal"):
        near = ((h[:, None] - h[None, :]).abs() <= pattern.radius) & ((w[:, None] - w[None, :]).abs() <= pattern.radius)
        return near & (t[:, None] == t[None, :]) if kind == "diagonal" else near
    if kind == "vertical-stripe":
        glob = t < pattern.slabs
        if pattern.every:
            glob = glob | (in_slab % pattern.every == 0)
        return glob[None, :].expand(n, n).clone()
    out = torch.zeros(n, n, dtype=torch.bool, device=device)
    for part in pattern.parts:
        out |= block_map(part, tiles, device)
    return out


def oracle_block_map(pattern: Pattern, tiles: tuple[int, int, int]) -> torch.Tensor:
    """The definition of the module docstring evaluated pair by pair in Python (slow; the tests' oracle).

    Returns:
        (n_tiles, n_tiles) bool on the CPU.
    """
    import torch

    nt, nh, nw = tiles
    cells = [(t, h, w) for t in range(nt) for h in range(nh) for w in range(nw)]

    def attends(p: Pattern, q: tuple[int, int, int], k: tuple[int, int, int]) -> bool:
        if p.kind == "dense":
            return True
        if p.kind == "skip":
            return False
        if p.kind == "diagonal":
            return q[0] == k[0] and max(abs(q[1] - k[1]), abs(q[2] - k[2])) <= p.radius
        if p.kind == "multi-diagonal":
            return max(abs(q[1] - k[1]), abs(q[2] - k[2])) <= p.radius
        if p.kind == "vertical-stripe":
            return k[0] < p.slabs or (p.every > 0 and (k[1] * nw + k[2]) % p.every == 0)
        return any(attends(part, q, k) for part in p.parts)

    return torch.tensor([[attends(pattern, q, k) for k in cells] for q in cells], dtype=torch.bool)


_TABLES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _build_table(pattern: Pattern, tiles: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    with torch.inference_mode(False):  # the tables are cached for the process: normal tensors, whoever builds first
        return _table(block_map(pattern, tiles))


def _table(bm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    cnt = bm.sum(1).to(torch.int32)
    width = max(1, int(cnt.max())) if cnt.numel() else 1
    # stable sort of ~bm puts each row's selected tiles first, in ascending order
    order = torch.sort((~bm).to(torch.int8), dim=1, stable=True).indices[:, :width]
    q2k = torch.where(torch.arange(width)[None, :] < cnt[:, None], order, torch.zeros((), dtype=torch.int64))
    return q2k.to(torch.int32).contiguous(), cnt.contiguous()


def q2k_table(pattern: Pattern, tiles: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The pattern compiled to the q2k index table the block-sparse kernels run (built once per (grid, pattern
    definition), cached for the process).

    Args:
        pattern: the pattern.
        tiles: (NT, NH, NW) tiles per dim.

    Returns:
        q2k: (n_tiles, K) int32 on the CPU, K = the largest row count (at least 1): each row's first cnt entries
            are its key tiles, ascending; the rest 0 (never read).
        cnt: (n_tiles,) int32, key tiles per query tile (0 for skip).
    """
    tiles = tuple(int(x) for x in tiles)  # type: ignore[assignment]
    key = (pattern.key(), tiles)
    if key not in _TABLES:
        _TABLES[key] = _build_table(pattern, tiles)
    return _TABLES[key]


def block_density(pattern: Pattern, tiles: tuple[int, int, int]) -> float:
    """Fraction of the (query tile, key tile) pairs the pattern computes: its cost relative to dense in blocks
    (the search's cost term)."""
    _, cnt = q2k_table(pattern, tiles)
    return float(cnt.sum()) / float(math.prod(tiles)) ** 2


def token_density(pattern: Pattern, tile_sizes: torch.Tensor, tiles: tuple[int, int, int]) -> float:
    """Fraction of the (query token, key token) pairs the pattern attends: the work a dense attention does that it
    keeps (partial tiles weigh by their true token counts).

    Args:
        tile_sizes: (n_tiles,) true token counts (`TileLayout.tile_sizes`).
    """
    import torch

    sizes = tile_sizes.detach().to("cpu", torch.float64)
    bm = block_map(pattern, tiles).to(torch.float64)
    return float(sizes @ bm @ sizes) / float(sizes.sum()) ** 2
