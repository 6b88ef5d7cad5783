"""SLA as its released code runs it, timed beside vsagen's `vsa` and `sla-star` (issue 12) by benchmarks/attention.py.

SLA (arXiv 2509.24006; thu-ml/SLA `sparse_linear_attention/core.py`, TurboDiffusion, FastVideo's SLA backend) runs
one attention call on q, k, v (B, L, H, D) as:
1. q, k, v -> (B, H, L, D) contiguous copies.
2. Block map (`block_map`; in torch here, SLA pools with a small Triton kernel): K smoothed (k minus its mean over
   the tokens), q and the smoothed k mean-pooled over contiguous 64-token blocks of the sequence as given (the last
   block partial), block scores pooled q . pooled k (no scale), the top int(ratio * N_BLOCKS) key blocks of each
   query block (ratio = 1 - sparsity; torch.topk, unsorted, int64) -> `lut` (B, H, M_BLOCKS, topk), and the dense
   0/1 int8 map `k_block_id` (B, H, M_BLOCKS, N_BLOCKS) that the backward's dK/dV kernel walks (row by row of query
   blocks, computing where it holds 1).
3. The sparse part: the Triton kernel `_attention.apply(q, k, v, k_block_id, lut, topk, 64, 64)` (softmax scale
   D^-0.5) of `sla_triton.py` from the fastvideo-kernel 0.3.5 sdist on PyPI, forward and backward.
4. The linear branch (`linear_branch`) in plain torch, in the compute dtype (bf16): phi = softmax over the head dim
   for q and k, o_l = phi(q) (phi(K)^T V) / (1e-5 + phi(q) . sum phi(K)).
5. o = o_s + proj_l(o_l), proj_l a float32 Linear(D, D) run under autocast bf16, then back to (B, L, H, D) (a view).

The kernel file is data carried with the benchmark run, never a dependency of vsagen: `load_kernel` imports it from
a path. `SLAPeer` has the shape of a vsagen attention backend (untiled, its projection from `bench_params`: the same
random projection of trained size that `sla-star` is timed with), so `vsagen.bench.time_attention` times it exactly
as it times the product's backends. `check` compares it once, on a small problem, with a float32 reference built
from vsagen's own reference functions on the same selection; `time_sla` times the rows; `summary` prints them.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
import torch
import torch.nn.functional as F

from vsagen.attention.base import AttnContext
from vsagen.attention.sla_star import SLAStarAttention, SLAStarOptions
from vsagen.attention.vsa import VSAAttention, VSAOptions
from vsagen.bench import AttentionShape, KernelRow, _backend_call, bench_ms, make_inputs, rel_l2, time_attention
from vsagen.kernels import reference as ref
from vsagen.kernels.tuning import KernelTuning
from vsagen.timing import NullTimer

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_KERNEL = ".peers/fastvideo_kernel-0.3.5/sla_triton.py"  # relative to the repository root
BLOCK = 64  # SLA's BLKQ = BLKK (the kernel takes BLOCK_M 64 or 128, BLOCK_N 64)
EPS = 1e-5  # added to the linear branch's denominator, as SLA's code does

# Row labels: the backends as the product runs them, and SLA
VSA, GLOBAL, MARGINAL = "vsa", "sla-star global", "sla-star marginal"
SLA = "SLA (fastvideo-kernel 0.3.5 sparse kernel + torch)"
CUDNN = "SDPA cuDNN"
PART = "SLA part: "  # the label prefix of SLA's parts timed alone


def load_kernel(path: str | Path | None) -> tuple[ModuleType | None, str]:
    """Import SLA's `sla_triton.py` from `path` (None: DEFAULT_KERNEL; a relative path that does not exist from the
    working folder is taken from the repository root).

    Returns:
        (module, "") or (None, why the SLA rows are skipped).
    """
    p = Path(DEFAULT_KERNEL if path is None else path)
    if not p.is_absolute() and not p.exists():
        p = ROOT / p
    if not p.is_file():
        return None, (f"{p} not found (the sla_triton.py of the fastvideo-kernel 0.3.5 sdist on PyPI; "
                      "give it with --sla-kernel PATH)")
    try:
        spec = importlib.util.spec_from_file_location("sla_peer_kernel", p)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - e.g. no triton here: report, go on without the SLA rows
        return None, f"{p} did not import: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
    if not hasattr(module, "_attention"):
        return None, f"{p} has no _attention (not SLA's sla_triton.py?)"
    return module, ""


def top_k_blocks(sparsity: float, blocks: int) -> int:
    """SLA's count of key blocks per query block: min(blocks, int(ratio * blocks)), ratio = 1 - sparsity (rounded
    to 12 places, so that e.g. 1 - 0.9 is the 0.1 a user would pass to SLA).

    Raises:
        ValueError: no block would be kept (SLA's kernel would divide by zero).
    """
    k = min(blocks, int(round(1.0 - sparsity, 12) * blocks))
    if k < 1:
        raise ValueError(f"sparsity {sparsity} keeps no key block of {blocks} in SLA's count")
    return k


def mean_pool(x: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """Means of contiguous token blocks: (B, H, L, D) -> (B, H, ceil(L / block), D) in x's dtype, summed in
    float32 (float64 for float64 x); the last block's mean is over its real tokens."""
    b, h, n, d = x.shape
    blocks = -(-n // block)
    acc = torch.promote_types(x.dtype, torch.float32)
    sums = F.pad(x.to(acc), (0, 0, 0, blocks * block - n)).view(b, h, blocks, block, d).sum(3)
    counts = torch.full((blocks, 1), float(block), dtype=acc, device=x.device)
    counts[-1] = n - (blocks - 1) * block
    return (sums / counts).to(x.dtype)


def block_map(q: torch.Tensor, k: torch.Tensor, sparsity: float,
              block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor, int]:
    """SLA's selection on (B, H, L, D) q and k (no autograd: SLA's pooling is a Triton kernel outside it).

    Returns:
        k_block_id: (B, H, M_BLOCKS, N_BLOCKS) int8, 1 where the query block attends the key block.
        lut: (B, H, M_BLOCKS, topk) int64, the selected key blocks of each query block (unsorted, as torch.topk).
        topk: the number of key blocks per query block.
    """
    with torch.no_grad():
        scores = mean_pool(q, block) @ mean_pool(k - k.mean(dim=-2, keepdim=True), block).transpose(-1, -2)
        topk = top_k_blocks(sparsity, scores.shape[-1])
        lut = torch.topk(scores, topk, dim=-1, sorted=False).indices
        k_block_id = torch.zeros_like(scores, dtype=torch.int8).scatter_(-1, lut, 1)
    return k_block_id, lut, topk


def linear_branch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """SLA's global linear attention on (B, H, L, D), in the inputs' dtype: phi(q) (phi(K)^T V) / (eps + phi(q) .
    sum phi(K)), phi = softmax over the head dim."""
    pq, pk = torch.softmax(q, dim=-1), torch.softmax(k, dim=-1)
    kv = pk.transpose(-1, -2) @ v  # (B, H, D, D)
    z = pk.sum(dim=-2, keepdim=True)  # (B, H, 1, D)
    return (pq @ kv) / (eps + (pq * z).sum(dim=-1, keepdim=True))


class SLAPeer:
    """SLA's attention call as an (untiled) vsagen backend: `peer(q, k, v, ctx)` on (B, S, H, D), `ctx.params` its
    proj_l (float32 Linear(D, D)).

    Args:
        kernel: the module `load_kernel` imported.
        sparsity: as vsa's; SLA keeps `top_k_blocks(sparsity, N_BLOCKS)` key blocks per query block.
        compute_dtype: SLA's `dtype` (bf16, or fp16); float32 only for tests under the Triton interpreter.
    """

    name = "sla"
    tiled = False

    def __init__(self, kernel: ModuleType, sparsity: float, compute_dtype: torch.dtype = torch.bfloat16) -> None:
        self.kernel = kernel
        self.sparsity = sparsity
        self.dtype = compute_dtype

    def bench_params(self, heads: int, head_dim: int, device: torch.device, seed: int) -> torch.nn.Module:
        """The random projection of trained size that `sla-star` is timed with (same seed, same weights)."""
        return SLAStarAttention().bench_params(heads, head_dim, device, seed)

    def sparse(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_block_id: torch.Tensor, lut: torch.Tensor,
               topk: int) -> torch.Tensor:
        """SLA's sparse kernel on (B, H, L, D) contiguous q, k, v (differentiable)."""
        return self.kernel._attention.apply(q, k, v, k_block_id, lut, topk, BLOCK, BLOCK)

    def branch(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, proj: torch.nn.Module) -> torch.Tensor:
        """proj_l(linear_branch) on (B, H, L, D), under autocast in the compute dtype as SLA runs it."""
        o_l = linear_branch(q, k, v)
        with torch.autocast(q.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
            return proj(o_l)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        """q, k, v: (B, S, H, D) -> (B, S, H, D) like q."""
        dtype = q.dtype
        q, k, v = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        k_block_id, lut, topk = block_map(q, k, self.sparsity)
        q, k, v = (x.to(self.dtype) for x in (q, k, v))
        o_s = self.sparse(q, k, v, k_block_id, lut, topk)
        return (o_s + self.branch(q, k, v, ctx.params)).to(dtype).transpose(1, 2)


def reference_selection(q: torch.Tensor, k: torch.Tensor, sparsity: float) -> torch.Tensor:
    """SLA's block map from vsagen's reference pooling (float32, `kernels/reference.py`) on (B, S, H, D) q and k:
    (B, H, M_BLOCKS, N_BLOCKS) bool."""
    s = q.shape[1]
    token_block = torch.arange(s, device=q.device) // BLOCK
    sizes = torch.bincount(token_block)
    q_c = ref.tile_mean_pool(q, token_block, sizes)
    k_c = ref.tile_mean_pool(k - k.float().mean(dim=1, keepdim=True), token_block, sizes)
    top = ref.select_top_k(ref.tile_scores(q_c, k_c), top_k_blocks(sparsity, sizes.numel()))
    return ref.block_map_from_q2k(top, sizes.numel())


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lut: torch.Tensor,
              proj: torch.nn.Module) -> torch.Tensor:
    """The same maths in float32 from vsagen's reference functions, given SLA's selection `lut`: (B, S, H, D)."""
    s = q.shape[1]
    blocks = -(-s // BLOCK)
    slots = torch.arange(blocks * BLOCK, device=q.device).view(blocks, BLOCK)
    o_s, _ = ref.block_sparse_attention_reference(q, k, v, lut.long(), slots.clamp(max=s - 1), slots < s)
    return o_s + F.linear(ref.linear_attention_branch(q, k, v), proj.weight.float(), proj.bias.float())


def check(kernel: ModuleType, sparsity: float, *, device: torch.device | str = "cuda",
          dtype: torch.dtype = torch.bfloat16, tokens: int = 2000, heads: int = 2, head_dim: int = 128,
          seed: int = 11) -> dict[str, float | bool]:
    """SLAPeer once on a small problem (a partial last block) against `reference` in float32 on the same selection:
    relative L2 of the output and of dq, dk, dv, d proj_l.weight; and how often its block map agrees with the
    reference pooling's (ties and bf16 rounding may flip a few).

    The peer computes in `dtype` (bf16 on the GPU; float32 under the Triton interpreter)."""
    device = torch.device(device)
    shape = AttentionShape("check", (1, 1, tokens), heads, head_dim)
    q, k, v = make_inputs(shape, seed, requires_grad=True, device=device, dtype=dtype)
    peer = SLAPeer(kernel, sparsity, compute_dtype=dtype)
    proj = peer.bench_params(heads, head_dim, device, seed)
    o = peer(q, k, v, AttnContext(layout=None, layer=0, expert=None, timer=NullTimer(), params=proj))
    do = torch.randn_like(o)
    o.backward(do)
    got = [o, q.grad, k.grad, v.grad, proj.weight.grad]
    qr, kr, vr = (x.detach().float().requires_grad_(True) for x in (q, k, v))
    proj.zero_grad()
    # the peer's selection again (deterministic on the same inputs), for the reference to use
    k_block_id, lut, _ = block_map(*(x.detach().transpose(1, 2).contiguous() for x in (q, k)), sparsity)
    o_ref = reference(qr, kr, vr, lut, proj)
    o_ref.backward(do.float())
    out: dict[str, float | bool] = {}
    for name, a, b in zip(("out", "dq", "dk", "dv", "dproj_w"), got, (o_ref, qr.grad, kr.grad, vr.grad,
                                                                      proj.weight.grad)):
        out[f"sla_{name}_vs_fp32_rel_l2"] = rel_l2(a, b)
        out[f"sla_{name}_finite"] = bool(torch.isfinite(a).all())
    same = k_block_id.bool() == reference_selection(q.detach(), k.detach(), sparsity)
    out["sla_block_map_agreement"] = float(same.float().mean())
    return out


def _runs(peer: SLAPeer, shape: AttentionShape, device: torch.device) -> str:
    """"" if SLA's forward+backward runs at `shape`, else why not (e.g. a launch that does not fit the GPU)."""
    try:
        q, k, v = make_inputs(shape, seed=0, requires_grad=True, device=device)
        _backend_call(peer, None, NullTimer(), shape, device, seed=0)(q, k, v).sum().backward()
        return ""
    except Exception as e:  # noqa: BLE001 - report, go on without the SLA rows
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"


def time_sla(shape: AttentionShape, sparsity: float, tuning: KernelTuning | None, kernel: ModuleType | None,
             *, seed: int = 2, device: torch.device | str = "cuda") -> list[dict]:
    """Forward and forward+backward at `shape` (B=1, bf16) of dense cuDNN (and flash), `vsa`, `sla-star` (global,
    marginal; with the random projection of trained size) and SLA (given its `kernel`), all through
    `vsagen.bench.time_attention` as `vsagen profile --kernels` times them; then SLA's parts alone on (B, H, L, D)
    inputs: its block map, its sparse kernel, its linear branch with the projection.

    Returns:
        `KernelRow.to_dict()` rows, ratios against SDPA cuDNN (on CUDA) of the same kind measured in this call.
    """
    device = torch.device(device)
    backends = [(VSA, VSAAttention(VSAOptions(sparsity=sparsity, tuning=tuning)))]
    backends += [(label, SLAStarAttention(SLAStarOptions(sparsity=sparsity, scope=scope, tuning=tuning)))
                 for label, scope in ((GLOBAL, "global"), (MARGINAL, "marginal"))]
    peer = None
    if kernel is not None:
        peer = SLAPeer(kernel, sparsity)
        why = _runs(peer, shape, device)
        if why:
            print(f"SLA rows skipped at {shape.name}: {why}", file=sys.stderr, flush=True)
            peer = None
        else:
            backends.append((SLA, peer))
    rows = time_attention(shape, backends, device=device, dtype=torch.bfloat16, seed=seed)
    if peer is not None:
        rows += _time_sla_parts(peer, shape, device, seed, rows)
    return [r.to_dict() for r in rows]


def _time_sla_parts(peer: SLAPeer, shape: AttentionShape, device: torch.device, seed: int,
                    rows: list[KernelRow]) -> list[KernelRow]:
    """SLA's block map (forward), sparse kernel and linear branch + projection (forward, forward+backward) alone,
    as rows like `rows` (time_attention's at the shape, whose first row is the baseline's)."""
    r0 = rows[0]
    base = {r.kind: r.ms for r in rows if r.kernel == r0.baseline}
    q, k, v = (x.transpose(1, 2).contiguous().requires_grad_(True) for x in make_inputs(shape, seed, device=device))
    proj = peer.bench_params(shape.heads, shape.head_dim, device, seed)
    k_block_id, lut, topk = block_map(q, k, peer.sparsity)
    do = torch.randn_like(q)
    sparse = lambda: peer.sparse(q, k, v, k_block_id, lut, topk)  # noqa: E731
    branch = lambda: peer.branch(q, k, v, proj)  # noqa: E731

    def fwd(fn):
        def run():
            with torch.no_grad():
                return fn()
        return run

    def fwd_bwd(fn):
        def run():
            for x in (q, k, v):
                x.grad = None
            fn().backward(do)
        return run

    timed = [(PART + "block map (torch)", "fwd", fwd(lambda: block_map(q, k, peer.sparsity))),
             (PART + "sparse kernel (Triton)", "fwd", fwd(sparse)),
             (PART + "linear branch + proj_l (torch)", "fwd", fwd(branch)),
             (PART + "sparse kernel (Triton)", "fwd+bwd", fwd_bwd(sparse)),
             (PART + "linear branch + proj_l (torch)", "fwd+bwd", fwd_bwd(branch))]
    out = []
    for label, kind, run in timed:
        ms = bench_ms(run, device=device)
        out.append(KernelRow(r0.shape, r0.tile_fit, r0.grid, r0.tokens, r0.heads, r0.head_dim, label, kind, ms,
                             r0.baseline, base[kind] / max(ms, 1e-9)))
    return out


def summary(rows: list[dict]) -> list[str]:
    """Markdown lines: per shape and pass, the baseline (SDPA cuDNN on CUDA), vsa, sla-star (both scopes) and SLA
    with their ratios; then issue 12's forward+backward ratios against its targets, and SLA's parts."""
    at = {(r["shape"], r["kernel"], r["kind"]): r for r in rows}
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    base = rows[0]["baseline"] if rows else CUDNN

    def ms(shape: str, label: str, kind: str) -> float | None:
        r = at.get((shape, label, kind))
        return r["ms"] if r else None

    def cell(shape: str, label: str, kind: str, against: str | None = None) -> str:
        r = at.get((shape, label, kind))
        if r is None:
            return "-"
        a = ms(shape, against, kind) if against else None
        return f"{r['ms']:.3f} ({r['speedup_vs_baseline']:.2f}x" + (f"; {r['ms'] / a:.2f}x)" if a else ")")

    lines = [f"| shape | pass | {base} ms | vsa ms (x {base}) | sla-star global ms (x {base}; / vsa) | "
             f"sla-star marginal ms (x {base}; / vsa) | SLA ms (x {base}; / sla-star global) |",
             "|---|---|---|---|---|---|---|"]
    for shape in shapes:
        for kind in ("fwd", "fwd+bwd"):
            c = ms(shape, base, kind)
            cells = [f"{c:.3f}" if c else "-", cell(shape, VSA, kind), cell(shape, GLOBAL, kind, VSA),
                     cell(shape, MARGINAL, kind, VSA), cell(shape, SLA, kind, GLOBAL)]
            lines.append(f"| {shape} | {kind} | " + " | ".join(cells) + " |")
    lines += ["", "Issue 12, forward+backward: sla-star / vsa (target <= 1.08x), SLA / sla-star global "
              "(target >= 3.13x, at the 1.3B shape)."]
    for shape in shapes:
        t = {label: ms(shape, label, "fwd+bwd") for label in (VSA, GLOBAL, MARGINAL, SLA)}
        said = [f"{label} / vsa {t[label] / t[VSA]:.3f}x ({'met' if t[label] <= 1.08 * t[VSA] else 'missed'})"
                for label in (GLOBAL, MARGINAL) if t[label] and t[VSA]]
        if t[SLA] and t[GLOBAL]:
            r = t[SLA] / t[GLOBAL]
            said.append(f"SLA / sla-star global {r:.2f}x ({'met' if r >= 3.13 else 'missed'})")
        parts = [f"{r['kernel'].removeprefix(PART)} {r['kind']} {r['ms']:.3f}" for r in rows
                 if r["shape"] == shape and r["kernel"].startswith(PART)]
        lines.append(f"- {shape}: " + ("; ".join(said) or "-")
                     + (f". SLA's parts (ms): {', '.join(parts)}" if parts else ""))
    return lines
