"""LoRA files for the tiny models in each format diffusers' Wan loader reads, written by the tests (`write_lora`),
and the float64 product each adds to one linear (`expected_delta`), from the formats' own definitions (W += scale *
alpha / rank * up @ down; no alpha: alpha = rank)."""

from __future__ import annotations

import torch
from safetensors.torch import save_file

# (original Wan name, diffusers name) of every linear a block's LoRA adapts
LINEARS = [*[(f"self_attn.{o}", f"attn1.{d}") for o, d in zip("qkvo", ("to_q", "to_k", "to_v", "to_out.0"))],
           *[(f"cross_attn.{o}", f"attn2.{d}") for o, d in zip("qkvo", ("to_q", "to_k", "to_v", "to_out.0"))],
           ("ffn.0", "ffn.net.0.proj"), ("ffn.2", "ffn.net.2")]
FORMATS = ("diffusers", "original", "kohya", "musubi")
ALPHA = 3.0  # the alpha of the formats that carry one (kohya, musubi): the product is scaled by ALPHA / rank


def _shape(transformer, diffusers_name: str) -> tuple[int, int]:
    linear = transformer.get_submodule(f"blocks.0.{diffusers_name}")
    return linear.out_features, linear.in_features


def write_lora(path, fmt: str, transformer, rank: int = 3, seed: int = 0, blocks: int | None = None) -> dict:
    """Write a LoRA on every block's attention and FFN linears of `transformer`'s architecture in format `fmt`:
    "diffusers" (PEFT keys under `transformer.`), "original" (Wan's names under `diffusion_model.`, lora_A /
    lora_B, no alpha), "kohya" (`lora_unet_` names, lora_down / lora_up, alphas: musubi-tuner's own files),
    "musubi" (musubi-tuner's converted for ComfyUI: Wan's names under `diffusion_model.`, lora_down / lora_up,
    alphas). Returns {(block, diffusers name): (down, up, alpha / rank)} in float64."""
    g = torch.Generator().manual_seed(seed)
    sd, factors = {}, {}
    for i in range(len(transformer.blocks) if blocks is None else blocks):
        for orig, diff in LINEARS:
            out_f, in_f = _shape(transformer, diff)
            down = torch.randn(rank, in_f, generator=g) * 0.2
            up = torch.randn(out_f, rank, generator=g) * 0.2
            has_alpha = fmt in ("kohya", "musubi")
            factors[(i, diff)] = (down.double(), up.double(), ALPHA / rank if has_alpha else 1.0)
            if fmt == "diffusers":
                stem, a, b = f"transformer.blocks.{i}.{diff}", "lora_A", "lora_B"
            elif fmt == "kohya":
                stem, a, b = f"lora_unet_blocks_{i}_{orig.replace('.', '_')}", "lora_down", "lora_up"
            else:
                stem = f"diffusion_model.blocks.{i}.{orig}"
                a, b = ("lora_A", "lora_B") if fmt == "original" else ("lora_down", "lora_up")
            sd[f"{stem}.{a}.weight"], sd[f"{stem}.{b}.weight"] = down.contiguous(), up.contiguous()
            if has_alpha:
                sd[f"{stem}.alpha"] = torch.tensor(ALPHA)
    save_file(sd, str(path))
    return factors


def expected_delta(factors: dict, block: int, name: str, scale: float) -> torch.Tensor:
    """The float64 product a LoRA adds to `blocks.<block>.<name>.weight` at `scale`."""
    down, up, s = factors[(block, name)]
    return scale * s * (up @ down)


def tiny_lora(folder, fmt: str = "diffusers", name: str = "l.safetensors"):
    """A LoRA of format `fmt` for the tiny transformer's architecture written into `folder`; its path."""
    from conftest import make_transformer

    write_lora(folder / name, fmt, make_transformer())
    return folder / name
