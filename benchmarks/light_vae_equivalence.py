"""vsagen's light VAE decoder against HummingbirdXT's own `AutoencoderKLTurboVAED`, run from their file as data
(issue 32 item 4).

Their module, `infer/examples/wan2.2/autoencoder_kl_turbo_vaed_ours_wan22.py` of AMD-AGI/HummingbirdXT @63b54d1, is
read from a path (`--source`) or from a git directory holding that commit (`--git-dir`, e.g. the snapshot `fetch`
brings), and loaded with a stand-in for its one non-diffusers import (`timm.models.vision_transformer.Mlp`, used only
by training-time heads); diffusers is vsagen's own dependency. Both decoders get the same random weights (theirs
randomized, copied into vsagen's by name: the keys must match one to one) and decode the same random latents:

1. the decoder alone (`forward`), 2. their run scripts' decode (windows of 16 frames every 12), 3. spatial tiles:
relative L2 of the frames (target <= 1e-3 in float32);
4. on CUDA: times (median of `vsagen.bench.bench_ms`) of theirs, vsagen's, and the stock diffusers Wan2.2 VAE decode
(`AutoencoderKLWan` with the wan2.2-ti2v-5b preset's architecture, random weights) on the same latents.

    python benchmarks/light_vae_equivalence.py --git-dir /work/.mirror/AMD-AGI+HummingbirdXT/repo \\
        [--arch tiny|hummingbird] [--shape small|704p] [--dtype fp32|bf16]

`--arch hummingbird` is the hummingbird-xt preset's assumed architecture (their config.json is not public in the code
repository); `tiny` the tiny-ti2v preset's. `704p` is the latent of 704x1280x121 (1, 48, 31, 44, 80).
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import torch
from peer_dmd import load_module, peer_file  # benchmarks/ is on the path when this script runs

from vsagen.bench import bench_ms, rel_l2
from vsagen.decode.light_decoder import LightVaeConfig, LightVaeDecoder
from vsagen.models.presets import load_preset

COMMIT = "63b54d1ab3433ab6752660e835a81769a2598298"
FILE = "infer/examples/wan2.2/autoencoder_kl_turbo_vaed_ours_wan22.py"
SHAPES = {"small": (5, 4, 6), "704p": (31, 44, 80)}  # latent (T, h, w)
ARCHS = {"tiny": "tiny-ti2v", "hummingbird": "hummingbird-xt"}


def their_module(args: argparse.Namespace) -> types.ModuleType:
    """Their file, loaded with a stand-in for timm's Mlp."""
    path = peer_file(args.source, args.git_dir, COMMIT, FILE)
    # Their file's diffusers imports resolve before the stand-in exists: diffusers' lazy modules probe for timm with
    # importlib.util.find_spec, which raises on a module without __spec__ (the 2026-12-05 H200 run stopped there).
    import diffusers.loaders  # noqa: F401
    import diffusers.models.autoencoders.autoencoder_kl_wan  # noqa: F401
    import diffusers.models.embeddings  # noqa: F401
    import diffusers.models.normalization  # noqa: F401
    from importlib.machinery import ModuleSpec

    for pkg in ("timm", "timm.models"):
        stand_in = sys.modules.setdefault(pkg, types.ModuleType(pkg))
        stand_in.__path__, stand_in.__spec__ = [], ModuleSpec(pkg, None, is_package=True)
    vit = types.ModuleType("timm.models.vision_transformer")
    vit.Mlp = type("Mlp", (torch.nn.Module,), {})
    sys.modules.setdefault(vit.__name__, vit)
    return load_module("turbo_vaed_theirs", path)


def pair(mod: types.ModuleType, config: dict, seed: int) -> tuple[torch.nn.Module, LightVaeDecoder]:
    """Theirs (random weights, every parameter) and vsagen's with the same weights, float32 CPU, eval."""
    theirs = mod.AutoencoderKLTurboVAED(**config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in theirs.decoder.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    ours = LightVaeDecoder(LightVaeConfig.from_dict(config, "benchmark")).eval()
    ours.load_state_dict(theirs.decoder.state_dict(), strict=True)  # the same tensor names, one to one
    return theirs, ours


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", help="their autoencoder_kl_turbo_vaed_ours_wan22.py")
    ap.add_argument("--git-dir", default="/work/.mirror/AMD-AGI+HummingbirdXT/repo")
    ap.add_argument("--arch", choices=sorted(ARCHS), default="tiny")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="small")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    config = load_preset(ARCHS[args.arch]).light_vae.config
    theirs, ours = pair(their_module(args), config, args.seed)
    theirs, ours = theirs.to(device, dtype), ours.to(device, dtype)
    t, h, w = SHAPES[args.shape]
    z = torch.randn(1, config["latent_channels"], t, h, w, generator=torch.Generator().manual_seed(args.seed + 1))
    z = z.to(device, dtype)
    print(f"{args.arch} decoder ({sum(p.numel() for p in ours.parameters()) / 1e6:.2f} M parameters), latent "
          f"{tuple(z.shape)}, {args.dtype} on {device}; their file {args.source or COMMIT[:7] + ':' + FILE}")
    with torch.no_grad():
        a, b = ours(z), theirs.decoder(z)
        print(f"decoder: frames {tuple(a.shape)}, rel L2 {rel_l2(a, b):.3e}")
        theirs.use_framewise_decoding = True
        theirs.tile_sample_min_num_frames, theirs.tile_sample_stride_num_frames = 16, 12
        ours.set_temporal_tiling(16, 12)
        a, b = ours.decode(z), theirs.decode(z, return_dict=False)[0]
        print(f"decode, windows of 16 frames every 12: frames {tuple(a.shape)}, rel L2 {rel_l2(a, b):.3e}")
        theirs.use_framewise_decoding, theirs.use_tiling = False, True
        ours.set_temporal_tiling(None)
        ours.use_tiling = True
        for m in (theirs, ours):  # tiles small enough to split the small shape too
            m.tile_sample_min_height = m.tile_sample_min_width = 64
            m.tile_sample_stride_height = m.tile_sample_stride_width = 48
        a, b = ours.decode(z), theirs.decode(z, return_dict=False)[0]
        print(f"decode, spatial tiles of 64 px every 48: frames {tuple(a.shape)}, rel L2 {rel_l2(a, b):.3e}")
    if device != "cuda":
        print("times: CUDA only")
        return
    from diffusers import AutoencoderKLWan

    stock = AutoencoderKLWan(**load_preset("wan2.2-ti2v-5b").vae).to(device, dtype).eval()
    theirs.use_tiling = ours.use_tiling = False
    theirs.use_framewise_decoding = True
    ours.set_temporal_tiling(16, 12)
    with torch.no_grad():
        for name, fn in [("theirs (windows 16/12)", lambda: theirs.decode(z, return_dict=False)),
                         ("vsagen light (windows 16/12)", lambda: ours.decode(z)),
                         ("stock AutoencoderKLWan decode", lambda: stock.decode(z, return_dict=False))]:
            torch.cuda.reset_peak_memory_stats()
            ms = bench_ms(fn, device=device, warmup_ms=1, rep_ms=1, min_reps=3)
            print(f"{name}: {ms / 1e3:.3f} s, peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
