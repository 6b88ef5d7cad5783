"""FA4 block-sparse adapter benchmark for the lent GPU (not a test): `vsagen.kernels.fa4_block_sparse` at full size.

At the Wan2.1-1.3B 480p shape (grid 21x30x52, 12 heads) and the 14B 720p shape (grid 21x45x80, 40 heads), D=128,
bf16, B=1, for tile volumes 128 (cube 4x4x8) and 256 (4x8x8) at 87.5% sparsity with random cube-level top-k
lists:
1. correctness: the adapter's output and q/k/v gradients against a float32 reference with the same selection
   (`reference.block_sparse_attention_reference`, padded-cube token mask), relative L2, on as many heads as fit a
   memory budget (heads are independent; the count is printed);
2. timings (triton.testing.do_bench medians through `vsagen.bench.bench_ms`): SDPA cuDNN forward and
   forward+backward in the same process, the adapter's forward (index conversion, padding and FA4 call together),
   its index conversion alone, its forward+backward; ratios against cuDNN.

Usage: python benchmarks/fa4_adapter.py [--shapes 1.3b,14b] [--volumes 128,256] [--sparsity 0.875] [--no-check]
Needs `pip install 'vsagen[fa4]'` and an sm90 / sm100 GPU; otherwise prints why and exits 2.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch.nn.attention import SDPBackend

from vsagen.bench import SHAPES, AttentionShape, bench_ms, make_inputs, rel_l2, sdpa
from vsagen.kernels import fa4_block_sparse as fa4
from vsagen.kernels.reference import block_sparse_attention_reference, top_k_from_sparsity
from vsagen.layout import tile_layout

TILES = {128: (4, 4, 8), 256: (4, 8, 8)}
# Elements of one float32 (heads, padded tokens, K*V) score tensor the reference may hold (its autograd keeps ~3).
CHECK_ELEMENTS = 2e9


def random_q2k(h: int, n: int, top_k: int, device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(q2k (1, H, n, K) int32 ascending distinct, q2k_cnt (1, H, n) int32 all K), random per row."""
    g = torch.Generator(device=device).manual_seed(seed)
    q2k = torch.rand(1, h, n, n, generator=g, device=device).argsort(-1)[..., :top_k].sort(-1).values
    return q2k.to(torch.int32), torch.full((1, h, n), top_k, dtype=torch.int32, device=device)


def check(shape: AttentionShape, vol: int, q, k, v, q2k, cnt, lay) -> str:
    """rel L2 of output and gradients against the float32 reference on the first heads that fit CHECK_ELEMENTS."""
    per_head = lay.num_tiles * vol * q2k.shape[-1] * vol
    heads = max(1, min(shape.heads, int(CHECK_ELEMENTS // per_head)))
    xs = [x[:, :, :heads].detach().clone().requires_grad_(True) for x in (q, k, v)]
    sel, c = q2k[:, :heads].contiguous(), cnt[:, :heads].contiguous()
    do = torch.randn_like(xs[0])
    out = fa4.fa4_block_sparse_attention(*xs, sel, c, lay.tile_sizes, lay.slots, lay.slot_valid, vol)
    out.backward(do)
    got = [out.detach(), *(x.grad for x in xs)]
    refs = [x.detach().float().requires_grad_(True) for x in xs]
    want, _ = block_sparse_attention_reference(*refs, sel.long(), lay.slots, lay.slot_valid)
    want.backward(do.float())
    errs = [rel_l2(a, b) for a, b in zip(got, [want.detach(), *(r.grad for r in refs)])]
    del want, refs
    torch.cuda.empty_cache()
    return f"{heads} head(s): out {errs[0]:.1e}  dq {errs[1]:.1e}  dk {errs[2]:.1e}  dv {errs[3]:.1e}"


def fwd_bwd(call, xs, do):
    def run():
        for x in xs:
            x.grad = None
        call().backward(do)
    return run


def checked_volumes(text: str, device: torch.device) -> list[int] | None:
    """The tile volumes of `--volumes` (128 / 256), or None after printing why FA4 cannot run one of them here."""
    volumes = [int(v) for v in text.split(",")]
    for vol in volumes:
        reason = f"--volumes takes 128 and / or 256, got {vol}" if vol not in TILES else fa4.fa4_unavailable(device,
                                                                                                              vol)
        if reason:
            print(f"error: {reason}", file=sys.stderr)
            return None
    return volumes


def fa4_parser(description: str) -> argparse.ArgumentParser:
    """The arguments this script and `fa4_profile.py` share: --shapes, --volumes, --sparsity."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--shapes", default="1.3b,14b")
    ap.add_argument("--volumes", default="128,256")
    ap.add_argument("--sparsity", type=float, default=0.875)
    return ap


def start(args: argparse.Namespace, device: torch.device) -> list[int] | None:
    """`checked_volumes` of --volumes (None: FA4 cannot run here, said on stderr); then prints the GPU line."""
    volumes = checked_volumes(args.volumes, device)
    if volumes is not None:
        print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  sparsity {args.sparsity}")
    return volumes


def main(argv: list[str] | None = None) -> int:
    ap = fa4_parser(__doc__.splitlines()[0])
    ap.add_argument("--no-check", action="store_true")
    args = ap.parse_args(argv)
    device = torch.device("cuda")
    volumes = start(args, device)
    if volumes is None:
        return 2
    rows = []
    for key in args.shapes.split(","):
        shape = SHAPES[key]
        q, k, v = make_inputs(shape, seed=0, requires_grad=True, device=device)
        do = torch.randn_like(q)
        dense_f = bench_ms(lambda: sdpa(q, k, v, SDPBackend.CUDNN_ATTENTION), device=device)
        dense_fb = bench_ms(fwd_bwd(lambda: sdpa(q, k, v, SDPBackend.CUDNN_ATTENTION), (q, k, v), do), device=device)
        rows.append((shape.name, "SDPA cuDNN", "", dense_f, dense_fb, ""))
        for vol in volumes:
            lay = tile_layout(shape.grid, TILES[vol], device)
            top_k = top_k_from_sparsity(args.sparsity, lay.num_tiles)
            q2k, cnt = random_q2k(shape.heads, lay.num_tiles, top_k, device, seed=vol)
            qb = fa4.fa4_query_block(torch.cuda.get_device_capability(device)[0], vol)
            note = "" if args.no_check else check(shape, vol, q, k, v, q2k, cnt, lay)

            def call(q2k=q2k, cnt=cnt, lay=lay, vol=vol):
                return fa4.fa4_block_sparse_attention(q, k, v, q2k, cnt, lay.tile_sizes, lay.slots,
                                                      lay.slot_valid, vol)

            with torch.no_grad():
                f = bench_ms(call, device=device)
                index_ms = bench_ms(lambda: fa4.fa4_block_sparse_index(q2k, cnt, lay.tile_sizes, vol, q_block=qb,
                                                                        backward=False), device=device)
            fb = bench_ms(fwd_bwd(call, (q, k, v), do), device=device)
            rows.append((shape.name, f"FA4 adapter V={vol} K={top_k}/{lay.num_tiles}",
                         f"{index_ms:.2f}", f, fb, note))
            print(rows[-1], flush=True)
    print("\n| shape | kernel | index ms | fwd ms (x cuDNN) | fwd+bwd ms (x cuDNN) | rel L2 vs fp32 |")
    print("|---|---|---|---|---|---|")
    base = {}
    for name, kernel, idx, f, fb, note in rows:
        if kernel == "SDPA cuDNN":
            base[name] = (f, fb)
        bf, bfb = base[name]
        print(f"| {name} | {kernel} | {idx} | {f:.2f} ({bf / f:.2f}x) | {fb:.2f} ({bfb / fb:.2f}x) | {note} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
