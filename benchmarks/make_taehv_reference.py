"""Write tests/data/taehv_reference.npz: madebyollin's TAEHV decoder run on fixed random latents with deterministic
random weights, the reference that tests/decode/test_tiny_decoder.py holds vsagen's decoder to (issue 45).

Their module is data here, never part of vsagen: its `taehv.py` is read from a path (`--source`) or from a git
directory holding the commit below (`--git-dir`, e.g. the snapshot the `fetch` tool brings), and loaded as a module
for this run only. Both decoders get the same weights by one rule (`seeded_tensor`, which the test imports from this
file): every tensor drawn from its own generator, seeded by the SHA-256 of its key, at a scale that keeps the
activations O(1). Cases: the published architectures (`taew2_1`: 16 latent channels, patch 1; `taew2_2`: 48
channels, patch 2; widths 256, 128, 64, 64), odd latent frame counts and a batch of two, small latents.

    python benchmarks/make_taehv_reference.py --git-dir /work/.mirror/madebyollin+taehv/repo

The frames are their `decode_video(..., parallel=True)`, checked here against their sequential path (the two must
agree to 1e-5) and their `StreamingTAEHV` frame count.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
import types
from pathlib import Path

import numpy as np
import torch

COMMIT = "1f14a568f24bf8811e0a0ac601613e04fc1581e8"
OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "taehv_reference.npz"
# name -> (latent channels, patch, batch, latent frames, h, w)
CASES = {"taew2_1_t5": (16, 1, 1, 5, 3, 4), "taew2_1_t1": (16, 1, 1, 1, 3, 4), "taew2_1_b2_t3": (16, 1, 2, 3, 2, 2),
         "taew2_2_t3": (48, 2, 1, 3, 2, 3)}
OUTPUT_BIAS = "decoder.22.bias"  # the last conv's bias: 0.5 added, so most pixels fall inside [0, 1] (not clamped)
RULE = ("each tensor of key K: torch.randn(shape, generator=torch.Generator().manual_seed(int.from_bytes("
        "sha256(K).digest()[:7], 'little'))), times 1 / sqrt(fan_in) for weights (fan_in = prod(shape[1:])), 0.1 "
        f"for biases; {OUTPUT_BIAS} + 0.5. Latents: torch.randn with manual_seed(1000 + case index).")


def seeded_tensor(key: str, shape: tuple[int, ...]) -> torch.Tensor:
    """The reference weight of `key` (`RULE`), float32."""
    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:7], "little")
    t = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    if len(shape) > 1:
        return t / math.sqrt(math.prod(shape[1:]))
    return t * 0.1 + (0.5 if key == OUTPUT_BIAS else 0.0)


def seeded_state(shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """{key: `seeded_tensor(key, shape)`} of a module's state dict shapes."""
    return {k: seeded_tensor(k, s) for k, s in shapes.items()}


def case_latents(index: int, channels: int, batch: int, frames: int, h: int, w: int) -> torch.Tensor:
    """The latents of case `index`, (batch, channels, frames, h, w) float32 (diffusers' order)."""
    return torch.randn(batch, channels, frames, h, w, generator=torch.Generator().manual_seed(1000 + index))


def their_module(args: argparse.Namespace) -> types.ModuleType:
    """Their taehv.py as a module of this run."""
    from peer_dmd import load_module, peer_file  # benchmarks/ is on the path when this script runs (the test imports
    # this file for its weight rule alone)

    return load_module("their_taehv", peer_file(args.source, args.git_dir, COMMIT, "taehv.py"))


def run_case(m: types.ModuleType, index: int, case: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(latents (B, C, T, h, w), their frames (B, 3, F, H, W) in [0, 1]) of one case, float32."""
    channels, patch, batch, frames, h, w = case
    theirs = m.TAEHV(checkpoint_path=None, patch_size=patch, latent_channels=channels).eval()
    theirs.load_state_dict(seeded_state({k: tuple(v.shape) for k, v in theirs.state_dict().items()}))
    z = case_latents(index, channels, batch, frames, h, w)
    with torch.no_grad():
        out = theirs.decode_video(z.transpose(1, 2), parallel=True, show_progress_bar=False)
        sequential = theirs.decode_video(z.transpose(1, 2), parallel=False, show_progress_bar=False)
        streaming = m.StreamingTAEHV(theirs)
        streamed = [f for t in range(frames) for f in [streaming.decode(z[:, :, t:t + 1].transpose(1, 2))]
                    if f is not None] + streaming.flush_decoder()
    torch.testing.assert_close(sequential, out, rtol=1e-5, atol=1e-5)
    assert len(streamed) == out.shape[1] == 4 * frames - 3, (len(streamed), out.shape)
    return z.numpy(), out.transpose(1, 2).contiguous().numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--source", help="their taehv.py")
    where.add_argument("--git-dir", help=f"a git directory holding madebyollin/taehv @{COMMIT[:7]}")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    m = their_module(args)
    arrays: dict[str, np.ndarray] = {"rule": np.array(RULE), "commit": np.array(COMMIT)}
    for index, (name, case) in enumerate(CASES.items()):
        latents, frames = run_case(m, index, case)
        arrays[f"{name}/latents"], arrays[f"{name}/frames"] = latents, frames
        inside = float(((frames > 0) & (frames < 1)).mean())
        print(f"{name}: latents {latents.shape} -> frames {frames.shape}, {100 * inside:.0f}% of pixels inside (0, 1)")
    np.savez_compressed(args.out, **arrays)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    sys.exit(main())
