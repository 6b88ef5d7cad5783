"""`--quant` resolved against the run's device and model, before anything loads: which precision the transformer
blocks' linears run in (`vsagen.quant`), or a one-line refusal where the device cannot run it."""

from __future__ import annotations

from ..errors import BadInput
from ..models.sources import ModelSource
from .options import Quant

QUANT_SUFFIX = "-quant"  # TurboDiffusion's presets whose transformer files hold int8 weights


def holds_int8_files(source: ModelSource, random_weights: bool) -> bool:
    """Whether the model's own transformer files are TurboDiffusion's int8 `-quant` ones (a `-quant` preset)."""
    return (source.preset.name.endswith(QUANT_SUFFIX) and source.preset.transformer_files is not None
            and not random_weights)


def resolve_quant(quant: Quant, device: str, source: ModelSource, random_weights: bool) -> tuple[str, tuple[str, ...]]:
    """The precision of the blocks' linears ("none" | "fp8" | "int8") and the notes the choice needs.

    "auto" is int8 for a `-quant` preset on a device that runs int8 (TurboDiffusion runs those files so), else
    none (a `-quant` preset then runs its weights dequantized, and says why).

    Raises:
        BadInput: fp8 or int8 asked for on a device without them (`fp8_unsupported`, `int8_unsupported`: one line
            naming the GPUs that have them).
    """
    if quant == Quant.NONE or (quant == Quant.AUTO and not holds_int8_files(source, random_weights)):
        return "none", ()  # (no torch import: the checks below read the device)
    from ..quant.fp8_linear import fp8_unsupported
    from ..quant.int8_linear import int8_unsupported

    if quant == Quant.FP8:
        problem = fp8_unsupported(device)
        if problem:
            raise BadInput(f"{problem}; use --quant none (or int8)")
        return "fp8", ()
    problem = int8_unsupported(device)  # int8 asked for, or auto for a -quant preset's files
    if problem is None:
        return "int8", ()
    if quant == Quant.INT8:
        raise BadInput(f"{problem}; use --quant none")
    return "none", (f"{source.preset.name}'s int8 weights are dequantized at load ({problem.split('; ')[0]})",)
