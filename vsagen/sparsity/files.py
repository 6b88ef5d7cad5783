"""Sparse-vDiT pattern files: the mode of every (step range, expert, layer, head), as JSON (seed 003's offline search
result; written by `vsagen search`, read by `--attn sparse-vdit:patterns=FILE`).

Format (version 1), one JSON object:

    format        "vsagen-sparse-vdit"
    version       1
    model         the model it was searched on (preset name, local directory or hub id), for reports
    architecture  {"layers", "heads", "head_dim", "in_channels", "ffn_dim", "patch_size"} of the transformer(s): a
                  file is refused on a transformer whose architecture differs (another model, layer or head count)
    experts       the pipeline components it covers, e.g. ["transformer"] or ["transformer", "transformer_2"]
    height, width, frames   the video size searched at (pixels, frames)
    grid          [T, Hl, Wl] post-patch latent grid of that size (the tile grid follows from it)
    steps, lam, eps, prompts   the search's settings (denoising steps, cost weight, MSE threshold, prompt count)
    modes         {name: definition} of the patterns used (`patterns.Pattern.spec`)
    ranges        [{"start", "stop", "heads": {expert: [[mode name per head] per layer]}}], step ranges
                  [start, stop) covering 0..steps without gaps (one range: the same modes at every step); steps
                  past the last range use the last range's modes
    scores        optional: {"<expert>/<layer>/<head>": {mode: mean MSE}} (the search's measurements)

Every field but scores is required; the last range's stop is `steps`.

Another size: a file is refused on another latent grid unless the run asks for a remap (`remap=True`): each mode's
parameters are in tile units (radius, slabs, stripe spacing), so remapping compiles the same modes on the new tile
grid; their densities change with the grid and the modes were not searched there (`check_grid`).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..architecture import ARCH_FIELDS
from ..errors import BadInput
from .patterns import Pattern, block_density

FORMAT = "vsagen-sparse-vdit"
VERSION = 1
def _arch_text(a: Mapping[str, Any]) -> str:
    return f"{a['layers']} layers x {a['heads']} heads of {a['head_dim']}, {a['in_channels']} input channels"


# The search's settings (`vsagen.attention.sparse_vdit_search`, `vsagen search`), here with the files that record them,
# so a search request is checked without torch: Sparse-vDiT's lambda (seed 003), the cost weight of a mode's block
# density; its epsilon, the relative MSE a sparse mode may have at most (1 = skip's); the implementations that compute
# the modes.
DEFAULT_LAM = 0.5
DEFAULT_EPS = 1.0
IMPLS = ("auto", "triton", "torch")


def step_ranges(steps: int, n: int) -> tuple[tuple[int, int], ...]:
    """`n` equal step ranges [start, stop) covering 0..steps: range i starts at i * steps // n.

    Raises:
        BadInput: n < 1 or n > steps (a range without a step).
    """
    if not 1 <= n <= steps:
        raise BadInput(f"--ranges must be in [1, --steps] = [1, {steps}] (each range needs a step), got {n}")
    bounds = [i * steps // n for i in range(n + 1)]
    return tuple(zip(bounds[:-1], bounds[1:]))



@dataclass(frozen=True)
class StepRange:
    """The modes of denoising steps [start, stop): heads[expert][layer][head] is a mode name."""

    start: int
    stop: int
    heads: Mapping[str, tuple[tuple[str, ...], ...]]


@dataclass(frozen=True)
class PatternFile:
    """A pattern file in memory (see the module docstring for the fields)."""

    model: str
    architecture: Mapping[str, Any]
    experts: tuple[str, ...]
    height: int
    width: int
    frames: int
    grid: tuple[int, int, int]
    steps: int
    lam: float
    eps: float
    prompts: int
    modes: Mapping[str, Pattern]
    ranges: tuple[StepRange, ...]
    scores: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    @property
    def tiles(self) -> tuple[int, int, int]:
        """(NT, NH, NW) tiles per dim of `grid` with (4, 4, 4) tiles."""
        return tuple(math.ceil(g / 4) for g in self.grid)  # type: ignore[return-value]

    def search_step(self, step: int, run_steps: int | None) -> int:
        """The file's step that denoising `step` of a run of `run_steps` steps stands for: the same fraction of the
        schedule (step * steps // run_steps), so a file searched over 50 steps in ranges keeps its ranges' share of a
        20-step run; `step` itself when run_steps is None or equal to the file's steps, or step < 0."""
        if run_steps is None or run_steps == self.steps or step < 0 or run_steps < 1:
            return step
        return step * self.steps // run_steps

    def layer_modes(self, expert: str | None, layer: int, step: int = 0,
                    run_steps: int | None = None) -> tuple[Pattern, ...]:
        """The patterns of every head of `layer` of `expert` (None: the first expert) at denoising `step` of a run of
        `run_steps` steps (None: the file's own steps; another count maps by fraction, `search_step`); steps past
        the last range take the last range's modes, a step before the first (-1: a call outside a denoising loop,
        `Timer.step`'s default) the first range's.

        Raises:
            BadInput: an expert or layer the file does not cover."""
        step = self.search_step(step, run_steps)
        rng = self.ranges[0] if step < 0 else self.ranges[-1]
        for r in self.ranges:
            if r.start <= step < r.stop:
                rng = r
                break
        name = expert if expert is not None else self.experts[0]
        if name not in rng.heads or not 0 <= layer < len(rng.heads[name]):
            raise BadInput(f"the pattern file covers layers 0-{len(rng.heads[self.experts[0]]) - 1} of "
                           f"{', '.join(self.experts)}, not layer {layer} of {name}: search again on this model")
        return tuple(self.modes[n] for n in rng.heads[name][layer])

    def to_json(self) -> dict[str, Any]:
        """The JSON object of the module docstring."""
        out: dict[str, Any] = {
            "format": FORMAT, "version": VERSION, "model": self.model, "architecture": dict(self.architecture),
            "experts": list(self.experts), "height": self.height, "width": self.width, "frames": self.frames,
            "grid": list(self.grid), "steps": self.steps, "lam": self.lam, "eps": self.eps, "prompts": self.prompts,
            "modes": {n: p.spec() for n, p in self.modes.items()},
            "ranges": [{"start": r.start, "stop": r.stop,
                        "heads": {e: [list(layer) for layer in r.heads[e]] for e in self.experts}}
                       for r in self.ranges],
        }
        if self.scores:
            out["scores"] = {k: dict(v) for k, v in self.scores.items()}
        return out

    def check_architecture(self, arch: Mapping[str, Any], expert: str | None, where: str) -> None:
        """Refuse a transformer this file was not searched on.

        Raises:
            BadInput: another architecture (model, layer or head count), or an expert the file does not cover.
        """
        def plain(a: Mapping[str, Any]) -> dict[str, Any]:
            return {k: list(a.get(k)) if isinstance(a.get(k), (list, tuple)) else a.get(k) for k in ARCH_FIELDS}

        mine, theirs = plain(self.architecture), plain(arch)
        if mine != theirs:
            differ = ", ".join(f"{k} {mine[k]} vs {theirs[k]}" for k in ARCH_FIELDS if mine[k] != theirs[k])
            raise BadInput(f"{where} was searched on {self.model} ({_arch_text(mine)}); this model has "
                           f"{_arch_text(theirs)} ({differ}): search again on it (vsagen search)")
        name = expert if expert is not None else self.experts[0]
        if name not in self.experts:
            raise BadInput(f"{where} covers {', '.join(self.experts)}, not this pipeline's {name}: search again "
                           "on this model")

    def check_grid(self, grid: Sequence[int], remap: bool, where: str) -> None:
        """Refuse another latent grid unless `remap`.

        Raises:
            BadInput: `grid` differs from the file's and `remap` is False.
        """
        if tuple(grid) != tuple(self.grid) and not remap:
            raise BadInput(f"{where} was searched at {self.frames}x{self.height}x{self.width} (frames x height x "
                           f"width; latent grid {'x'.join(map(str, self.grid))}), this run's grid is "
                           f"{'x'.join(map(str, grid))} (its size and --tile-fit decide it): search at this size and "
                           "tile fit, or pass remap=true (--attn sparse-vdit:patterns=FILE:remap=true) to compile "
                           "the same modes on the new grid")

    def density(self, tiles: tuple[int, int, int] | None = None) -> float:
        """Mean block density over every (step range, expert, layer, head), ranges weighted by their steps, on
        `tiles` (default the file's tile grid)."""
        tiles = self.tiles if tiles is None else tiles
        dens = {n: block_density(p, tiles) for n, p in self.modes.items()}
        total, weight = 0.0, 0
        for r in self.ranges:
            w = r.stop - r.start
            for e in self.experts:
                for layer in r.heads[e]:
                    total += w * sum(dens[n] for n in layer)
                    weight += w * len(layer)
        return total / max(weight, 1)

    def mode_counts(self) -> dict[str, int]:
        """How many (step range, expert, layer, head) entries use each mode."""
        counts = {n: 0 for n in self.modes}
        for r in self.ranges:
            for e in self.experts:
                for layer in r.heads[e]:
                    for n in layer:
                        counts[n] += 1
        return counts


def file_hash(path: Path) -> str:
    """sha256 of a file's bytes, hex (recorded in a run's JSON beside the file's path)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _need(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in data:
        raise BadInput(f"{where}: no {key!r} field (not a vsagen pattern file?)")
    value = data[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise BadInput(f"{where}: field {key!r} has the wrong type ({type(value).__name__})")
    return value


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _parse_ranges(raw: list[Any], experts: tuple[str, ...], layers: int, heads: int, modes: set[str],
                  where: str) -> list[StepRange]:
    """The `StepRange`s of a pattern file's "ranges" list: consecutive from step 0, each with a (layers x heads)
    table of mode names per expert, every name one of `modes`.

    Raises:
        BadInput: a range that is not an object, does not start where the previous one stopped or is empty, or whose
            per-expert table has the wrong experts, shape or mode names.
    """
    ranges = []
    expect = 0
    for i, r in enumerate(raw):
        if not isinstance(r, dict):
            raise BadInput(f"{where}: ranges[{i}] is not an object")
        start, stop = r.get("start"), r.get("stop")
        if not (isinstance(start, int) and isinstance(stop, int) and start == expect and stop > start):
            raise BadInput(f"{where}: ranges[{i}] must start at step {expect} and end after it")
        expect = stop
        table = r.get("heads")
        if not isinstance(table, dict) or set(table) != set(experts):
            raise BadInput(f"{where}: ranges[{i}].heads must have one entry per expert ({', '.join(experts)})")
        per_expert = {}
        for e in experts:
            rows = table[e]
            if not isinstance(rows, list) or len(rows) != layers:
                raise BadInput(f"{where}: ranges[{i}].heads.{e} must list {layers} layers (its \"architecture\" "
                               f"block's count; a damaged or edited file: search again)")
            for li, row in enumerate(rows):
                if not isinstance(row, list) or len(row) != heads:
                    raise BadInput(f"{where}: layer {li} of {e} must list {heads} head modes (its \"architecture\" "
                                   f"block's count; a damaged or edited file: search again)")
                if not all(isinstance(n, str) for n in row):
                    raise BadInput(f"{where}: layer {li} of {e} must list mode names (strings)")
                unknown = sorted(set(row) - modes)
                if unknown:
                    raise BadInput(f"{where}: layer {li} of {e} uses mode(s) {', '.join(unknown)} that \"modes\" "
                                   "does not define")
            per_expert[e] = tuple(tuple(row) for row in rows)
        ranges.append(StepRange(start, stop, per_expert))
    return ranges


def parse_patterns(data: Any, where: str) -> PatternFile:
    """A `PatternFile` from its JSON object, checked throughout.

    Raises:
        BadInput: not a version-1 vsagen pattern file, a missing or mistyped field, an unknown mode, a mode list of
            the wrong length for the architecture, or step ranges that do not cover the steps.
    """
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BadInput(f"{where}: not a vsagen pattern file (no \"format\": \"{FORMAT}\")")
    if type(data.get("version")) is not int or data.get("version") != VERSION:  # JSON true == 1 in Python
        raise BadInput(f"{where}: pattern file version {data.get('version')!r}, this vsagen reads {VERSION}")
    arch = _need(data, "architecture", dict, where)
    for k in ARCH_FIELDS:
        if k not in arch:
            raise BadInput(f"{where}: architecture lacks {k!r}")
    layers, heads = arch["layers"], arch["heads"]
    if not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in (layers, heads)):
        raise BadInput(f"{where}: architecture layers and heads must be positive integers")
    experts = tuple(_need(data, "experts", list, where))
    if not experts or not all(isinstance(e, str) for e in experts) or len(set(experts)) != len(experts):
        raise BadInput(f"{where}: experts must be a list of distinct names")
    grid = _need(data, "grid", list, where)
    if len(grid) != 3 or not all(isinstance(g, int) and not isinstance(g, bool) and g > 0 for g in grid):
        raise BadInput(f"{where}: grid must be three positive integers")
    try:
        modes = {str(n): Pattern.from_spec(str(n), spec) for n, spec in _need(data, "modes", dict, where).items()}
    except ValueError as e:
        raise BadInput(f"{where}: {e}") from None
    steps = _need(data, "steps", int, where)
    if steps < 1:
        raise BadInput(f"{where}: steps must be a positive integer, got {steps}")
    ranges = _parse_ranges(_need(data, "ranges", list, where), experts, layers, heads, set(modes), where)
    if not ranges:
        raise BadInput(f"{where}: no step ranges")
    if ranges[-1].stop != steps:
        raise BadInput(f"{where}: the step ranges end at step {ranges[-1].stop}, not at steps ({steps}): they must "
                       f"cover 0..{steps}")
    scores = data.get("scores", {})
    if not isinstance(scores, dict) or not all(
            isinstance(v, dict) and all(isinstance(m, str) and _finite(x) for m, x in v.items())
            for v in scores.values()):
        raise BadInput(f"{where}: scores must be an object of {{mode: number}} objects")

    def number(key: str) -> float:
        v = _need(data, key, (int, float), where)
        if not _finite(v):
            raise BadInput(f"{where}: field {key!r} must be a finite number, got {v!r}")
        return float(v)

    def count(key: str, least: int) -> int:
        v = _need(data, key, int, where)
        if v < least:
            raise BadInput(f"{where}: field {key!r} must be an integer >= {least}, got {v}")
        return v

    return PatternFile(model=str(_need(data, "model", str, where)), architecture=dict(arch), experts=experts,
                       height=count("height", 1), width=count("width", 1), frames=count("frames", 1),
                       grid=tuple(grid), steps=steps, lam=number("lam"), eps=number("eps"),
                       prompts=count("prompts", 0), modes=modes, ranges=tuple(ranges), scores=scores)


def load_patterns(path: Path) -> PatternFile:
    """Read and check a pattern file.

    Raises:
        BadInput: a missing or unreadable file, not JSON, or anything `parse_patterns` refuses (one line naming the
            file).
    """
    path = Path(path).expanduser()
    where = f"pattern file {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(f"{where} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"{where} cannot be read: {e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadInput(f"{where} is not JSON: {e}") from None
    return parse_patterns(data, where)


def save_patterns(patterns: PatternFile, path: Path, *, overwrite: bool = False) -> None:
    """Write `patterns` as JSON, atomically (an interrupted write leaves no partial file).

    Raises:
        BadInput: `path` exists and `overwrite` is False.
    """
    from ..media.video import write_json

    write_json(patterns.to_json(), Path(path), overwrite=overwrite)
