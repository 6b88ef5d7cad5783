"""`--quant` resolved against the run's device and model, before anything loads: which precision the transformer
blocks' linears run in (`vsagen.quant`), or a one-line refusal where the device cannot run it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import BadInput
from ..models.sources import ModelSource

QUANT_SUFFIX = "-quant"  # TurboDiffusion's presets whose transformer files hold int8 weights


def holds_int8_files(source: ModelSource, random_weights: bool) -> bool:
    """Whether the model's own transformer files are TurboDiffusion's int8 `-quant` ones (a `-quant` preset)."""
    return (source.preset.name.endswith(QUANT_SUFFIX) and source.preset.transformer_files is not None
            and not random_weights)


def resolve_quant(quant: str, device: str, source: ModelSource, random_weights: bool) -> tuple[str, tuple[str, ...]]:
    """The precision of the blocks' linears ("none" | "fp8" | "int8") and the notes the choice needs.

    "auto" is int8 for a `-quant` preset on a device that runs int8 (TurboDiffusion runs those files so), else
    none (a `-quant` preset then runs its weights dequantized, and says why).

    Raises:
        BadInput: fp8 or int8 asked for on a device without them (`fp8_unsupported`, `int8_unsupported`: one line
            naming the GPUs that have them).
    """
    if quant == "none" or (quant == "auto" and not holds_int8_files(source, random_weights)):
        return "none", ()  # (no torch import: the checks below read the device)
    from ..quant.fp8_linear import fp8_unsupported
    from ..quant.int8_linear import int8_unsupported

    if quant == "fp8":
        problem = fp8_unsupported(device)
        if problem:
            raise BadInput(f"{problem}; use --quant none (or int8)")
        return "fp8", ()
    problem = int8_unsupported(device)  # int8 asked for, or auto for a -quant preset's files
    if problem is None:
        return "int8", ()
    if quant == "int8":
        raise BadInput(f"{problem}; use --quant none")
    return "none", (f"{source.preset.name}'s int8 weights are dequantized at load ({problem.split('; ')[0]})",)


QUANT_LIST_EXAMPLE = "none,int8 or none,fp8,int8"


@dataclass(frozen=True)
class QuantList:
    """`--quant` as parsed once (`vsagen.request.options.PlacementOptions`): the text as given and one `Quant` per comma-separated entry, in
    order. Whether a list is taken is the command's (`one`: t2v, i2v, profile, serve; `several`: `vsagen compare`,
    whose first entry is the reference precision)."""

    text: str
    values: tuple[Any, ...]  # `vsagen.request.options.Quant` members (str-valued: "auto", "none", "fp8", "int8")

    def one(self) -> Any:
        """The precision of a command that runs one.

        Raises:
            BadInput: a list (one line naming `vsagen compare`, which takes several).
        """
        if len(self.values) > 1:
            raise BadInput(f"--quant {self.text!r}: this command runs one precision; `vsagen compare` compares "
                           "several on one loaded model (comma-separated)")
        return self.values[0]

    def several(self) -> tuple[Any, ...]:
        """The precisions of `vsagen compare`, in order (each entry resolved on its own: `resolve_quants`)."""
        return self.values


def resolve_quants(quants: tuple[str, ...], device: str, source: ModelSource,
                   random_weights: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Each of `quants` resolved on its own (`resolve_quant`): (the precisions, in order; the notes, each once).

    Raises:
        BadInput: see `resolve_quant` (the first entry the device cannot run); two entries that resolve to one
            precision (`auto` beside the precision it means for this model and device).
    """
    out: list[str] = []
    notes: list[str] = []
    for quant in quants:
        precision, why = resolve_quant(quant, device, source, random_weights)
        if precision in out:
            given = [str(q) for q in quants]
            raise BadInput(f"--quant {','.join(given)!r}: {given[out.index(precision)]} and {quant} both run "
                           f"{precision} here (auto is int8 for a -quant preset's files where the device runs it, "
                           "else none); give each precision once")
        out.append(precision)
        notes += [n for n in why if n not in notes]
    return tuple(out), tuple(notes)
