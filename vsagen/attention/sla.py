"""`sla`: SLA as its authors run it (arXiv 2509.24006; thu-ml's SLA module in TurboDiffusion): top-k key blocks over
raster token blocks for the sparse part, plus a projected linear-attention branch over every key.

o = o_s + proj_l(o_l):
* o_s: softmax attention of each query block over the key blocks it selected (`vsagen.kernels.raster_blocks`: q and
  the smoothed k mean-pooled over `block_q` / `block_k` raster tokens, scored without scale, the top
  int(topk * blocks) kept), run on vsagen's block-sparse kernels over 64-token raster tiles (a 128-token block is two
  tiles sharing one key list; with `query_rows=128` one program takes both tiles over `kernels.query_groups`).
* o_l = phi(q) Sum / (1e-5 + phi(q) . z) over every key (`global` scope of `sla-star`'s branch, its fused kernels),
  phi the softmax over the head dim by default; proj_l a float32 Linear(D, D) with bias per layer, shared by the
  heads, read from the checkpoint under TurboDiffusion's name (`blocks.{i}.self_attn.attn_op.local_attn.proj_l`)
  or FastVideo's (`blocks.{i}.attn1.attn_impl.proj_l`), or from the file `proj_weights` names. Without one the
  branch is zero (SLA's initialisation) and not computed.

The tokens stay in the model's raster order (`tiled = False`): SLA's blocks are runs of that order, not cubes. The
difference from `sla-star` is the selection: `sla-star` selects VSA's (4, 4, 4) cubes with VSA's coarse scores, so
a checkpoint trained with SLA attends there to other keys than it was trained with.

Precision against SLA's own code: the selection is computed as SLA computes it (pools summed in fp32 and stored in
the run's dtype, scores in that dtype, torch.topk), so the block maps are the same; the sparse part accumulates in
fp32 as SLA's kernel does; the branch keeps its sums in fp32 where SLA's runs bf16 matmuls (closer to the fp32
formula). With `impl=torch` everything runs the float references (`vsagen.kernels.reference`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..errors import BadInput
from .base import AttnContext, Backend, LayerWeights, RunInfo
from .dense import DenseKnobs, check_knobs
from .shared import (FASTVIDEO_PROJ_KEY, FEATURE_MAPS, QUERY_LAUNCH, TURBODIFFUSION_PROJ_KEY, check_impl_option,
                     check_precision_option, check_tuning, int8_emulation_note, int8_fine_stage, int8_refusal,
                     interpreting, proj_module, proj_shapes, random_proj, weights_path_option)

if TYPE_CHECKING:
    import torch

    from ..kernels.tuning import KernelTuning
else:
    KernelTuning = Any  # the real type needs torch; `check_tuning` checks a given value against it

SLA_BLOCKS = (64, 128)  # block sizes in tokens (`vsagen.kernels.raster_blocks.BLOCK_SIZES`)


@dataclass(frozen=True)
class SLAOptions(DenseKnobs):
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
        precision: the sparse part's arithmetic, "bf16" (the run's dtype) or "int8": SageSLA's 8-bit numerics
            (`kernels.sage`: K smoothed, int8 q / k with one scale per query / key block, fp8 e4m3 P.V), on the
            Triton kernels or, with impl torch, the same formulas in float32 torch ops. With block_q 64 and
            block_k 128 this is TurboDiffusion's SageSLA on Hopper (its sm90 geometry; 128 / 64 elsewhere).
            Forward only (refused where gradients are needed); the selection and the linear branch stay in the
            run's dtype.

    Raises:
        BadInput: topk not a number in (0, 1], a block size not 64 or 128, an unknown feature map or impl, a
            tuning that is not a KernelTuning, query_rows not 64 or 128 (128 with block_q 64), a proj_weights
            path that is not a file, or a precision other than bf16 / int8.
    """

    topk: float = 0.1
    block_q: int = 128
    block_k: int = 64
    feature_map: Literal["softmax", "elu", "relu"] = "softmax"
    impl: Literal["auto", "triton", "torch"] = "auto"
    query_rows: int = 64
    proj_weights: Path | None = None
    precision: Literal["bf16", "int8"] = "bf16"
    tuning: KernelTuning | None = None

    def __post_init__(self) -> None:
        check_knobs(self)  # dense_steps, dense_layers, min_tokens (`vsagen.attention.dense`)
        check_precision_option(self.precision)
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
        check_impl_option(self.impl)
        check_tuning(self.tuning)
        if self.proj_weights is not None:
            object.__setattr__(self, "proj_weights", weights_path_option(self.proj_weights, "proj_weights"))


class SLAAttention(Backend):
    """SLA as TurboDiffusion runs it: top-k key blocks over raster token blocks plus a projected linear branch."""

    name = "sla"
    Options = SLAOptions
    tiled = False
    traceable = True  # torch ops and custom ops (the block-sparse kernels, the fused branch)
    weights = LayerWeights(key=TURBODIFFUSION_PROJ_KEY, attr="sla_proj_l", shapes=proj_shapes, build=proj_module,
                           optional=("bias",), file_option="proj_weights", aliases=(FASTVIDEO_PROJ_KEY,),
                           dtype="float32",
                           missing_note="sla: no trained projection (proj_l) in the checkpoint, so the linear branch "
                                        "is zero and only the sparse part runs (name one with proj_weights=FILE)")
    # `--attn auto` runs it for a checkpoint holding TurboDiffusion's or FastVideo's proj_l (before sla-star, whose
    # own key is vsagen's `attn1.proj_l`)
    auto_priority = 3

    def __init__(self, options: SLAOptions | None = None) -> None:
        super().__init__(options)
        self._groups: dict[tuple, torch.Tensor] = {}  # query-group tables per (S, H, device), for query_rows 128

    def resolved_impl(self, device: torch.device) -> str:
        """'triton' or 'torch' for tensors on `device` (`impl` auto: Triton on CUDA)."""
        if self.options.impl != "auto":
            return self.options.impl
        return "triton" if device.type == "cuda" else "torch"

    def check(self, device: torch.device, dtype: torch.dtype) -> None:
        """Raises BadInput for the Triton kernels on a CPU (unless the Triton interpreter is on), and for
        precision=int8 on a GPU without fp8 tensor cores (`shared.int8_refusal`)."""
        from ..errors import BadInput

        if self.resolved_impl(device) == "triton" and device.type != "cuda" and not interpreting():
            raise BadInput(f"impl triton (--attn-impl triton or {self.name}:impl=triton) needs a CUDA device (or "
                           "TRITON_INTERPRET=1 for the slow interpreter); use impl torch on CPU")
        why = int8_refusal(self.name, self.options.precision, self.resolved_impl(device), device)
        if why:
            raise BadInput(why)

    def prepare(self, run: RunInfo) -> tuple[str, ...]:
        """`check`; a note when the run's sequence is so short that SLA's int(topk * blocks) keeps no key block
        (vsagen keeps one: `raster_blocks.selected_blocks`), and where precision=int8 runs as float32 formulas
        (`shared.int8_emulation_note`)."""
        self.check(run.device, run.dtype)
        notes = int8_emulation_note(self.name, self.options.precision, self.resolved_impl(run.device))
        if run.grid is None:
            return notes
        seq = run.grid[0] * run.grid[1] * run.grid[2]
        n = -(-seq // self.options.block_k)
        if int(self.options.topk * n) < 1:
            return notes + (f"sla: topk {self.options.topk:g} of {n} key block{'s' if n != 1 else ''} keeps none by "
                            "SLA's rule int(topk * blocks) (its kernel would divide by zero); 1 is kept per query "
                            "block",)
        return notes

    def describe(self, device: torch.device | None = None) -> dict:
        """{"name", "topk", "block_q", "block_k", "feature_map", "impl", "query_rows"} (+ "proj_weights" when named) and, given the
        run's device, "impl_ran"."""
        o = self.options
        d = {"name": self.name, "topk": o.topk, "block_q": o.block_q, "block_k": o.block_k,
             "feature_map": o.feature_map, "impl": o.impl, "query_rows": o.query_rows}
        if o.proj_weights is not None:
            d["proj_weights"] = str(o.proj_weights)
        if o.precision != "bf16":
            d["precision"] = o.precision  # the sparse part's; the selection and the branch run in the run's dtype
        if device is not None:
            d["impl_ran"] = self.resolved_impl(device)
        return d

    def bench_params(self, heads: int, head_dim: int, device: torch.device, seed: int) -> torch.nn.Module:
        """A random projection of trained size (float32 Linear(D, D)) to time the branch with, as `sla-star`'s."""
        return random_proj(head_dim, device, seed)

    def select(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """SLA's selection of raster q, k (B, S, H, D) as the kernels' (q2k, q2k_cnt) over 64-token tiles
        (`raster_blocks.sla_block_map`, then `tile_lists`)."""
        from ..kernels import raster_blocks as rb

        o = self.options
        lut = rb.sla_block_map(q, k, o.topk, o.block_q, o.block_k)
        return rb.tile_lists(lut, q.shape[1], o.block_q, o.block_k)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        """q, k, v: (B, S, H, D) raster order -> (B, S, H, D) like q. Stages: coarse (the selection), fine (the
        sparse part; with gradients and a projection, the branch too, as one op), linear (the branch)."""
        import torch

        from ..kernels import raster_blocks as rb

        proj, timer, o = ctx.params, ctx.timer, self.options
        with timer.region("self_attention/coarse"):
            q2k, cnt = self.select(q, k)
        if self.resolved_impl(q.device) != "triton":
            return self._torch(q, k, v, q2k, cnt, proj, timer)
        from ..kernels.block_sparse_attn import block_sparse_attention, block_sparse_attention_grouped

        offsets = rb.raster_tile_offsets(q.shape[1], q.device)
        tuning = o.tuning
        grads = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
        if o.precision == "int8":
            groups = self.query_groups(q.shape[1], q.shape[2], offsets) if o.query_rows == 128 else None
            with timer.region("self_attention/fine"):
                out = int8_fine_stage(q, k, v, q2k, cnt, offsets, *self.int8_groups(q.shape[1], q.device),
                                      triton=True, tuning=tuning, groups=groups)
        elif o.query_rows == 128:  # one program per 128-token block (both of its tiles), the branch after it
            groups = self.query_groups(q.shape[1], q.shape[2], offsets)
            with timer.region("self_attention/fine"):
                out, _ = block_sparse_attention_grouped(q, k, v, q2k, cnt, offsets, groups, QUERY_LAUNCH[128],
                                                        tuning=tuning)
        elif proj is not None and (grads or any(p.requires_grad for p in proj.parameters())):
            from ..kernels.sla_star_attn import sla_star_attention

            with timer.region("self_attention/fine"):
                return sla_star_attention(q, k, v, q2k, cnt, offsets, proj.weight, proj.bias, scope="global",
                                          kind=o.feature_map, tuning=tuning)
        else:
            with timer.region("self_attention/fine"):
                out, _ = block_sparse_attention(q, k, v, q2k, cnt, offsets, tuning=tuning)
        if proj is None:
            return out
        from ..kernels.linear_branch import linear_branch_add

        with timer.region("self_attention/linear"):
            return linear_branch_add(out, q, k, v, proj.weight, proj.bias, kind=o.feature_map)

    def int8_groups(self, seq: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The token groups of precision=int8's scales over `seq` raster tokens: (query, key) block starts of
        block_q / block_k tokens, the blocks SLA selects (as SageSLA quantizes: TurboDiffusion core.py:186-203)."""
        from ..kernels.sage import block_offsets

        return block_offsets(seq, self.options.block_q, device), block_offsets(seq, self.options.block_k, device)

    def query_groups(self, seq: int, heads: int, offsets: torch.Tensor) -> torch.Tensor:
        """The query-group table (`kernels.query_groups.build_query_groups`, block_m 128) that gives each 128-token
        query block of `heads` heads over `seq` raster tokens one program; the two tiles of a block always share
        their key list (`raster_blocks.tile_lists`), so the table depends on the shape only. Cached per (seq,
        heads, device); int32 on `offsets`' device."""
        key = (seq, heads, str(offsets.device))
        if key not in self._groups:
            import torch

            from ..kernels import raster_blocks as rb
            from ..kernels.query_groups import block_query_groups

            with torch.inference_mode(False):
                block_of = torch.arange(offsets.numel() - 1) // (self.options.block_q // rb.TILE)
                self._groups[key] = block_query_groups(block_of, heads, rb.raster_tile_offsets(seq, "cpu"),
                                                       128).to(offsets.device)
        return self._groups[key]

    def _torch(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2k: torch.Tensor, cnt: torch.Tensor,
               proj: Any, timer: Any) -> torch.Tensor:
        """The float references: the sparse part over the raster tiles (`raster_blocks.block_sparse_reference`),
        the branch in float32 (`reference.linear_attention_branch`)."""
        import torch

        from ..kernels import raster_blocks as rb
        from ..kernels import reference as ref

        with timer.region("self_attention/fine"):
            if self.options.precision == "int8":
                out = int8_fine_stage(q, k, v, q2k, cnt, rb.raster_tile_offsets(q.shape[1], q.device),
                                      *self.int8_groups(q.shape[1], q.device), triton=False)
            else:
                out = rb.block_sparse_reference(q, k, v, q2k, cnt)
        if proj is None:
            return out
        with timer.region("self_attention/linear"):
            o_l = ref.linear_attention_branch(q, k, v, kind=self.options.feature_map)
            branch = torch.nn.functional.linear(o_l.float(), proj.weight.float(), proj.bias.float())
            return out + branch.to(out.dtype)
