"""FastVideo's Triton VSA fine stage, run from its PyPI sdist as data on vsagen's cube selection (issue 33, item 4).

FastVideo runs VSA's fine stage on one Triton kernel of 64-token blocks (`fastvideo-kernel/python/fastvideo_kernel/
triton_kernels/block_sparse_attn_triton.py`: `triton_block_sparse_attn_forward(q, k, v, q2k_index, q2k_num,
variable_block_sizes)` on (B, H, T, D) inputs whose T is a multiple of 64, and `triton_block_sparse_attn_backward`),
and its 128- and 256-token tiles on the same kernel by "route A" (`block_sparse_attn_256.py`): the logical cube map
repeat-interleaved to 64-token blocks on both sides, each cube's real-token count chopped into 64-token strides as the
blocks' `variable_block_sizes`, `map_to_index` (`triton_kernels/index.py`) for the q2k lists, and in the backward
`invert_indices` for the k2q lists. This module does the same, given the cube lists (q2k, q2k_cnt) vsagen's coarse
stage chose on the same inputs:
1. tile-order (B, S, H, D) q, k, v -> FastVideo's padded layout (B, H, nC * V, D): cube c in rows [c V, (c + 1) V),
   its real tokens first, zeros after (`TileLayout.slots` / `slot_valid`, V the tile volume 64 / 128 / 256);
2. the (B, H, nC, nC) cube map -> route A's (B, H, nC V / 64, nC V / 64) block map -> `map_to_index`;
3. FastVideo's forward (and, under autograd, its backward with `invert_indices`), then back to (B, S, H, D).
Each call does all three, as FastVideo's own VSA call builds its index lists per call.

The two files are extracted from the sdist (`pip download --no-deps --no-binary :all: fastvideo==0.2.1`) and imported
from a path (`benchmarks/peer_dmd.py`'s helpers); FastVideo is never installed nor imported as a package. On a CPU
(the Triton interpreter) `invert_indices`, which refuses non-CUDA tensors, is replaced by `map_to_index` of the
transposed block map (the same k2q sets, ascending).

Run alone it is the harness's CPU check (TRITON_INTERPRET=1; minutes):
    TRITON_INTERPRET=1 python benchmarks/fastvideo_vsa.py --sdist .peers/fastvideo-0.2.1.tar.gz [--grid 5,6,10]
for each tile volume: the index conversion against the dense cube mask (pure torch), then FastVideo's path and
vsagen's fine stage on the same selection against a float32 reference (output and dq / dk / dv, relative L2).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/peer_dmd.py, also when loaded by path
from peer_dmd import extract, load_module  # noqa: E402

from vsagen.bench import rel_l2  # noqa: E402
from vsagen.kernels.fa4_block_sparse import cube_map, pad_to_cubes, unpad_from_cubes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SDIST = ".peers/fastvideo-0.2.1.tar.gz"  # relative to the repository root
KERNEL_DIR = "fastvideo-kernel/python/fastvideo_kernel/triton_kernels/"
FILES = {"attn": KERNEL_DIR + "block_sparse_attn_triton.py", "index": KERNEL_DIR + "index.py"}
BLOCK = 64  # FastVideo's Triton kernel: BLOCK_M = BLOCK_N = 64
TILES = {64: (4, 4, 4), 128: (4, 4, 8), 256: (4, 8, 8)}  # tile volume -> cube, as vsagen's `tile` option names it


# The one line of FastVideo's dQ kernel the Triton interpreter cannot run (a `range` loop variable is a Python int
# there, without `.to`), and the same arithmetic it can: applied only by `load(..., interpreter_shim=True)`.
INTERPRETER_SHIM = ("half = (blk_idx % 2).to(tl.int32)", "half = blk_idx % 2")


def load(sdist: str | Path | None,
         interpreter_shim: bool = False) -> tuple[tuple[ModuleType, ModuleType] | None, str]:
    """FastVideo's kernel and index modules from the sdist at `sdist` (None: DEFAULT_SDIST; a relative path that does
    not exist from the working folder is taken from the repository root). `interpreter_shim`: rewrite the extracted
    kernel's INTERPRETER_SHIM line (for the CPU check under the Triton interpreter; never on the GPU).

    Returns:
        ((attn module, index module), "") or (None, why the FastVideo rows are skipped, one line).
    """
    p = Path(DEFAULT_SDIST if sdist is None else sdist)
    if not p.is_absolute() and not p.exists():
        p = ROOT / p
    if not p.is_file():
        return None, f"{p} not found (FastVideo 0.2.1's sdist; give it with --fastvideo-sdist PATH)"
    try:
        files = extract(p, Path(tempfile.mkdtemp(prefix="fastvideo_vsa_")), FILES)  # kept: Triton reads the sources
        if interpreter_shim:
            text = files["attn"].read_text()
            if INTERPRETER_SHIM[0] not in text:
                return None, f"{p}: no line {INTERPRETER_SHIM[0]!r} in {FILES['attn']} (another version?)"
            files["attn"].write_text(text.replace(*INTERPRETER_SHIM))
        return (load_module("fastvideo_vsa_attn", files["attn"]), load_module("fastvideo_vsa_index", files["index"])), ""
    except (Exception, SystemExit) as e:  # noqa: BLE001 - e.g. no triton here, or not that sdist: report, go on
        return None, f"{p}: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


def padded_heads(x: torch.Tensor, layout) -> torch.Tensor:
    """(B, S, H, D) tile order -> FastVideo's (B, H, nC * V, D) contiguous, each cube padded to V with zeros."""
    return pad_to_cubes(x, layout.slots, layout.slot_valid).transpose(1, 2).contiguous()


def unpadded(xp: torch.Tensor, layout) -> torch.Tensor:
    """(B, H, nC * V, D) padded -> (B, S, H, D) tile order (the inverse of `padded_heads`)."""
    return unpad_from_cubes(xp.transpose(1, 2), layout.slots, layout.slot_valid, layout.num_tokens)


def block_sizes(layout) -> torch.Tensor:
    """Route A's `variable_block_sizes`: (nC * V / 64,) int32 real tokens of each 64-token block of the padded
    sequence (each cube's count chopped into 64-token strides, 0 for a block of padding only)."""
    per_cube = layout.tile_volume // BLOCK
    start = torch.arange(per_cube, device=layout.tile_sizes.device) * BLOCK
    return (layout.tile_sizes.view(-1, 1) - start).clamp(0, BLOCK).reshape(-1).to(torch.int32).contiguous()


def block_map(q2k: torch.Tensor, q2k_cnt: torch.Tensor, layout) -> torch.Tensor:
    """Route A's (B, H, nC V / 64, nC V / 64) bool block map of the cube lists q2k (B, H, nC, K), q2k_cnt (B, H, nC)."""
    r = layout.tile_volume // BLOCK
    cubes = cube_map(q2k, q2k_cnt, layout.num_tiles)
    return cubes.repeat_interleave(r, -1).repeat_interleave(r, -2).contiguous()


def k2q_lists(index: ModuleType, q2k_idx: torch.Tensor, q2k_num: torch.Tensor, blocks: int,
              bmap: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward's k2q lists: FastVideo's `invert_indices` on CUDA; on a CPU (it refuses CPU tensors)
    `map_to_index` of the transposed block map `bmap` (the same sets, ascending)."""
    if q2k_idx.is_cuda:
        return index.invert_indices(q2k_idx, q2k_num, blocks)
    return index.map_to_index(bmap.transpose(-1, -2).contiguous())


class _PeerAttention(torch.autograd.Function):
    """FastVideo's forward and backward kernels on (B, H, T, D) contiguous q, k, v (as its custom op wires them)."""

    @staticmethod
    def forward(ctx, q, k, v, q2k_idx, q2k_num, sizes, bmap, mods):
        o, m = mods[0].triton_block_sparse_attn_forward(q, k, v, q2k_idx, q2k_num, sizes)
        ctx.save_for_backward(q, k, v, o, m, q2k_idx, q2k_num, sizes, bmap)
        ctx.mods = mods
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, m, q2k_idx, q2k_num, sizes, bmap = ctx.saved_tensors
        attn, index = ctx.mods
        k2q_idx, k2q_num = k2q_lists(index, q2k_idx, q2k_num, sizes.numel(), bmap)
        dq, dk, dv = attn.triton_block_sparse_attn_backward(do.contiguous(), q, k, v, o, m, q2k_idx, q2k_num,
                                                            k2q_idx, k2q_num, sizes)
        return dq, dk, dv, None, None, None, None, None


def fastvideo_fine(mods: tuple[ModuleType, ModuleType], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   q2k: torch.Tensor, q2k_cnt: torch.Tensor, layout) -> torch.Tensor:
    """VSA's fine stage as FastVideo's Triton path runs it, on vsagen's cube selection.

    Args:
        mods: `load`'s (attn, index) modules.
        q, k, v: (B, S, H, D) tile order (`layout`), bf16 on CUDA (the kernel casts P to bf16); under the
            interpreter any float dtype the interpreter's dots take.
        q2k: (B, H, nC, K) int key cubes per query cube; q2k_cnt: (B, H, nC) int, each >= 1.
        layout: the `TileLayout` of the cubes (tile volume 64, 128 or 256).

    Returns:
        (B, S, H, D) like q, differentiable in q, k, v through FastVideo's backward kernels.
    """
    bmap = block_map(q2k, q2k_cnt, layout)
    q2k_idx, q2k_num = mods[1].map_to_index(bmap)
    sizes = block_sizes(layout)
    o = _PeerAttention.apply(*(padded_heads(x, layout) for x in (q, k, v)), q2k_idx, q2k_num, sizes,
                             bmap if not q.is_cuda else None, mods)
    return unpadded(o, layout)


def decoded_mask(q2k_idx: torch.Tensor, q2k_num: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """What FastVideo's forward computes, as a dense (B, H, T, T) bool token mask over the padded sequence (pure
    torch): query row i attends key j when j's 64-block is among the first q2k_num entries of i's block list and j
    lies within that block's `variable_block_sizes` (its first tokens)."""
    nb = sizes.numel()
    used = torch.arange(q2k_idx.shape[-1], device=q2k_idx.device) < q2k_num.unsqueeze(-1)
    cols = torch.where(used, q2k_idx.long(), nb)
    blocks = torch.zeros(*q2k_idx.shape[:-1], nb + 1, dtype=torch.bool).scatter_(-1, cols, True)[..., :nb]
    in_block = torch.arange(BLOCK).view(1, -1) < sizes.long().view(-1, 1)  # (nb, 64)
    keys = blocks.unsqueeze(-1) & in_block  # (B, H, nb, nb, 64)
    return keys.flatten(-2).repeat_interleave(BLOCK, -2)


def cube_mask(q2k: torch.Tensor, q2k_cnt: torch.Tensor, layout) -> torch.Tensor:
    """The selection as a dense (B, H, T, T) bool token mask over the padded sequence: key slot j is attended by
    query slot i when j is a real token of a cube that i's cube selected."""
    v = layout.tile_volume
    sel = cube_map(q2k, q2k_cnt, layout.num_tiles).repeat_interleave(v, -1).repeat_interleave(v, -2)
    return sel & layout.slot_valid.reshape(1, 1, 1, -1)


class KernelEmulation:
    """FastVideo's kernel contract in torch (float32, float64 for float64 inputs), a stand-in for its `block_sparse_attn_triton.py` in the CPU check
    (the Triton interpreter's bf16 dots return garbage, and the kernel casts P and dS to bf16): the lists are decoded
    into the token mask the kernel applies (`decoded_mask`), and the backward checks that its k2q lists are the
    q2k lists transposed."""

    @staticmethod
    def triton_block_sparse_attn_forward(q, k, v, q2k_idx, q2k_num, sizes):
        """(o like q, M (B, H, T) float32 base-2 log-sum-exp), as the kernel returns them."""
        acc = torch.promote_types(q.dtype, torch.float32)
        s = (q.to(acc) @ k.to(acc).transpose(-1, -2)) * q.shape[-1] ** -0.5
        s = s.masked_fill(~decoded_mask(q2k_idx, q2k_num, sizes), float("-inf"))
        return torch.softmax(s, -1).matmul(v.to(acc)).to(q.dtype), (torch.logsumexp(s, -1) / math.log(2)).float()

    @staticmethod
    def triton_block_sparse_attn_backward(do, q, k, v, o, m, q2k_idx, q2k_num, k2q_idx, k2q_num, sizes):
        """(dq, dk, dv) like q, k, v; raises AssertionError where the k2q lists are not q2k's transposed."""
        ones = torch.full_like(sizes, BLOCK)
        by_key = decoded_mask(k2q_idx, k2q_num, ones)[..., ::BLOCK, ::BLOCK]
        assert bool((by_key == decoded_mask(q2k_idx, q2k_num, ones)[..., ::BLOCK, ::BLOCK].transpose(-1, -2)).all())
        acc = torch.promote_types(q.dtype, torch.float32)
        xs = [x.detach().to(acc).requires_grad_(True) for x in (q, k, v)]
        with torch.enable_grad():
            o32, _ = KernelEmulation.triton_block_sparse_attn_forward(*xs, q2k_idx, q2k_num, sizes)
            o32.backward(do.to(acc))
        return tuple(x.grad.to(x0.dtype) for x, x0 in zip(xs, (q, k, v)))


def check(mods: tuple[ModuleType, ModuleType], grid: tuple[int, int, int], heads: int, head_dim: int,
          sparsity: float, dtype: torch.dtype, seed: int = 0) -> list[str]:
    """The harness on CPU (under TRITON_INTERPRET=1): per tile volume, the route A lists decoded against the cube
    mask, then FastVideo's path and vsagen's fine stage against the float32 reference with one reference selection.

    Returns one line per tile volume ("... fwd e dq e dk e dv e" for each engine)."""
    from vsagen.attention.shared import kernel_lists
    from vsagen.kernels import reference as ref
    from vsagen.kernels.block_sparse_attn import block_sparse_attention
    from vsagen.layout import tile_layout

    lines = []
    for vol, tile in TILES.items():
        lay = tile_layout(grid, tile)
        g = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(1, lay.num_tokens, heads, head_dim, generator=g) for _ in range(3))
        top_k = ref.top_k_from_sparsity(sparsity, lay.num_tiles)
        q2k = ref.select_top_k(ref.tile_scores(ref.tile_mean_pool(q, lay.token_tile, lay.tile_sizes),
                                               ref.tile_mean_pool(k, lay.token_tile, lay.tile_sizes)), top_k)
        cnt = torch.full(q2k.shape[:-1], top_k, dtype=torch.int32)
        bmap = block_map(q2k, cnt, lay)
        idx, num = mods[1].map_to_index(bmap)
        same = bool((decoded_mask(idx, num, block_sizes(lay)) == cube_mask(q2k, cnt, lay)).all())
        do = torch.randn(q.shape, generator=g)
        qr, kr, vr = (x.clone().requires_grad_(True) for x in (q, k, v))
        want, _ = ref.block_sparse_attention_reference(qr, kr, vr, q2k, lay.slots, lay.slot_valid)
        want.backward(do)
        errs = []
        emulated = (KernelEmulation, mods[1])
        engines = (("FastVideo Triton (interpreted)", lambda a, b, c: fastvideo_fine(mods, a, b, c, q2k, cnt, lay)),
                   ("FastVideo path, kernel emulated",
                    lambda a, b, c: fastvideo_fine(emulated, a, b, c, q2k, cnt, lay)),
                   ("vsagen", lambda a, b, c: block_sparse_attention(a, b, c, *kernel_lists(lay, q2k, cnt))[0]))
        for name, run in engines:
            xs = [x.to(dtype, copy=True).requires_grad_(True) for x in (q, k, v)]  # a fresh leaf per engine
            said = name
            try:
                out = run(*xs)
                said += f" fwd {rel_l2(out, want):.1e}"
                out.backward(do.to(dtype))
                said += " " + " ".join(f"{n} {rel_l2(x.grad, r.grad):.1e}" for n, x, r in
                                       zip(("dq", "dk", "dv"), xs, (qr, kr, vr)))
            except Exception as e:  # noqa: BLE001 - report what the interpreter refused, go on
                said += f" failed: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
            errs.append(said)
        lines.append(f"V={vol} {'x'.join(map(str, tile))} {lay.num_tiles} cubes K={top_k}: route A lists == cube "
                     f"mask: {same}; " + "; ".join(errs))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sdist", default=DEFAULT_SDIST, help="FastVideo 0.2.1's sdist (default: %(default)s)")
    ap.add_argument("--grid", default="5,6,10", help="post-patch latent grid T,H,W (default: %(default)s)")
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--sparsity", type=float, default=0.5)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16",
                    help="FastVideo's kernel casts P and dS to bf16: float32 inputs fail its dots' dtype check")
    ap.add_argument("--no-shim", action="store_true", help="load FastVideo's kernel unchanged (its dQ kernel then "
                    "fails under the interpreter)")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("error: the CPU check runs under the Triton interpreter: TRITON_INTERPRET=1", file=sys.stderr)
        return 2
    mods, why = load(args.sdist, interpreter_shim=not args.no_shim)
    if mods is None:
        print(f"error: {why}", file=sys.stderr)
        return 2
    mods[0]._attn_fwd_sparse.configs = mods[0]._attn_fwd_sparse.configs[:1]  # one config: no autotuning here
    grid = tuple(int(x) for x in args.grid.split(","))
    for line in check(mods, grid, args.heads, args.head_dim, args.sparsity, getattr(torch, args.dtype)):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
