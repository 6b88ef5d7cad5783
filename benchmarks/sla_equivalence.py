"""vsagen's `sla` against SLA's own code, run from FastVideo's PyPI sdist as data (issue 31).

FastVideo 0.2.1 ships SLA's module as TurboDiffusion runs it: `fastvideo/attention/backends/sla.py` (its Triton
`mean_pool`, `get_block_map`, the `SLAAttentionImpl` forward: the sparse kernel, the torch linear branch, proj_l under
bf16 autocast; TurboDiffusion's defaults topk 0.1, BLKQ 128, BLKK 64) and the sparse kernel
`fastvideo-kernel/python/fastvideo_kernel/triton_kernels/sla_triton.py`. This script extracts those two files from the
sdist (`pip download --no-deps --no-binary :all: fastvideo==0.2.1`), loads them with stand-ins for the three package
imports they make (FastVideo's backend base classes, its logger, the kernel's package path), and runs them beside
vsagen's `sla` on the same q, k, v and projection:

1. block maps: SLA's `get_block_map` lut against vsagen's `raster_blocks.sla_block_map` (as sets per query block);
2. forward and backward: relative L2 of the outputs and of dq, dk, dv, d(proj_l) (targets: 3e-3 forward, 5e-3
   gradients), and of each against a float32 computation of SLA's formulas on SLA's own selection;
3. times (CUDA, do_bench medians): SLA's module, vsagen's `sla`, and dense SDPA (cuDNN) on the same inputs,
   forward and forward+backward.

FastVideo is never installed nor imported as a package. Runs on a GPU, or on a CPU under TRITON_INTERPRET=1 at a
small shape (`--shape small`: the check only, no times).

    python benchmarks/sla_equivalence.py --sdist fastvideo-0.2.1.tar.gz [--shape 1.3b|small] [--topk 0.1]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import types
from pathlib import Path

import torch
from peer_dmd import extract, load_module  # benchmarks/ is on the path when this script runs

from vsagen.attention.base import AttnContext
from vsagen.attention.sla import SLAAttention, SLAOptions
from vsagen.bench import bench_ms
from vsagen.kernels import raster_blocks as rb
from vsagen.kernels.reference import feature_map
from vsagen.timing import NullTimer

FILES = {"module": "fastvideo/attention/backends/sla.py",
         "kernel": "fastvideo-kernel/python/fastvideo_kernel/triton_kernels/sla_triton.py"}
# (S, H), D = 128, B = 1. On a CPU (`small`) the check runs in float32, SLA's compute dtype set to float32 too: under
# the Triton interpreter SLA's kernel returns garbage in bf16 (vsagen's kernels do not), and for masked loads without
# `other` past a partial block (which a GPU fills with zeros), so `small` has no partial block.
SHAPES = {"1.3b": (32760, 12), "14b-720p": (75600, 40), "small": (1024, 2)}


def slas_module(files: dict[str, Path]) -> types.ModuleType:
    """FastVideo's SLA module, loaded with stand-ins for its package imports."""
    for pkg in ("fastvideo", "fastvideo.attention", "fastvideo.attention.backends", "fastvideo_kernel",
                "fastvideo_kernel.triton_kernels"):
        sys.modules.setdefault(pkg, types.ModuleType(pkg)).__path__ = []
    abstract = types.ModuleType("fastvideo.attention.backends.abstract")
    for cls in ("AttentionBackend", "AttentionImpl", "AttentionMetadata", "AttentionMetadataBuilder"):
        setattr(abstract, cls, type(cls, (), {}))
    sys.modules[abstract.__name__] = abstract
    logger = types.ModuleType("fastvideo.logger")
    logger.init_logger = logging.getLogger
    sys.modules["fastvideo.logger"] = logger
    load_module("fastvideo_kernel.triton_kernels.sla_triton", files["kernel"])
    return load_module("fastvideo.attention.backends.sla", files["module"])


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def formula_fp32(q, k, v, lut, proj, block_q, block_k):
    """SLA's output in float32 from its formulas on a given selection (lut: (B, H, NQ, n) key blocks)."""
    s = q.shape[1]
    qh, kh, vh = (x.float().transpose(1, 2) for x in (q, k, v))
    q2k, cnt = rb.tile_lists(lut, s, block_q, block_k)
    o_s = rb.block_sparse_reference(q.float(), k.float(), v.float(), q2k, cnt)
    pq, pk = feature_map(qh, "softmax"), feature_map(kh, "softmax")
    o_l = (pq @ (pk.transpose(-1, -2) @ vh)) / (1e-5 + pq @ pk.sum(dim=2).unsqueeze(-1))
    return o_s + (o_l @ proj.weight.float().t() + proj.bias.float()).transpose(1, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sdist", type=Path, required=True, help="FastVideo's sdist (.tar.gz), 0.2.1")
    ap.add_argument("--shape", choices=list(SHAPES), default="1.3b")
    ap.add_argument("--topk", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    s, h = SHAPES[args.shape]
    d, bq, bk = 128, 128, 64
    with tempfile.TemporaryDirectory() as tmp:
        sla = slas_module(extract(args.sdist, Path(tmp), FILES))
    g = torch.Generator(device=device).manual_seed(args.seed)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    q, k, v = (torch.randn(1, s, h, d, device=device, dtype=dtype, generator=g) for _ in range(3))
    ours = SLAAttention(SLAOptions(topk=args.topk, block_q=bq, block_k=bk))
    proj = ours.bench_params(h, d, device, args.seed)
    theirs = sla.SLAAttentionImpl(num_heads=h, head_size=d, topk_ratio=args.topk, BLKQ=bq, BLKK=bk).to(device)
    if device.type != "cuda":
        theirs.dtype = torch.float32  # see SHAPES
    with torch.no_grad():
        theirs.proj_l.weight.copy_(proj.weight)
        theirs.proj_l.bias.copy_(proj.bias)
    meta = types.SimpleNamespace(topk_ratio=args.topk)

    def run_ours(a, b, c):
        return ours(a, b, c, AttnContext(layout=None, layer=0, expert=None, timer=NullTimer(), params=proj))

    def run_theirs(a, b, c):
        return theirs.forward(a, b, c, meta)

    ours128 = SLAAttention(SLAOptions(topk=args.topk, block_q=bq, block_k=bk, query_rows=128))

    def run_ours128(a, b, c):  # one program per 128-token query block
        return ours128(a, b, c, AttnContext(layout=None, layer=0, expert=None, timer=NullTimer(), params=proj))

    # 1. block maps
    _, lut_theirs, n_theirs = sla.get_block_map(q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(),
                                                topk_ratio=args.topk, BLKQ=bq, BLKK=bk)
    lut_ours = rb.sla_block_map(q, k, args.topk, bq, bk)
    same_rows = (lut_theirs.sort(-1).values == lut_ours.sort(-1).values).all(-1)
    print(f"shape S={s} H={h} D={d} topk={args.topk} ({n_theirs} of {-(-s // bk)} key blocks), {device}")
    print(f"block maps: {int(same_rows.sum())} of {same_rows.numel()} query-block rows identical")
    # ties on this device: torch.topk's choice among equal scores (SLA's rule is whatever torch.topk does)
    tie = torch.zeros(1, 64, device=device)
    tie[0, ::2] = 1.0
    print(f"torch.topk ties on {device.type}: picks {sorted(torch.topk(tie, 4, sorted=False).indices[0].tolist())} "
          "of the equal scores at 0, 2, 4, ...")

    # 2. forward and backward
    xs_o = [x.clone().requires_grad_() for x in (q, k, v)]
    xs_t = [x.clone().requires_grad_() for x in (q, k, v)]
    out_o, out_t = run_ours(*xs_o), run_theirs(*xs_t)
    dout = torch.randn(out_o.shape, device=device, dtype=out_o.dtype, generator=g)
    proj.zero_grad()
    out_o.backward(dout)
    grads_o = [x.grad for x in xs_o] + [proj.weight.grad.clone(), proj.bias.grad.clone()]
    out_t.backward(dout)
    grads_t = [x.grad for x in xs_t] + [theirs.proj_l.weight.grad, theirs.proj_l.bias.grad]
    ref = formula_fp32(q, k, v, lut_theirs, proj, bq, bk) if s * s * h <= 4e9 else None
    print(f"forward rel L2 vsagen vs SLA: {rel(out_o, out_t):.2e} (target <= 3e-3)"
          + (f"; vs fp32 formulas: vsagen {rel(out_o, ref):.2e}, SLA {rel(out_t, ref):.2e}" if ref is not None
             else ""))
    for name, a, b in zip(("dq", "dk", "dv", "dW", "db"), grads_o, grads_t):
        print(f"{name} rel L2 vsagen vs SLA: {rel(a, b):.2e} (target <= 5e-3)")
    xs_g = [x.clone().requires_grad_() for x in (q, k, v)]
    out_g = run_ours128(*xs_g)
    proj.zero_grad()
    out_g.backward(dout)
    print(f"query_rows=128 vs SLA: forward {rel(out_g, out_t):.2e}, "
          + ", ".join(f"{n} {rel(x.grad, y):.2e}" for n, x, y in zip(("dq", "dk", "dv"), xs_g, grads_t)))
    if device.type != "cuda":
        return

    # 3. times
    def fwd_bwd(fn, xs):
        def call():
            for x in xs:
                x.grad = None
            fn(*xs).backward(dout)
        return call

    def sdpa(a, b, c):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(
                a.transpose(1, 2), b.transpose(1, 2), c.transpose(1, 2)).transpose(1, 2)

    rows = []
    for label, fn in (("dense SDPA cuDNN", sdpa), ("SLA (FastVideo 0.2.1 sdist)", run_theirs),
                      ("vsagen sla", run_ours), ("vsagen sla query_rows=128", run_ours128)):
        with torch.no_grad():
            fwd = bench_ms(lambda: fn(q, k, v))
        both = bench_ms(fwd_bwd(fn, [x.clone().requires_grad_() for x in (q, k, v)]))
        rows.append((label, fwd, both))
    base_f, base_b = rows[0][1], rows[0][2]
    print(f"{'':30} {'fwd ms':>8} {'x cuDNN':>8} {'fwd+bwd ms':>11} {'x cuDNN':>8}")
    for label, fwd, both in rows:
        print(f"{label:30} {fwd:8.2f} {base_f / fwd:8.2f} {both:11.2f} {base_b / both:8.2f}")
    for label, fwd, both in rows[2:]:
        print(f"{label} over SLA: fwd {rows[1][1] / fwd:.2f}x, fwd+bwd {rows[1][2] / both:.2f}x")


if __name__ == "__main__":
    main()
