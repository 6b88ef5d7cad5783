"""`vsagen compare --quant none,int8`: the precisions of the transformer blocks' linears as one more dimension of the
runs, on one loaded model.

The model loads once, its linears in the run's dtype but a transformer file's int8 ones (a `-quant` preset's, or
`--transformer`'s), which load as int8 linears where int8 is asked (`load_request`). For each transformer
(`vsagen.architecture.experts`), every precision's set of block linears (`vsagen.quant.swap.block_linears`: {name:
module}) is built once, before the first run:

* "none": the loaded `nn.Linear`s as they are; a loaded low-bit linear (a file's int8) as the run-dtype linear it
  stands for (`dequantized_linear`: the weight `--quant none` loads from that file);
* "int8": the loaded `Int8Linear`s as they are (a file's own int8 weights, as `--quant int8` runs them), the others
  quantized from the loaded linears (`quantize_transformer`, as `--quant int8` does at load);
* "fp8": quantized from the "none" set (`quantize_transformer`: a linear `torch._scaled_mm` cannot take stays in the
  run's dtype, as with `--quant fp8`).

Each run puts its precision's set in place (`put_modules`) before its DiT runs; the loaded set comes back at the end,
whatever happened (`PrecisionSets.restore`). Every set stays on the device for the whole comparison: the linears'
memory is that of every precision asked at once (for Wan2.1-1.3B in bf16: 2.6 GB, plus 1.3 GB for each 8-bit set).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator


def load_request(cfg: Any) -> Any:
    """The request `cfg` (a `CompareConfig`) loads the model with: itself where it runs one precision (`--quant`
    applied at load, as t2v does), else itself with `quant` "none" (nothing quantized at load: each 8-bit set is built
    from the loaded weights) and, where int8 is asked, `keep_int8_files` (a transformer file's int8 weights, a
    `-quant` preset's or `--transformer`'s, load as the int8 linears they are, for the int8 runs to run as stored)."""
    if not cfg.several_quants:
        return cfg
    import dataclasses

    return dataclasses.replace(cfg, quant="none", keep_int8_files="int8" in cfg.quants)


class PrecisionSets:
    """Every precision's block linears of every transformer of a loaded pipeline (module docstring), built once.

    Attributes:
        precisions: the precisions, in `--quant` order ("none" | "fp8" | "int8").
        sets: per precision, {expert name: {linear name: module}}.
        loaded: the linears the pipeline held when this was built, per expert (put back by `restore`).
        notes: per precision but "none", what its swap did (`SwapReport.note`).
        summaries: per precision, {expert name: `precision_summary`} while its set is in place.
    """

    def __init__(self, pipe: Any, precisions: tuple[str, ...], dtype: Any) -> None:
        """Build the sets of `pipe`'s transformers in `dtype` (the run's torch dtype) for `precisions`.

        Raises:
            ValueError: an unknown precision.
        """
        from torch import nn

        from ..architecture import experts
        from ..quant.lowbit import LowBitLinear
        from ..quant.swap import (block_linears, dequantized_linear, precision_summary, put_modules,
                                  quantize_transformer)

        self.precisions = precisions
        self.transformers = dict(experts(pipe))
        self.loaded = {name: dict(block_linears(t, kind=(nn.Linear, LowBitLinear)))
                       for name, t in self.transformers.items()}
        self.sets: list[dict[str, dict[str, Any]]] = []
        self.notes: list[str] = []
        self.summaries: list[dict[str, dict[str, int]]] = []
        none = {name: {k: m if isinstance(m, nn.Linear) else dequantized_linear(m, dtype) for k, m in own.items()}
                for name, own in self.loaded.items()}
        try:
            for precision in precisions:
                per_expert = {}
                for name, t in self.transformers.items():
                    # int8 keeps a -quant file's own int8 linears; every other precision starts from the dtype set
                    put_modules(t, self.loaded[name] if precision == "int8" else none[name])
                    report = quantize_transformer(t, precision)
                    if precision != "none":
                        self.notes.append(f"--quant {precision}: {name}: {report.note()}")
                    per_expert[name] = dict(block_linears(t, kind=(nn.Linear, LowBitLinear)))
                self.sets.append(per_expert)
                self.summaries.append({name: precision_summary(t) for name, t in self.transformers.items()})
        finally:
            self.restore()

    def put(self, index: int) -> None:
        """Put precision `precisions[index]`'s linears in place in every transformer."""
        from ..quant.swap import put_modules

        for name, t in self.transformers.items():
            put_modules(t, self.sets[index][name])

    def restore(self) -> None:
        """Put back the linears the pipeline held when this was built."""
        from ..quant.swap import put_modules

        for name, t in self.transformers.items():
            put_modules(t, self.loaded[name])


@contextlib.contextmanager
def precision_sets(cfg: Any, pipe: Any, notes: list[str]) -> Iterator[Callable[[int], dict[str, Any]]]:
    """Within the block, `put(index)` puts `cfg.quants[index]`'s linears in place (built once, on entering:
    `PrecisionSets`, whose notes are added to `notes`) and returns the run's `quant` record ({"precision", <expert>:
    `precision_summary`}, as t2v's JSON has it); the linears the pipeline was loaded with come back after, whatever
    happened. With one precision nothing is swapped: the model runs as loaded (`--quant` applied at load), and the
    record describes it.

    Raises:
        ValueError: an unknown precision in `cfg.quants`.
    """
    import torch

    from ..architecture import experts
    from ..quant.swap import precision_summary
    from ..request.resolve import torch_dtype

    if not cfg.several_quants:
        record = {"precision": cfg.quant, **{name: precision_summary(t) for name, t in experts(pipe)}}
        yield lambda index: record
        return
    with torch.no_grad():
        sets = PrecisionSets(pipe, cfg.quants, torch_dtype(cfg.dtype))
    notes += sets.notes
    notes.append(f"--quant {','.join(cfg.quants)}: every precision's block linears were built once after loading "
                 "and swapped in for its runs (all kept in memory at once); the loaded ones put back at the end")

    def put(index: int) -> dict[str, Any]:
        sets.put(index)
        return {"precision": cfg.quants[index], **sets.summaries[index]}

    try:
        yield put
    finally:
        sets.restore()
