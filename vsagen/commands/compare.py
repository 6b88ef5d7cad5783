"""`vsagen compare`: the speed and fidelity of attention backends and samplers against a reference, from one loaded
pipeline.

The model is loaded once (`vsagen.pipeline.Session`) and the prompt encoded once (the negative branch too when any
run has CFG). The runs are every (sampler, backend, step cache) triple of `--sampler` x `--attn` x `--cache`,
sampler-major, a backend's caches side by side, in the order given (`CompareConfig.runs`); the first is the reference
(by default `full` uncached with the preset's sampler). A run's cache goes on after its backend and comes off before
it (`Session.run(cache=...)`); its row counts the DiT forwards the cache computed and reused. Every run
generates the same video: same prompt embeddings, same seed (each run seeds a fresh CPU generator, so every run
starts from the same initial noise; a re-noise sampler's draws are seeded too), same size; each with its sampler's
steps, CFG scale and flow shift (`vsagen.request.sampling.SamplerPlan`: a re-noise sampler such as `dmd` runs its
sigma list without CFG; `default` runs the checkpoint's scheduler, swapped for one of its class at the plan's flow
shift where that differs from the one loaded: `flow_shift`). `warmup` untimed steps first (a re-noise sampler: one
whole pass), then the timed generation, decoded. Per run (`CompareRow`):

* DiT seconds per video (every timed step, both CFG passes) and per step, and the speed-up over the reference of
  the seconds per video (runs of different step counts or CFG compare as videos; with one sampler the ratio is the
  per-step one), measured as `vsagen profile` measures them (the "dit" regions of the timed steps; warm-up untimed);
  its sampler, steps, CFG scale and DiT forwards;
* PSNR and SSIM of the decoded 8-bit frames against the reference's, per frame and overall (`vsagen.media.metrics`),
  and the relative L2 distance of the final latents;
* the precision of the blocks' linears (`quant`): with several `--quant` precisions every run above runs in each,
  precision-major, each precision's linears built once and swapped in (`vsagen.commands.compare_quant`);
* the decode: its decoder and weights, its seconds and those saved against the reference's. With several `--vae`
  decoders (`stock,tiny`, the first the reference), each triple's DiT runs once and each decoder (built once,
  `decoder_states`, swapped on the VAE) decodes its final latents as a run of its own (with `--warmup`, once
  untimed first); with one triple, PSNR / SSIM are each decoder's against the reference decoder on the same latents;
* the attention error: at the steps `error_steps` (default the first, middle and last of each run's own steps),
  every self-attention call's output is compared with dense attention (`full`'s SDPA) on the same q, k, v; per
  (step, expert, layer) the relative L2 sqrt(sum ||o - o_dense||^2 / sum ||o_dense||^2) over that step's calls (both
  CFG passes), and per layer the same over every chosen step (`AttentionProbe`). The dense reference runs inside
  the timed steps, so its time (region "compare_probe") is taken out of the DiT, attn1 and backend times of the
  step it ran in (`without_region`), and the JSON reports it apart (`probe_s`).

Outputs go to one folder (`--out`, default `vsagen-<model>-compare-seed<seed>/`): each run's mp4, a side-by-side
mp4 with each panel labelled, the plot (speed-up against PSNR; attention error per layer; needs matplotlib),
`compare.json` and `compare.csv`. Nothing is written before every run has finished; the files are one set
(`vsagen.media.video.Outputs`): each written to a temporary file, then all moved into place together, so an interrupted
(Ctrl-C, SIGTERM) or failed write leaves none of them. Text-to-video models only. Renderings (table, csv, plot,
side-by-side video) are in `vsagen.commands.compare_render`.
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Collection, Iterator

from ..attention.base import BackendWrapper
from ..cache.cache_spec import CacheCounts, cache_counts
from ..errors import BadInput
from ..media.metrics import json_number, pooled_rel_l2, psnr_db, ssim
from ..decode.decoder_choice import decoder_states, reattach, vae_summary
from .compare_config import CompareConfig, precision_label, stale_outputs
from .compare_quant import load_request, precision_sets

PROBE_REGION = "compare_probe"
# The regions a probe call runs inside (besides "total" and "denoise", which compare does not report).
PROBE_ENCLOSED_BY = ("dit", "attn1", "self_attention")
# A step cache's per-forward regions (`vsagen.cache.install`): each encloses the probe calls recorded since the last
# one of them ended (a step may hold a computed and a reused forward).
PROBE_ENCLOSED_BY_FORWARD = ("dit_computed", "dit_reused")


# ------------------------------------------------------------------------------------------------ attention error


class AttentionProbe(BackendWrapper):
    """Wraps an attention backend: returns the backend's output unchanged and, at the chosen denoising steps of
    a timed run (`ctx.timer.enabled`: warm-up steps are skipped), compares it with dense attention on the same
    q, k, v (`full`; token order does not change dense attention, so tiled backends compare in tile order).
    Every other protocol member (name, options, tiled, weights, prepare, report, ...) is the backend's
    (`BackendWrapper`); its check adds dense attention's.

    `sums[(step, expert, layer)]` holds a (2,) float32 tensor on the run's device: [sum ||o - o_dense||^2,
    sum ||o_dense||^2] over that step's calls (read after the run, so the probe never synchronizes the device).
    The comparison is timed as region PROBE_REGION, inside the backend's "self_attention" region.
    """

    def __init__(self, backend: Any, steps: Collection[int]) -> None:
        from ..attention.full import FullAttention

        super().__init__(backend)
        self.steps = frozenset(steps)
        self.dense = FullAttention()
        self.sums: dict[tuple[int, str, int], Any] = {}

    def prepare(self, run: Any) -> tuple[str, ...]:
        """The backend's preparation, with this probe's `check` (dense attention's too)."""
        self.check(run.device, run.dtype)
        return self.inner.prepare(run)

    def check(self, device: Any, dtype: Any) -> None:
        """The backend's check, and dense attention's (on CUDA it needs bf16 or fp16).

        Raises:
            BadInput: either cannot run on `device` / `dtype`.
        """
        self.inner.check(device, dtype)
        if self.steps:
            try:
                self.dense.check(device, dtype)
            except BadInput:
                raise BadInput("the attention error compares with dense attention (cuDNN / flash on CUDA), which "
                               "needs --dtype bf16 or fp16; or pass --error-steps none") from None

    def __call__(self, q: Any, k: Any, v: Any, ctx: Any) -> Any:
        """q, k, v: (B, S, H, D) -> the backend's (B, S, H, D) output, unchanged."""
        import torch

        out = self.inner(q, k, v, ctx)
        if ctx.timer.enabled and ctx.step in self.steps:
            with ctx.timer.region(PROBE_REGION):
                ref = self.dense(q, k, v, ctx).float()
                sums = torch.stack([(out.float() - ref).square().sum(), ref.square().sum()])
                key = (ctx.step, ctx.expert or "transformer", ctx.layer)
                self.sums[key] = sums if key not in self.sums else self.sums[key] + sums
        return out

    def errors(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(per (step, expert, layer): {"step", "expert", "layer", "rel_l2"}, per (expert, layer) over every chosen
        step: {"expert", "layer", "rel_l2"}), sorted; rel_l2 None where not finite. Clears the sums."""
        sums = {k: [float(x) for x in v.cpu()] for k, v in self.sums.items()}
        self.sums.clear()
        per_step = [{"step": s, "expert": e, "layer": layer, "rel_l2": pooled_rel_l2([d], [r])}
                    for (s, e, layer), (d, r) in sorted(sums.items())]
        pooled: dict[tuple[str, int], list[list[float]]] = defaultdict(lambda: [[], []])
        for (_, e, layer), (d, r) in sums.items():
            pooled[(e, layer)][0].append(d)
            pooled[(e, layer)][1].append(r)
        per_layer = [{"expert": e, "layer": layer, "rel_l2": pooled_rel_l2(*pooled[(e, layer)])}
                     for e, layer in sorted(pooled)]
        return per_step, per_layer


def without_region(records: list[tuple[str, int, float]], region: str,
                   enclosing: tuple[str, ...] = PROBE_ENCLOSED_BY,
                   per_forward: tuple[str, ...] = PROBE_ENCLOSED_BY_FORWARD) -> tuple[list[tuple[str, int, float]],
                                                                                      float]:
    """Take the time of `region` out of the regions that enclose it.

    Args:
        records: `Timer.finish()` records (name, step, seconds), in the order the regions ended.
        region: the nested region to remove (PROBE_REGION).
        enclosing: region names that contain every `region` call; names "<name>/..." of them (e.g. "dit/<expert>")
            count too, except the backend's stages ("self_attention/<stage>", which end before the probe runs).
        per_forward: region names of which each contains the `region` calls that ended after the previous one of
            them ended (a step cache's "dit_computed" / "dit_reused": one per forward, several a step); each is
            reduced by those calls' seconds.

    Returns:
        (the records without `region`, each enclosing name's records of a step reduced by that step's `region`
        seconds, never below 0; the seconds removed).
    """
    spent: dict[int, float] = defaultdict(float)
    for name, step, sec in records:
        if name == region:
            spent[step] += sec
    left: dict[tuple[str, int], float] = {}
    out = []
    pending = 0.0  # `region` seconds since the last `per_forward` record
    for name, step, sec in records:
        if name == region:
            pending += sec
            continue
        if name in per_forward:
            take = min(pending, sec)
            pending, sec = 0.0, sec - take
        elif name in enclosing or (name.split("/", 1)[0] in enclosing and not name.startswith("self_attention/")):
            rest = left.setdefault((name, step), spent.get(step, 0.0))
            take = min(rest, sec)
            left[(name, step)] = rest - take
            sec -= take
        out.append((name, step, sec))
    return out, sum(spent.values())


# ------------------------------------------------------------------------------------------------ the run


@dataclass
class CompareRow(CacheCounts):
    """One run's results (a backend with a sampler). `sampler` is its `Sampler.summary()`, `steps` its denoising
    steps, `guidance` its CFG scale (> 1: two transformer forwards a step), `flow_shift` the scheduler's shift (None
    for a re-noise sampler, whose sigmas are used as given), `dit_forwards` the transformer forwards it timed.
    `dit_s_per_video` sums the DiT time of every timed step (both CFG passes), `dit_s_per_step` is its mean over the
    steps, and `speedup_vs_reference` = the reference's `dit_s_per_video` / this run's (the same as per step where the
    runs have one step count); `attention_s_per_step` is the backend call alone (None: not timed). PSNR in dB (+inf:
    equal frames), SSIM in [-1, 1], relative L2 distances (None: not finite) against the reference:
    `latents_rel_l2` of the final latents. `attention_rel_l2` per (step, expert, layer) at `error_steps`,
    `attention_rel_l2_per_layer` per (expert, layer) over those steps, against dense attention
    (`AttentionProbe.errors`); `attention_rel_l2_mean` / `_max` over the layers. `probe_s`: seconds the dense
    comparison took (not in the DiT times). The step cache: `CacheCounts`' fields (its entry, the DiT forwards it
    computed and reused, the seconds of one of each). The decode: `vae_decoder` ("stock" | "light" | "tiny"),
    `vae_weights` (the tiny decoder's weights as t2v's JSON names them, else None) and `vae_tiling` of the decoder
    that decoded the run (`vae_summary`); `decode_s` its seconds (host clock, the device synchronized),
    `decode_saved_s` the reference's `decode_s` minus this run's, `decode_speedup_vs_reference` their ratio."""

    label: str
    backend: str
    spec: str
    sparsity: float | None
    impl: str | None
    file: str
    sampler: dict[str, Any]
    steps: int
    guidance: float
    flow_shift: float | None
    dit_forwards: int
    dit_s_per_video: float
    dit_s_per_step: float
    dit_per_step_s: list[float]
    attention_s_per_step: float | None
    speedup_vs_reference: float
    psnr_db: float
    psnr_per_frame_db: list[float]
    ssim: float
    ssim_per_frame: list[float]
    latents_rel_l2: float | None
    error_steps: list[int]
    attention_rel_l2: list[dict[str, Any]]
    attention_rel_l2_per_layer: list[dict[str, Any]]
    attention_rel_l2_mean: float | None
    attention_rel_l2_max: float | None
    probe_s: float
    warmup_s: float
    vae_decoder: str
    vae_weights: str | None
    vae_tiling: bool
    decode_s: float
    decode_saved_s: float
    decode_speedup_vs_reference: float | None
    backend_info: dict[str, Any] = field(default_factory=dict)
    lora_scale: float | None = None  # the scale of the --lora that lists row scales (None: none lists several)
    # [K, tiles]: key tiles each query tile keeps, of the tiles of the backend's cube on the denoised grid (VSA's
    # backends: K = ceil((1 - sparsity) tiles)); None where the backend has no such count
    key_tiles_kept: list[int] | None = None
    # the precision of the blocks' linears: {"precision": "none" | "fp8" | "int8", <expert>: {"int8": n, "fp8": n,
    # "dtype": n}} (`vsagen.quant.swap.precision_summary`, as t2v's JSON)
    quant: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (PSNR +inf as the string "inf": `json_number`)."""
        d = asdict(self)
        d["psnr_db"] = json_number(self.psnr_db)
        d["psnr_per_frame_db"] = [json_number(x) for x in self.psnr_per_frame_db]
        return d


@dataclass
class CompareReport:
    """The result of `compare`: one row per run (the reference first), the files written, the notes."""

    settings: dict[str, Any]
    versions: dict[str, str]
    rows: list[CompareRow]
    files: dict[str, str]
    load_s: float
    text_encode_s: float
    notes: list[str]
    vae: dict[str, Any] = field(default_factory=dict)  # what decoded every run (`decoder_choice.vae_summary`)
    lora: list[dict[str, Any]] = field(default_factory=list)  # --lora: each file's record (`vsagen.models.lora`)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (no NaN or Infinity: PSNR +inf is "inf")."""
        s = self.settings
        return {"command": "compare", "model": s["model"], "prompt": s["prompt"], "device": s["device"],
                "dtype": s["dtype"], "frames": s["frames"], "height": s["height"], "width": s["width"],
                "steps": s["steps"], "warmup": s["warmup"], "guidance": s["guidance"], "seed": s["seed"],
                "samplers": s["samplers"], "caches": s.get("caches", []), "speedup_of": "dit_s_per_video",
                "reference": self.rows[0].label, "error_steps": s["error_steps"],
                "rows": [r.to_dict() for r in self.rows], "files": self.files, "load_s": self.load_s,
                "text_encode_s": self.text_encode_s, "notes": self.notes, **self.vae, "lora": self.lora, "settings": s,
                "versions": self.versions}


def _mean_max(per_layer: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """(mean, max) of the layers' rel_l2; (None, None) without layers or where one is None (not finite)."""
    vals = [x["rel_l2"] for x in per_layer]
    if not vals or any(v is None for v in vals):
        return None, None
    return sum(vals) / len(vals), max(vals)


def video_metrics(ref: Any, frames: Any) -> dict[str, Any]:
    """{"psnr_db", "psnr_per_frame_db", "ssim", "ssim_per_frame"} of (F, H, W, 3) uint8 `frames` against `ref`
    (`vsagen.media.metrics`); the reference itself (the same array) gets +inf and 1 without computing."""
    if frames is ref:
        n = len(ref)
        return {"psnr_db": math.inf, "psnr_per_frame_db": [math.inf] * n, "ssim": 1.0, "ssim_per_frame": [1.0] * n}
    p, p_frames = psnr_db(ref, frames)
    s, s_frames = ssim(ref, frames)
    return {"psnr_db": p, "psnr_per_frame_db": p_frames, "ssim": s, "ssim_per_frame": s_frames}


def key_tiles_kept(info: dict[str, Any], grid: tuple[int, int, int]) -> list[int] | None:
    """[K, tiles] of a VSA-family backend's description `info` ({"sparsity", "tile", ...}) on `grid`: how many key
    tiles of its cube each query tile keeps (K = ceil((1 - sparsity) tiles), VSA's top-k; with "topk_count":
    "tokens", ceil((1 - sparsity) tokens / tile volume)), so runs of different tiles or sparsities compare at their
    real density; None for backends without a tile and a sparsity."""
    if "tile" not in info or info.get("sparsity") is None:
        return None
    from ..kernels.reference import top_k_from_sparsity, top_k_from_tokens
    from ..layout import parse_tile, tile_layout

    layout = tile_layout(tuple(grid), parse_tile(info["tile"]))
    n = layout.num_tiles
    if info.get("topk_count") == "tokens":  # FastVideo's count before its PR #1517 (the `topk_count` option)
        return [top_k_from_tokens(float(info["sparsity"]), layout.num_tokens, layout.tile_volume, n), n]
    return [top_k_from_sparsity(float(info["sparsity"]), n), n]


def _walk(plan: Any, warmup: int) -> str:
    """How a run walks, for its progress line: "1 warm-up + 50 steps, CFG 5" or "1 warm-up pass + 3 steps (dmd, no
    CFG)" (a re-noise sampler warms up with one whole pass)."""
    n, renoise = plan.steps, plan.sampler.renoise
    warm = (f"{warmup} warm-up {'pass' if renoise else 'step' + 's' * (warmup != 1)} + " if warmup else "")
    how = f"{plan.sampler.name}, no CFG" if renoise else (f"CFG {plan.guidance:g}" if plan.guidance > 1 else "no CFG")
    return f"{warm}{n} step{'s' if n != 1 else ''} ({how})"


@contextlib.contextmanager
def flow_shift(pipe: Any, shift: float | None) -> Iterator[None]:
    """Within the block, the pipeline's scheduler (UniPC, loaded with the request's first flow shift by
    `vsagen.models.loading`) runs at flow shift `shift`: a scheduler of its class from its config with that shift
    replaces it for the block, and the loaded one comes back after; nothing changes for None (a re-noise sampler, whose
    sigmas are used as given), the loaded shift, or a scheduler without a flow shift."""
    own = pipe.scheduler
    loaded = getattr(own.config, "flow_shift", None)
    if shift is None or loaded is None or loaded == shift:
        yield
        return
    pipe.scheduler = type(own).from_config(own.config, flow_shift=shift)
    try:
        yield
    finally:
        pipe.scheduler = own


def compare(cfg: CompareConfig, *, log: Callable[[str], None] = lambda m: None, progress: bool = True,
            cancelled: Callable[[], bool] = lambda: False) -> CompareReport:
    """Generate every run of `cfg` (each sampler with each backend) on one loaded pipeline, compare each with the
    reference and write the folder's files (module docstring).

    Args:
        cfg: the validated request (`resolve_compare`).
        log: receives progress lines; progress: show diffusers' progress bar per run.
        cancelled: asked before the files are written; True (an interrupt a finalizer swallowed) raises
            KeyboardInterrupt instead.

    Returns:
        The report (also written as compare.json / compare.csv).

    Raises:
        BadInput: a backend cannot run on this device / dtype or refuses the grid (before loading where the
            preset says the model's strides), or an output file appeared during the run.
        ModelNotFound: the checkpoint cannot be loaded.
        RunFailure: out of GPU memory (the message names the run), or a decoded video of the wrong size.
        KeyboardInterrupt: `cancelled()`; no file is left.
    """
    import torch

    from .. import __version__
    from ..estimate import cpu_time_estimate
    from ..models.loading import versions
    from ..pipeline import Session

    device = torch.device(cfg.device)
    # one probe per backend, shared by its runs (each run sets the steps it measures and reads its errors after)
    probes = [AttentionProbe(spec.build(), cfg.runs[0].error_steps) for spec in cfg.backends]
    # each backend refuses what it cannot serve before loading (`Session.load`); weights are attached per run
    session = Session.load(load_request(cfg), probes, progress=progress, log=log)
    if cfg.device == "cpu":  # hours of work on a real size: said once the model loaded
        warning = cpu_time_estimate(cfg, runs=len(cfg.runs), runs_of="runs")
        if warning is not None:
            log(warning)
    # every decoder of --vae built once (the first is the one the model loaded with); None: that one decodes
    states = decoder_states(cfg, session.pipe.vae, session.notes) if cfg.several_vaes else None
    results: list[_RunResult] = []
    with precision_sets(cfg, session.pipe, session.notes) as put:  # every --quant precision's linears, built once
        session.notes[0:0] = cfg.notes
        for note in session.notes:
            log(f"note: {note}")
        plan = session.plan(cfg.tile_fit)
        session.prompts()
        warmed: set[int] = set()  # the decoders decoded once untimed (several decoders with --warmup)
        for i, run_of in enumerate(cfg.runs):
            if run_of.vae_index == 0:  # a (precision, sampler, backend, cache, LoRA scale)'s DiT run, each decoder
                if run_of.lora_scale is not None:  # the --lora of row scales at this run's (merged again where fused)
                    session.model.lora_rescale(run_of.lora_scale)
                dit = _generate(cfg, session, plan, probes, i, log, put(run_of.quant_index))
            results.append(_decode(cfg, session, run_of, dit, states, warmed, log))
    ref = results[0]
    rows = [_row(res, ref, probes[res.run_of.backend_index].report(device).info, plan.denoise_grid, cfg.runs[0].label,
                 log) for res in results]
    if states is not None:
        reattach(session.pipe.vae, states[0])
    report = CompareReport(settings=cfg.summary(), versions={"vsagen": __version__, **versions(cfg.device)},
                           rows=rows, files={k: str(v) for k, v in cfg.files.items()}, load_s=session.load_s,
                           text_encode_s=session.text_encode_s, notes=_report_notes(cfg, session),
                           vae={**vae_summary(session.model.pipe.vae),
                                "vae_tiling_choice": session.vae_tiling.summary() if session.vae_tiling else None},
                           lora=session.model.loras)
    if cancelled():
        raise KeyboardInterrupt
    log(f"writing {len(cfg.files)} files into {cfg.out}/")
    write_outputs(cfg, report, [r.frames for r in results], log=log)
    return report


@dataclass
class _DitRun:
    """One DiT run of `compare` (a (sampler, backend, cache) triple): its probe's errors (per step, per layer), the
    `Session.run` result (latents, records), the probe's seconds and the timing report without them."""
    errors: tuple[Any, Any]
    run: Any
    probe_s: float
    timing: Any
    quant: dict[str, Any]  # the precision its linears ran in (`compare_quant.precision_sets`)


@dataclass
class _RunResult:
    """One run of `compare`: what it was, its DiT run (shared by the runs that decode the same latents), its uint8
    frames, the seconds its decode took and what decoded it (`vae_summary`)."""
    run_of: Any
    dit: _DitRun
    frames: Any
    decode_s: float
    vae: dict[str, Any]


def _generate(cfg: CompareConfig, session: Any, plan: Any, probes: list[AttentionProbe], i: int,
              log: Callable[[str], None], quant: dict[str, Any]) -> _DitRun:
    """Run `cfg.runs[i]`'s DiT on the loaded `session` (its sampler, backend probe and cache; its precision's linears
    in place, `quant` their record), its latents undecoded, and take the probe's region out of its timings.

    Raises:
        RunFailure: out of GPU memory (the message names the run).
    """
    from ..timing import TimingReport

    runs = cfg.runs
    run_of = runs[i]
    sp, probe, label, at = run_of.plan, probes[run_of.backend_index], run_of.label, run_of.error_steps
    probe.steps = frozenset(at)
    log(f"[{i + 1}/{len(runs)}] {label}{' (reference)' if i == 0 else ''}: {_walk(sp, cfg.warmup)} at "
        f"{cfg.frames}x{cfg.height}x{cfg.width}, attention error at step{'s' if len(at) != 1 else ''} "
        f"{', '.join(map(str, at)) or 'none'}")
    what = f"comparing {label}"
    with flow_shift(session.pipe, None if sp.sampler.renoise else sp.flow_shift):
        run = session.run(probe, plan, what=what, sampler=sp.sampler, guidance=sp.guidance, steps=sp.steps,
                          cache=run_of.cache)
    records, probe_s = without_region(run.records, PROBE_REGION)
    return _DitRun(probe.errors(), run, probe_s, TimingReport.from_records(records, cfg.device, warmup_s=run.warmup_s),
                   quant)


def _decode(cfg: CompareConfig, session: Any, run_of: Any, dit: _DitRun, states: list[dict[str, Any]] | None,
            warmed: set[int], log: Callable[[str], None]) -> _RunResult:
    """Decode `dit`'s final latents with `run_of`'s decoder (`states[run_of.vae_index]`, reattached to the VAE; None:
    the one the model loaded with) into uint8 frames, timed (host clock, the device synchronized; with several
    decoders and `cfg.warmup`, each decoder first decodes once untimed: the first decode of a process pays cuDNN's
    and the allocator's set-up).

    Raises:
        RunFailure: out of GPU memory while decoding (the message names the run), or frames of the wrong size.
    """
    import time

    import torch

    from ..errors import out_of_memory_as_failure
    from ..pipeline import decode_latents, video_frames

    vae = session.pipe.vae
    if states is not None:
        reattach(vae, states[run_of.vae_index])
    sync = torch.cuda.synchronize if torch.device(cfg.device).type == "cuda" else (lambda: None)
    what = f"decoding {run_of.label}"
    log(f"{what} ({vae_summary(vae)['vae_decoder']} VAE decoder)")
    session.decide_vae_tiling(dit.run.latents, streamed=False)  # --vae-tiling auto: by memory, for this decoder
    with out_of_memory_as_failure(what, cfg.memory_hints()), torch.inference_mode():
        if states is not None and cfg.warmup and run_of.vae_index not in warmed:
            decode_latents(session.pipe, dit.run.latents)
            warmed.add(run_of.vae_index)
        sync()
        t0 = time.perf_counter()
        video = decode_latents(session.pipe, dit.run.latents)
        sync()
        decode_s = time.perf_counter() - t0
        frames = video_frames(session.pipe, video, (cfg.frames, cfg.height, cfg.width))
    return _RunResult(run_of, dit, frames, decode_s, vae_summary(vae))


def _row(res: _RunResult, ref: _RunResult, info: dict[str, Any], grid: tuple[int, int, int], ref_label: str,
         log: Callable[[str], None]) -> CompareRow:
    """The `CompareRow` of one run against the reference run `ref` (speed-up, PSNR / SSIM of the frames, latents'
    relative L2, attention errors); `info` is the run's backend report info, `grid` the denoised latent grid."""
    from ..bench import rel_l2

    run_of, (per_step, per_layer), run, timing = res.run_of, res.dit.errors, res.dit.run, res.dit.timing
    spec, sp = run_of.spec, run_of.plan
    if res is not ref:
        log(f"PSNR / SSIM of {run_of.label} against {ref_label}")
    steps = max(len(timing.dit_per_step_s), 1)
    mean, worst = _mean_max(per_layer)
    latents = rel_l2(run.latents, ref.dit.run.latents)
    return CompareRow(
        label=run_of.label, backend=spec.name, spec=spec.text(), sparsity=spec.sparsity,
        impl=info.get("impl_ran", spec.impl), file=str(run_of.file), sampler=sp.sampler.summary(),
        steps=sp.steps, guidance=sp.guidance, flow_shift=None if sp.sampler.renoise else sp.flow_shift,
        dit_forwards=timing.dit_forwards, dit_s_per_video=timing.dit_s, dit_s_per_step=timing.dit_s / steps,
        dit_per_step_s=list(timing.dit_per_step_s),
        attention_s_per_step=None if timing.self_attention_s is None else timing.self_attention_s / steps,
        speedup_vs_reference=1.0 if res.dit is ref.dit else ref.dit.timing.dit_s / timing.dit_s,
        **video_metrics(ref.frames, res.frames),
        latents_rel_l2=latents if math.isfinite(latents) else None,  # NaN latents: no distance
        error_steps=list(run_of.error_steps), attention_rel_l2=per_step, attention_rel_l2_per_layer=per_layer,
        attention_rel_l2_mean=mean, attention_rel_l2_max=worst,
        probe_s=res.dit.probe_s, warmup_s=run.warmup_s, backend_info=info,
        vae_decoder=res.vae["vae_decoder"], vae_weights=res.vae["vae_weights"], vae_tiling=res.vae["vae_tiling"],
        decode_s=res.decode_s, decode_saved_s=ref.decode_s - res.decode_s,
        decode_speedup_vs_reference=ref.decode_s / res.decode_s if res.decode_s > 0 else None,
        key_tiles_kept=key_tiles_kept(info, grid), quant=res.dit.quant, lora_scale=run_of.lora_scale,
        **cache_counts(run_of.cache, timing))


def _report_notes(cfg: CompareConfig, session: Any) -> list[str]:
    """The report's notes: the session's (each once, in order), then what the timings and metrics mean here."""
    notes = list(dict.fromkeys(session.notes))
    if cfg.device != "cuda":
        notes.append("CPU timings (each run measured once, in order): indicative only; compare speed on a GPU")
    if session.model.random_weights or cfg.source.kind == "tiny":
        notes.append("random weights: PSNR, SSIM and the errors measure how far each run moves this network's "
                     "output, not the quality of real video")
    return notes


def write_outputs(cfg: CompareConfig, report: CompareReport, videos: list[Any], *,
                  log: Callable[[str], None] = lambda m: None) -> None:
    """Write every file of `cfg.files` as one set (`vsagen.media.video.Outputs`): each to a temporary file first, then
    all moved into place together; if one fails, or the write is interrupted (Ctrl-C, SIGTERM: held to a safe
    point), none is left, nor the folder if this call created it. Once all are in place, remove the files an
    earlier compare wrote into the folder (`stale_outputs`, read before the new compare.json replaces the old one)
    that this run did not write again.

    Args:
        videos: each run's (F, H, W, 3) uint8 frames, in `cfg.runs` order.

    Raises:
        BadInput: a file appeared meanwhile (without `overwrite`); matplotlib is missing for the plot.
        SignalInterrupt: an ending signal arrived before the files were in place.
    """
    import json

    from . import compare_render
    from ..media.sheet import save_sheet, sheet_title
    from ..media.video import Outputs, encode_mp4, find_ffmpeg

    files = cfg.files
    stale = stale_outputs(cfg.out, files.values())
    find_ffmpeg()  # resolved (and cached) while a signal still interrupts at once
    with Outputs(overwrite=cfg.overwrite, folder=cfg.out) as outputs:
        runs = cfg.runs
        for run, frames in zip(runs, videos):
            outputs.add(run.file, lambda tmp, frames=frames: encode_mp4(frames, tmp, cfg.fps, cfg.encoding))
        if cfg.sheet:
            words = cfg.sampler_labels()
            for run, frames in zip(runs, videos):
                sampler = words[cfg.samplers.index(run.plan)] if cfg.several_samplers else ""
                what = (run.spec.short_text() + (f" + {run.cache.short_text()}" if run.cache.enabled else "")
                        + (f" | vae {cfg.vae_decoders[run.vae_index].short_text()}" if cfg.several_vaes else "")
                        + (f" | {precision_label(cfg.quants[run.quant_index], cfg.dtype)} linears"
                           if cfg.several_quants else ""))
                title = sheet_title(cfg.model, what, cfg.frames, cfg.height, cfg.width,
                                    run.plan.steps, cfg.seed, sampler, f"compare, reference {runs[0].label}")
                outputs.add(files[f"{run.label} sheet"],
                            lambda tmp, frames=frames, title=title: save_sheet(frames, tmp, cfg.fps, title))
        panels = compare_render.side_by_side(videos, cfg.labels)
        outputs.add(files["side-by-side"], lambda tmp: encode_mp4(panels, tmp, cfg.fps, cfg.encoding))
        if "plot" in files:
            compare_render.write_plot(report, files["plot"], outputs=outputs)
        text = json.dumps(report.to_dict(), indent=2, allow_nan=False) + "\n"
        outputs.add(files["json"], lambda tmp: tmp.write_text(text, encoding="utf-8"))
        csv_text = compare_render.render_csv(report)
        outputs.add(files["csv"], lambda tmp: tmp.write_text(csv_text, encoding="utf-8"))
        outputs.publish()
    for path in files.values():
        log(f"wrote {path}")
    for path in stale:
        path.unlink(missing_ok=True)
        log(f"removed {path} (an earlier compare's, not written by this one)")
