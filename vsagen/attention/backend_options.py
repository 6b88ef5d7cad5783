"""The shipped backends' `Options` dataclasses, importable without torch.

`vsagen backends`, `vsagen presets` and the checks of `--attn NAME:KEY=VALUE` read a backend's options (their fields,
defaults and validation) before anything heavy loads, so they live here, apart from the backend classes (whose
modules import torch and the kernels): each backend module imports its Options from here (and re-exports them), and
the registry (`vsagen.attention.registry`) names them beside the module that holds each class.

A `tuning` field holds a `vsagen.kernels.tuning.KernelTuning` (the kernels import torch): at run time its annotation
reads `Any` (so the field is set from Python only, as before) and the value is checked in `__post_init__`, importing
the kernels only when one is given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..errors import BadInput
from ..layout import parse_tile, tile_text

if TYPE_CHECKING:
    from ..kernels.tuning import KernelTuning
else:
    KernelTuning = Any  # the real type needs torch; `_check_tuning` checks a given value against it

DEFAULT_SPARSITY = 0.875
IMPLS = ("auto", "triton", "torch")
VSA_IMPLS = IMPLS + ("fa4",)  # vsa / rocm-vsa: also FlashAttention-4's block-sparse kernels (tiles of 128 / 256)
SCOPES = ("global", "marginal")  # sla-star's branch: over every key, or over the key tiles not selected
FEATURE_MAPS = ("softmax", "elu", "relu")  # sla-star's phi (`vsagen.kernels.reference.FEATURE_MAPS`)
QUERY_BLOCKS = (64, 128)  # sparse-vdit's grouped query rows (`vsagen.attention.sparse_vdit.QUERY_LAUNCH`'s keys)
DEFAULT_QUERY_BLOCK = 64
# VSA's `tile` option: its default, and how `vsagen backends` lists its values (any cube `layout.parse_tile` takes)
TILE_FIELD = dict(default="4x4x4", metadata={"values": "TxHxW, power-of-two sides, 64 / 128 / 256 tokens, e.g. "
                                                       "4x4x4 | 4x4x8 | 4x8x8"})


def option_names(options_cls: type) -> list[str]:
    """The field names of an Options dataclass, in declaration order."""
    return [f.name for f in fields(options_cls)]


def options_dict(options: Any) -> dict[str, Any]:
    """JSON-ready {field: value} of an Options instance; fields that are None (unset optional inputs such as a
    weights file) are left out, values that are not JSON scalars become strings."""
    out = {}
    for f in fields(options):
        v = getattr(options, f.name)
        if v is not None:
            out[f.name] = v if isinstance(v, (bool, int, float, str)) else str(v)
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


def _check_tuning(tuning: Any) -> None:
    """Refuse a `tuning` that is not None nor a `KernelTuning` (imported here only when one is given)."""
    if tuning is None:
        return
    from ..kernels.tuning import KernelTuning as Tuning

    if not isinstance(tuning, Tuning):
        raise BadInput(f"tuning must be a vsagen.kernels.tuning.KernelTuning, got {type(tuning).__name__}")


def _tile_option(tile: Any) -> str:
    """The `tile` option checked (`vsagen.layout.parse_tile`) and spelled `TxHxW`.

    Raises:
        BadInput: the one-line reason `parse_tile` gives.
    """
    try:
        return tile_text(parse_tile(tile))
    except ValueError as e:
        raise BadInput(str(e)) from None


def _check_impl(impl: Any, impls: tuple[str, ...] = IMPLS) -> None:
    if impl not in impls:
        raise BadInput(f"impl must be one of {', '.join(impls)}, got {impl!r}")


@dataclass(frozen=True)
class NoOptions:
    """A backend without options."""


@dataclass(frozen=True)
class VSAOptions:
    """Options of `vsa`.

    Attributes:
        sparsity: fraction of key tiles skipped per query tile, in [0, 1) (`--sparsity`); top-k =
            ceil((1 - sparsity) * tiles).
        impl: "auto" (Triton kernels on CUDA, the torch reference elsewhere; for `vsa` the fine stage on FA4 where
            that was measured faster: whole cubes of 128 / 256 tokens, bf16 / fp16, sm90, FA4 installed, eager:
            `VSAAttention.auto_engine`), "triton", "torch" (`--attn-impl`), or "fa4": the fine stage on
            FlashAttention-4's block-sparse kernels (`pip install 'vsagen[fa4]'`; an NVIDIA sm90 / sm100 GPU, bf16 /
            fp16, a tile of 128 or 256 tokens; the coarse stage stays vsagen's Triton).
        tile: the cube VSA selects, `TxHxW` over the post-patch latent grid (latent frames x rows x columns): "4x4x4"
            (64 tokens, VSA's paper and FastVideo's published checkpoints), "4x4x8" (128) or "4x8x8" (256), or any
            cube of power-of-two sides holding 64, 128 or 256 tokens. Top-k counts cubes of this shape; a
            checkpoint trained with one tile is run with it (its preset sets it).
        query_rows: query rows per program of the Triton fine stage: 64 (one program per 64-token kernel tile) or
            128 (one program per 128 rows of a cube, its kernel tiles sharing the cube's key list; needs a tile of
            128 or 256 tokens).
        gate_weights: a safetensors file with trained gates (`blocks.{i}.to_gate_compress.{weight,bias}`, or the
            alias `blocks.{i}.attn1.to_gate_compress.*`, one scheme throughout),
            loaded for every transformer of the pipeline instead of the checkpoint's own; None: the checkpoint's,
            if it has any.
        tuning: the Triton kernels' tuning (`vsagen.kernels.tuning.KernelTuning`: TMA loads, partial-tile packing,
            the backward's second stream, score precision, launch tables), passed down to the launchers; None: the
            per-architecture defaults (`kernel_tuning(device, head_dim)`). Set from Python only, not the command
            line (benchmarks/attention.py builds variants with `dataclasses.replace`).

    Raises:
        BadInput: sparsity not a number in [0, 1), an unknown impl, a tile that is not such a cube, query_rows not
            64 or 128 (128 with a 64-token tile), a tuning that is not a KernelTuning, or a gate_weights path that is
            not a file.
    """

    sparsity: float = DEFAULT_SPARSITY
    impl: Literal["auto", "triton", "torch", "fa4"] = "auto"
    tile: str = field(**TILE_FIELD)  # type: ignore[assignment]
    query_rows: int = field(default=DEFAULT_QUERY_BLOCK, metadata={"values": "64 | 128 (128: a 128 / 256-token tile)"})
    gate_weights: Path | None = None
    tuning: KernelTuning | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tile", _tile_option(self.tile))
        rows = self.query_rows
        if isinstance(rows, bool) or rows not in QUERY_BLOCKS:
            raise BadInput(f"query_rows must be {' or '.join(map(str, QUERY_BLOCKS))}, got {rows!r}")
        if rows == 128 and math.prod(parse_tile(self.tile)) < 128:
            raise BadInput(f"query_rows=128 runs the 128 rows of one cube per program and needs a tile of 128 or 256 "
                           f"tokens (tile=4x4x8 or 4x8x8), got tile={self.tile}")
        s = self.sparsity
        if isinstance(s, bool) or not isinstance(s, (int, float)):
            raise BadInput(f"sparsity must be a number in [0, 1), got {s!r}")
        if not math.isfinite(s) or not 0.0 <= s < 1.0:
            raise BadInput(f"sparsity must be in [0, 1), got {s}")
        object.__setattr__(self, "sparsity", float(s) + 0.0)  # + 0.0: -0.0 becomes 0.0
        _check_impl(self.impl, VSA_IMPLS)
        _check_tuning(self.tuning)
        if self.gate_weights is not None:
            object.__setattr__(self, "gate_weights", weights_path_option(self.gate_weights, "gate_weights"))


@dataclass(frozen=True)
class ROCmVSAOptions(VSAOptions):
    """Options of `rocm-vsa`: `vsa`'s (sparsity, impl, tile, gate_weights, tuning); a tuning given here replaces the
    "rocm-vsa" profile's default. Raises BadInput as `VSAOptions`."""


@dataclass(frozen=True)
class SLAStarOptions:
    """Options of `sla-star`.

    Attributes:
        sparsity: VSA's fraction of key tiles skipped per query tile, in [0, 1) (`--sparsity`).
        impl: "auto" (Triton on CUDA, the torch reference elsewhere), "triton" or "torch" (`--attn-impl`): the
            sparse part's implementation, and the branch's.
        tile: VSA's cube (as `vsa`'s `tile`).
        scope: "global" (the branch over every key) or "marginal" (over the key tiles not selected).
        feature_map: phi, "softmax" (over the head dim), "elu" (elu + 1) or "relu".
        proj_weights: a safetensors file with trained projections (`blocks.{i}.attn1.proj_l.{weight,bias}`, or
            an alias scheme), loaded for every transformer instead of the checkpoint's own; None: the
            checkpoint's, if it has any (else the projection is zero).
        tuning: the Triton kernels' tuning of the sparse part (as `vsa`'s; Python only).

    Raises:
        BadInput: a value out of range (as `VSAOptions`), an unknown scope or feature map, or a proj_weights path
            that is not a file.
    """

    sparsity: float = DEFAULT_SPARSITY
    impl: Literal["auto", "triton", "torch"] = "auto"
    tile: str = field(**TILE_FIELD)  # type: ignore[assignment]
    scope: Literal["global", "marginal"] = "global"
    feature_map: Literal["softmax", "elu", "relu"] = "softmax"
    proj_weights: Path | None = None
    tuning: KernelTuning | None = None

    def __post_init__(self) -> None:
        _check_impl(self.impl)  # not fa4: the branch runs on vsagen's kernels
        sparse = VSAOptions(sparsity=self.sparsity, impl=self.impl, tile=self.tile, tuning=self.tuning)  # VSA's checks
        object.__setattr__(self, "sparsity", sparse.sparsity)
        object.__setattr__(self, "tile", sparse.tile)
        if self.scope not in SCOPES:
            raise BadInput(f"scope must be one of {', '.join(SCOPES)}, got {self.scope!r}")
        if self.feature_map not in FEATURE_MAPS:
            raise BadInput(f"feature_map must be one of {', '.join(FEATURE_MAPS)}, got {self.feature_map!r}")
        if self.proj_weights is not None:
            object.__setattr__(self, "proj_weights", weights_path_option(self.proj_weights, "proj_weights"))


SLA_BLOCKS = (64, 128)  # sla's block sizes in tokens (`vsagen.kernels.raster_blocks.BLOCK_SIZES`)


@dataclass(frozen=True)
class SLAOptions:
    """Options of `sla`.

    Attributes:
        topk: fraction of key blocks each query block keeps, in (0, 1]: int(topk * blocks), at least 1 (SLA's
            `topk`; TurboDiffusion's default 0.1).
        block_q: tokens per query block, 64 or 128 (TurboDiffusion's inference: 128; its SageSLA on Hopper: 64).
        block_k: tokens per key block, 64 or 128 (TurboDiffusion's inference: 64; its SageSLA on Hopper: 128).
        feature_map: the linear branch's phi, "softmax" (over the head dim; SLA's default), "elu" (elu + 1) or
            "relu".
        impl: "auto" (Triton kernels on CUDA, the torch reference elsewhere), "triton" or "torch" (`--attn-impl`).
        query_rows: query rows per program of the Triton sparse part: 64 (one program per 64-token raster tile; a
            128-token block's two tiles each walk its key list) or 128 (one program per 128-token query block over
            `kernels.query_groups`, loading each selected key tile once for both halves; needs block_q 128).
        proj_weights: a safetensors file with trained projections (`blocks.{i}.self_attn.attn_op.local_attn.
            proj_l.{weight,bias}`, TurboDiffusion's names, or FastVideo's `blocks.{i}.attn1.attn_impl.proj_l.*`),
            loaded for every transformer instead of the checkpoint's own; None: the checkpoint's, if it has any
            (else the branch is zero).
        tuning: the block-sparse kernels' tuning (`KernelTuning`; Python only).

    Raises:
        BadInput: topk not a number in (0, 1], a block size not 64 or 128, an unknown feature map or impl, a
            tuning that is not a KernelTuning, query_rows not 64 or 128 (128 with block_q 64), or a proj_weights
            path that is not a file.
    """

    topk: float = 0.1
    block_q: int = 128
    block_k: int = 64
    feature_map: Literal["softmax", "elu", "relu"] = "softmax"
    impl: Literal["auto", "triton", "torch"] = "auto"
    query_rows: int = 64
    proj_weights: Path | None = None
    tuning: KernelTuning | None = None

    def __post_init__(self) -> None:
        t = self.topk
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or not 0.0 < t <= 1.0:
            raise BadInput(f"topk must be a number in (0, 1], got {t!r}")
        object.__setattr__(self, "topk", float(t))
        for name in ("block_q", "block_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or value not in SLA_BLOCKS:
                raise BadInput(f"{name} must be {' or '.join(map(str, SLA_BLOCKS))}, got {value!r}")
        if isinstance(self.query_rows, bool) or self.query_rows not in SLA_BLOCKS:
            raise BadInput(f"query_rows must be {' or '.join(map(str, SLA_BLOCKS))}, got {self.query_rows!r}")
        if self.query_rows > self.block_q:
            raise BadInput(f"query_rows {self.query_rows} needs block_q {self.query_rows} (the rows of one program "
                           f"share one key list), got block_q {self.block_q}")
        if self.feature_map not in FEATURE_MAPS:
            raise BadInput(f"feature_map must be one of {', '.join(FEATURE_MAPS)}, got {self.feature_map!r}")
        _check_impl(self.impl)
        _check_tuning(self.tuning)
        if self.proj_weights is not None:
            object.__setattr__(self, "proj_weights", weights_path_option(self.proj_weights, "proj_weights"))


@dataclass(frozen=True)
class SparseVDiTOptions:
    """Options of `sparse-vdit`.

    Attributes:
        patterns: the pattern file (`vsagen search --out`); required (a preset may give a default).
        remap: run a file searched at another size on this run's grid (the same modes compiled on the new tile
            grid; their densities change and they were not searched there).
        impl: "auto" (Triton kernels on CUDA, the torch reference elsewhere), "triton" or "torch".
        query_block: the forward's query rows per program over query groups (`kernels.query_groups`: tiles with
            equal key lists share a program, partial query tiles packed): 64 or 128; 0 runs one program per query
            tile (the `vsa` forward). The backward is the same either way.
        tuning: the Triton kernels' tuning (`KernelTuning`), from Python only; None: the device's defaults.
        sdpa_heads: with impl triton, heads whose query tiles all share one key list (dense, vertical-stripe) run
            torch SDPA (cuDNN on CUDA) over the tokens of that list instead of the block-sparse kernel (their rows
            of the kernel's tables are emptied): one SDPA call per distinct list; False: every head in the kernel.
            No effect with impl torch (every head runs the masked reference there).

    Raises:
        BadInput: a patterns path that is not a file, an unknown impl, a tuning that is not a KernelTuning.
    """

    patterns: Path | None = None
    remap: bool = False
    impl: Literal["auto", "triton", "torch"] = "auto"
    query_block: int = DEFAULT_QUERY_BLOCK
    tuning: KernelTuning | None = None
    sdpa_heads: bool = True

    def __post_init__(self) -> None:
        if self.patterns is not None:
            if not str(self.patterns).strip():
                raise BadInput("patterns is empty: give a pattern file (write one with `vsagen search`)")
            path = Path(self.patterns).expanduser()
            if path.is_dir():
                raise BadInput(f"patterns {str(path)!r} is a folder: give a pattern file (.json)")
            if not path.is_file():
                raise BadInput(f"patterns {str(path)!r}: no such file (write one with `vsagen search`)")
            object.__setattr__(self, "patterns", path.resolve())  # the run's JSON records where it really is
        for name in ("remap", "sdpa_heads"):
            if not isinstance(getattr(self, name), bool):
                raise BadInput(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.query_block not in QUERY_BLOCKS and self.query_block != 0:
            raise BadInput(f"query_block must be 0, {' or '.join(map(str, QUERY_BLOCKS))}, got {self.query_block!r}")
        _check_impl(self.impl)
        _check_tuning(self.tuning)
