"""Which linears of a diffusers `WanTransformer3DModel` run in low precision, and the swap that puts
`Int8Linear` / `Fp8Linear` in their place.

The layers: inside each transformer block, the self-attention's q / k / v / output projections (`attn1.to_q`,
`to_k`, `to_v`, `to_qkv` where fused, `to_out.0`), the cross-attention's (`attn2.*`, with the image projections
`add_k_proj` / `add_v_proj` of the I2V models) and the FFN's two linears (`ffn.net.0.proj`, `ffn.net.2`): the
linears TurboDiffusion's `replace_linear_norm` quantizes (every `nn.Linear` in `model.blocks` but SLA's `proj_l`,
`turbodiffusion/inference/modify_model.py:64-67`), named as diffusers names them; FP8 keeps the cross-attention's
text / image k / v projections (`FP8_KEPT`). Everything else stays in the run's
dtype: the patch embedding, the time / text / image embedders, the time projection that makes the modulation, the
blocks' modulation tables and norms, the head (`proj_out`), and any module an attention backend attached (SLA's
`proj_l`). These layers hold nearly all of the DiT's GEMM FLOPs (Wan2.1-1.3B at 32,760 tokens: 30 blocks x (6 x 1536 +
2 x 8960) x 1536 multiply-adds per token against 2 x 64 x 1536 for the patch embedding and the head, 99.98%).

Measured (`benchmarks/quant_layer_error.py` on the CPU, 2026-12-07: the 1.3B architecture cut to 2 blocks, diffusers'
random initialisation, 512 tokens; FP8 emulated, one group low-bit at a time, the rest float32), the output's
relative L2 distance to the float64 forward, fp8 / int8: self-attention 2.2e-3 / 2.2e-3, cross-attention
3.7e-3 / 2.3e-3, FFN 2.5e-3 / 2.2e-3, every block linear 3.9e-3 / 2.3e-3, against 5.8e-3 for the whole forward in
bf16. The head alone: 3.7e-2 / 1.1e-2 (its error reaches the output with no residual stream to dilute it), so it
stays in the run's dtype; the text embedder and the modulation projection 2.8e-3 / 2.2e-3 for a negligible share of
the FLOPs (kept; diffusers' time embedder also reads its first parameter's dtype, which a swapped linear lacks).
Every block linear's own FP8 output within 3.7e-2 of float64 (int8: 1.6e-2). Random weights have no trained
outlier channels: these figures rank the groups, they do not predict a trained checkpoint's error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from torch import nn

from ..architecture import experts

from .fp8_ffn import fuse_fp8_ffns
from .fp8_linear import Fp8Linear
from .int8_linear import Int8Linear
from .lowbit import LowBitLinear, SharedInput

PRECISIONS = ("none", "fp8", "int8")
# group -> the names inside one block (diffusers' WanTransformerBlock)
LAYER_GROUPS = {
    "self_attn": ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_qkv", "attn1.to_out.0"),
    "cross_attn": ("attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_kv", "attn2.to_out.0", "attn2.add_k_proj",
                   "attn2.add_v_proj"),
    "ffn": ("ffn.net.0.proj", "ffn.net.2"),
}
# Under FP8, the cross-attention's projections of the text (and I2V image) tokens stay in the run's dtype: their
# rows are the prompt's 512 tokens (257 image tokens), a negligible share of the FLOPs (2 x 512 x 1536^2 multiply-adds
# a block against 32,760 x 13,184 x 1536 for the 1.3B's other linears: 0.3%), where the activation quantizer's
# launch and pass cost more than the GEMM saves: on an H100 at 512x1536x1536, bf16 0.011 ms, FP8 0.056 / 0.077 ms
# (to_k / to_v; BENCHMARKS.md 2026-12-07 evening, `quant_layers_gpu.py`). int8 keeps them low-bit: TurboDiffusion
# quantizes every block linear, and their `-quant` files hold them as int8.
FP8_KEPT = {"attn2.to_k", "attn2.to_v", "attn2.to_kv", "attn2.add_k_proj", "attn2.add_v_proj"}
FP8_KEPT_WHY = "text / image tokens: FP8's quantizer costs more than it saves at a few hundred rows"
# The projections that read one activation: quantized once for all of them (`SharedInput`).
SHARED_INPUTS = (("attn1.to_q", "attn1.to_k", "attn1.to_v"), ("attn2.to_k", "attn2.to_v"),
                 ("attn2.add_k_proj", "attn2.add_v_proj"))


@dataclass
class SwapReport:
    """What `quantize_transformer` did: the linears swapped (block-qualified names, diffusers' naming) and those
    left in the run's dtype with the reason."""
    precision: str
    swapped: list[str] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)
    already: list[str] = field(default_factory=list)  # low-bit before the swap (a `-quant` file's int8 linears)

    def note(self) -> str:
        """One line for the run's notes."""
        what = {"fp8": "FP8 e4m3 W8A8 (row-wise scales)", "int8": "int8 W8A8 (128x128 block scales)"}
        n = len(self.swapped) + len(self.already)
        text = f"{n} block linears run as {what.get(self.precision, self.precision)}"
        if self.already:
            text += f" ({len(self.already)} as loaded)"
        reasons: dict[str, list[str]] = {}
        for name, why in self.kept:
            reasons.setdefault(why, []).append(name)
        for why, names in reasons.items():
            text += f"; {len(names)} kept in the run's dtype (e.g. {names[0]}: {why})"
        return text


def block_linears(transformer: Any, groups: Iterable[str] = tuple(LAYER_GROUPS),
                  kind: type = nn.Linear) -> list[tuple[str, Any]]:
    """The modules of type `kind` (`nn.Linear`; `LowBitLinear`: those already swapped) of `transformer.blocks` in
    `groups` (LAYER_GROUPS), as (name from the transformer, module), block by block. Raises ValueError for an
    unknown group."""
    unknown = sorted(set(groups) - set(LAYER_GROUPS))
    if unknown:
        raise ValueError(f"unknown layer group(s) {unknown}; known: {sorted(LAYER_GROUPS)}")
    names = [n for g in groups for n in LAYER_GROUPS[g]]
    out = []
    for i, block in enumerate(transformer.blocks):
        for name in names:
            module = block.get_submodule(name) if _has(block, name) else None
            if isinstance(module, kind):
                out.append((f"blocks.{i}.{name}", module))
    return out


def _has(module: nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
    except AttributeError:
        return False
    return True


def fp8_shape_problem(linear: nn.Linear) -> str | None:
    """Why `torch._scaled_mm` cannot take this linear (K and N multiples of 16), or None."""
    if linear.in_features % 16 or linear.out_features % 16:
        return f"{linear.in_features} -> {linear.out_features} is not a multiple of 16 (torch._scaled_mm)"
    return None


def install_int8(transformer: Any, codes: dict[str, tuple[Any, Any]]) -> list[str]:
    """Replace, in place, each linear named in `codes` (diffusers' name from the transformer, e.g.
    `blocks.0.attn1.to_q`) by an `Int8Linear` holding its (int8 weight, block scales) as given (a `-quant` file's),
    with the linear's bias, on the linear's device. Returns the names.

    Raises:
        ValueError: a name that is not an `nn.Linear` of the transformer, or codes of another shape than its weight.
    """
    for name, (q, scale) in codes.items():
        linear = transformer.get_submodule(name) if _has(transformer, name) else None
        if not isinstance(linear, nn.Linear) or tuple(q.shape) != tuple(linear.weight.shape):
            raise ValueError(f"{name}: no linear of weight shape {tuple(q.shape)} in the transformer")
        bias = None if linear.bias is None else linear.bias.detach()
        device = linear.weight.device
        put_modules(transformer, {name: Int8Linear(q.to(device), scale.to(device), bias)})
    return list(codes)


def share_inputs(transformer: Any) -> int:
    """Give each group of `SHARED_INPUTS` in every block one `SharedInput` where all its linears are low-bit of one
    class (and clear it from those where they are not, e.g. after `compare --quant` put bf16 layers back), so the
    activation they all read is quantized once. Returns the number of groups sharing."""
    n = 0
    for block in transformer.blocks:
        for names in SHARED_INPUTS:
            mods = [block.get_submodule(name) if _has(block, name) else None for name in names]
            low = [m for m in mods if isinstance(m, LowBitLinear)]
            same = len(low) == len(names) and len({type(m) for m in low}) == 1
            shared = SharedInput(len(names)) if same else None
            for m in low:
                m.shared_input = shared
            n += same
    return n


def put_modules(transformer: Any, modules: dict[str, nn.Module]) -> None:
    """Set each named submodule of `transformer` (`blocks.0.attn1.to_q`) to the given module, in place: the swap's
    undo with the linears it replaced."""
    for name, module in modules.items():
        parent_name, _, leaf = name.rpartition(".")
        transformer.get_submodule(parent_name).register_module(leaf, module)


def dequantized_linear(module: LowBitLinear, dtype: Any) -> nn.Linear:
    """The `nn.Linear` in `dtype` a low-bit linear stands for, on its device: the weight its codes and scales give,
    computed in float64 and cast once to `dtype` (for a `-quant` file's int8 linear, the weight loading that file
    without `--quant int8` gives: `vsagen.models.transformer_files.dequantize`), its bias as it is (cast to `dtype`)."""
    import torch

    codes = getattr(module, module.kept[0])
    linear = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None, device=codes.device,
                       dtype=dtype)
    with torch.no_grad():
        linear.weight.copy_(module.dequantized_weight(torch.float64).to(dtype))
        if module.bias is not None:
            linear.bias.copy_(module.bias)
    return linear


def quantize_transformer(transformer: Any, precision: str, groups: Iterable[str] = tuple(LAYER_GROUPS)) -> SwapReport:
    """Replace, in place, the block linears of `groups` by low-precision ones built from their weights
    (`Int8Linear.from_linear` / `Fp8Linear.from_linear`) on each linear's own device.

    Args:
        transformer: a diffusers WanTransformer3DModel (anything with `.blocks` of WanTransformerBlock).
        precision: "fp8" or "int8" ("none" changes nothing).

    Returns:
        SwapReport: the names swapped, and those kept with the reason (FP8: the text / image projections
        `FP8_KEPT`, and `torch._scaled_mm`'s shape rule). The q / k / v projections (and the text k / v under int8)
        then quantize their common input once (`share_inputs`).

    Raises:
        ValueError: an unknown precision or group.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; known: {', '.join(PRECISIONS)}")
    report = SwapReport(precision)
    if precision == "none":
        return report
    report.already = [name for name, _ in block_linears(transformer, groups, LowBitLinear)]
    build: Callable[[nn.Linear], nn.Module] = Fp8Linear.from_linear if precision == "fp8" else Int8Linear.from_linear
    for name, linear in block_linears(transformer, groups):
        problem = None
        if precision == "fp8":
            problem = FP8_KEPT_WHY if name.split(".", 2)[2] in FP8_KEPT else fp8_shape_problem(linear)
        if problem:
            report.kept.append((name, problem))
            continue
        put_modules(transformer, {name: build(linear)})
        report.swapped.append(name)
    share_inputs(transformer)
    if precision == "fp8":
        fuse_fp8_ffns(transformer)  # (eager CUDA runs: the GELU inside the second linear's quantizer)
    return report


def precision_summary(transformer: Any) -> dict[str, int]:
    """How many of the transformer's block linears (LAYER_GROUPS) run in each precision: {"int8": n, "fp8": n,
    "dtype": n} (dtype: the run's own), for the run's JSON."""
    out = {"int8": 0, "fp8": 0, "dtype": 0}
    for _, module in block_linears(transformer, kind=(nn.Linear, LowBitLinear)):
        key = "int8" if isinstance(module, Int8Linear) else "fp8" if isinstance(module, Fp8Linear) else "dtype"
        out[key] += 1
    return out


def quantize_pipeline(pipe: Any, quant: str) -> list[str]:
    """`--quant fp8|int8` on a loaded pipeline: every transformer's block linears swapped (`quantize_transformer`;
    those already int8 from a `-quant` file kept as loaded). Returns the run notes (none for "none")."""
    if quant == "none":
        return []
    return [f"--quant {quant}: {name}: {quantize_transformer(t, quant).note()}" for name, t in experts(pipe)]
