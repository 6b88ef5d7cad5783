"""`vsa`: Video Sparse Attention (arXiv 2505.13389, sec. 2).

Coarse stage: mean-pool q, k, v per (4,4,4) tile with true token counts, tile-level scores, top-k key tiles
per query tile with K = ceil((1 - sparsity) * n_tiles). Fine stage: token attention over the selected tiles.
The `tile` option sets the cube: (4, 4, 4) by default, or FastVideo's larger VSA tile volumes (4, 4, 8) = 128 and
(4, 8, 8) = 256 tokens; the coarse stage then pools, scores and selects those cubes (top-k counted in them), and the
fine stage runs each selected cube as its 64-token kernel tiles (`vsagen.kernels.tile_expand`).
Output = fine + gate * coarse, where coarse is the tile-level attention of the pooled tiles broadcast to each tile's
tokens and gate = Linear(dim, dim)(the attn1 input), unflattened per head, no sigmoid (FastVideo's
WanTransformerBlock_VSA; the attn1 input is the modulated norm1 output its q, k, v are projected from). The gate is zero
(pure fine output) unless trained `to_gate_compress` weights are loaded: the checkpoint's
`blocks.{i}.to_gate_compress.{weight,bias}` (the canonical key, at the block level as FastVideo's published VSA
checkpoints store it; `blocks.{i}.attn1.to_gate_compress.*` is accepted as an alias, one scheme per layer), or the
file named by the `gate_weights` option. The backend owns them (`weights`, attached as `attn1.to_gate_compress`),
and each layer's processor hands its gate projection over as `ctx.params`.

Two implementations of the same function, chosen by the `impl` option:
* "triton": the kernels in `vsagen.kernels` (fused pooling + top-k into q2k lists, block-sparse flash
  attention forward and backward). The default on CUDA, except where `auto` picks "fa4" (below).
* "torch": the eager reference in `vsagen.kernels.reference`, the oracle of the tests. The default elsewhere.
* "fa4": the coarse stage on the Triton kernels, the fine stage on FlashAttention-4's block-sparse kernels
  (`vsagen.kernels.fa4_block_sparse`: the cube lists as FA4's full / mask 128-token blocks over the cube-padded
  sequence), for tiles of 128 or 256 tokens on NVIDIA sm90 / sm100 with `flash-attn-4` installed; refused before
  loading anywhere else (`check`). "auto" runs the fine stage on FA4 wherever it was measured faster than vsagen's
  Triton fine stage: a grid of whole cubes of 128 or 256 tokens (e.g. `--tile-fit crop`: no padding, no mask
  blocks), bf16 / fp16, on sm90 with FA4 installed, eager (H100, 2026-12-05, BENCHMARKS.md: forward 1.29-1.32x,
  forward+backward 1.40-1.45x, the 1.3B DiT 1.09x). On grids with partial cubes FA4 must pad them and loses:
  Triton runs there.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..errors import BadInput
from ..layout import parse_tile
from .base import AttnContext, Backend, LayerWeights
from .dense import DenseKnobs, check_knobs
from .shared import (DEFAULT_QUERY_BLOCK, DEFAULT_SPARSITY, IMPLS, QUERY_BLOCKS, QUERY_LAUNCH, TILE_FIELD,
                     check_impl_option, check_precision_option, check_tuning, int8_emulation_note, int8_fine_stage,
                     int8_refusal, interpreting, kernel_lists, tile_option, weights_path_option)

if TYPE_CHECKING:
    import torch

    from ..kernels.tuning import KernelTuning
else:
    KernelTuning = Any  # the real type needs torch; `check_tuning` checks a given value against it

VSA_IMPLS = IMPLS + ("fa4",)  # vsa / rocm-vsa: also FlashAttention-4's block-sparse kernels (tiles of 128 / 256)
# The trained gate's checkpoint keys: FastVideo's published block-level name (canonical) and the name under `attn1`
# (an alias) that vsagen read before.
GATE_KEY = "blocks.{layer}.to_gate_compress"
GATE_ALIASES = ("blocks.{layer}.attn1.to_gate_compress",)
TOPK_COUNTS = ("tiles", "tokens")  # the `topk_count` option: what VSA's top-k is counted from


@dataclass(frozen=True)
class VSAOptions(DenseKnobs):
    """Options of `vsa`.

    Attributes:
        sparsity: fraction of key tiles skipped per query tile, in [0, 1) (`--sparsity`); top-k =
            ceil((1 - sparsity) * tiles) (`topk_count`).
        topk_count: what the top-k is counted from: "tiles", ceil((1 - sparsity) * tiles), partial tiles counted
            whole (FastVideo since its PR #1517, 2026-07: video_sparse_attn.py:166-169 @2f3d407), or "tokens",
            ceil((1 - sparsity) * tokens / tile volume) (FastVideo before it, what FastWan and Wan2.1-VSA were
            trained with: `vsagen.kernels.reference.top_k_from_tokens`). The two differ only on grids with partial
            tiles (480x832x81 at 0.8: 125 kept tiles of 624 vs 103).
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
        precision: the fine stage's arithmetic, "bf16" (the run's dtype) or "int8": SageSLA's 8-bit numerics
            (`kernels.sage`: int8 Q.K^T with K smoothing and scales per 64-token kernel tile, fp8 e4m3 P.V) on the
            Triton kernels, or the same formulas in float32 torch ops with impl torch. Forward only (refused where
            gradients are needed: there is no 8-bit backward); not with impl fa4 (auto keeps the Triton fine stage
            then). The coarse stage and the gate stay in the run's dtype.

    Raises:
        BadInput: sparsity not a number in [0, 1), an unknown impl, a tile that is not such a cube, query_rows not
            64 or 128 (128 with a 64-token tile), a tuning that is not a KernelTuning, a gate_weights path that is
            not a file, a precision other than bf16 / int8 (int8 with impl fa4), or a topk_count other than tiles /
            tokens.
    """

    sparsity: float = DEFAULT_SPARSITY
    impl: Literal["auto", "triton", "torch", "fa4"] = "auto"
    tile: str = field(**TILE_FIELD)  # type: ignore[assignment]
    query_rows: int = field(default=DEFAULT_QUERY_BLOCK, metadata={"values": "64 | 128 (128: a 128 / 256-token tile)"})
    gate_weights: Path | None = None
    precision: Literal["bf16", "int8"] = "bf16"
    topk_count: Literal["tiles", "tokens"] = "tiles"
    tuning: KernelTuning | None = None

    def __post_init__(self) -> None:
        check_knobs(self)  # dense_steps, dense_layers, min_tokens (`vsagen.attention.dense`)
        object.__setattr__(self, "tile", tile_option(self.tile))
        if self.topk_count not in TOPK_COUNTS:
            raise BadInput(f"topk_count must be one of {', '.join(TOPK_COUNTS)}, got {self.topk_count!r}")
        check_precision_option(self.precision)
        if self.precision != "bf16" and self.impl == "fa4":
            raise BadInput(f"precision={self.precision} runs vsagen's fine stage (impl triton or torch), not FA4's "
                           "(impl fa4)")
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
        check_impl_option(self.impl, VSA_IMPLS)
        check_tuning(self.tuning)
        if self.gate_weights is not None:
            object.__setattr__(self, "gate_weights", weights_path_option(self.gate_weights, "gate_weights"))


def _gate_shapes(attn: Any) -> dict[str, tuple[int, ...]]:
    """The gate projection maps the attn1 input (dim) to one gate value per head channel (heads x head dim),
    as `to_q` does."""
    out_features, in_features = attn.to_q.weight.shape if hasattr(attn, "to_q") else (attn.inner_dim, attn.query_dim)
    return {"weight": (out_features, in_features), "bias": (out_features,)}


def _gate_module(tensors: dict[str, torch.Tensor], attn: Any) -> torch.nn.Module:
    """A Linear holding the trained gate, in the stored dtype (the loader then casts it to the transformer's: built
    in float32 first, a float64 gate would lose its precision on the way)."""
    import torch

    w = tensors["weight"]
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias="bias" in tensors, dtype=w.dtype)
    lin.load_state_dict(tensors)
    return lin


class VSAAttention(Backend):
    """VSA with a fixed sparsity (fraction of key tiles skipped per query tile)."""

    name = "vsa"
    Options = VSAOptions
    tiled = True
    # Both implementations trace without a graph break: "triton" through the custom ops vsagen::coarse_stage and
    # vsagen::block_sparse_attn, "torch" as plain static-shape torch ops.
    traceable = True
    weights = LayerWeights(key=GATE_KEY, attr="to_gate_compress", shapes=_gate_shapes, build=_gate_module,
                           optional=("bias",), file_option="gate_weights", aliases=GATE_ALIASES)
    auto_priority = 1  # `--attn auto` runs vsa for a checkpoint holding trained gates (after sla-star: auto.py)

    kernel_profile = "vsa"  # `kernels.tuning.kernel_tuning`'s profile of the Triton kernels' default tuning
    auto_fa4 = True  # impl auto may run the fine stage on FA4 (`auto_engine`); rocm-vsa and sla-star's VSA do not
    ws_forward = True  # the default tuning may run the warp-specialized forward (`fine_tuning`); as auto_fa4

    def __init__(self, options: VSAOptions | None = None) -> None:
        super().__init__(options)
        self._groups: dict[tuple[int, int], tuple[Any, torch.Tensor]] = {}  # query_rows 128: (layout, table)
        self._fa4_here: dict[tuple[str, int], bool] = {}  # (device, tile volume) -> FA4 runs there (sm90, installed)
        self._ran: str | None = None  # the engine of the latest eager call ("triton", "torch", "fa4"), for describe
        self._fine_kernel: str | None = None  # its Triton forward kernel ("warp-specialized" | "pipelined")
        self._ws_tunings: dict[Any, Any] = {}  # a tuning -> the same with fwd_warp_specialized (`fine_tuning`)

    def tuning(self, q: torch.Tensor):
        """The Triton kernels' tuning for q (B, S, H, D): the `tuning` option, else the device's default of this
        backend's kernel profile (`kernels.tuning.default_tuning`)."""
        from ..kernels.tuning import default_tuning

        t = self.options.tuning
        return default_tuning(q.device, q.shape[-1], self.kernel_profile) if t is None else t

    def fine_tuning(self, tuning: Any, layout: Any) -> Any:
        """The fine stage's tuning: `tuning` (this call's, `tuning(q)`) with `fwd_warp_specialized` on where the
        warp-specialized forward measured faster than the pipelined one (`kernels.bsa_forward_ws.ws_forward_pays`:
        256-token cubes, or any cubes where every cube is whole; H200 and H100, BENCHMARKS.md 2026-12-06). Only for
        this backend's default tuning (no `tuning` option), query_rows 64 and TMA loads; the kernel itself still
        runs only where it can (`ws_unsupported`: sm_90, bf16 / fp16, D 64 / 128), the pipelined one elsewhere."""
        if (not self.ws_forward or self.options.tuning is not None or self.options.query_rows != 64
                or not tuning.tma_loads or tuning.fwd_warp_specialized):
            return tuning
        from ..kernels.bsa_forward_ws import ws_forward_pays
        from ..kernels.fa4_block_sparse import every_cube_full

        whole = every_cube_full(layout.num_tiles, layout.tile_volume, layout.num_tokens)
        if not ws_forward_pays(layout.tile_volume, whole):
            return tuning
        if tuning not in self._ws_tunings:  # one object per tuning, validated once (a dict: dynamo traces it)
            self._ws_tunings[tuning] = dataclasses.replace(tuning, fwd_warp_specialized=True)
        return self._ws_tunings[tuning]

    @property
    def sparsity(self) -> float:
        """The `sparsity` option."""
        return self.options.sparsity

    def top_k(self, layout: Any) -> int:
        """The key tiles each query tile keeps on `layout` (a `vsagen.layout.TileLayout`), counted as the
        `topk_count` option says (`kernels.reference.top_k_from_sparsity` / `top_k_from_tokens`)."""
        from ..kernels import reference as ref

        if self.options.topk_count == "tokens":
            return ref.top_k_from_tokens(self.sparsity, layout.num_tokens, layout.tile_volume, layout.num_tiles)
        return ref.top_k_from_sparsity(self.sparsity, layout.num_tiles)

    @property
    def tile(self) -> tuple[int, int, int]:  # type: ignore[override]
        """The `tile` option as (tt, th, tw): the cube of the layout the tile-order hooks build."""
        return parse_tile(self.options.tile)

    @property
    def impl(self) -> str:
        """The `impl` option, as asked ("auto" included)."""
        return self.options.impl

    def query_groups(self, layout: Any, heads: int) -> torch.Tensor:
        """The query-group table (`kernels.query_groups.block_query_groups`, block_m 128) that runs each cube's rows
        of `heads` heads in programs of 128 (the cube's kernel tiles share its key list in every batch entry, so the
        table depends on the layout only). Cached per (layout, heads); int32 on the layout's device."""
        key = (id(layout), heads)
        if key not in self._groups:
            import torch

            from ..kernels.query_groups import block_query_groups

            with torch.inference_mode(False):
                self._groups[key] = (layout, block_query_groups(layout.kernel_tile_of, heads, layout.kernel_offsets_i32,
                                                                128).to(layout.kernel_offsets_i32.device))
        return self._groups[key][1]

    def resolved_impl(self, device: torch.device) -> str:
        """'triton', 'torch' or 'fa4' for tensors on `device` ('auto': Triton on CUDA, else torch; a call on a grid
        of whole cubes may then run FA4's fine stage instead: `auto_engine`)."""
        if self.impl != "auto":
            return self.impl
        return "triton" if device.type == "cuda" else "torch"

    def auto_engine(self, q: torch.Tensor, layout: Any) -> str:
        """The fine stage's engine for impl auto on CUDA: "fa4" where it was measured faster than the Triton fine
        stage, else "triton".

        FA4 where all of these hold: this backend may (`auto_fa4`: `vsa`, not `rocm-vsa` or `sla-star`'s VSA), the
        Triton-only options are at their defaults (query_rows 64, no tuning), q is bf16 / fp16, the call is eager
        (not traced by torch.compile: the custom ops are), every cube of the layout is whole and holds 128 or 256
        tokens (`kernels.fa4_block_sparse.every_cube_full`), and the GPU is sm90 with FA4 installed
        (`fa4_unavailable`; sm100 was not measured) in the version the adapter follows (`fa4_is_pinned_version`).
        Measured on the H100 (2026-12-05, BENCHMARKS.md, fifth session: the 1.3B grid rounded up to whole cubes):
        forward 2.43 / 2.39 ms against 3.29 / 3.30 ms at 4x4x8 / 4x8x8, forward + backward 9.26 / 9.10 against
        13.11 / 13.25 ms; in the 1.3B DiT at `--tile-fit crop` 0.619 against 0.687 s/step. On the model's grid with
        partial cubes FA4 must pad them (31% more rows at 1.3B) and is slower (3.38 against 2.11 ms forward).

        Args:
            q: (B, S, H, D) on a CUDA device.
            layout: the call's `TileLayout`.
        """
        import torch

        from ..kernels.fa4_block_sparse import FA4_BLOCK, every_cube_full, fa4_is_pinned_version, fa4_unavailable

        volume = layout.tile_volume
        if (not self.auto_fa4 or self.options.query_rows != 64 or self.options.tuning is not None
                or self.options.precision != "bf16"
                or q.dtype not in (torch.bfloat16, torch.float16) or volume % FA4_BLOCK
                or torch.compiler.is_compiling() or not every_cube_full(layout.num_tiles, volume, layout.num_tokens)):
            return "triton"
        key = (str(q.device), volume)
        if key not in self._fa4_here:
            self._fa4_here[key] = (torch.cuda.get_device_capability(q.device)[0] == 9
                                   and fa4_unavailable(q.device, volume) is None and fa4_is_pinned_version())
        return "fa4" if self._fa4_here[key] else "triton"

    def check(self, device: torch.device, dtype: torch.dtype) -> None:
        """Raises BadInput for the Triton kernels on a CPU (unless the Triton interpreter is on), for impl fa4
        where FA4 cannot run (`kernels.fa4_block_sparse.fa4_unavailable`: the tile, the device, the package) or in
        float32, and for precision=int8 on a GPU without fp8 tensor cores (`shared.int8_refusal`)."""
        import torch

        if self.impl == "fa4":
            from ..kernels.fa4_block_sparse import FA4_BLOCK, fa4_unavailable

            volume = math.prod(self.tile)
            # every reason at once (the tile's and the machine's), so one fix is not followed by another refusal
            reasons = [fa4_unavailable(device, volume if volume % FA4_BLOCK == 0 else 2 * FA4_BLOCK),
                       fa4_unavailable(device, volume) if volume % FA4_BLOCK else None]
            # the dtype where it is the next fix: on a GPU, or alone (off a GPU --dtype bf16 would not help)
            if dtype not in (torch.bfloat16, torch.float16) and (device.type == "cuda" or not any(reasons)):
                reasons.append(f"FA4 runs bf16 / fp16, not {str(dtype).replace('torch.', '')} (--dtype bf16)")
            why = "; ".join(dict.fromkeys(r for r in reasons if r))
            if why:
                raise BadInput(f"impl fa4 (--attn-impl fa4 or {self.name}:impl=fa4): {why}")
        if self.resolved_impl(device) == "triton" and device.type != "cuda" and not interpreting():
            raise BadInput(f"impl triton (--attn-impl triton or {self.name}:impl=triton) needs a CUDA device (or "
                           "TRITON_INTERPRET=1 for the slow interpreter); use impl torch on CPU")
        why = int8_refusal(self.name, self.options.precision, self.resolved_impl(device), device)
        if why:
            raise BadInput(why)

    def prepare(self, run: Any) -> tuple[str, ...]:
        """`check(run.device, run.dtype)`; a note where `query_rows=128` has no effect (it sets the Triton fine
        stage's programs: the torch reference and FA4 ignore it), and where precision=int8 runs as float32 formulas
        (`shared.int8_emulation_note`)."""
        self.check(run.device, run.dtype)
        impl = self.resolved_impl(run.device)
        notes = int8_emulation_note(self.name, self.options.precision, impl)
        if self.options.query_rows != 64 and impl != "triton":
            how = "the torch reference" if impl == "torch" else "FA4's fine stage"
            notes += (f"{self.name}: query_rows={self.options.query_rows} has no effect with {how} (impl {impl}): it "
                      "sets the programs of the Triton fine stage (impl triton, on CUDA)",)
        return notes

    def describe(self, device: torch.device | None = None) -> dict:
        """{"name", "sparsity", "impl", "tile"} and, given the run's device, "impl_ran" ("triton" | "torch")."""
        d = {"name": self.name, "sparsity": self.sparsity, "impl": self.impl, "tile": self.options.tile}
        if self.options.query_rows != 64:
            d["query_rows"] = self.options.query_rows
        if self.options.gate_weights is not None:
            d["gate_weights"] = str(self.options.gate_weights)
        if self.options.precision != "bf16":
            d["precision"] = self.options.precision  # the fine stage's; the coarse stage runs in the run's dtype
        if self.options.topk_count != "tiles":
            d["topk_count"] = self.options.topk_count
        if device is not None:
            d["impl_ran"] = self.resolved_impl(device)
            if self.impl == "auto" and device.type == "cuda" and self._ran:  # auto may have run FA4: say what ran
                d["impl_ran"] = self._ran  # (one grid per run, so one engine: the latest call's)
            if d["impl_ran"] == "triton" and device.type == "cuda" and self._fine_kernel:
                d["fine_kernel"] = self._fine_kernel  # the Triton forward that ran (`fine_tuning`)
        return d

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        """q, k, v: (B, S, H, D) tile order -> (B, S, H, D) like q. Stages: coarse, fine. With a trained gate
        (`ctx.params`, a Linear on `ctx.hidden_states`) the coarse output is added, gated."""
        layout = ctx.layout
        if layout is None:
            raise RuntimeError("vsa needs tokens in tile order with a TileLayout (tile-order hooks missing)")
        gate = None
        if ctx.params is not None:
            gate = ctx.params(ctx.hidden_states).unflatten(2, (q.shape[2], -1))
        return self.attend(q, k, v, layout, gate, ctx.timer)[0]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Any, gate: torch.Tensor | None,
               timer: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """VSA on tile-ordered q, k, v (B, S, H, D) with an optional gate (B, S, H, D).

        Returns:
            out: (B, S, H, D) like q.
            q2k: (B, H, Q_TILES, K) integer, the key tiles each query tile selected (for backends built on VSA's
                selection, e.g. `sla-star`'s marginal scope).
        """
        import torch

        top_k = self.top_k(layout)
        impl = self.resolved_impl(q.device)
        if impl == "triton" and self.impl == "auto":
            impl = self.auto_engine(q, layout)
        if not torch.compiler.is_compiling():
            self._ran = impl
        if impl in ("triton", "fa4"):
            return self._triton(q, k, v, layout, gate, timer, top_k, fa4=impl == "fa4")
        return self._torch(q, k, v, layout, gate, timer, top_k)

    def _torch(self, q, k, v, layout, gate, timer, top_k):
        """The eager reference: (out, q2k) as `attend`."""
        from ..kernels import reference as ref

        with timer.region("self_attention/coarse"):
            q_c = ref.tile_mean_pool(q, layout.token_tile, layout.tile_sizes)
            k_c = ref.tile_mean_pool(k, layout.token_tile, layout.tile_sizes)
            scores = ref.tile_scores(q_c, k_c)
            q2k = ref.select_top_k(scores.detach(), top_k)
            coarse = None
            if gate is not None:
                v_c = ref.tile_mean_pool(v, layout.token_tile, layout.tile_sizes)
                coarse = ref.coarse_attention(q_c, k_c, v_c, scores).index_select(1, layout.token_tile)
        with timer.region("self_attention/fine"):
            if self.options.precision == "int8":
                out = self._torch_int8(q, k, v, layout, q2k)
            else:
                out, _ = ref.block_sparse_attention_reference(q, k, v, q2k, layout.slots, layout.slot_valid)
        if coarse is not None:
            out = out + (gate.to(coarse.dtype) * coarse).to(out.dtype)
        return out, q2k

    def _torch_int8(self, q, k, v, layout, q2k):
        """The 8-bit fine stage in torch ops (float32) over the cube lists q2k expanded to kernel tiles, int8
        scales per kernel tile: the formulas the Triton kernels run (`shared.int8_fine_stage`)."""
        import torch

        from ..kernels.tile_expand import expand_to_kernel_tiles

        cnt = torch.full(q2k.shape[:3], q2k.shape[-1], dtype=torch.int32, device=q2k.device)
        lists, counts = expand_to_kernel_tiles(q2k, cnt, layout.tile_kernel_first, layout.tile_kernel_count,
                                               layout.kernel_tile_of, layout.kernel_tiles_per_tile)
        off = layout.kernel_offsets_i32
        return int8_fine_stage(q, k, v, lists, counts, off, off, off, triton=False)

    def _triton(self, q, k, v, layout, gate, timer, top_k, fa4=False):
        """The Triton kernels (with `fa4`, FA4's for the fine stage): (out, q2k) as `attend`."""
        import torch

        from ..kernels import reference as ref
        from ..kernels.block_sparse_attn import block_sparse_attention
        from ..kernels.coarse import coarse_stage

        tuning = self.tuning(q)
        with timer.region("self_attention/coarse"):
            c = coarse_stage(q, k, layout.tile_offsets_i32, top_k, v=v if gate is not None else None, tuning=tuning)
            if not fa4:
                lists, counts, offsets = kernel_lists(layout, c.q2k, c.q2k_cnt)
        with timer.region("self_attention/fine"):
            if fa4:
                from ..kernels.fa4_block_sparse import fa4_block_sparse_attention

                out = fa4_block_sparse_attention(q, k, v, c.q2k, c.q2k_cnt, layout.tile_sizes, layout.slots,
                                                 layout.slot_valid, layout.tile_volume)
            elif self.options.precision == "int8":  # the 8-bit fine stage, scales per kernel tile
                groups = self.query_groups(layout, q.shape[2]) if self.options.query_rows == 128 else None
                out = int8_fine_stage(q, k, v, lists, counts, offsets, offsets, offsets, triton=True, tuning=tuning,
                                      groups=groups)
                if not torch.compiler.is_compiling():
                    self._fine_kernel = "pipelined"
            elif self.options.query_rows == 128:  # one program per 128 rows of a cube (its kernel tiles' one list)
                from ..kernels.block_sparse_attn import block_sparse_attention_grouped

                out, _ = block_sparse_attention_grouped(q, k, v, lists, counts, offsets,
                                                        self.query_groups(layout, q.shape[2]), QUERY_LAUNCH[128],
                                                        tuning=tuning)
            else:
                tuning = self.fine_tuning(tuning, layout)
                out, _ = block_sparse_attention(q, k, v, lists, counts, offsets, tuning=tuning)
                if not torch.compiler.is_compiling():  # after the call: a Gluon kernel that failed in it ran no more
                    self._fine_kernel = _fine_kernel(tuning, q, k, v)
        if gate is not None:
            coarse = ref.coarse_attention(c.q_c, c.k_c, c.v_c, c.scores).index_select(1, layout.token_tile)
            out = out + (gate.to(coarse.dtype) * coarse).to(out.dtype)
        return out, c.q2k


def _fine_kernel(tuning: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
    """Which forward kernel `bsa_fwd` runs with `tuning` on q, k, v: "warp-specialized" or "pipelined"."""
    if tuning.fwd_warp_specialized:
        from ..kernels.bsa_forward_ws import ws_unsupported

        if ws_unsupported(q, k, v) is None:
            return "warp-specialized"
    return "pipelined"
