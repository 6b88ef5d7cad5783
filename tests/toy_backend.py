"""`toy`: an attention backend written as docs/adding-a-backend.md says, for tests/test_adding_a_backend.py.

Dense attention on the tokens in tile order, times a known factor (`scale`) and, where trained gains are loaded, a
per-head gain: its output is known exactly (with `scale=1` and no gains it is dense attention, so its latents equal
`full`'s up to rounding). It records what it was told of each run (`prepare`) and what each call received (`SEEN`),
and reports one row per (expert, layer) (`per_layer`). It imports vsagen's public modules only, as a module of its
own would, and, as every backend module, no torch until it computes; the test registers it as the shipped backends
are, by its line ("toy_backend:ToyAttention") among `vsagen.attention.registry._BACKENDS`. Nothing in vsagen names
it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vsagen.attention.base import AttnContext, Backend, BackendReport, LayerWeights, RunInfo
from vsagen.attention.shared import weights_path_option
from vsagen.errors import BadInput

if TYPE_CHECKING:
    import torch

GAIN_KEY = "blocks.{layer}.attn1.toy_gain"
GAIN_ALIAS = "blocks.{layer}.attn1.gain"  # another project's name for the same tensors (`LayerWeights.aliases`)
MISSING_NOTE = "toy: no trained gains in the checkpoint, so every head's gain is 1"
STAGE = "self_attention/dense"


@dataclass(frozen=True)
class Call:
    """What one `__call__` received: q's shape (k and v must match), the layout's grid, the context's layer,
    expert and step, and the gains it applied (None: none loaded)."""

    shape: tuple[int, ...]
    grid: tuple[int, int, int]
    layer: int
    expert: str | None
    step: int
    gains: tuple[float, ...] | None


@dataclass
class Seen:
    """Every `RunInfo` the toy was prepared with and every call it served, across instances (the commands build
    their own instances), in order."""

    runs: list[RunInfo] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)

    def clear(self) -> None:
        """Forget everything seen."""
        self.runs.clear()
        self.calls.clear()


SEEN = Seen()


@dataclass(frozen=True)
class ToyOptions:
    """Options of `toy`.

    Attributes:
        scale: the factor dense attention's output is multiplied by, a number > 0 (1: dense attention).
        max_tokens: the most tokens (the post-patch grid's) a run may have, an integer >= 1; `prepare` refuses more.
        gains: a safetensors file with trained gains (`blocks.{i}.attn1.toy_gain.weight`, one value per head),
            loaded instead of the checkpoint's; None: the checkpoint's, if it has any.

    Raises:
        BadInput: a scale that is not a number > 0, a max_tokens that is not an integer >= 1, a gains path that
            is not a file.
    """

    scale: float = 1.0
    max_tokens: int = 1 << 20
    gains: Path | None = None

    def __post_init__(self) -> None:
        s = self.scale
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s <= 0:
            raise BadInput(f"scale must be a number > 0, got {s!r}")
        object.__setattr__(self, "scale", float(s))
        n = self.max_tokens
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise BadInput(f"max_tokens must be an integer >= 1, got {n!r}")
        if self.gains is not None:
            object.__setattr__(self, "gains", weights_path_option(self.gains, "gains"))


def gain_shapes(attn: Any) -> dict[str, tuple[int, ...]]:
    """One gain per head of the layer's `attn1`."""
    return {"weight": (int(attn.heads),)}


def gain_module(tensors: dict[str, torch.Tensor], attn: Any) -> torch.nn.Module:
    """The checked tensors of one layer as a Module holding them: `weight`, (heads,)."""
    import torch

    gain = torch.nn.Module()
    gain.weight = torch.nn.Parameter(tensors["weight"].detach().clone(), requires_grad=False)
    return gain


class ToyAttention(Backend):
    """Dense attention in tile order times a known factor (a test's backend: its output is known)."""

    name = "toy"
    Options = ToyOptions
    tiled = True          # q, k, v in tile order, `ctx.layout` set
    traceable = False     # it records each call in Python: run eagerly between compiled graphs
    per_layer = True      # one `report` row per (expert, layer); `--kernels` times every layer
    weights = LayerWeights(key=GAIN_KEY, attr="toy_gain", shapes=gain_shapes, build=gain_module,
                           file_option="gains", aliases=(GAIN_ALIAS,), missing_note=MISSING_NOTE)
    auto_priority = 4     # `--attn auto` runs it for a checkpoint holding its gains, before sla (3), sla-star, vsa

    def __init__(self, options: ToyOptions | None = None) -> None:
        super().__init__(options)
        self.rows: dict[tuple[str | None, int], dict[str, Any]] = {}

    def prepare(self, run: RunInfo) -> tuple[str, ...]:
        """Refuse a grid of more than `max_tokens` tokens; record the run; forget the last run's rows; one note."""
        self.check(run.device, run.dtype)
        tokens = math.prod(run.grid) if run.grid is not None else None
        if tokens is not None and tokens > self.options.max_tokens:
            raise BadInput(f"--attn toy: the grid {'x'.join(map(str, run.grid))} is {tokens} tokens, more than "
                           f"max_tokens={self.options.max_tokens}")
        SEEN.runs.append(run)
        self.rows = {}
        return (f"toy: dense attention times {self.options.scale:g}",)

    def describe(self, device: torch.device | None = None) -> dict:
        """{"name", **the options set, "calls": the calls served since the last `prepare`}."""
        return {**super().describe(device), "calls": sum(r["calls"] for r in self.rows.values())}

    def report(self, device: torch.device | None = None) -> BackendReport:
        """`describe(device)` and each (expert, layer)'s first call since `prepare`, sorted by expert then layer."""
        rows = tuple(self.rows[key] for key in sorted(self.rows, key=lambda k: (k[0] or "", k[1])))
        return BackendReport(self.describe(device), tuple({k: v for k, v in r.items() if k != "calls"} for r in rows))

    def bench_params(self, heads: int, head_dim: int, device: torch.device, seed: int) -> torch.nn.Module:
        """Gains of one (`vsagen profile --kernels` times the gain's multiply too)."""
        import torch

        return gain_module({"weight": torch.ones(heads)}, None).to(device)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        """q, k, v: (B, S, H, D) in tile order -> scale x dense attention (x the layer's gains), (B, S, H, D)."""
        import torch.nn.functional as F

        if ctx.layout is None or not q.shape == k.shape == v.shape:
            raise RuntimeError("toy needs q, k, v of one shape in tile order with a TileLayout")
        heads = q.shape[2]
        with ctx.timer.region(STAGE):
            out = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v))).transpose(1, 2)
            out = out * self.options.scale
            gains = None
            if ctx.params is not None:  # this layer's gains; under Ulysses q holds heads head_start.. only
                gains = ctx.params.weight[ctx.head_start:ctx.head_start + heads]
                out = out * gains.to(out.dtype).view(1, 1, heads, 1)
        row = self.rows.setdefault((ctx.expert, ctx.layer), {
            "expert": ctx.expert or "transformer", "layer": ctx.layer, "heads": heads, "launches": 1, "groups": 1,
            "density": 1.0, "sdpa_heads": heads, "modes": {"dense": heads}, "calls": 0})
        row["calls"] += 1
        SEEN.calls.append(Call(tuple(q.shape), tuple(ctx.layout.grid), ctx.layer, ctx.expert, ctx.step,
                               None if gains is None else tuple(float(g) for g in gains)))
        return out
