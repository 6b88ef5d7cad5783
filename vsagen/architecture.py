"""The architecture of a Wan transformer as attention backends and pattern files compare it: a small dict read from a
loaded diffusers `WanTransformer3DModel`, or from its constructor kwargs before anything is loaded; and a Wan
pipeline's transformers by component name (`experts`)."""

from __future__ import annotations

from typing import Any, Mapping

ARCH_FIELDS = ("layers", "heads", "head_dim", "in_channels", "ffn_dim", "patch_size")


def architecture_of(transformer: Any) -> dict[str, Any]:
    """The architecture of a diffusers `WanTransformer3DModel`, read from its config and its first block's `attn1`:
    {"layers", "heads", "head_dim", "in_channels", "ffn_dim", "patch_size"} (`ARCH_FIELDS`)."""
    cfg = getattr(transformer, "config", None)
    attn = transformer.blocks[0].attn1
    heads = int(getattr(attn, "heads", getattr(cfg, "num_attention_heads", 0)))
    inner = attn.to_q.weight.shape[0] if hasattr(attn, "to_q") else attn.inner_dim
    return {"layers": len(transformer.blocks), "heads": heads, "head_dim": int(inner) // max(heads, 1),
            "in_channels": int(getattr(cfg, "in_channels", 0) or 0), "ffn_dim": int(getattr(cfg, "ffn_dim", 0) or 0),
            "patch_size": [int(p) for p in getattr(cfg, "patch_size", (1, 2, 2))]}


# diffusers' `WanTransformer3DModel` constructor defaults of the fields `architecture_from_config` reads (diffusers
# 0.42.1), for configs that leave one out.
CONFIG_DEFAULTS = {"num_layers": 40, "num_attention_heads": 40, "attention_head_dim": 128, "in_channels": 16,
                   "ffn_dim": 13824, "patch_size": (1, 2, 2)}


def architecture_from_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """`architecture_of` a transformer not built yet, from its constructor kwargs (a checkpoint's
    `transformer/config.json`, a preset's [transformer] table; a missing field takes diffusers' default,
    `CONFIG_DEFAULTS`): the same dict, no weights read."""
    c = {**CONFIG_DEFAULTS, **{k: v for k, v in config.items() if v is not None}}
    return {"layers": int(c["num_layers"]), "heads": int(c["num_attention_heads"]),
            "head_dim": int(c["attention_head_dim"]), "in_channels": int(c["in_channels"]),
            "ffn_dim": int(c["ffn_dim"]), "patch_size": [int(p) for p in c["patch_size"]]}


def experts(pipe: Any) -> list[tuple[str, Any]]:
    """The pipeline's transformers by component name: [("transformer", t)] or, for two-expert (A14B-style)
    pipelines, also ("transformer_2", t2)."""
    return [(n, t) for n in ("transformer", "transformer_2") if (t := getattr(pipe, n, None)) is not None]
