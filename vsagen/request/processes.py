"""How a request runs in several processes, checked before loading: `--gpus N` split into Ulysses x CFG parallel
(`split_processes`, `split_request`), and the refusals of a `--ulysses` degree that cannot run (`check_ulysses`).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ..errors import BadInput
from ..layout import TILE
from ..models.sources import ModelSource
from .options import Device, Offload
from .plans import preset_plan


def check_ulysses(ulysses: int, src: ModelSource, *, offload: str, compile: bool, tile_fit: str, frames: int,
                  height: int, width: int, tile: tuple[int, int, int] = TILE) -> None:
    """Refuse a `--ulysses` that cannot run (before loading; once per tile fit): not with --offload (diffusers
    #12533) nor --compile (not tested together); for a model of its preset's architecture, a degree that splits the
    heads and the tokens of the grid denoised under `tile_fit`.

    Raises:
        BadInput: one of these, in one line (the degree's: with the degrees that do divide).
    """
    if ulysses == 1:  # (a degree below 1: `PlacementOptions` refuses it)
        return
    if offload != "none":
        raise BadInput(f"--ulysses {ulysses} cannot run with --offload {offload} (diffusers' context parallelism "
                       "and offloading do not work together, diffusers #12533); use --offload none")
    if compile:
        raise BadInput(f"--ulysses {ulysses} with --compile is not supported yet; drop --compile")
    if src.exact_preset:
        from ..parallel.ulysses import check_ulysses_degree

        grid = preset_plan(src, frames, height, width, tile_fit, tile).denoise_grid
        check_ulysses_degree(ulysses, int(src.preset.transformer["num_attention_heads"]), math.prod(grid))


def split_processes(gpus: int, ulysses: int | None, cfg_parallel: bool, *, guidance: float,
                    degrees: Sequence[int] | None) -> tuple[int, bool, str | None]:
    """How the `gpus` processes of `--gpus N` split a run: (ulysses, cfg_parallel, note).

    What is given is kept: `--ulysses U` needs N = U (N = 2 x U with `--cfg-parallel`, which `--gpus 2U --ulysses U`
    implies when CFG is on); `--cfg-parallel` alone takes U = N / 2. Neither given (the note then says what was
    chosen): with CFG on (guidance > 1) and N even, the CFG passes on two halves of the processes, each splitting
    the sequence N / 2 ways, where N / 2 splits the model; else Ulysses over all N. CFG parallel comes first because
    its halves exchange one noise prediction per step, where Ulysses exchanges activations four times per
    attention layer (q, k, v, output).

    Args:
        gpus: N >= 1; ulysses: `--ulysses` (None: not given); cfg_parallel: `--cfg-parallel`.
        guidance: the run's CFG scale (of the first expert: > 1 runs the unconditional pass).
        degrees: the Ulysses degrees that split the model's heads and every grid the run denoises, at least up to
            N (`vsagen.parallel.ulysses.ulysses_degrees`); None where unknown before loading (no preset describes
            the model: any degree is tried).

    Raises:
        BadInput: a given split of another process count, `--cfg-parallel` with an odd N, or an N that no split
            fits (the message lists the counts that do).
    """
    cfg_on = guidance > 1

    def fits(n: int) -> bool:
        return degrees is None or n in degrees

    def ways(n: int) -> str:  # the splits that fit n processes, as flags ("" if none)
        half = ["--cfg-parallel" + (f" --ulysses {n // 2}" if n > 2 else "")] \
            if cfg_on and n % 2 == 0 and fits(n // 2) else []
        return " or ".join(([f"--ulysses {n}"] if fits(n) else []) + half)

    if ulysses is not None:
        need = ulysses * (2 if cfg_parallel else 1)
        if gpus == need:
            return ulysses, cfg_parallel, None
        if not cfg_parallel and gpus == 2 * ulysses and cfg_on:
            return ulysses, True, (f"--gpus {gpus} with --ulysses {ulysses}: the CFG passes run on two halves of the "
                                   "processes (as --cfg-parallel)")
        flags = f"--ulysses {ulysses}" + (" --cfg-parallel" if cfg_parallel else "")
        hint = ways(gpus)
        raise BadInput(f"{flags} runs in {need} processes, --gpus {gpus} starts {gpus}: "
                       + (f"for --gpus {gpus} give {hint}, or leave --ulysses out (vsagen then picks)" if hint else
                          f"give --gpus {need}"))
    if cfg_parallel:
        if gpus % 2:
            raise BadInput(f"--cfg-parallel runs the CFG passes on two halves of the processes; --gpus {gpus} is odd: "
                           "give an even --gpus")
        return gpus // 2, True, None
    if gpus == 1:
        return 1, False, None
    if cfg_on and gpus % 2 == 0 and fits(gpus // 2):
        half = gpus // 2
        return half, True, (f"--gpus {gpus}: the conditional and unconditional CFG passes run on two halves of the "
                            "processes" + (f", each splitting the sequence {half} ways (as --cfg-parallel --ulysses "
                                           f"{half})" if half > 1 else " (as --cfg-parallel)"))
    if fits(gpus):
        return gpus, False, f"--gpus {gpus}: the sequence is split {gpus} ways (as --ulysses {gpus})"
    assert degrees is not None
    counts = sorted({d for d in degrees if d > 1} | ({2 * d for d in degrees} if cfg_on else set()))
    split = [d for d in degrees if d > 1]
    raise BadInput(f"--gpus {gpus} cannot split this run: Ulysses splits it across "
                   + (f"{', '.join(map(str, split))} processes" if split else "no more than 1 process")
                   + " (the degrees that divide the model's heads and this size's tokens)"
                   + (", twice as many with CFG parallel" if cfg_on else "")
                   + (f"; give --gpus {', '.join(map(str, counts))}" if counts else "; run it in one process"))


def ulysses_degrees_for(src: ModelSource, frames: int, height: int, width: int, tile_fits: Sequence[str],
                     up_to: int, tile: tuple[int, int, int] = TILE) -> list[int] | None:
    """The Ulysses degrees <= up_to (at least 8) that split the heads and every grid of `tile_fits` of a model its
    preset describes; None for another model (unknown before loading)."""
    if not src.exact_preset:
        return None
    from ..parallel.ulysses import ulysses_degrees

    heads = int(src.preset.transformer["num_attention_heads"])
    grids = [math.prod(preset_plan(src, frames, height, width, fit, tile).denoise_grid) for fit in tile_fits]
    return [d for d in ulysses_degrees(heads, grids[0], max(8, up_to)) if all(g % d == 0 for g in grids)]


def split_request(pl: Any, src: ModelSource, device: str, guidance: float, frames: int, height: int, width: int,
                   fits: Sequence[str], tile: tuple[int, int, int] = TILE) -> tuple[int, bool, tuple[str, ...]]:
    """(ulysses, cfg_parallel, notes) of the placement options `pl`: as given without `--gpus`, else
    `split_processes`, after refusing what several processes started here cannot do.

    Raises:
        BadInput: `--gpus` above 1 with --offload or --compile, or above the GPUs visible on CUDA; as
            `split_processes`.
    """
    if pl.gpus is None:
        return pl.ulysses or 1, pl.cfg_parallel, ()
    if pl.gpus > 1 and pl.offload != Offload.NONE:
        raise BadInput(f"--gpus {pl.gpus} cannot run with --offload {pl.offload} (multi-process runs keep the weights "
                       "on the GPU); use --offload none")
    if pl.gpus > 1 and pl.compile:
        raise BadInput(f"--gpus {pl.gpus} with --compile is not supported yet; drop --compile")
    notes: tuple[str, ...] = ()
    if pl.gpus > 1 and device == "cuda":
        import torch

        visible = torch.cuda.device_count()
        if pl.gpus > visible:
            raise BadInput(f"--gpus {pl.gpus}: torch sees {visible} GPU{'s' if visible != 1 else ''} here (one "
                           f"process per GPU); give --gpus {visible} or fewer")
    elif pl.gpus > 1:
        why = "no CUDA here" if pl.device == Device.AUTO else "--device cpu"
        notes += (f"--gpus {pl.gpus} on the CPU ({why}): {pl.gpus} processes (gloo) share this machine's cores",)
    ulysses, cfg_parallel, note = split_processes(
        pl.gpus, pl.ulysses, pl.cfg_parallel, guidance=guidance,
        degrees=ulysses_degrees_for(src, frames, height, width, fits, pl.gpus, tile))
    return ulysses, cfg_parallel, notes + ((note,) if note else ())
