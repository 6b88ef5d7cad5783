"""k2q transpose benchmark for the lent GPU (not a test): the torch oracle `reference.build_k2q` against the Triton
`k2q.build_k2q_triton` the backward runs, bitwise checked, then timed with and without launch overhead. Moved out of
kernels/k2q.py (kernel modules hold no benchmark code); its numbers are in kernels/k2q.py's docstring.

Usage: python benchmarks/k2q.py [--b 1] [--h 12] [--n 624] [--top-k 78]   (default: Wan2.1-1.3B 480p, 87.5%)
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.testing

from vsagen.kernels.k2q import build_k2q_triton
from vsagen.kernels.reference import build_k2q


def random_q2k(b: int, h: int, n: int, top_k: int, device: str | torch.device = "cuda",
               seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(q2k (B, H, n, K) int32, q2k_cnt (B, H, n) int32 all K): K distinct random key tiles per row, ascending."""
    g = torch.Generator(device=device).manual_seed(seed)
    q2k = torch.rand(b, h, n, n, generator=g, device=device).argsort(-1)[..., :top_k].sort(-1).values
    return q2k.to(torch.int32), torch.full((b, h, n), top_k, dtype=torch.int32, device=device)


def bench_k2q(b: int = 1, h: int = 12, n: int = 624, top_k: int = 78, device: str = "cuda",
              seed: int = 0) -> dict:
    """Time `reference.build_k2q` (torch) against `build_k2q_triton` at one shape (default: Wan2.1-1.3B
    480p, 87.5% sparsity), after checking that they agree bitwise, on random sorted distinct q2k rows.

    Two timings each: triton.testing.do_bench (launch overhead included: on a slow host, mostly the CPU cost of
    the launches) and triton.testing.do_bench_cudagraph (GPU time only). Returns {"torch_ms", "triton_ms",
    "torch_graph_ms", "triton_graph_ms"} (milliseconds) and prints one line. Raises AssertionError when the
    outputs differ.
    """
    q2k, cnt = random_q2k(b, h, n, top_k, device, seed)
    want, want_cnt = build_k2q(q2k, cnt, n)
    got, got_cnt = build_k2q_triton(q2k, cnt, n)
    assert torch.equal(got, want) and torch.equal(got_cnt, want_cnt), "build_k2q_triton differs from build_k2q"
    fns = {"torch": lambda: build_k2q(q2k, cnt, n), "triton": lambda: build_k2q_triton(q2k, cnt, n)}
    res = {}
    for name, fn in fns.items():
        res[f"{name}_ms"] = triton.testing.do_bench(fn)
        res[f"{name}_graph_ms"] = triton.testing.do_bench_cudagraph(fn)
    print(f"build_k2q B={b} H={h} n={n} K={top_k}, outputs equal; do_bench: torch {res['torch_ms'] * 1e3:.1f} us, "
          f"triton {res['triton_ms'] * 1e3:.1f} us; CUDA graph: torch {res['torch_graph_ms'] * 1e3:.1f} us, "
          f"triton {res['triton_graph_ms'] * 1e3:.1f} us")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--b", type=int, default=1)
    ap.add_argument("--h", type=int, default=12)
    ap.add_argument("--n", type=int, default=624, help="tiles (Q_TILES = KV_TILES)")
    ap.add_argument("--top-k", type=int, default=78)
    args = ap.parse_args()
    bench_k2q(args.b, args.h, args.n, args.top_k)


if __name__ == "__main__":
    main()
