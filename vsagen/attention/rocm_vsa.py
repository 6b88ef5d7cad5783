"""`rocm-vsa`: VSA (arXiv 2505.13389, sec. 2) with the ROCm seed's kernel changes (seed 002, AMD's "Triton-Based
Optimization of Video Sparse Attention on ROCm").

Same selection, output and options as `vsa` (coarse stage, top-k key tiles, block-sparse fine stage, the optional
trained gate): only how the Triton kernels run differs, as data (`vsagen.kernels.tuning.KernelTuning`, profile
"rocm-vsa" of `kernel_tuning`). The seed's three changes:

1. tuning spaces: forward and backward launch tables of their own per AMD architecture, with the AMD compiler
   options (waves_per_eu, matrix_instr_nonkdim, kpack; `tuning.HIP_LAUNCH`, `tuning.HIP_OPTIONS`). They are every
   AMD architecture's defaults, so `vsa` on a ROCm build of torch uses them too.
2. one-pass load hints: the operands each program streams once (K / V in the forward and dQ loops, Q / dO in the
   dK/dV loop) loaded as streaming (`KernelTuning.one_pass_loads`; on AMD the `nt` bit, the form in which Triton's
   AMD backend emits such a hint). `rocm-vsa`'s own change, on AMD.
3. leaner index traversal (`KernelTuning.lean_index`): k2q entries that carry their query tile's start row and
   length, so the dK/dV loop reads one word per query tile. It took 1.2-1.5% off the H200's fine-stage
   forward+backward at the 1.3B and 5B shapes, so `vsa` has it everywhere.

On AMD, `rocm-vsa` is `vsa` plus the hints (every kernel compiled and resource-checked for gfx942 and gfx950,
`vsagen.kernels.amd_build`; not run on AMD hardware). On NVIDIA the hints change no instruction on sm_90 (the
pipelined loads carry none) and the H200 timings agreed, so `rocm-vsa` is `vsa` there: never slower
(`tuning.ROCM_VSA_CHANGES`; BENCHMARKS.md, "rocm-vsa"). The torch implementation (`impl=torch`) is `vsa`'s eager
reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .vsa import VSAAttention, VSAOptions

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class ROCmVSAOptions(VSAOptions):
    """Options of `rocm-vsa`: `vsa`'s (sparsity, impl, tile, gate_weights, tuning); a tuning given here replaces the
    "rocm-vsa" profile's default. Raises BadInput as `VSAOptions`."""


class ROCmVSAAttention(VSAAttention):
    """`vsa` run with the "rocm-vsa" kernel profile."""

    name = "rocm-vsa"
    Options = ROCmVSAOptions
    kernel_profile = "rocm-vsa"
    auto_priority = None  # vsa's gates, vsa's output: `--attn auto` runs vsa for a gated checkpoint, never this
    auto_fa4 = False  # the ROCm seed's kernel changes are what this backend runs: impl auto stays on Triton
    ws_forward = False  # ... and its tuning: no warp-specialized (Hopper-only) forward

    def __init__(self, options: ROCmVSAOptions | None = None) -> None:
        super().__init__(ROCmVSAOptions() if options is None else options)

    def describe(self, device: torch.device | None = None) -> dict:
        """`vsa`'s description and, given a device where the Triton kernels run with this profile's default tuning,
        "kernel_changes": the tuning fields in which it differs from `vsa`'s there (at head dim 128; {} on NVIDIA,
        where the two run the same kernels)."""
        d = super().describe(device)
        if device is not None and d.get("impl_ran") == "triton" and self.options.tuning is None:
            import dataclasses

            from ..kernels.tuning import kernel_tuning

            mine, vsa = kernel_tuning(device, 128, self.kernel_profile), kernel_tuning(device, 128)
            d["kernel_changes"] = {f.name: getattr(mine, f.name) for f in dataclasses.fields(mine)
                                   if getattr(mine, f.name) != getattr(vsa, f.name)}
        return d
