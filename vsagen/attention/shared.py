"""What several backends share: the checks and constants of their options, and the helpers of their computation
that more than one backend calls, so that no backend imports another's private parts.

Options: `NoOptions`, the field names and JSON form of an Options value (`option_names`, `options_dict`), a weights
file option (`weights_path_option`), a `tuning` (`check_tuning`), VSA's `tile` (`TILE_FIELD`, `tile_option`), an
`impl` (`IMPLS`, `check_impl_option`), the default sparsity and the linear branch's feature maps.

The quality knobs' bookkeeping (`KNOBS`, `has_knobs`, the calls run dense and sparse: `counts_of`, `knob_info`; the
knobs themselves are `vsagen.attention.dense`'s).

Computation: whether the Triton interpreter runs (`interpreting`), VSA's cube lists as the block-sparse kernels' tile
lists (`kernel_lists`: `vsa`, `sla-star`), the launch settings of the grouped kernels per query rows
(`QUERY_LAUNCH`: `vsa`, `sla`, `sparse-vdit`) and the linear branch's trained projection (its checkpoint names,
`proj_shapes`, `proj_module`, `random_proj`: `sla-star`, `sla`).

Like the backend modules, this module imports neither torch nor the kernels when it is imported (the registry imports
every backend for the listings and the checks of `--attn`, before torch loads): the functions that compute import
them. A `tuning` field holds a `vsagen.kernels.tuning.KernelTuning`: its annotation reads `Any` at run time (so the
field is set from Python only) and a given value is checked by `check_tuning`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BadInput
from ..layout import parse_tile, tile_text

if TYPE_CHECKING:
    import torch

DEFAULT_SPARSITY = 0.875
IMPLS = ("auto", "triton", "torch")
FEATURE_MAPS = ("softmax", "elu", "relu")  # the linear branch's phi (`vsagen.kernels.reference.FEATURE_MAPS`)
# The grouped kernels' launches per query rows (`vsa`'s and `sla`'s `query_rows`, `sparse-vdit`'s `query_block`):
# (block_m, num_warps, num_stages) of the forward, then of dQ. Swept on the H200 (torch 2.11, triton 3.6;
# `benchmarks/sparse_vdit.py --sweep`, Wan2.1-1.3B 480p shape): 64-row groups at (4 warps, 2 stages) took the forward
# from 4.55 to 3.77 ms on a vertical-stripe layer, 3.55 to 3.33 on multi-diagonal, 5.76 to 5.18 on a mixed layer
# (diagonal: 1.11 to 1.10), forward+backward 18.8 to 17.3, 14.2 to 14.0, 22.5 to 21.9 ms (diagonal 4.44 to 4.50);
# 128-row groups (8 warps) were slower on every layer; the packed dK/dV loop then took forward+backward to 15.8, 13.3,
# 20.1 (diagonal 4.37) ms (BENCHMARKS.md, "sparse-vdit").
QUERY_LAUNCH = {64: (64, 4, 2, 64, 4, 2), 128: (128, 8, 3, 128, 8, 2)}
QUERY_BLOCKS = tuple(QUERY_LAUNCH)  # the query rows a grouped launch takes
DEFAULT_QUERY_BLOCK = 64
# VSA's `tile` option: its default, and how `vsagen backends` lists its values (any cube `layout.parse_tile` takes)
TILE_FIELD = dict(default="4x4x4", metadata={"values": "TxHxW, power-of-two sides, 64 / 128 / 256 tokens, e.g. "
                                                       "4x4x4 | 4x4x8 | 4x8x8"})


@dataclass(frozen=True)
class NoOptions:
    """A backend without options."""


def option_names(options_cls: type) -> list[str]:
    """The field names of an Options dataclass, in declaration order, keyword-only fields (those every sparse
    backend shares, `vsagen.attention.dense.DenseKnobs`, declared on a base class) last."""
    every = fields(options_cls)
    return [f.name for f in every if not f.kw_only] + [f.name for f in every if f.kw_only]


def options_dict(options: Any) -> dict[str, Any]:
    """JSON-ready {field: value} of an Options instance (in `option_names` order); fields that are None (unset
    optional inputs such as a weights file) are left out, values that are not JSON scalars become strings."""
    out = {}
    for name in option_names(type(options)):
        v = getattr(options, name)
        if v is not None:
            out[name] = v if isinstance(v, (bool, int, float, str)) else str(v)
    return out


def weights_path_option(value: Any, option: str) -> Path:
    """An Options field naming a weights file (`gate_weights`, `proj_weights`), checked: an existing file.

    Raises:
        BadInput: empty, a folder, or no such file.
    """
    path = Path(value)
    if path.is_dir() or not str(value).strip():
        raise BadInput(f"{option} {str(value)!r}: give a .safetensors file, not a folder")
    if not path.is_file():
        raise BadInput(f"{option} {str(path)!r}: no such file (give a .safetensors file)")
    return path


def check_tuning(tuning: Any) -> None:
    """Refuse a `tuning` that is not None nor a `KernelTuning` (imported here only when one is given).

    Raises:
        BadInput: "tuning must be a vsagen.kernels.tuning.KernelTuning, got <type>".
    """
    if tuning is None:
        return
    from ..kernels.tuning import KernelTuning as Tuning

    if not isinstance(tuning, Tuning):
        raise BadInput(f"tuning must be a vsagen.kernels.tuning.KernelTuning, got {type(tuning).__name__}")


def tile_option(tile: Any) -> str:
    """The `tile` option checked (`vsagen.layout.parse_tile`) and spelled `TxHxW`.

    Raises:
        BadInput: the one-line reason `parse_tile` gives.
    """
    try:
        return tile_text(parse_tile(tile))
    except ValueError as e:
        raise BadInput(str(e)) from None


def check_impl_option(impl: Any, impls: tuple[str, ...] = IMPLS) -> None:
    """Refuse an `impl` option that is none of `impls`.

    Raises:
        BadInput: "impl must be one of auto, triton, torch, got 'x'".
    """
    if impl not in impls:
        raise BadInput(f"impl must be one of {', '.join(impls)}, got {impl!r}")


PRECISIONS = ("bf16", "int8")  # the fine stage's arithmetic (`vsa` / `sla` option `precision`)


def check_precision_option(precision: Any) -> None:
    """Refuse a `precision` option that is not one of PRECISIONS (BadInput, one line)."""
    if precision not in PRECISIONS:
        raise BadInput(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")


def int8_refusal(name: str, precision: str, impl: str, device: torch.device) -> str | None:
    """Why backend `name` cannot run precision=int8 on the Triton kernels on `device` (None: it can, or the run
    takes bf16 or the torch formulas): the kernels' P.V is an fp8 e4m3 dot, which NVIDIA GPUs from sm_89 (Ada,
    Hopper, Blackwell) run; older NVIDIA GPUs and ROCm builds (whose MI300 fp8 is e4m3fnuz) are refused."""
    if precision != "int8" or impl != "triton" or device.type != "cuda":
        return None
    import torch

    if torch.version.hip:
        return f"{name}: precision=int8 runs fp8 e4m3 P.V on NVIDIA GPUs from sm_89; not on ROCm (use precision=bf16)"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        return (f"{name}: precision=int8 needs fp8 tensor cores (NVIDIA sm_89 Ada, sm_90 Hopper, sm_100 Blackwell); "
                f"this GPU is sm_{major}{minor} (use precision=bf16)")
    return None


def int8_emulation_note(name: str, precision: str, impl: str) -> tuple[str, ...]:
    """The run note for precision=int8 off the Triton kernels (impl torch, the CPU's): the 8-bit numerics are then
    computed by the float32 formulas (`kernels.sage.sage_attention_reference`), which reproduce their error but not
    their speed; () otherwise. (A new-user trial: the CPU run said nothing of it, and its title does not say int8.)"""
    if precision != "int8" or impl == "triton":
        return ()
    return (f"{name}: precision=int8 with impl {impl} computes the 8-bit fine stage's numerics (int8 Q.K^T, fp8 P.V) "
            "in float32 torch ops: its error, not its speed (slower than bf16); the 8-bit kernels run with impl "
            "triton on NVIDIA GPUs from sm_89",)


def int8_fine_stage(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lists: torch.Tensor, counts: torch.Tensor,
                    offsets: torch.Tensor, q_offsets: torch.Tensor, k_offsets: torch.Tensor, triton: bool,
                    tuning: Any = None, groups: torch.Tensor | None = None) -> torch.Tensor:
    """The 8-bit fine stage of `vsa` / `sla` (precision=int8) over kernel-tile lists: on the Triton kernels
    (`kernels.sage_attn.sage_block_sparse_attention`; `groups` a 128-row query-group table or None), else the same
    formulas in float32 torch ops (`kernels.sage.sage_attention_reference`, the CPU path). q, k, v (B, S, H, D);
    lists / counts / offsets as the block-sparse kernels take them; q_offsets / k_offsets the token groups of the
    int8 scales. Returns (B, S, H, D) in q's dtype. Raises ValueError where gradients are needed (forward only)."""
    import torch

    from ..kernels import sage

    sage.check_forward_only(q, k, v)
    if triton:
        from ..kernels.sage_attn import sage_block_sparse_attention

        launch = None if groups is None else QUERY_LAUNCH[128][:3]
        return sage_block_sparse_attention(q, k, v, lists, counts, offsets, q_offsets, k_offsets, tuning=tuning,
                                           groups=groups, group_launch=launch)
    return sage.sage_attention_reference(q, k, v, lists, counts, offsets, q_offsets, k_offsets, dtype=torch.float32)


def interpreting() -> bool:
    """Whether the Triton interpreter runs the kernels (TRITON_INTERPRET=1: the Triton paths then run on a CPU)."""
    from ..kernels.tuning import interpreting as triton_interpreting

    return triton_interpreting()


def kernel_lists(layout: Any, q2k: torch.Tensor, q2k_cnt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                                torch.Tensor]:
    """A cube-level selection as the block-sparse kernels take it: (q2k, q2k_cnt, tile_offsets) over the layout's
    kernel tiles (`kernels.tile_expand_triton`, one launch, equal to the torch `kernels.tile_expand`); cubes of at
    most 64 tokens come back as they are, with `layout.tile_offsets_i32`. For the Triton paths only (CUDA, ROCm or
    the interpreter).

    Args:
        layout: the `TileLayout` (its tile any of VSA's cubes).
        q2k: (B, H, Q_TILES, K) integer key cubes per query cube; q2k_cnt: (B, H, Q_TILES) integer.

    Returns:
        q2k (B, H, n_kernel_tiles, K') int32, q2k_cnt (B, H, n_kernel_tiles) int32, tile_offsets
        (n_kernel_tiles + 1,) int32.
    """
    import torch

    if layout.kernel_tiles_per_tile == 1:
        return q2k.to(torch.int32), q2k_cnt.to(torch.int32), layout.tile_offsets_i32
    from ..kernels.tile_expand_triton import expand_to_kernel_tiles_triton

    lists, counts = expand_to_kernel_tiles_triton(q2k, q2k_cnt, layout.tile_kernel_first, layout.tile_kernel_count,
                                                  layout.kernel_tile_of, layout.kernel_tiles_per_tile)
    return lists, counts, layout.kernel_offsets_i32


# The linear branch's trained projection under other projects' checkpoint names: TurboDiffusion's (SLA's own module) and
# FastVideo's diffusers conversion; `sla` reads them, `sla-star` takes them as aliases of its own key.
TURBODIFFUSION_PROJ_KEY = "blocks.{layer}.self_attn.attn_op.local_attn.proj_l"
FASTVIDEO_PROJ_KEY = "blocks.{layer}.attn1.attn_impl.proj_l"


def proj_shapes(attn: Any) -> dict[str, tuple[int, ...]]:
    """The linear branch's projection proj_l maps one head's D channels to D (shared by the heads): its tensors'
    shapes given the layer's attn1 module."""
    d = attn.to_q.weight.shape[0] // attn.heads
    return {"weight": (d, d), "bias": (d,)}


def proj_module(tensors: dict[str, torch.Tensor], attn: Any) -> torch.nn.Module:
    """A float32 Linear(D, D) holding the trained projection (bias zero when the file has none)."""
    import torch

    w = tensors["weight"]
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=True, dtype=torch.float32)
    with torch.no_grad():
        lin.weight.copy_(w.float())
        lin.bias.copy_(tensors["bias"].float() if "bias" in tensors else torch.zeros(w.shape[0]))
    return lin


def random_proj(head_dim: int, device: torch.device, seed: int) -> torch.nn.Module:
    """A random projection of trained size (float32 Linear(D, D)) to time the linear branch with (`bench_params` of
    `sla-star` and `sla`: without one the branch is not computed)."""
    import torch

    g = torch.Generator().manual_seed(seed + 17)
    tensors = {"weight": torch.randn(head_dim, head_dim, generator=g) / head_dim ** 0.5,
               "bias": torch.randn(head_dim, generator=g) * 0.01}
    return proj_module(tensors, None).to(device)


# The quality knobs every sparse backend's Options take (`vsagen.attention.dense.DenseKnobs`): here, below the backends
# and `base`, the report's counts of the calls they sent to `full`.
KNOBS = ("dense_steps", "dense_layers", "min_tokens")


def has_knobs(options: Any) -> bool:
    """Whether `options` set any knob (a backend without them, e.g. `full`, has none set)."""
    return any(getattr(options, k, None) is not None for k in KNOBS)


@dataclass
class CallCounts:
    """Attention calls of the last run that ran dense and sparse (`knob_info`)."""

    dense: int = 0
    sparse: int = 0


def innermost(backend: Any) -> Any:
    """The backend under any wrappers (`BackendWrapper.inner`: compare's probe, Ulysses)."""
    while getattr(backend, "inner", None) is not None:
        backend = backend.inner
    return backend


def counts_of(backend: Any) -> CallCounts:
    """The call counts kept on the innermost backend object (made on first use)."""
    inner = innermost(backend)
    counts = getattr(inner, "_dense_counts", None)
    if counts is None:
        counts = CallCounts()
        inner._dense_counts = counts
    return counts


def reset_counts(backend: Any) -> None:
    """Start the counts of a new run (`vsagen.apply`)."""
    counts = counts_of(backend)
    counts.dense = counts.sparse = 0


def knob_info(backend: Any) -> dict[str, Any]:
    """JSON-ready knobs a backend's options set and its calls of the last run: {"dense_steps", "dense_layers",
    "min_tokens" (those set), "dense_calls", "sparse_calls"}; {} where no knob is set (a report as before)."""
    options = getattr(backend, "options", None)
    if not has_knobs(options):
        return {}
    counts = counts_of(backend)
    return {**{k: getattr(options, k) for k in KNOBS if getattr(options, k) is not None},
            "dense_calls": counts.dense, "sparse_calls": counts.sparse}
