"""`--lora` resolved against the model and `--quant`, before anything loads: each LoRA's expert (every expert of
the model where not given), its file's header checked (`vsagen.models.lora_spec.lora_format`), and the
combinations that cannot run refused in one line."""

from __future__ import annotations

from pathlib import Path

from ..errors import BadInput
from ..models.lora_spec import LoraSpec, lora_format
from ..models.sources import ModelSource
from .quantization import holds_int8_files


def resolve_loras(loras: tuple[LoraSpec, ...], source: ModelSource, model: str, quant: str,
                  random_weights: bool, several: bool = False) -> tuple[LoraSpec, ...]:
    """The LoRAs with their experts resolved ("1" on a one-expert model, "both" on a two-expert one where not
    given), local files' headers checked against the model's block count (a preset that describes the model).
    `several`: the command runs a row per scale of one LoRA's `scale=S1,S2,...` (`vsagen compare`).

    Raises:
        BadInput: a list of scales where the command runs one, or on more than one LoRA;
            expert 2 (or both) on a one-expert model, an unfused LoRA with low-bit linears (`--quant` swaps
            the linears the PEFT layers wrap: fuse it), any LoRA on a `-quant` preset's int8 weights (they cannot
            take a fused product), a damaged file or one of no known format or of a larger model.
    """
    experts = source.preset.experts
    layers = source.preset.transformer.get("num_layers") if source.exact_preset else None
    out = []
    listed = [spec for spec in loras if spec.scales]
    if listed and not several:
        raise BadInput(f"--lora {listed[0].text()}: one scale per run; vsagen compare runs a row per scale")
    if len(listed) > 1:
        raise BadInput(f"--lora {listed[1].text()}: rows over the scales of one LoRA (--lora "
                       f"{listed[0].source} lists some already); give the other LoRAs one scale")
    for spec in loras:
        where = f"--lora {spec.source}"
        if spec.expert in ("2", "both") and experts < 2:
            raise BadInput(f"{where}: expert={spec.expert} names transformer_2, and --model {model} has one "
                           "transformer; leave expert out (or expert=1)")
        if not spec.fused and quant != "none":
            raise BadInput(f"{where}:fused=false keeps PEFT layers around the linears that --quant {quant} swaps "
                           "for low-bit ones; fuse it (leave fused out) or use --quant none")
        if quant == "int8" and holds_int8_files(source, random_weights):
            raise BadInput(f"{where}: {source.preset.name}'s transformer weights are int8 and take no LoRA; use "
                           "--quant none (they are dequantized at load, then the LoRA is fused) or the preset "
                           "without -quant")
        if spec.local:
            lora_format(Path(spec.source), where, layers)
        expert = spec.expert or ("both" if experts > 1 else "1")
        out.append(LoraSpec(spec.source, spec.scale, expert, spec.fused, spec.scales))
    return tuple(out)
