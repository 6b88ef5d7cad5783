"""Write a random LoRA for a preset's architecture (not a test; `benchmarks/lora_gpu.sh` times what it costs): the
original Wan keys (`diffusion_model.blocks.N.self_attn.q.lora_down.weight`, `lora_up`, `alpha`) on every block's
self- and cross-attention and FFN linears, rank `--rank`, alpha = rank, factors N(0, 0.02^2) in bf16.

Usage: python benchmarks/lora_file.py PRESET OUT.safetensors [--rank 64]
"""

from __future__ import annotations

import argparse

import torch
from safetensors.torch import save_file

from vsagen.models.presets import load_preset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset")
    parser.add_argument("out")
    parser.add_argument("--rank", type=int, default=64)
    args = parser.parse_args()
    arch = load_preset(args.preset).transformer
    dim = arch["num_attention_heads"] * arch["attention_head_dim"]
    shapes = {**{f"self_attn.{o}": (dim, dim) for o in "qkvo"}, **{f"cross_attn.{o}": (dim, dim) for o in "qkvo"},
              "ffn.0": (arch["ffn_dim"], dim), "ffn.2": (dim, arch["ffn_dim"])}
    g = torch.Generator().manual_seed(0)
    lora = {}
    for i in range(arch["num_layers"]):
        for name, (out_f, in_f) in shapes.items():
            stem = f"diffusion_model.blocks.{i}.{name}"
            lora[f"{stem}.lora_down.weight"] = (torch.randn(args.rank, in_f, generator=g) * 0.02).bfloat16()
            lora[f"{stem}.lora_up.weight"] = (torch.randn(out_f, args.rank, generator=g) * 0.02).bfloat16()
            lora[f"{stem}.alpha"] = torch.tensor(float(args.rank))
    save_file(lora, args.out)
    print(f"wrote {args.out}: {len(lora)} tensors, rank {args.rank}, {arch['num_layers']} blocks of {dim}")


if __name__ == "__main__":
    main()
