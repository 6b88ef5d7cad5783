"""`vsagen profile`: where the DiT time goes, per attention backend, on one loaded pipeline.

The model is loaded once and the prompt embeddings computed once (`vsagen.pipeline.Session`). Every configuration
(backend x tile fit) then runs on that pipeline (`Session.run`): patch the transformer(s) with the backend
(`vsagen.apply`), denoise `warmup` steps untimed, denoise `steps` timed steps, unpatch. Denoising only (output_type
"latent": no VAE decode, no mp4). Every call seeds a fresh CPU generator with the same seed, so every configuration
with the same denoised size starts from the same latents (a `crop` configuration denoises a larger latent, so its
noise is a different draw).

With `--cache` (a comma list, e.g. `none,first-block`) every (backend, cache) pair of a tile fit is a configuration,
the caches of one backend side by side; the cache's hooks go on after the backend and come off before it
(`Session.run(cache=...)`), and each row counts the DiT forwards its cache computed and reused.

Per configuration (`ProfileRow`): DiT seconds per step (all transformer forwards of a step: two with CFG),
the attention backend's seconds per step and its stages (VSA: coarse, fine; the tile-order reorderings are
reported apart as `layout`), the attention share of DiT time, the DiT speed-up against `full` uncached at the same
tile fit, the DiT time projected to the preset's step count, and the final latents' relative L2 distance to `full`'s.
Also what the backend says of itself (`describe`: sparse-vdit's pattern file, its sha256, density and modes) and,
for backends whose layers run differently (`per_layer`: sparse-vdit; their `report(device).layers`), one row per
(expert, layer): launches,
computed-block density, modes.

Overhead of vsagen itself (`stock`): the same transformer with diffusers' own processors and no vsagen hooks
but the DiT timers (`diffusers-sdpa`; on CUDA its SDPA calls are pinned to cuDNN, then flash, as `full`'s are,
so the difference is vsagen's code, not a kernel choice), and `full` with its tokens in tile order
(`full+tile-order`: dense attention does not depend on token order, so it differs from `full` only by the cost
of the tile-order hooks). Both run at the first tile fit, uncached.

Under torchrun (`--ulysses N`, `--cfg-parallel`) every rank loads the model and runs every configuration split
across the ranks (`Session.run` switches the parallelism on and off per configuration); after each, every rank's
timing goes to rank 0 (`vsagen.parallel.launch.gather_to_writer`), whose rows give the slowest rank's DiT, attention,
all-to-all and CFG-exchange seconds and keep every rank's in `ProfileRow.ranks`. Only rank 0 gets a report. The
overhead rows are left out under `--ulysses` (diffusers' own processors would need diffusers' own context-parallel
plan, whose RoPE split differs from vsagen's); the report's notes say so.

`--kernels` (`profile_kernels`) times the self-attention alone at the model's shape instead; see
`vsagen.bench`. The reports' renderings (table, markdown, csv, json, the plot) are in `vsagen.commands.profile_render`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from ..attention.full import FullAttention
from ..cache.cache_spec import NO_CACHE, CacheCounts, cache_counts
from ..models.loading import reworded_notes
from ..models.presets import LAST_IMAGE_REQUIRED
from .profile_config import ProfileConfig
from ..timing import TimingReport, rank_stats
from ..errors import BadInput

STOCK = "diffusers-sdpa"
TILE_ORDER_FULL = "full+tile-order"
BASELINE = "full"


class TileOrderFull(FullAttention):
    """`full` on tokens in tile order (profile only, not an `--attn` choice). Dense attention is the same
    function of any token order (q, k, v and the RoPE tables move together), so the output equals `full`'s and
    the time differs by the tile-order hooks alone."""

    name = TILE_ORDER_FULL
    tiled = True


@dataclass
class ProfileRow(CacheCounts):
    """One configuration's timing; every `*_s_per_step` is seconds per denoising step (mean over the timed
    steps; a step holds two transformer forwards with CFG).

    `kind` is "backend" (an `--attn` entry) or "overhead" (`diffusers-sdpa`, `full+tile-order`); `impl` the
    implementation that ran (VSA: "triton" or "torch", resolved from "auto"), None for overhead rows.
    `attention_s_per_step` is the backend call alone and `attention_stages_s_per_step` its stages;
    `attn1_s_per_step` the whole self-attention module (projections, q/k norms, RoPE, output projection too);
    `layout_s_per_step` the tile-order reorderings (tiled backends; 0 for raster ones). These are None for
    `diffusers-sdpa`, which has no vsagen processor. Under `--compile` what ran inside the compiled graphs is
    None too: `attn1_s_per_step` always, and `attention_s_per_step` and `attention_share_of_dit` when the
    backend was compiled in (`traceable`; its stages are then empty); `layout_s_per_step` then counts only the
    reorderings outside the blocks. `speedup_vs_full` = DiT s/step of `full` uncached at the same tile fit / this
    row's (exactly 1.0 for it; None without such a row). `projected_dit_s` = DiT s/step x
    `projected_steps` (the preset's step count). `overhead_vs_stock` = DiT s/step / `diffusers-sdpa`'s - 1 (for
    `full` uncached and the overhead rows). `latents_rel_l2_vs_full`: ||x - x_full|| / ||x_full|| of the final
    (cropped) latents against `full` uncached at the same tile fit. `backend_info` is the backend's `describe(device)`
    (empty for the overhead rows). `layers` holds, for backends that record it, what each (expert, layer) ran in
    its first call of the configuration (the first warm-up or timed step, its first forward), sorted by
    expert then layer (the backend's `report(device).layers`): {"expert", "layer", "heads", "launches" (kernel
    launches and SDPA calls of one call: 0 for a layer that computes nothing), "groups" (distinct patterns among its heads), "density" (computed
    tile pairs / (heads x tiles^2)), "sdpa_heads" (heads run by SDPA instead of the kernel), "modes" ({mode name:
    heads})}; empty for the others. `launches_per_forward` (their sum)
    and `block_density` (their head-weighted mean) summarise them (None without `layers`).

    The step cache (`--cache`): `CacheCounts`' fields (its entry, the DiT forwards it computed and reused, the
    seconds of one of each).

    Multi-process runs (`--ulysses`, `--cfg-parallel`): `dit_s_per_step`, `attention_s_per_step`,
    `all_to_all_s_per_step` (Ulysses' sequence <-> heads exchanges, inside the attention) and
    `cfg_exchange_s_per_step` (the CFG branches' exchange, inside the DiT) are the max over the ranks (the slowest
    rank sets the pace: every step ends in exchanges that wait for it), and so are the share, the speed-up and the
    projection made of them; `ranks` holds one {"rank", "dit_forwards", "dit_s_per_step", "attention_s_per_step",
    "all_to_all_s_per_step", "cfg_exchange_s_per_step"} per rank, in rank order; the other fields (attn1, stages,
    layout, `dit_per_step_s`, `dit_forwards`) are rank 0's. In one process the exchanges are 0 and `ranks` empty.
    """

    backend: str
    kind: str
    sparsity: float | None
    impl: str | None
    tile_fit: str
    grid: list[int]
    tokens: int
    tiles: int
    full_tiles: int
    steps: int
    dit_forwards: int
    dit_s_per_step: float
    dit_per_step_s: list[float]
    attn1_s_per_step: float | None
    attention_s_per_step: float | None
    attention_stages_s_per_step: dict[str, float]
    layout_s_per_step: float | None
    attention_share_of_dit: float | None
    projected_steps: int
    projected_dit_s: float
    warmup_s: float
    speedup_vs_full: float | None = None
    overhead_vs_stock: float | None = None
    latents_rel_l2_vs_full: float | None = None
    dit_by_expert_s_per_step: dict[str, float] = field(default_factory=dict)
    spec: str | None = None  # the backend entry with every option spelled out (`vsa:sparsity=0.875:impl=auto`)
    backend_info: dict[str, Any] = field(default_factory=dict)
    layers: list[dict[str, Any]] = field(default_factory=list)
    launches_per_forward: int | None = None
    block_density: float | None = None
    all_to_all_s_per_step: float = 0.0
    cfg_exchange_s_per_step: float = 0.0
    ranks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def label(self) -> str:
        """Backend name with its sparsity, a cube other than the default 4x4x4, and the cache, if any, e.g.
        "vsa 0.875", "vsa 0.875 tile 4x4x8", "full + first-block"."""
        from ..attention.spec import parse_entry, tile_label

        tile = parse_entry(self.spec).options.get("tile") if self.spec else None
        return (self.backend + (f" {self.sparsity:g}" if self.sparsity is not None else "") + tile_label(tile)
                + self.cache_suffix)


def row_labels(rows: list[ProfileRow]) -> list[str]:
    """Each row's label ("vsa 0.875"), or its spec without the default options ("vsa:impl=torch") where two rows of
    one tile fit would otherwise read the same (two settings of one backend that differ in more than the
    sparsity); either followed by " + <cache>" in a cached row."""
    from ..attention.spec import short_spec_text

    labels = [r.label for r in rows]
    keys = [(label, r.tile_fit) for label, r in zip(labels, rows)]
    return [short_spec_text(r.spec) + r.cache_suffix if keys.count(k) > 1 and r.spec else label
            for label, r, k in zip(labels, rows, keys)]


@dataclass
class ProfileReport:
    """The result of `profile_dit`: `rows` holds one `ProfileRow` per (tile fit, backend, cache), in that order;
    `overhead` the `diffusers-sdpa` and `full+tile-order` rows (empty with --no-stock);
    `tile_fit_comparison` one entry per (backend, cache) when both tile fits ran. `load_s` and `text_encode_s` (host
    clock, once for all configurations) are outside every row."""

    settings: dict[str, Any]
    versions: dict[str, str]
    rows: list[ProfileRow]
    overhead: list[ProfileRow]
    tile_fit_comparison: list[dict[str, Any]]
    load_s: float
    text_encode_s: float
    notes: list[str]
    compile_fullgraph: bool | None = None  # --compile: each block one graph (True) or with graph breaks (False)
    lora: list[dict[str, Any]] = field(default_factory=list)  # --lora: each file's record (`vsagen.models.lora`)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (seconds; ratios as plain numbers; no NaN)."""
        full_vs_stock = next((r.overhead_vs_stock for r in self.rows if r.backend == BASELINE
                              and r.overhead_vs_stock is not None), None)
        tile_vs_stock = next((r.overhead_vs_stock for r in self.overhead if r.backend == TILE_ORDER_FULL), None)
        return {
            "command": "profile", "model": self.settings["model"], "device": self.settings["device"],
            "dtype": self.settings["dtype"], "frames": self.settings["frames"], "height": self.settings["height"],
            "width": self.settings["width"], "steps": self.settings["steps"],
            "warmup": self.settings["warmup"], "projected_steps": self.settings["full_steps"],
            "guidance": self.settings["guidance"], "compile_fullgraph": self.compile_fullgraph,
            "rows": [asdict(r) for r in self.rows],
            "overhead": {"rows": [asdict(r) for r in self.overhead], "full_vs_stock": full_vs_stock,
                         "tile_order_vs_stock": tile_vs_stock},
            "tile_fit_comparison": self.tile_fit_comparison,
            "load_s": self.load_s, "text_encode_s": self.text_encode_s, "notes": self.notes,
            "lora": self.lora, "settings": self.settings, "versions": self.versions,
        }


@dataclass
class _Measured:
    report: Any  # TimingReport
    layout_s: float
    latents: Any  # (1, z, F_lat, H_lat, W_lat), cropped to the requested latent
    ranks: list[dict[str, Any]] | None = None  # every rank's `TimingReport.rank_row` (rank 0 of a launch), or None


# A `TimingReport.rank_row` column -> its `ProfileRow` field (seconds per step)
RANK_FIELDS = {"dit_s": "dit_s_per_step", "self_attention_s": "attention_s_per_step",
               "all_to_all_s": "all_to_all_s_per_step", "cfg_exchange_s": "cfg_exchange_s_per_step"}


def _layer_summary(layers: list[dict[str, Any]]) -> tuple[int | None, float | None]:
    """(launches per forward, head-weighted mean block density) of per-layer rows (`ProfileRow.layers`); (None,
    None) for none."""
    heads = sum(r["heads"] for r in layers)
    if not layers or not heads:
        return None, None
    return sum(r["launches"] for r in layers), sum(r["density"] * r["heads"] for r in layers) / heads


def denoise_grids(cfg: ProfileConfig) -> dict[str, tuple[int, int, int]]:
    """{tile fit: post-patch latent grid (T, Hl, Wl) denoised under it} of `cfg`'s size (`Request.plan`: the
    preset's VAE strides and patch size)."""
    return {fit: tuple(cfg.plan(fit).denoise_grid) for fit in cfg.tile_fits}


def _per_step(x: float | None, steps: int) -> float | None:
    """x per step; None (not timed) stays None."""
    if x is None:
        return None
    return x / steps if steps else 0.0


def _make_row(name: str, kind: str, spec: Any, tile_fit: str, plan: Any, m: _Measured, cfg: ProfileConfig,
              has_processor: bool, tiled: bool, impl: str | None = None,
              tile: tuple[int, int, int] | None = None, cache: Any = NO_CACHE) -> ProfileRow:
    """One configuration's `ProfileRow` from its measurement `m` (`cache`: the `CacheSpec` it ran with)."""
    from ..layout import TILE, tile_layout

    t = m.report
    steps = len(t.dit_per_step_s) or cfg.steps
    layout = tile_layout(plan.denoise_grid, tile or TILE)  # the backend's cubes (tile counts of the row)
    # the slowest rank's seconds (rank_stats' max) in a multi-process run, else this process's
    top = rank_stats(m.ranks)["ranks_max"] if m.ranks else t.rank_row(0)
    dit = _per_step(top["dit_s"], steps)
    attention = top["self_attention_s"]
    return ProfileRow(
        backend=name, kind=kind, sparsity=None if spec is None else spec.sparsity, impl=impl,
        tile_fit=tile_fit, grid=list(plan.denoise_grid), tokens=layout.num_tokens, tiles=layout.num_tiles,
        full_tiles=layout.num_full_tiles, steps=steps, dit_forwards=t.dit_forwards, dit_s_per_step=dit,
        dit_per_step_s=list(t.dit_per_step_s),
        attn1_s_per_step=_per_step(t.attn1_s, steps) if has_processor else None,
        attention_s_per_step=_per_step(attention, steps) if has_processor else None,
        attention_stages_s_per_step={k: _per_step(v, steps) for k, v in t.self_attention_stages_s.items()},
        layout_s_per_step=(_per_step(m.layout_s, steps) if tiled else 0.0) if has_processor else None,
        attention_share_of_dit=(None if attention is None or not has_processor else
                                attention / top["dit_s"] if top["dit_s"] > 0 else 0.0),
        projected_steps=cfg.full_steps, projected_dit_s=dit * cfg.full_steps, warmup_s=t.warmup_s,
        dit_by_expert_s_per_step=({k: _per_step(v, steps) for k, v in t.dit_by_expert_s.items()}
                                  if len(t.dit_by_expert_s) > 1 else {}),
        all_to_all_s_per_step=_per_step(top["all_to_all_s"], steps),
        cfg_exchange_s_per_step=_per_step(top["cfg_exchange_s"], steps),
        ranks=[{"rank": r["rank"], "dit_forwards": r["dit_forwards"],
                **{name: _per_step(r[key], steps) for key, name in RANK_FIELDS.items()}} for r in m.ranks or []],
        **cache_counts(cache, t),
    )


def stock_rows(cfg: ProfileConfig) -> bool:
    """Whether the overhead rows run: asked for (`--stock`, the default) and not under `--ulysses` (module
    docstring)."""
    return cfg.stock and cfg.ulysses == 1


def _pinned_sdpa() -> Any:
    """SDPA restricted to cuDNN, then flash (what `full` uses on CUDA)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION], set_priority=True)


def profile_dit(cfg: ProfileConfig, *, log: Callable[[str], None] = lambda m: None,
                writer: bool = True) -> ProfileReport | None:
    """Load the model once (`vsagen.pipeline.Session`) and time every (tile fit, backend, cache) configuration of
    `cfg` on it (see the module docstring for what is measured and how).

    Under `--ulysses` / `--cfg-parallel` every rank of the launch's process group (`vsagen.parallel.launch.start`)
    calls this with the same `cfg`; each configuration's timing is gathered to rank 0 (the `writer`), which returns
    the report; the other ranks return None.

    Raises:
        BadInput: a backend cannot run on this device / dtype (before loading), refuses a tile fit's grid (a
            pattern file searched at another size: before loading where a preset gives the model's patch size)
            or the model's architecture (after loading, before the first configuration runs), or the model
            cannot be loaded as asked (ModelNotFound).
        RunFailure: out of GPU memory while denoising (the message names the configuration).
    """
    import torch

    from .. import __version__
    from ..compiling import fused_blocks_note
    from ..models.loading import versions

    device = torch.device(cfg.device)
    backends = [(spec, spec.build()) for spec in cfg.backends]
    session = _load_session(cfg, [b for _, b in backends], writer, log)
    cuda = device.type == "cuda"
    fused_note = fused_blocks_note(cfg.warmup) if session.fused else None
    latents: dict[int, Any] = {}  # id(row) -> its final latents
    rows = _backend_rows(cfg, session, backends, latents, log)
    overhead: list[ProfileRow] = []
    if stock_rows(cfg):
        fit = cfg.tile_fits[0]
        plan = session.plan(fit)
        m = _measure(cfg, session, f"{STOCK} (diffusers' processors)", plan, None, log,
                     _pinned_sdpa if cuda else contextlib.nullcontext)
        overhead.append(_make_row(STOCK, "overhead", None, fit, plan, m, cfg, False, False))
        latents[id(overhead[-1])] = m.latents
        m = _measure(cfg, session, f"{TILE_ORDER_FULL}", plan, TileOrderFull(), log)
        overhead.append(_make_row(TILE_ORDER_FULL, "overhead", None, fit, plan, m, cfg, True, True))
        latents[id(overhead[-1])] = m.latents

    if not writer:
        return None
    _compare_with_full(rows, overhead, latents)
    del latents
    comparison = _tile_fit_comparison(cfg, rows)
    notes = _profile_notes(cfg, [*cfg.notes, *session.notes], fused_note, rows, cuda)  # the request's own first
    return ProfileReport(settings=cfg.summary(), versions={"vsagen": __version__, **versions(cfg.device)},
                         rows=rows, overhead=overhead, tile_fit_comparison=comparison, load_s=session.load_s,
                         text_encode_s=session.text_encode_s, notes=notes, compile_fullgraph=session.compile_fullgraph,
                         lora=session.model.loras)


def _load_session(cfg: ProfileConfig, backends: list[Any], writer: bool, log: Callable[[str], None]) -> Any:
    """The `Session` every configuration of `cfg` runs on: the overhead rows' dtype checked, the model loaded once
    (a conditioned model with a synthetic first / last frame), the CPU estimate said, the prompt encoded once.

    Raises:
        BadInput: the overhead rows on CUDA in a dtype cuDNN / flash attention refuse; what `Session.load` raises.
    """
    import torch

    from ..estimate import cpu_time_estimate
    from ..models.loading import torch_dtype
    from ..pipeline import Conditioning, Session

    if stock_rows(cfg):
        try:
            TileOrderFull().check(torch.device(cfg.device), torch_dtype(cfg.dtype))
        except BadInput:
            raise BadInput("the overhead rows (diffusers-sdpa, full+tile-order) run cuDNN/flash attention on CUDA, "
                           "which need --dtype bf16 or fp16; pass another --dtype or --no-stock") from None
    last = cfg.source.preset.last_image == LAST_IMAGE_REQUIRED
    conditioning = Conditioning.synthetic(cfg.height, cfg.width, cfg.seed, last) if cfg.conditioned else None
    # every backend is prepared for every tile fit's run before loading and again once loaded (`Session.load`);
    # backend weights are attached per configuration and detached after it
    session = Session.load(cfg, backends, also_runs=[TileOrderFull()] if stock_rows(cfg) else [],
                           conditioning=conditioning, log=log)
    if cfg.device == "cpu" and writer:  # hours of work on a real size: said once the model loaded
        warning = cpu_time_estimate(cfg, runs=len(backends) * len(cfg.tile_fits) * len(cfg.caches)
                                    + 2 * stock_rows(cfg),
                                    runs_of="configurations")
        if warning is not None:
            log(warning)
    session.prompts()  # once for every configuration (host clock: `text_encode_s`)
    if cfg.conditioned:
        session.notes.append("image-to-video model: conditioned on a synthetic first frame"
                             + (" and last frame" if last else "")
                             + " (the DiT's cost does not depend on the picture); encoding the condition (VAE, and "
                               "CLIP where the model has it) is outside the DiT times")
    return session


def _measure(cfg: ProfileConfig, session: Any, label: str, plan: Any, backend: Any, log: Callable[[str], None],
             context: Callable[[], Any] = contextlib.nullcontext, cache: Any = NO_CACHE) -> _Measured:
    """Run one configuration on `session` (`cfg.warmup` untimed + `cfg.steps` timed steps) and read its timing; under
    `--ulysses` / `--cfg-parallel` a collective that gathers every rank's row to the writer (every rank, every
    configuration, in the same order)."""
    log(f"profiling {label} at {plan.denoise_frames}x{plan.denoise_height}x{plan.denoise_width}: "
        f"{cfg.warmup} warm-up + {cfg.steps} timed step{'s' * (cfg.steps != 1)}")
    run = session.run(backend, plan, context=context, what=f"profiling {label}", cache=cache)
    report = TimingReport.from_records(run.records, cfg.device, warmup_s=run.warmup_s,
                                       warmup_parts_s=run.warmup_parts, untimed=session.untimed(backend))
    ranks = None
    if cfg.processes > 1:
        import torch.distributed as dist

        from ..parallel.launch import gather_to_writer

        ranks = gather_to_writer(report.rank_row(dist.get_rank()))
    return _Measured(report, run.layout_s, run.latents, ranks)


def _backend_rows(cfg: ProfileConfig, session: Any, backends: list[tuple[Any, Any]], latents: dict[int, Any],
                  log: Callable[[str], None]) -> list[ProfileRow]:
    """One row per (tile fit, backend, cache) of `cfg`, a backend's caches together; each row's final latents go into
    `latents` by id(row)."""
    import torch

    device = torch.device(cfg.device)
    rows: list[ProfileRow] = []
    names = [spec.name for spec in cfg.backends]
    for fit in cfg.tile_fits:
        plan = session.plan(fit)
        for (spec, backend), cache in ((b, c) for b in backends for c in cfg.caches):
            what = spec.short_text() if names.count(spec.name) > 1 else spec.name  # settings of one backend apart
            what += f" + {cache.short_text()}" if cache.enabled else ""
            m = _measure(cfg, session, f"{what} (tile fit {fit})", plan, backend, log, cache=cache)
            said = backend.report(device)  # what the run's layers ran (each run prepares the backend anew)
            info = said.info
            r = _make_row(spec.name, "backend", spec, fit, plan, m, cfg, True, backend.tiled,
                          info.get("impl_ran", spec.impl), tuple(backend.tile), cache)
            r.spec, r.backend_info, r.layers = spec.text(), info, [dict(row) for row in said.layers]
            r.launches_per_forward, r.block_density = _layer_summary(r.layers)
            rows.append(r)
            latents[id(r)] = m.latents
    return rows


def _compare_with_full(rows: list[ProfileRow], overhead: list[ProfileRow], latents: dict[int, Any]) -> None:
    """Fill each row's speed-up and latent distance against the first uncached `full` row of its tile fit, and the
    overhead against `diffusers-sdpa` (`overhead[0]`, when the overhead rows ran). `latents`: id(row) -> final
    latents."""
    from ..bench import rel_l2

    full: dict[str, ProfileRow] = {}
    for r in rows:  # the first uncached `full` entry of each tile fit is the baseline
        if r.backend == BASELINE and not r.cached:
            full.setdefault(r.tile_fit, r)
    stock = overhead[0] if overhead else None
    for r in rows + overhead:
        ref = full.get(r.tile_fit)
        if ref is not None:
            dist = rel_l2(latents[id(r)], latents[id(ref)])
            r.latents_rel_l2_vs_full = dist if math.isfinite(dist) else None  # NaN latents: no distance
            if r.kind == "backend":
                r.speedup_vs_full = ref.dit_s_per_step / r.dit_s_per_step
        if stock is not None and r.tile_fit == stock.tile_fit and (r.kind == "overhead" or r is full.get(r.tile_fit)):
            r.overhead_vs_stock = r.dit_s_per_step / stock.dit_s_per_step - 1.0


def _tile_fit_comparison(cfg: ProfileConfig, rows: list[ProfileRow]) -> list[dict[str, Any]]:
    """One entry per (backend entry, cache) when both tile fits ran: its partial and crop rows side by side, labelled
    as the main table labels its partial row (two entries of one backend and sparsity, e.g. two tiles, by spec)."""
    comparison: list[dict[str, Any]] = []
    if set(cfg.tile_fits) != {"partial", "crop"}:
        return comparison
    labels = {id(r): label for r, label in zip(rows, row_labels(rows))}  # the main table's ("vsa:tile=4x4x8", ...)
    for spec, cache in ((b, c) for b in cfg.backends for c in cfg.caches):
        p, c = (next(r for r in rows if r.spec == spec.text() and r.cache_spec == cache.text() and r.tile_fit == f)
                for f in ("partial", "crop"))
        comparison.append({
            "label": labels[id(p)], "spec": spec.text(),
            "backend": spec.name, "sparsity": spec.sparsity, "cache": cache.short_text(),
            "partial_tokens": p.tokens, "crop_tokens": c.tokens,
            "partial_dit_s_per_step": p.dit_s_per_step, "crop_dit_s_per_step": c.dit_s_per_step,
            "crop_vs_partial": c.dit_s_per_step / p.dit_s_per_step,
            "partial_attention_s_per_step": p.attention_s_per_step,
            "crop_attention_s_per_step": c.attention_s_per_step,
        })
    return comparison


def _profile_notes(cfg: ProfileConfig, session_notes: list[str], fused_note: str | None, rows: list[ProfileRow],
                   cuda: bool) -> list[str]:
    """The report's notes: the session's (once each), then what the reader must know about these timings."""
    from ..kernels.tuning import interpreting

    stock_suffix = ("; every row has them, diffusers-sdpa included, so the overhead rows compare attention "
                    "processors and hooks only" if stock_rows(cfg) else "")
    notes = list(dict.fromkeys(n + (stock_suffix if n == fused_note else "") for n in session_notes))
    notes = reworded_notes(notes, "its outputs mean nothing")
    if not cuda:
        notes.append("CPU timings (each configuration measured once, in order): indicative only, other work on the "
                     "machine moves them a lot; compare backends on a GPU")
    if BASELINE not in [s.name for s in cfg.backends]:
        notes.append("no `full` in --attn: speed-ups, latent distances and the overhead of `full` are not computed")
    elif all(c.enabled for c in cfg.caches):
        notes.append("no `none` in --cache: speed-ups and latent distances are against `full` uncached, which did not "
                     "run; add it (e.g. --cache none,first-block)")
    if any(r.cached for r in rows):
        notes.append(f"cached rows: DiT s/step and its projection to {cfg.full_steps} steps hold the share these "
                     f"{cfg.steps} timed steps reused (each configuration's cache starts afresh); another step count "
                     "reuses another share: the seconds per computed and per reused forward carry over")
    interpreted = sorted({label for r, label in zip(rows, row_labels(rows)) if r.impl == "triton"})
    if interpreted and interpreting():
        notes.append(f"{', '.join(interpreted)}: the Triton kernels ran under the Triton interpreter "
                     "(TRITON_INTERPRET=1), so these times are the interpreter's, not the kernels'")
    if cuda and stock_rows(cfg):
        notes.append(f"{STOCK}: diffusers' own processors, SDPA pinned to cuDNN then flash (as `full`)")
    if cfg.processes > 1:
        how = " and ".join(([f"--ulysses {cfg.ulysses}"] if cfg.ulysses > 1 else [])
                           + (["--cfg-parallel"] if cfg.cfg_parallel else []))
        notes.append(f"{cfg.processes} processes ({how}): DiT, attention"
                     + (", all-to-all" if cfg.ulysses > 1 else "") + (", CFG exchange" if cfg.cfg_parallel else "")
                     + " s/step are the slowest rank's (every step ends in exchanges that wait for it); stages and "
                       "layout are rank 0's; the JSON's rows hold every rank's (`ranks`)")
    if cfg.stock and cfg.ulysses > 1:
        notes.append(f"--ulysses {cfg.ulysses}: the overhead rows ({STOCK}, {TILE_ORDER_FULL}) are left out: "
                     f"{STOCK} runs diffusers' own processors, which would need diffusers' own context-parallel "
                     "plan (its RoPE split) instead of vsagen's; profile them in one process")
    return notes


# --------------------------------------------------------------------------------------------------------------
# --kernels


@dataclass
class KernelReport:
    """The result of `profile_kernels`: `rows` (see `vsagen.bench.KernelRow`) per tile fit, forward rows
    first, each with its ratio to the dense baseline (SDPA cuDNN on CUDA, torch's CPU SDPA elsewhere)."""

    settings: dict[str, Any]
    versions: dict[str, str]
    rows: list[Any]
    notes: list[str]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (milliseconds)."""
        return {"command": "profile --kernels", "model": self.settings["model"], "device": self.settings["device"],
                "dtype": self.settings["dtype"], "rows": [r.to_dict() for r in self.rows], "notes": self.notes,
                "settings": self.settings, "versions": self.versions}


def profile_kernels(cfg: ProfileConfig, *, log: Callable[[str], None] = lambda m: None) -> KernelReport:
    """Time the self-attention alone at the model's shape (grid of each tile fit, `cfg.heads` x `cfg.head_dim`,
    B = 1, `cfg.dtype`): forward and forward+backward of dense SDPA (cuDNN and flash on CUDA; torch's CPU
    kernel elsewhere) and of every backend in `cfg.backends`. No model is loaded. A backend whose layers run
    differently (`vsagen.bench.timed_layers`: sparse-vdit) is timed at every layer of every expert of the model,
    its row the mean per layer (a note says so); the others at layer 0.

    Raises:
        BadInput: a backend cannot run on this device / dtype, or refuses a tile fit's grid or the model's
            architecture (a pattern file searched at another size, or on another model: checked before anything
            is timed, the architecture read from the model's config), or CUDA
            with a dtype cuDNN / flash do not take.
    """
    import torch

    from .. import __version__
    from ..bench import AttentionShape, time_attention, timed_layers
    from ..models.loading import torch_dtype, versions
    from ..models.sources import transformer_configs

    device, dtype = torch.device(cfg.device), torch_dtype(cfg.dtype)
    backends = [(spec, spec.build()) for spec in cfg.backends]
    grids = denoise_grids(cfg)
    configs = transformer_configs(cfg.source, cfg.model)
    for fit, grid in grids.items():  # device, dtype, the grid, the architecture from its config: before any timing
        run = dataclasses.replace(cfg.predicted_run(fit), grid=grid)
        for _, backend in backends:
            backend.prepare(run)
    if device.type == "cuda" and dtype not in (torch.bfloat16, torch.float16):
        raise BadInput("--kernels on CUDA compares against SDPA cuDNN / flash, which need --dtype bf16 or fp16")
    experts = [(name, int(c.get("num_layers", 0) or 0)) for name, c in configs]
    names = [spec.name for spec, _ in backends]  # two settings of one backend: spelled out
    entries = [(spec.short_text() if names.count(spec.name) > 1 else spec.label, b, timed_layers(b, experts))
               for spec, b in backends]
    rows = []
    for fit, grid in grids.items():
        shape = AttentionShape(f"{cfg.model} {cfg.frames}x{cfg.height}x{cfg.width}", grid, cfg.heads, cfg.head_dim)
        log(f"timing attention at grid {'x'.join(map(str, grid))} (S={shape.tokens}, H={cfg.heads}, "
            f"D={cfg.head_dim}, tile fit {fit})")
        rows += time_attention(shape, entries, device=device, dtype=dtype, tile_fit=fit, seed=cfg.seed)
    notes = [] if device.type == "cuda" else [
        "CPU: the dense baseline is torch's CPU SDPA and the backends run their eager PyTorch paths; SDPA "
        "cuDNN / flash rows need CUDA"]
    per_layer = [label for label, _, contexts in entries if len(contexts) > 1]
    if per_layer:
        where = " and ".join(f"{name} ({n} layers)" for name, n in experts)
        notes.append(f"{', '.join(per_layer)}: timed at every layer of {where}, as its layers run differently; ms "
                     "is the mean per layer (the 'timed at' column); the other rows time one call at layer 0")
    return KernelReport(settings=cfg.summary(), versions={"vsagen": __version__, **versions(cfg.device)},
                        rows=rows, notes=notes)
