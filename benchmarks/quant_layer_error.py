"""Which of the Wan DiT's linears can go low-bit, by measured error (issue 46: "which layers stay bf16 chosen by
measured error"), on the CPU: a Wan2.1-1.3B-architecture transformer with diffusers' random initialisation, cut to
a few blocks, one forward on random latents and text embeddings, each layer group quantized alone (FP8 e4m3 row-wise,
emulated as `vsagen.quant.fp8_linear` does off the GPU; TurboDiffusion's int8 W8A8 with 128 x 128 blocks) and the
output's relative L2 distance to the float64 forward printed beside bf16's own distance. Also every block linear's
own FP8 output against its float64 output on the inputs it saw (the issue's per-layer bound: 5e-2).

Random weights are not trained ones (no outlier channels): the figures rank the groups, they do not predict a
trained checkpoint's error. Usage (4.5 minutes on 2 shared cores; the figures of 2026-12-07 are in
`vsagen/quant/swap.py`'s docstring):
    python benchmarks/quant_layer_error.py [--layers 2] [--tokens 512]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vsagen.quant.fp8_linear import Fp8Linear  # noqa: E402
from vsagen.quant.int8_linear import Int8Linear  # noqa: E402
from vsagen.quant.swap import LAYER_GROUPS, block_linears, put_modules  # noqa: E402

ARCH_1_3B = dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
                 text_dim=4096, freq_dim=256, ffn_dim=8960, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                 eps=1e-6, rope_max_seq_len=1024)


def outside_linears(t) -> list[tuple[str, nn.Linear]]:
    """The linears outside the blocks that can be swapped: the text embedder, the time projection (modulation) and
    the head. (Not the time embedder: diffusers' `WanTimeTextImageEmbedding.forward` reads the dtype of its first
    parameter, and a swapped one has none.)"""
    return [(n, m) for n, m in t.named_modules() if isinstance(m, nn.Linear) and not n.startswith("blocks.")
            and ".time_embedder." not in n]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=512, help="latent tokens (a square grid of 2 frames)")
    args = ap.parse_args()
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    t = WanTransformer3DModel(**ARCH_1_3B, num_layers=args.layers).eval()
    side = int((args.tokens // 2) ** 0.5) * 2  # latent height = width (patch 2): 2 frames x (side/2)^2 tokens
    x = dict(hidden_states=torch.randn(1, 16, 2, side, side), timestep=torch.tensor([700.0]),
             encoder_hidden_states=torch.randn(1, 512, 4096), return_dict=False)
    with torch.no_grad():
        ref = t.double()(**{k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v
                            for k, v in x.items()})[0]
        t.float()
        fp32 = t(**x)[0]
        bf16 = t.to(torch.bfloat16)(**{k: v.to(torch.bfloat16) if torch.is_tensor(v) and v.is_floating_point()
                                       else v for k, v in x.items()})[0]
        t.float()
    print(f"1.3B architecture, {args.layers} blocks, {2 * (side // 2) ** 2} tokens; output relative L2 to float64")
    print(f"{'what':48} {'fp8':>9} {'int8':>9}")
    print(f"{'(float32 forward)':48} {rel(fp32, ref):9.2e}")
    print(f"{'(bf16 forward)':48} {rel(bf16, ref):9.2e}")
    groups = {**{g: lambda g=g: block_linears(t, [g]) for g in LAYER_GROUPS},
              "all block linears": lambda: block_linears(t),
              "text embedder + time (modulation) projection": lambda: [p for p in outside_linears(t) if p[0] != "proj_out"],
              "head (proj_out)": lambda: [p for p in outside_linears(t) if p[0] == "proj_out"]}
    for name, pick in groups.items():
        errs = []
        for cls in (Fp8Linear, Int8Linear):
            originals = dict(pick())
            put_modules(t, {n: cls.from_linear(m) for n, m in originals.items()})
            with torch.no_grad():
                errs.append(rel(t(**x)[0], ref))
            put_modules(t, originals)
        print(f"{name:48} {errs[0]:9.2e} {errs[1]:9.2e}")
    per_layer(t, x)


def per_layer(t, x) -> None:
    """Every block linear's FP8 output against its float64 output on the input it saw in the float32 forward."""
    seen: dict[str, torch.Tensor] = {}
    hooks = [m.register_forward_hook(lambda m, a, o, n=n: seen.__setitem__(n, a[0].detach()))
             for n, m in block_linears(t)]
    with torch.no_grad():
        t(**x)
    for h in hooks:
        h.remove()
    worst = []
    for n, m in block_linears(t):
        want = nn.functional.linear(seen[n].double(), m.weight.double(), m.bias.double())
        with torch.no_grad():
            worst.append((rel(Fp8Linear.from_linear(m)(seen[n]), want), rel(Int8Linear.from_linear(m)(seen[n]), want),
                          n))
    worst.sort(reverse=True)
    print(f"\nper block linear, its output's relative L2 to float64 (worst 5 of {len(worst)} by fp8):")
    for e8, e_int, n in worst[:5]:
        print(f"{n:48} {e8:9.2e} {e_int:9.2e}")
    print(f"every block linear's fp8 error below 5e-2: {all(e < 5e-2 for e, _, _ in worst)}")


if __name__ == "__main__":
    main()
