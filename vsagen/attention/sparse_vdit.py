"""`sparse-vdit`: Sparse-vDiT's static per-(layer, head) attention patterns (seed 003, arXiv 2506.03065).

Every head of every layer runs one pattern found offline by `vsagen search` (`vsagen.sparsity`): dense, skip
(zero output), diagonal, multi-diagonal, vertical stripe or a union of them, each compiled once per (tile grid,
pattern) to the q2k index tables of `vsa`'s block-sparse kernels. The modes come from a pattern file (the
`patterns` option; a preset may name a default under `vsagen/preset_data/patterns/`), per step range, expert, layer and head.

Head fusion: all heads of a layer run in one call of the block-sparse kernel whatever their modes, from per-head
index tables (a (1, H, Q_TILES, K) table with K the layer's widest row, expanded over the batch); skip heads have
empty rows (their programs exit at once) and a layer whose heads all skip launches nothing. A layer whose heads are
all dense runs torch's SDPA (cuDNN on CUDA) instead, and (option `sdpa_heads`, on by default) so does every head
whose query tiles all share one key list (dense, vertical-stripe): SDPA over that list's tokens, one call per
distinct list, those heads' rows emptied in the kernel's tables (dense cuDNN computes a block faster than the
block-sparse kernel, BENCHMARKS.md). There is no coarse stage: the selection is static, so the
kernels run over query groups (`vsagen.kernels.query_groups`, the `query_block` option): tiles of a head with equal
key lists share a program and partial query tiles are packed, in the forward and dQ kernels, and the dK/dV loop
packs partial query tiles as well (`block_sparse_attention_grouped`).

Implementations (`impl`): "triton" (the kernels, the default on CUDA) and "torch" (token-level masked attention in
fp32 from the same tables, the default elsewhere and the tests' per-head reference is built independently from the
oracle masks).

A file searched on another architecture (model, layer or head count) or expert is refused when the backend is
prepared for a run (`prepare`: before loading with the preset's architecture, and when `vsagen.apply` binds it to the
loaded transformers); one searched at another size is refused once the run's grid is known, unless `remap=true`
(`vsagen.sparsity.files`). What each layer ran is in `report(device).layers`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Mapping

from ..architecture import architecture_of
from ..errors import BadInput
from ..sparsity.files import PatternFile, file_hash, load_patterns
from ..sparsity.patterns import Pattern, block_map, q2k_table, skip
from .base import AttnContext, Backend, BackendReport, RunInfo
from .dense import DenseKnobs, check_knobs
from .shared import (DEFAULT_QUERY_BLOCK, QUERY_BLOCKS, QUERY_LAUNCH, check_impl_option, check_tuning, interpreting,
                     knob_info)

if TYPE_CHECKING:
    import torch

    from ..kernels.tuning import KernelTuning
else:
    KernelTuning = Any  # the real type needs torch; `check_tuning` checks a given value against it


@dataclass(frozen=True)
class SparseVDiTOptions(DenseKnobs):
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
        BadInput: a patterns path that is not a file, or not a pattern file (`load_patterns`), an unknown impl, a
            tuning that is not a KernelTuning.
    """

    patterns: Path | None = None
    remap: bool = False
    impl: Literal["auto", "triton", "torch"] = "auto"
    query_block: int = DEFAULT_QUERY_BLOCK
    tuning: KernelTuning | None = None
    sdpa_heads: bool = True

    def __post_init__(self) -> None:
        check_knobs(self)  # dense_steps, dense_layers, min_tokens (`vsagen.attention.dense`)
        if self.patterns is not None:
            if not str(self.patterns).strip():
                raise BadInput("patterns is empty: give a pattern file (write one with `vsagen search`)")
            path = Path(self.patterns).expanduser()
            if path.is_dir():
                raise BadInput(f"patterns {str(path)!r} is a folder: give a pattern file (.json)")
            if not path.is_file():
                raise BadInput(f"patterns {str(path)!r}: no such file (write one with `vsagen search`)")
            object.__setattr__(self, "patterns", path.resolve())  # the run's JSON records where it really is
            load_patterns(path)  # JSON of a pattern file, or one line naming it when the option is given (the
            # backend reads it again when built, after torch loads; its architecture and grid are checked then)
        for name in ("remap", "sdpa_heads"):
            if not isinstance(getattr(self, name), bool):
                raise BadInput(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.query_block not in QUERY_BLOCKS and self.query_block != 0:
            raise BadInput(f"query_block must be 0, {' or '.join(map(str, QUERY_BLOCKS))}, got {self.query_block!r}")
        check_impl_option(self.impl)
        check_tuning(self.tuning)


CACHE_BYTES = 1 << 30  # per-layer index tables kept on the device, at most (beyond it they are rebuilt per call)


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
    """Token-level attention under a per-head boolean mask, in fp32 (fp64 for fp64 input); rows with no key give 0.

    Args:
        q, k, v: (B, S, H, D).
        token_mask: (H, S, S) bool, [h, i, j]: query i of head h attends to key j.

    Returns:
        (B, S, H, D) like q.
    """
    import torch

    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = q.shape[-1] ** -0.5
    outs = []
    for h in range(q.shape[2]):  # one head at a time bounds memory at (B, S, S)
        logits = torch.einsum("bsd,btd->bst", q[:, :, h].to(acc), k[:, :, h].to(acc)) * scale
        logits = logits.masked_fill(~token_mask[h], float("-inf"))
        p = torch.softmax(logits, dim=-1).nan_to_num(0.0)  # an empty row: softmax of -inf is NaN -> 0
        outs.append(torch.einsum("bst,btd->bsd", p, v[:, :, h].to(acc)))
    return torch.stack(outs, dim=2).to(q.dtype)


class SparseVDiTAttention(Backend):
    """Static per-head patterns from a pattern file, all heads of a layer in one block-sparse launch."""

    name = "sparse-vdit"
    Options = SparseVDiTOptions
    tiled = True
    traceable = False  # the per-layer table lookup is Python; the kernel call runs eagerly between graphs
    per_layer = True  # each (expert, layer) has its own modes: benchmarks time every layer, `report` has their rows

    def __init__(self, options: SparseVDiTOptions | None = None) -> None:
        super().__init__(options)
        self.file: PatternFile | None = None
        self.file_sha256: str | None = None
        if self.options.patterns is not None:
            self.file = load_patterns(self.options.patterns)
            self.file_sha256 = file_hash(self.options.patterns)
        self._tables: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._cached_bytes = 0
        self._checked_grids: set[tuple[int, int, int]] = set()
        self._run_grid: tuple[int, int, int] | None = None
        self._run_steps: int | None = None
        self.layer_stats: dict[tuple[str | None, int], dict[str, Any]] = {}

    @property
    def where(self) -> str:
        return f"pattern file {self.options.patterns}"

    def resolved_impl(self, device: torch.device) -> str:
        """'triton' or 'torch' for tensors on `device`."""
        if self.options.impl != "auto":
            return self.options.impl
        return "triton" if device.type == "cuda" else "torch"

    def check(self, device: torch.device, dtype: torch.dtype) -> None:
        """Raises BadInput without a pattern file, or for the Triton kernels on a CPU without the interpreter."""
        import torch

        if self.file is None:
            raise BadInput("sparse-vdit needs a pattern file, its option patterns=FILE (--attn sparse-vdit:patterns="
                           "FILE; in Python vsagen.apply(pipe, 'sparse-vdit', patterns=FILE)); write one with `vsagen "
                           "search`")
        if self.resolved_impl(device) == "triton" and dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise BadInput(f"--attn sparse-vdit's Triton kernels take bf16, fp16 or fp32, not {dtype}; use "
                           "impl=torch")
        if self.resolved_impl(device) == "triton" and device.type != "cuda" and not interpreting():
            raise BadInput("impl triton (--attn-impl triton or sparse-vdit:impl=triton) needs a CUDA device (or "
                           "TRITON_INTERPRET=1 for the slow interpreter); use impl torch on CPU")

    def prepare(self, run: RunInfo) -> tuple[str, ...]:
        """Take a run: `check` its device and dtype, refuse transformers the file was not searched on (`bind`) and
        a grid it was not searched at (`check_grid`), map the file's step ranges onto the run's step count
        (`check_steps`, whose note is returned), and forget what the layers ran in the previous run (a run on
        another grid runs other tables).

        Raises:
            BadInput: see `check`, `bind`, `check_grid`.
        """
        self.check(run.device, run.dtype)
        names = run.expert_names
        for expert in run.experts:
            self.bind(expert.architecture, expert.name, experts=names)
        if run.grid is not None:
            self.check_grid(run.grid)
        self.layer_stats.clear()
        notes = [self.check_steps(run.steps) if run.steps is not None else None]
        if run.model is not None and run.model != self.file.model:  # the architecture matched (bind)
            notes.append(f"sparse-vdit: {self.where} was searched on {self.file.model}, this run is {run.model} (the "
                         f"same architecture, so it runs; patterns searched on other weights may fit these less "
                         f"well: `vsagen search --model {run.model}` searches this one)")
        return tuple(n for n in notes if n is not None)

    def bind(self, transformer: Any, expert: str | None, experts: Any = None) -> None:
        """Refuse a transformer the pattern file was not searched on (`prepare` calls it for each expert).

        Args:
            transformer: a diffusers WanTransformer3DModel, or its architecture (`vsagen.architecture`'s dict);
                expert: its component name (None: a bare transformer).
            experts: the component names of every transformer of the pipeline, if known.

        Raises:
            BadInput: another architecture (model, layer or head count), an expert the file does not cover, or a
                pipeline with other experts than the file's (a two-expert file on a one-expert model, or back).
        """
        if self.file is None:
            return
        arch = transformer if isinstance(transformer, Mapping) else architecture_of(transformer)
        self.file.check_architecture(arch, expert, self.where)
        names = [e for e in (experts or ()) if e is not None]
        if names and set(names) != set(self.file.experts):
            raise BadInput(f"{self.where} covers {', '.join(self.file.experts)}, this pipeline has "
                           f"{', '.join(names)}: search again on this model")

    def check_grid(self, grid: tuple[int, int, int]) -> None:
        """Refuse a latent grid the file was not searched at, unless the `remap` option is on.

        Raises:
            BadInput: see `PatternFile.check_grid`.
        """
        if self.file is not None and tuple(grid) not in self._checked_grids:
            self.file.check_grid(grid, self.options.remap, self.where)
            self._checked_grids.add(tuple(grid))
        self._run_grid = tuple(grid)

    def check_steps(self, steps: int) -> str | None:
        """Take the run's denoising step count: a file whose modes change over step ranges, searched over another
        count, maps the run's steps onto its own by fraction of the schedule (`PatternFile.search_step`). Returns
        a note saying so in that case, else None."""
        self._run_steps = int(steps)
        pf = self.file
        if pf is None or len(pf.ranges) < 2 or pf.steps == self._run_steps:
            return None
        bounds = ", ".join(f"{r.start}-{r.stop - 1}" for r in pf.ranges)
        return (f"sparse-vdit: {pf.steps}-step pattern file (step ranges {bounds}) on a {self._run_steps}-step run: "
                f"step s uses the file's step s x {pf.steps} // {self._run_steps} (the same fraction of the schedule)")

    def describe(self, device: torch.device | None = None) -> dict:
        """{"name", "patterns" (absolute path), "patterns_sha256", "remap", "impl", "query_block", "sdpa_heads",
        "density" (the file's mean block density on its grid), "modes" (head counts per mode)}; after a remapped run
        (another grid) also "remapped_from" (the file's grid), "grid" and "density_on_grid" (the same modes on the
        run's grid); after a run of another step count with a file of several step ranges, "steps_mapped_from" (the
        file's steps) and "run_steps"; given the device, "impl_ran"."""
        d: dict[str, Any] = {"name": self.name, "impl": self.options.impl, "remap": self.options.remap}
        if self.file is not None:
            d.update(patterns=str(self.options.patterns), patterns_sha256=self.file_sha256,
                     patterns_model=self.file.model, density=round(self.file.density(), 6),
                     modes=self.file.mode_counts(), query_block=self.options.query_block,
                     sdpa_heads=self.options.sdpa_heads)
            if self._run_grid is not None and self._run_grid != tuple(self.file.grid):
                tiles = tuple(-(-g // 4) for g in self._run_grid)
                d.update(remapped_from=list(self.file.grid), grid=list(self._run_grid),
                         density_on_grid=round(self.file.density(tiles), 6))
            if self._run_steps is not None and len(self.file.ranges) > 1 and self._run_steps != self.file.steps:
                d.update(steps_mapped_from=self.file.steps, run_steps=self._run_steps)
        if device is not None:
            d["impl_ran"] = self.resolved_impl(device)
        return d

    def report(self, device: torch.device | None = None) -> BackendReport:
        """`describe(device)` and what each (expert, layer) ran in its first call of the last run (`layer_stats`),
        sorted by expert then layer: {"expert", "layer", "heads", "launches" (kernel launches and SDPA calls of one
        call: 0 for a layer that computes nothing), "groups" (distinct patterns among its heads), "density" (computed
        tile pairs / (heads x tiles^2)), "sdpa_heads" (heads run by SDPA instead of the kernel), "modes" ({mode
        name: heads})}."""
        rows = tuple({**self.layer_stats[key], "modes": dict(self.layer_stats[key]["modes"])}
                     for key in sorted(self.layer_stats, key=lambda k: (k[0] or "", k[1])))
        return BackendReport({**self.describe(device), **knob_info(self)}, rows)

    def layer_table(self, modes: tuple[Pattern, ...], layout: Any,
                    device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The fused per-head index tables of one layer: q2k (1, H, Q_TILES, K) and q2k_cnt (1, H, Q_TILES) int32 on
        `device`, K the widest row of the layer's heads, and the query-group table of the grouped forward
        (`kernels.query_groups.build_query_groups`, None with query_block 0), for a `TileLayout`; cached per (modes,
        grid, device) up to CACHE_BYTES."""
        import torch
        import torch.nn.functional as F

        tiles = layout.tiles_per_dim
        key = (tuple(p.key() for p in modes), tuple(layout.grid), str(device))
        hit = self._tables.get(key)
        if hit is not None:
            return hit
        # Cached across calls: normal tensors even when the first caller runs under torch.inference_mode (as
        # `generate` does), or a later autograd forward (which saves them for the backward) fails.
        with torch.inference_mode(False):
            parts = [q2k_table(p, tiles) for p in modes]
            width = max(t.shape[1] for t, _ in parts)
            q2k = torch.stack([F.pad(t, (0, width - t.shape[1])) for t, _ in parts])[None].to(device)
            cnt = torch.stack([c for _, c in parts])[None].to(device)
            groups = None
            if self.options.query_block:
                from ..kernels.query_groups import build_query_groups

                groups = build_query_groups(q2k[0], cnt[0], layout.tile_offsets, self.options.query_block)
                groups = groups.to(device)
        size = q2k.numel() * 4 + cnt.numel() * 4 + (0 if groups is None else groups.numel() * 4)
        if self._cached_bytes + size <= CACHE_BYTES:
            self._tables[key] = (q2k, cnt, groups)
            self._cached_bytes += size
        return q2k, cnt, groups

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        """q, k, v: (B, S, H, D) tile order -> (B, S, H, D) like q; stage "self_attention/fine"."""
        layout = ctx.layout
        if layout is None:
            raise RuntimeError("sparse-vdit needs tokens in tile order with a TileLayout (tile-order hooks missing)")
        if self.file is None:
            raise BadInput("sparse-vdit needs a pattern file, its option patterns=FILE")
        self.check_grid(layout.grid)
        modes = self.file.layer_modes(ctx.expert, ctx.layer, ctx.step, self._run_steps)
        if ctx.head_start + q.shape[2] > len(modes):  # (fewer heads than the file's: refused by bind)
            raise BadInput(f"{self.where} has {len(modes)} heads per layer, this model {q.shape[2]}")
        modes = modes[ctx.head_start:ctx.head_start + q.shape[2]]  # this rank's heads under Ulysses
        with ctx.timer.region("self_attention/fine"):
            return self.attend(q, k, v, modes, layout, ctx)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, modes: tuple[Pattern, ...], layout: Any,
               ctx: AttnContext | None = None) -> torch.Tensor:
        """The layer's attention with head h under `modes[h]`, q, k, v (B, S, H, D) in tile order."""
        import torch

        kinds = {p.kind for p in modes}
        stats_key = (None if ctx is None else ctx.expert, -1 if ctx is None else ctx.layer)
        if kinds == {"skip"}:
            self._note(stats_key, modes, layout, launches=0)
            return torch.zeros_like(q)
        if kinds == {"dense"}:
            self._note(stats_key, modes, layout, launches=1)
            return _sdpa(q, k, v)
        if self.resolved_impl(q.device) == "torch":
            self._note(stats_key, modes, layout, launches=1)
            bm = torch.stack([block_map(p, layout.tiles_per_dim, q.device) for p in modes])  # (H, Q_T, KV_T)
            tt = layout.token_tile.to(q.device)
            return masked_attention(q, k, v, bm[:, tt][:, :, tt])
        from ..kernels.block_sparse_attn import block_sparse_attention, block_sparse_attention_grouped

        q2k, cnt, groups, sdpa = self.layer_plan(modes, layout, q.device)
        self._note(stats_key, modes, layout, launches=int(q2k is not None) + len(sdpa),
                   sdpa_heads=sum(h.numel() for h, _ in sdpa))
        if q2k is None:  # every head skips or runs SDPA
            out = torch.zeros_like(q)
        else:
            b = q.shape[0]
            args = (q, k, v, q2k.expand(b, -1, -1, -1), cnt.expand(b, -1, -1), layout.tile_offsets_i32.to(q.device))
            if groups is None:
                out = block_sparse_attention(*args, tuning=self.options.tuning)[0]
            else:
                out = block_sparse_attention_grouped(*args, groups, QUERY_LAUNCH[self.options.query_block],
                                                     tuning=self.options.tuning)[0]
        grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
        for heads, rows in sdpa:  # the kernel wrote zeros for these heads (empty rows)
            o = _sdpa(*(_take(x, heads, None if x is q else rows) for x in (q, k, v)))
            out = out.index_copy(2, heads, o) if grad else out.index_copy_(2, heads, o)
        return out

    def layer_plan(self, modes: tuple[Pattern, ...], layout: Any, device: torch.device
                   ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None,
                              tuple[tuple[torch.Tensor, torch.Tensor | None], ...]]:
        """How the Triton impl runs one layer: the kernel's tables (`layer_table`) with the heads that go to SDPA
        emptied (q2k, cnt and groups None when no head is left for the kernel), and the SDPA calls, one per distinct
        key list shared by every query tile of a head ((head indices (h,) int64, key token rows (R,) int64 in tile
        order or None for all keys), on `device`); no SDPA calls unless the `sdpa_heads` option is on. Cached per
        (modes, grid, device)."""
        import torch

        key = ("plan", tuple(p.key() for p in modes), tuple(layout.grid), str(device))
        hit = self._tables.get(key)
        if hit is not None:
            return hit
        lists: dict[tuple[int, ...], list[int]] = {}
        if self.options.sdpa_heads:
            for h, p in enumerate(modes):
                row = _shared_list(p, layout.tiles_per_dim)
                if row is not None:
                    lists.setdefault(row, []).append(h)
        with torch.inference_mode(False):
            sdpa = tuple((torch.tensor(heads, dtype=torch.int64, device=device),
                          None if len(row) == layout.num_tiles else _token_rows(row, layout).to(device))
                         for row, heads in lists.items())
        routed = {h for heads in lists.values() for h in heads}
        kernel_modes = tuple(skip() if h in routed else p for h, p in enumerate(modes))
        if all(p.kind == "skip" for p in kernel_modes):
            plan = (None, None, None, sdpa)
        else:
            plan = (*self.layer_table(kernel_modes, layout, device), sdpa)
        self._tables[key] = plan  # (the tables themselves are counted by layer_table)
        return plan

    def _note(self, key: tuple[str | None, int], modes: tuple[Pattern, ...], layout: Any, launches: int,
              sdpa_heads: int = 0) -> None:
        """Record what layer `key` ran (for `vsagen profile`'s per-layer table): launches (kernel launches and SDPA
        calls), block density, mode groups, heads run by SDPA."""
        if key in self.layer_stats:
            return
        tiles = layout.tiles_per_dim
        cnts = [int(q2k_table(p, tiles)[1].sum()) for p in modes]
        self.layer_stats[key] = {"expert": key[0], "layer": key[1], "heads": len(modes), "launches": launches,
                                 "groups": len({p.key() for p in modes}),
                                 "density": sum(cnts) / (len(modes) * layout.num_tiles ** 2), "sdpa_heads": sdpa_heads,
                                 "modes": {n: sum(1 for p in modes if p.name == n) for n in
                                           dict.fromkeys(p.name for p in modes)}}


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Dense attention of q (B, S, H, D) over k, v (B, R, H, D) -> (B, S, H, D), torch SDPA (cuDNN first on CUDA for
    bf16 / fp16)."""
    import torch
    import torch.nn.functional as F

    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    if q.is_cuda and q.dtype in (torch.bfloat16, torch.float16):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION], set_priority=True):
            return F.scaled_dot_product_attention(qt, kt, vt).transpose(1, 2)
    return F.scaled_dot_product_attention(qt, kt, vt).transpose(1, 2)


def _take(x: torch.Tensor, heads: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """x (B, S, H, D)'s heads (a view when they are consecutive), then its token rows (a copy) unless rows is None."""
    h0, n = int(heads[0]), heads.numel()
    if int(heads[-1]) - h0 == n - 1:  # ascending and unique by construction, so consecutive
        x = x[:, :, h0:h0 + n]
    else:
        x = x.index_select(2, heads)
    return x if rows is None else x.index_select(1, rows)


def _shared_list(pattern: Pattern, tiles: tuple[int, int, int]) -> tuple[int, ...] | None:
    """The key tiles of `pattern` when every query tile has the same non-empty list (dense, vertical-stripe); else
    None."""
    q2k, cnt = q2k_table(pattern, tiles)
    n = int(cnt[0])
    if n == 0 or not bool((cnt == n).all()) or not bool((q2k[:, :n] == q2k[:1, :n]).all()):
        return None
    return tuple(int(t) for t in q2k[0, :n])


def _token_rows(key_tiles: tuple[int, ...], layout: Any) -> torch.Tensor:
    """(R,) int64 tile-order token rows of `key_tiles` (ascending) under `layout`."""
    import torch

    off = layout.tile_offsets.cpu()
    return torch.cat([torch.arange(int(off[t]), int(off[t + 1])) for t in key_tiles])
