"""The 8-bit fine stage's forward compiled for sm90 (Hopper) on any machine, no GPU (not a test): what Triton makes
of its P.V product. Triton's launch is replaced by `triton.compile(..., target=GPUTarget("cuda", 90, 32))` (as
`vsagen.kernels.amd_build` does for AMD targets) while `bsa_fwd_sage` / `block_sparse_attention` launch on CPU
tensors; for each build it prints the P.V dot of the TTGIR (`ttng.warp_group_dot` = wgmma, its operand types and
B operand's shared layout), the PTX's wgmma / mma instructions, how V (or V^T) reaches shared memory (TMA
`cp.async.bulk.tensor`, `cp.async`, `ld.global` widths) and the shared memory size.

Builds (head dim 128, launch (64, 4, 3), VSA's (4, 4, 4) tiles): the SAGE forward over q2k lists on a grid whose
tile starts are multiples of 8 tokens like the 1.3B 480p grid's (`lists8`: (5, 6, 8), frames and rows 1 and 2 past
a multiple of 4, as (21, 30, 52)) and of 4 like the 14B 720p grid's (`lists4`: (5, 5, 8), as (21, 45, 80)), over
tile plans on the first (`packed8`), over a grid of full tiles (`full`: tile starts multiples of 64),
as the query-group launch `vsa` / `sla` take with 128-row groups on the first (`groups8`: launch (128, 8, 3),
`attention.shared.QUERY_LAUNCH`); the bf16 forward on the first grid (`bf16`) for comparison. V is in the kernel
tiles' 64-token slots (`sage.v_slots`), so every V^T box starts at a multiple of 64 tokens whatever the grid's tile
starts: the SAGE builds should fetch V^T by `cp.async.bulk.tensor` on every grid (the packed partial tiles' gathers
by pointer loads).

Usage (CPU; the Triton of this machine, not the lent GPU's):
    PYTHONPATH=$PWD python benchmarks/sage_sm90_build.py [--builds plain,packed,full,bf16] [--dump DIR]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import re
from pathlib import Path

import torch
import triton

from vsagen.kernels import sage
from vsagen.kernels.block_sparse_attn import block_sparse_attention
from vsagen.kernels.query_groups import block_query_groups
from vsagen.kernels.sage_attn import bsa_fwd_sage
from vsagen.kernels.tuning import arch_tuning
from vsagen.layout import tile_layout


def compile_forward(build: str) -> dict[str, str]:
    """The asm of `_bsa_fwd_kernel` (its last launch) for `build`, compiled for sm90: {"ttgir": ..., "ptx": ...,
    "shared": bytes}."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    got = {}
    original = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        if self.fn.__name__ != "_bsa_fwd_kernel":
            return None  # the tile-plan builder's launch: not needed (its output is not read)
        bound, spec, options = create_function_from_signature(self.signature, self.params, backend)(*args, **kwargs)
        options, signature, constexprs, attrs = self._pack_args(backend, kwargs, bound, spec, options)
        c = triton.compile(ASTSource(self, signature, constexprs, attrs), target=target, options=options.__dict__)
        got.update(ttgir=c.asm["ttgir"], ptx=c.asm["ptx"], shared=str(c.metadata.shared))
        starts = off[:-1].long()
        got["align"] = str(max(a for a in (1, 2, 4, 8, 16, 32, 64) if not bool((starts % a).any())))
        return None

    b, h, d = 1, 2, 128
    grid = {"lists4": (5, 5, 8), "full": (4, 8, 8)}.get(build, (5, 6, 8))
    off = tile_layout(grid).tile_offsets_i32
    s, t = int(off[-1]), off.numel() - 1
    q2k = torch.arange(t, dtype=torch.int32).repeat(b, h, t, 1)[..., :4].contiguous()
    cnt = torch.full((b, h, t), 4, dtype=torch.int32)
    tuning = dataclasses.replace(arch_tuning("sm90", d), pack_partial_tiles=build == "packed8",
                                 fwd_launch=((64, 4, 3),))
    JITFunction.run = compile_only
    try:
        if build == "bf16":
            x = torch.zeros(b, s, h, d, dtype=torch.bfloat16)
            block_sparse_attention(x, x, x, q2k, cnt, off, tuning=tuning)
        else:
            qi, sc = torch.zeros(b, s, h, d, dtype=torch.int8), torch.ones(b, h, s)
            vt = sage.v_slots(torch.zeros(b, s, h, d, dtype=sage.FP8), off)
            groups = None
            if build == "groups8":
                q2k[..., 1::2, :], cnt[..., 1::2] = q2k[..., 0::2, :], cnt[..., 0::2]  # tile pairs share a list
                groups = block_query_groups(torch.arange(t) // 2, h, off, 128)
            bsa_fwd_sage(qi, sc, qi, sc, vt, torch.ones(b, h, d), q2k, cnt, off, tuning=tuning, groups=groups,
                         group_launch=(128, 8, 3) if groups is not None else None)
    finally:
        JITFunction.run = original
    return got


def summary(asm: dict[str, str]) -> list[str]:
    """Lines: the TTGIR dots, the B operands' shared layouts, the PTX's MMA and load instructions."""
    ttgir, ptx = asm["ttgir"], asm["ptx"]
    layouts = dict(re.findall(r"^(#shared\d*) = (.*)$", ttgir, re.M))
    lines = []
    for m in re.finditer(r"= (ttng\.warp_group_dot|tt\.dot) (%[\w.]+), (%[\w.]+),.*?: (.*?) loc", ttgir):
        types = m.group(4)
        b_layout = re.search(r"\* !ttg\.memdesc<[^,]+, (#shared\d*)", types)
        lines.append(f"  {m.group(1)}: {types[:160]}")
        if b_layout:
            lines.append(f"    B operand {b_layout.group(1)} = {layouts.get(b_layout.group(1), '?')}")
    count = collections.Counter(re.findall(r"\b(wgmma\.mma_async[\w.]*|mma\.sync[\w.]*|cp\.async\.bulk\.tensor[\w.:]*"
                                           r"|cp\.async\.c[ag][\w.]*|ld\.global[\w.]*|ld\.shared[\w.]*)", ptx))
    lines += [f"  {n:4d} x {name}" for name, n in sorted(count.items())]
    lines.append(f"  shared memory: {asm['shared']} bytes; tile starts multiples of {asm['align']} tokens")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--builds", default="lists8,lists4,packed8,full,groups8,bf16")
    ap.add_argument("--dump", type=Path, help="write each build's ttgir and ptx into this folder")
    args = ap.parse_args()
    print("triton", triton.__version__, "target cuda sm90 (compiled on the CPU, nothing launched)")
    for build in args.builds.split(","):
        asm = compile_forward(build)
        print(f"\n{build}:")
        print("\n".join(summary(asm)))
        if args.dump:
            args.dump.mkdir(parents=True, exist_ok=True)
            for kind in ("ttgir", "ptx"):
                (args.dump / f"{build}.{kind}").write_text(asm[kind])


if __name__ == "__main__":
    main()
