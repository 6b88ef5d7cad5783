"""Attention-alone timing, shared by `vsagen profile --kernels` and `benchmarks/attention.py`.

Shape vocabulary as in docs/internals.md: B batch (1 here), S tokens, H heads, D head dim, (T, Hl, Wl) the post-patch
latent grid. Inputs are (B, S, H, D), the layout at the backend boundary.

Timing: on CUDA `triton.testing.do_bench` (median of repeated launches, its own warm-up and cache flush); on a
CPU the median of `time.perf_counter` around repeated calls after a warm-up call. Dense references are
torch's `scaled_dot_product_attention` pinned to one kernel (cuDNN, flash) on CUDA, and torch's own CPU kernel
elsewhere; the vsagen backends are called through their `AttentionBackend` interface, exactly as the processor
calls them (tiled backends get a `TileLayout` of the grid). A backend is called at layer 0 of expert None, or, where
its layers run differently (`timed_layers`: sparse-vdit's per-layer patterns), at each (expert, layer) given, its
time then the mean per layer.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from .attention.base import AttnContext
from .layout import tile_layout
from .timing import NullTimer


@dataclass(frozen=True)
class AttentionShape:
    """One self-attention problem: a post-patch latent grid (T, Hl, Wl) -> S = T*Hl*Wl tokens, H heads of D."""

    name: str
    grid: tuple[int, int, int]
    heads: int
    head_dim: int = 128

    @property
    def tokens(self) -> int:
        """S, tokens per sequence."""
        return math.prod(self.grid)

    def dense_flops(self) -> float:
        """FLOPs of one dense attention forward at B=1 (two S x S x D products per head)."""
        return 4.0 * self.tokens * self.tokens * self.head_dim * self.heads


# The Wan self-attention shapes of REFERENCE.md (B=1, D=128).
SHAPES = {
    "1.3b": AttentionShape("Wan2.1-1.3B 480x832x81", (21, 30, 52), 12),
    "5b": AttentionShape("Wan2.2-5B 704x1280x121", (31, 22, 40), 24),
    "14b": AttentionShape("Wan2.1-14B 720x1280x81", (21, 45, 80), 40),
}


def bench_ms(fn: Callable[[], Any], *, device: torch.device | str = "cuda", warmup_ms: float = 100,
             rep_ms: float = 500, min_reps: int = 3) -> float:
    """Median milliseconds of one `fn()` call.

    CUDA: `triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")`. CPU: calls `fn`
    for `warmup_ms` (at least once) untimed, then at least `min_reps` timed calls and more until `rep_ms`
    have passed (at most 1000).
    """
    if torch.device(device).type == "cuda":
        import triton

        return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    end = time.perf_counter() + warmup_ms / 1e3
    fn()
    while time.perf_counter() < end:
        fn()
    times: list[float] = []
    end = time.perf_counter() + rep_ms / 1e3
    while len(times) < min_reps or (time.perf_counter() < end and len(times) < 1000):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def rel_l2(x: torch.Tensor, y: torch.Tensor) -> float:
    """||x - y|| / ||y|| in float64 (any equal shapes)."""
    x, y = x.detach().double(), y.detach().double()
    return float((x - y).norm() / y.norm())


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: Any = None) -> torch.Tensor:
    """Dense attention of q, k, v (B, S, H, D) -> (B, S, H, D) like q, through torch's SDPA restricted to
    `backend` (a `torch.nn.attention.SDPBackend`), or torch's own choice when None."""
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    if backend is None:
        return F.scaled_dot_product_attention(qt, kt, vt).transpose(1, 2)
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(qt, kt, vt).transpose(1, 2)


def make_inputs(shape: AttentionShape, seed: int, requires_grad: bool = False, *,
                device: torch.device | str = "cuda", dtype: torch.dtype = torch.bfloat16) -> list[torch.Tensor]:
    """[q, k, v], each (1, S, H, D) standard normal in `dtype` on `device`, from a generator seeded `seed`."""
    g = torch.Generator(device=device).manual_seed(seed)
    xs = [torch.randn(1, shape.tokens, shape.heads, shape.head_dim, device=device, dtype=dtype, generator=g)
          for _ in range(3)]
    return [x.requires_grad_(requires_grad) for x in xs]


@dataclass(frozen=True)
class KernelRow:
    """One timed kernel at one shape.

    `kind` is "fwd" or "fwd+bwd"; `ms` the median milliseconds of one call; `baseline` the dense kernel the
    ratio is taken against (SDPA cuDNN on CUDA, torch's CPU SDPA elsewhere), same kind, same run;
    `speedup_vs_baseline` = baseline ms / ms (> 1: faster than dense). `layers`: how many (expert, layer)
    contexts the backend was called at, `ms` being the mean per layer over them (1: layer 0 alone).
    """

    shape: str
    tile_fit: str
    grid: tuple[int, int, int]
    tokens: int
    heads: int
    head_dim: int
    kernel: str
    kind: str
    ms: float
    baseline: str
    speedup_vs_baseline: float
    layers: int = 1

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (grid as a list)."""
        d = asdict(self)
        d["grid"] = list(self.grid)
        return d


def _dense_call(backend: Any) -> Callable[..., torch.Tensor]:
    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return sdpa(q, k, v, backend)
    return call


Context = tuple[str | None, int]  # (expert, layer) of one backend call
LAYER0: tuple[Context, ...] = ((None, 0),)


def timed_layers(backend: Any, experts: Sequence[tuple[str, int]]) -> tuple[Context, ...]:
    """The (expert, layer) contexts to time `backend` at: every layer of every expert (`experts`: (component name,
    layer count) pairs, e.g. (("transformer", 30),)) for a backend whose layers run differently (`per_layer`:
    sparse-vdit's per-layer patterns); layer 0 of expert None (`LAYER0`) otherwise, all its layers being alike."""
    contexts = tuple((e, i) for e, n in experts for i in range(n))
    return contexts if contexts and backend.per_layer else LAYER0


def _backend_calls(backend: Any, layout: Any, timer: NullTimer, shape: AttentionShape, device: torch.device,
                   seed: int, contexts: Sequence[Context]) -> list[Callable[..., torch.Tensor]]:
    """The backend as the processor calls it at each (expert, layer) of `contexts`, with the per-layer parameters it
    is timed with (`bench_params`: e.g. sla-star's projection at its trained size; None for backends timed without
    their own weights, as vsa without a gate)."""
    make = backend.bench_params
    params = make(shape.heads, shape.head_dim, device, seed) if make is not None else None

    def at(expert: str | None, layer: int) -> Callable[..., torch.Tensor]:
        def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return backend(q, k, v, AttnContext(layout=layout, layer=layer, expert=expert, timer=timer,
                                                params=params))
        return call
    return [at(e, i) for e, i in contexts]


def _backend_call(backend: Any, layout: Any, timer: NullTimer, shape: AttentionShape, device: torch.device,
                  seed: int) -> Callable[..., torch.Tensor]:
    """The backend as the processor calls it at layer 0 of expert None (`_backend_calls` at `LAYER0`)."""
    return _backend_calls(backend, layout, timer, shape, device, seed, LAYER0)[0]


def time_attention(shape: AttentionShape, backends: Sequence[tuple[Any, ...]], *, device: torch.device | str,
                   dtype: torch.dtype, tile_fit: str = "partial", seed: int = 0, warmup_ms: float = 100,
                   rep_ms: float = 500) -> list[KernelRow]:
    """Time the self-attention alone at `shape`: forward and forward+backward of the dense references and of
    each backend.

    Args:
        shape: the attention problem (B = 1).
        backends: (label, backend) pairs, or (label, backend, contexts) triples; each backend is an
            `AttentionBackend` (see vsagen.attention.base), called as the vsagen processor calls it (tiled backends
            with the grid's `TileLayout`; no trained weights, except those a backend asks to be timed with: its
            `bench_params(heads, head_dim, device, seed)`, e.g. sla-star's random projection of trained size) at
            each (expert, layer) of `contexts` (default `LAYER0`; see `timed_layers`) in turn, on the same inputs;
            its row is the mean per layer. Forward+backward runs each layer's backward after its forward (one
            layer's activations alive at a time); a layer whose output needs no gradient (sparse-vdit's all-skip
            layers: zeros) costs its forward only.
        device, dtype: where and in what precision (CUDA needs bf16 or fp16 for the cuDNN / flash rows).
        tile_fit: only copied into the rows (the caller chose the grid by it).
        seed: input seed. warmup_ms, rep_ms: see `bench_ms`.

    Returns:
        Rows in the order: dense references, then the backends, forward rows first, then forward+backward.
        On CUDA the references are "SDPA cuDNN" (the baseline) and "SDPA flash"; elsewhere "SDPA (torch CPU)".
        A row's `layers` is its number of contexts.

    Raises:
        RuntimeError: a kernel fails (e.g. a dtype the pinned SDPA kernel does not take).
        BadInput: a backend refuses the problem (e.g. a pattern file with another head count).
    """
    device = torch.device(device)
    q, k, v = make_inputs(shape, seed, device=device, dtype=dtype)
    qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    do = torch.randn_like(q)
    timer = NullTimer()
    if device.type == "cuda":
        from torch.nn.attention import SDPBackend

        dense = [("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION), ("SDPA flash", SDPBackend.FLASH_ATTENTION)]
    else:
        dense = [("SDPA (torch CPU)", None)]
    baseline = dense[0][0]

    Call = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

    def fwd(calls: list[Call]) -> Callable[[], Any]:
        def run() -> Any:
            with torch.no_grad():
                for call in calls:  # each output dropped before the next layer
                    call(q, k, v)
        return run

    def fwd_bwd(calls: list[Call]) -> Callable[[], Any]:
        def run() -> None:
            for x in (qg, kg, vg):
                x.grad = None
            for call in calls:
                out = call(qg, kg, vg)
                if out.requires_grad:  # an all-skip layer's zeros have no graph
                    out.backward(do)
        return run

    calls: list[tuple[str, list[Call]]] = [(name, [_dense_call(be)]) for name, be in dense]
    for entry in backends:
        label, be = entry[0], entry[1]
        contexts = tuple(entry[2]) if len(entry) > 2 else LAYER0
        layout = tile_layout(shape.grid, tuple(be.tile), device=device) if be.tiled else None  # the backend's cubes
        calls.append((label, _backend_calls(be, layout, timer, shape, device, seed, contexts)))
    rows: list[KernelRow] = []
    for kind, wrap in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
        times = [(name, len(layer_calls),
                  bench_ms(wrap(layer_calls), device=device, warmup_ms=warmup_ms, rep_ms=rep_ms) / len(layer_calls))
                 for name, layer_calls in calls]
        base = times[0][2]
        rows += [KernelRow(shape.name, tile_fit, shape.grid, shape.tokens, shape.heads, shape.head_dim, name, kind,
                           ms, baseline, base / max(ms, 1e-9), n) for name, n, ms in times]
    return rows
