"""`CompareConfig`: a validated `vsagen compare` request: the shared part (`vsagen.request.resolve.resolve`: a list
of backends, a list of samplers, a list of step caches, a list of VAE decoders and a list of precisions of the
blocks' linears, the first of each the reference) and its own: the runs (every (sampler, backend, cache) triple,
sampler-major, a backend's caches side by side, each triple's latents decoded by every decoder, all of it once per
precision), the attention-error steps of each, the output folder and its files (and an earlier run's files it
leaves behind: `stale_outputs`)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Collection

from ..attention.spec import BackendSpec
from ..cache.cache_spec import NO_CACHE, CacheSpec
from ..errors import BadInput
from ..models.sources import resolve_model
from ..media.paths import check_folder, check_target, default_folder, sheet_path
from ..request.options import RequestOptions, VaeSpec, request_options
from ..request.resolve import SEVERAL, Request, negative_prompt_note, request_fields, resolve
from ..request.sampling import SamplerPlan
from ..media.encoding import Encoding, check_encoder

DEFAULT_ATTN = "full,vsa"
DEFAULT_ERROR_STEPS = "first,middle,last"
COMPARE_WARMUP = 1  # untimed warm-up steps per run unless --warmup says otherwise (as `vsagen profile`)
SIDE_BY_SIDE, JSON_FILE, CSV_FILE, PLOT_FILE = "side-by-side.mp4", "compare.json", "compare.csv", "compare.png"


@dataclass(frozen=True)
class CompareRun:
    """One run of a comparison: a sampler (with its steps, CFG scale and flow shift), a backend and a step cache.

    Attributes:
        plan: the sampler and what it leaves the run (`vsagen.request.sampling.SamplerPlan`).
        spec: the attention backend.
        label: names the run in tables, panels and the plot: the backend's label, " + <cache>" for a cached run
            ("vsa 0.8 + first-block"), " / <sampler>" where samplers differ ("vsa 0.8 / dmd").
        file: the run's mp4.
        error_steps: the 0-based steps of this run at which its attention is compared with dense attention.
        backend_index: the backend's index in `CompareConfig.backends`.
        cache: the step cache (`none`: uncached).
        vae_index: the decoder's index in `CompareConfig.vae_decoders`; the runs of one (sampler, backend, cache,
            LoRA scale) share one DiT run, whose latents the decoder of each decodes (0 starts one).
        quant_index: the precision's index in `CompareConfig.quants` (the blocks' linears the run's DiT runs in).
        lora_scale: the scale of the `--lora` that lists row scales (`scale=S1,S2,...`), None without one.
    """

    plan: SamplerPlan
    spec: BackendSpec
    label: str
    file: Path
    error_steps: tuple[int, ...]
    backend_index: int
    cache: CacheSpec = NO_CACHE
    vae_index: int = 0
    quant_index: int = 0
    lora_scale: float | None = None


def precision_label(quant: str, dtype: str) -> str:
    """The blocks' linears of a `--quant` precision in a word, for labels and file names: "int8", "fp8", or the
    run's dtype for "none" ("bf16")."""
    return dtype if quant == "none" else quant


def sampler_label(plan: SamplerPlan, shift: bool = False) -> str:
    """A sampler plan in a few words: a re-noise sampler's entry ("dmd", "dmd:sigmas=1.0,0.75,0.5"); the checkpoint's
    scheduler with its steps and CFG ("default 50 steps CFG 5", "default 4 steps no CFG"), and its flow shift when
    `shift` ("default 4 steps CFG 5 shift 8")."""
    if plan.sampler.renoise:
        return plan.sampler.text
    cfg = f"CFG {plan.guidance:g}" if plan.guidance > 1 else "no CFG"
    return (f"default {plan.steps} step{'s' if plan.steps != 1 else ''} {cfg}"
            + (f" shift {plan.flow_shift:g}" if shift else ""))


def _plan_key(plan: SamplerPlan) -> tuple[Any, ...]:
    """What a run of `plan` does: two plans of one key run the same denoising."""
    s = plan.sampler
    if s.renoise:
        return ("renoise", s.sigmas, s.timesteps, s.noise)
    return ("default", plan.steps, plan.guidance, plan.flow_shift)


@dataclass(frozen=True, kw_only=True)
class CompareConfig(Request):
    """A validated `vsagen compare` request (see `Request` for the shared fields).

    The runs (`runs`) are every (sampler, backend, cache) triple of `samplers` x `backends` x `caches`, in that
    order (sampler-major, a backend's caches side by side), as given, all of them once per precision of `quants`
    (precision-major); the first is the reference. `sampler_error_steps` are, per sampler, the 0-based denoising steps whose
    attention is compared with dense attention (sorted, each < that sampler's steps); `error_steps` the first's.
    `out` is the output folder, `files` the paths written in it. `plot` draws compare.png (matplotlib); `sheet`
    writes each run's contact sheet beside its mp4. `labels` name the runs in tables, panels and the plot.
    `encoding`: how the mp4s are encoded (`--codec`).
    """

    fps: int
    out: Path
    error_steps: tuple[int, ...]
    plot: bool
    sheet: bool = False
    sampler_error_steps: tuple[tuple[int, ...], ...] = ()
    encoding: Encoding = Encoding()

    @property
    def several_samplers(self) -> bool:
        """Whether the runs differ in their sampler (labels and file names then name it)."""
        return len(self.samplers) > 1

    def sampler_labels(self) -> list[str]:
        """Each sampler's `sampler_label`, with the flow shift where the `default` entries differ in it."""
        shifts = {p.flow_shift for p in self.samplers if not p.sampler.renoise}
        return [sampler_label(p, shift=len(shifts) > 1) for p in self.samplers]

    @property
    def several_vaes(self) -> bool:
        """Whether the runs differ in their VAE decoder (`--vae` lists several: labels and file names then name it)."""
        return len(self.vae_decoders) > 1

    @property
    def several_quants(self) -> bool:
        """Whether the runs differ in the precision of the blocks' linears (`--quant` lists several: labels and file
        names then name it)."""
        return len(self.quants) > 1

    @property
    def lora_scales(self) -> tuple[float, ...]:
        """The row scales of the `--lora` that lists several (`scale=S1,S2,...`), () without one."""
        return next((spec.scales for spec in self.loras if spec.scales), ())

    @property
    def runs(self) -> list[CompareRun]:
        """Every (sampler, backend, cache) triple, sampler-major (each sampler with every backend, each backend with
        every cache), each at every row scale of a `--lora` that lists several (`lora_scales`), each with every
        decoder of `vae_decoders` when it lists several (one DiT run, its latents decoded by each), the reference
        first; with several `quants`, all of that once per precision, in their order (precision-major: the
        reference is the first precision's first run; several precisions and several LoRA scales are not asked
        together, `resolve` refuses it).

        Labels: the backend's ("vsa 0.875"; its spec without default options where a name repeats), then
        " + <cache>" for a cached run (the cache's entry without default options: "vsa 0.875 + first-block"), then
        " / <sampler>" (`sampler_label`) when the samplers differ, then " / LoRA <scale>" when the LoRA scales
        differ, then " / <decoder> VAE" when the decoders differ ("full / tiny VAE"; a weights file by its name:
        `VaeSpec.short_text`), then " / <precision> linears" when the precisions differ ("full / int8 linears",
        "full / bf16 linears": `precision_label`); a run listed again (a library caller's list) gets " (2)",
        " (3)", ... Files: each run's mp4 in `out`, named after its backend's spec without default options
        (`file_stem`: `vsa-sparsity-0.9.mp4`), then its cache's (`vsa-first-block.mp4`), then its sampler's words
        when the samplers differ (`vsa-dmd.mp4`, `full-default-50-steps-cfg-5.mp4`), then "lora-<scale>" when the
        LoRA scales differ (`full-lora-0.5.mp4`), then "vae-<decoder>" when the decoders differ
        (`full-vae-tiny.mp4`), then "quant-<entry>" when the precisions differ (`full-quant-none.mp4`,
        `full-quant-int8.mp4`); a name taken by an earlier run gets `-<index>`."""
        names = [s.name for s in self.backends]
        backend_labels = [s.short_text() if names.count(s.name) > 1 else s.label for s in self.backends]
        plans = self.samplers or (SamplerPlan(self.sampler, self.steps, self.guidance, self.flow_shift),)
        words = self.sampler_labels() if self.samplers else [""]
        steps = self.sampler_error_steps or (self.error_steps,) * len(plans)
        caches = self.caches or (NO_CACHE,)
        vaes = [v.short_text() for v in self.vae_decoders] if self.several_vaes else [""]
        quants = [precision_label(q, self.dtype) for q in self.quants] if self.several_quants else [""]
        scales = self.lora_scales or (None,)
        runs = [(q, i, j, c, w, v) for q in range(len(quants)) for i in range(len(plans))
                for j in range(len(self.backends)) for c in caches for w in scales for v in range(len(vaes))]
        labels = [backend_labels[j] + (f" + {c.short_text()}" if c.enabled else "")
                  + (f" / {words[i]}" if self.several_samplers else "")
                  + (f" / LoRA {w:g}" if w is not None else "")
                  + (f" / {vaes[v]} VAE" if self.several_vaes else "")
                  + (f" / {quants[q]} linears" if self.several_quants else "") for q, i, j, c, w, v in runs]
        labels = [x if x not in labels[:k] else f"{x} ({labels[:k].count(x) + 1})" for k, x in enumerate(labels)]
        stems: list[str] = []
        for q, i, j, c, w, v in runs:
            spec = self.backends[j]
            stem = file_stem(spec.short_text()) or spec.name
            if c.enabled:
                stem += "-" + (file_stem(c.short_text()) or c.name)
            if self.several_samplers:
                stem += "-" + (file_stem(words[i].lower()) or "sampler")
            if w is not None:
                stem += f"-lora-{w:g}"
            if self.several_vaes:
                stem += "-vae-" + file_stem(vaes[v])
            if self.several_quants:
                stem += "-quant-" + self.quants[q]
            stems.append(stem if stem not in stems else f"{stem}-{len(stems)}")
        return [CompareRun(plans[i], self.backends[j], label, self.out / f"{stem}.mp4", steps[i], j, c, v, q, w)
                for (q, i, j, c, w, v), label, stem in zip(runs, labels, stems)]

    @property
    def labels(self) -> list[str]:
        """Each run's label (`runs`)."""
        return [r.label for r in self.runs]

    @property
    def run_files(self) -> list[Path]:
        """Each run's mp4 (`runs`)."""
        return [r.file for r in self.runs]

    @property
    def files(self) -> dict[str, Path]:
        """{what: path} of every file the run writes: each run's mp4 under its label, then (`sheet`) each run's
        contact sheet under "<label> sheet", "side-by-side", "plot" (when drawn), "json", "csv"."""
        runs = self.runs
        out = {r.label: r.file for r in runs}
        if self.sheet:
            out.update({f"{r.label} sheet": sheet_path(r.file) for r in runs})
        out["side-by-side"] = self.out / SIDE_BY_SIDE
        if self.plot:
            out["plot"] = self.out / PLOT_FILE
        out.update(json=self.out / JSON_FILE, csv=self.out / CSV_FILE)
        return out

    def memory_hints(self) -> list[str]:
        """`--vae-tiling on` where not given."""
        return [] if self.vae_tiling == "on" else ["--vae-tiling on"]

    def summary(self) -> dict[str, Any]:
        """JSON-ready settings (no Path objects, no preset internals)."""
        d = asdict(self)
        d["caches"] = [c.summary() for c in self.caches]
        d.pop("samplers")
        d.pop("sampler_error_steps")
        d["sampler"] = self.sampler.summary()
        d["flow_shift"] = self.used_flow_shift  # the first sampler's, as `sampler`; each one's in `samplers`
        d["samplers"] = [{"sampler": p.sampler.summary(), "label": label, "steps": p.steps, "guidance": p.guidance,
                          "flow_shift": None if p.sampler.renoise else p.flow_shift,
                          "error_steps": list(steps)}
                         for p, label, steps in zip(self.samplers, self.sampler_labels(), self.sampler_error_steps)]
        for key in ("source", "tile_fits", "attn_requested", "attn_note"):
            d.pop(key)
        d["tile_fit"] = self.tile_fit
        d["vae_decoder"] = self.vae_decoder.text()  # `--vae` as given (a weights file absolute)
        d["vae_decoders"] = [v.text() for v in self.vae_decoders]  # every entry (the first: `vae_decoder`)
        d["backends"] = [b.summary() for b in self.backends]
        d["quants"] = list(self.quants)  # every --quant precision resolved (the first: `quant`)
        d["error_steps"] = list(self.error_steps)
        d["out"] = str(self.out)
        d["model_source"] = {"kind": self.source.kind, "location": self.source.location,
                             "preset": self.source.preset.name,
                             "transformer_files": list(self.transformer_sources)}
        d.pop("transformer_files", None)
        return d


def file_stem(spec: str) -> str:
    """A file name stem for a backend spec (`NAME:KEY=VALUE...`): the parts joined by "-", a value's file extension
    left out, every character other than letters, digits, "." and "-" made "-" (`sparse-vdit:patterns=tiny.json`
    -> `sparse-vdit-patterns-tiny`, `vsa:sparsity=0.9` -> `vsa-sparsity-0.9`); "" when nothing is left."""
    parts = []
    for part in spec.split(":"):
        key, eq, value = part.partition("=")
        parts.append(f"{key}-{re.sub(r'[.][A-Za-z][A-Za-z0-9]*$', '', value)}" if eq else part)
    return re.sub(r"-{2,}", "-", re.sub(r"[^A-Za-z0-9.-]+", "-", "-".join(parts))).strip("-.")


def parse_error_steps(text: str, steps: int, run: str = "") -> tuple[int, ...]:
    """`--error-steps`: comma-separated 0-based step indices and the words first (0), middle (steps // 2) and
    last (steps - 1); "none" for no attention error. Returns the sorted distinct steps.

    Args:
        text: the option as given.
        steps: the run's denoising steps.
        run: names the run in the message where runs differ in their steps (e.g. "the dmd run"); "" for one.

    Raises:
        BadInput: an empty entry, a word or number that is not a step of the run (0 <= step < steps).
    """
    names = {"first": 0, "middle": steps // 2, "last": steps - 1}
    if text.strip().lower() == "none":
        return ()
    out = set()
    for item in (x.strip().lower() for x in text.split(",")):
        if item in names:
            out.add(names[item])
            continue
        try:
            step = int(item)
        except ValueError:
            raise BadInput(f"--error-steps {text!r}: give step indices from 0 and / or first, middle, last "
                           "(comma-separated), or none") from None
        if not 0 <= step < steps:
            where = (f"{run}, which runs steps 0 to {steps - 1} (a numbered step must be a step of every run; first, "
                     "middle and last are each run's own)") if run else f"this run (0 to {steps - 1})"
            raise BadInput(f"--error-steps {text!r}: step {step} is not a step of {where}")
        out.add(step)
    return tuple(sorted(out))


def check_sampler_plans(plans: tuple[SamplerPlan, ...], text: str) -> None:
    """Refuse two `--sampler` entries that run the same denoising (written differently: `default` and
    `default:steps=4` where the preset runs 4 steps).

    Raises:
        BadInput: one line naming both entries.
    """
    keys = [_plan_key(p) for p in plans]
    for i, key in enumerate(keys):
        if key in keys[:i]:
            first = plans[keys.index(key)]
            raise BadInput(f"--sampler {text!r}: {first.sampler.text} and {plans[i].sampler.text} run the same "
                           f"({sampler_label(plans[i], shift=True)}); give each sampler once")


def _check_two_runs(req: Any, attn: str, sampler_text: str) -> None:
    """BadInput unless the resolved compare request `req` makes at least two runs (backends x samplers x caches x
    VAE decoders x precisions x LoRA scales): the reference and one to compare with it."""
    scales = next((spec.scales for spec in req.loras if spec.scales), (None,))
    if len(req.backends) * len(req.samplers) * len(req.caches) * len(req.vae_decoders) * len(req.quants) \
            * len(scales) < 2:
        raise BadInput(f"--attn {attn!r} with --sampler {sampler_text!r} is one run: compare needs the reference and "
                       "at least one run to compare with it: two backends (e.g. --attn full,vsa), two samplers "
                       "(e.g. --sampler dmd,default:steps=50:guidance=5), two caches (e.g. --cache none,first-block), "
                       "two VAE decoders (e.g. --vae stock,tiny), two precisions (e.g. --quant none,int8) or two LoRA "
                       "scales (e.g. --lora FILE:scale=0,1)")


def _plot_choice(plot: bool | None) -> tuple[bool, tuple[str, ...]]:
    """Whether compare draws its plot, and the note when it does not: `plot=None` draws it where matplotlib is
    installed (else a note), False never, True needs matplotlib (BadInput without it)."""
    if plot is False:
        return False, ()
    import importlib.util

    if importlib.util.find_spec("matplotlib") is not None:
        return True, ()
    if plot:  # asked for by name
        raise BadInput("the plot needs matplotlib, which is not installed: pip install 'vsagen[plot]', or "
                       "pass --no-plot")
    return False, ("no plot (compare.png): matplotlib is not installed (pip install 'vsagen[plot]')",)


def resolve_compare_options(prompt: str, options: RequestOptions, *, error_steps: str = DEFAULT_ERROR_STEPS,
                            plot: bool | None = None) -> CompareConfig:
    """Validate a `vsagen compare` request: the shared part (`vsagen.request.resolve.resolve`; `--attn` a list of
    backends as `vsagen profile` takes it, `--sampler` a list of samplers (`parse_sampler_list`; default the preset's),
    `--cache` a list of step caches (`vsagen.request.caching.resolve_caches`; default none), `--vae` a list of VAE
    decoders (`vsagen.request.options.VaeList.several`; each checked against the model), `--quant` a list of
    precisions (`vsagen.request.quantization.resolve_quants`: each against the device and the model), at least two
    runs between them, the first the reference) and its own. `warmup` defaults to COMPARE_WARMUP.
    `--error-steps` words are each run's own steps (first, middle, last of its step count); a numbered step must be a
    step of every run. `options.output.out` is a folder (default `vsagen-<model>-compare-seed<seed>`); none of the
    files the run writes there (`CompareConfig.files`) may exist unless `overwrite`.

    Raises:
        BadInput: any invalid setting (one message naming the flag), before anything is loaded or written: a single
            run, an unknown backend, sampler, decoder, precision or option, an entry written twice or two sampler
            entries that run the same, a precision the device cannot run (fp8 on the CPU) or two that resolve to one, a decoder the model cannot take (`--vae light` without one, tiny weights of another latent
            width), a flag a sampler refuses (`--sampler dmd --guidance 5`), an image-to-video model, a size, frame
            count or step count the model refuses, bad --error-steps, an existing output file without `overwrite`,
            an unwritable folder, `plot=True` without matplotlib (`plot=None`, the default, draws the plot when
            matplotlib is installed and otherwise adds a note).
    """
    if not prompt.strip():
        raise BadInput("the prompt is empty")
    attn = options.attention.attn.text  # parsed with its group: a bad entry was refused before the model is resolved
    model = options.model.model
    src = resolve_model(model)
    if src.image_to_video:
        raise BadInput(f"--model {model} is an image-to-video model; vsagen compare runs text-to-video models")
    s = options.sampling
    options = dataclasses.replace(options, sampling=dataclasses.replace(
        s, warmup=COMPARE_WARMUP if s.warmup is None else s.warmup))
    out = options.output
    if out.out is not None:  # before `resolve`, whose `--device auto` imports torch to ask for CUDA (seconds)
        _check_out_folder(out.out)
    sampler_text = s.sampler.text if s.sampler is not None else src.preset.defaults.sampler
    try:
        req = resolve(src, options, prompt=prompt, backends=SEVERAL, several_samplers=True, several_vaes=True,
                      several_quants=True, several_loras=True)
    except BadInput as e:  # a flag a sampler of the list refuses: say how to set it for one entry
        listed = s.sampler is not None and len(s.sampler.entries) > 1  # (a preset's sampler is one entry)
        if listed and str(e).startswith(("--steps", "--guidance", "--flow-shift")):
            d = src.preset.defaults
            raise BadInput(f"{e} (--steps, --guidance and --flow-shift apply to every --sampler entry; set a default "
                           f"entry's own: default:steps={d.steps}:guidance={d.guidance:g}:shift={d.flow_shift:g})") \
                from None
        raise
    _check_two_runs(req, attn, sampler_text)
    check_sampler_plans(req.samplers, sampler_text)
    if min(req.height, req.width) < 7:
        raise BadInput(f"SSIM needs frames of at least 7 x 7 pixels; got {req.width} x {req.height}")
    several = len(req.samplers) > 1
    words = [sampler_label(p) for p in req.samplers]
    chosen = tuple(parse_error_steps(error_steps, p.steps, f"the {w} run" if several else "")
                   for p, w in zip(req.samplers, words))
    notes = req.notes
    if several and any(p.guidance > 1 for p in req.samplers):  # the negative prompt steers the runs with CFG
        first = negative_prompt_note(s.negative_prompt, req.guidance, req.sampler)
        notes = tuple(n for n in notes if n != first)
    plot, plot_notes = _plot_choice(plot)
    notes += plot_notes
    folder = out.out if out.out is not None else default_folder(model, "compare", req.seed, out.overwrite)
    if out.encoding.note() is not None:
        notes = (*notes, out.encoding.note())
    cfg = CompareConfig(**{**request_fields(req), "notes": notes}, fps=src.preset.defaults.fps if out.fps is None
                        else out.fps, out=folder, error_steps=chosen[0], plot=plot, sheet=out.sheet,
                        sampler_error_steps=chosen, encoding=out.encoding)
    check_encoder(cfg.encoding)
    for path in cfg.files.values():
        check_target(path, cfg.overwrite, "--out folder")
    if out.out is None:
        _check_out_folder(folder)
    return cfg


def _check_out_folder(folder: Path) -> None:
    """compare's `--out`: a folder (created if missing) that takes new files.

    Raises:
        BadInput: a file there, or a folder that takes no new file (`check_folder`)."""
    if folder.exists() and not folder.is_dir():
        raise BadInput(f"--out {folder} is a file; give a folder (it is created if missing)")
    check_folder(folder)


def resolve_compare(prompt: str, *, attn: str = DEFAULT_ATTN, error_steps: str = DEFAULT_ERROR_STEPS,
                    plot: bool | None = None, **flags: Any) -> CompareConfig:
    """`resolve_compare_options` with the shared options as keyword arguments named as the flags
    (`vsagen.request.options.FLAGS`: model, attn, sampler, sparsity, height, steps, device, out, ...), for Python
    callers.

    Raises:
        BadInput: see `resolve_compare_options`.
        TypeError: an unknown keyword.
    """
    return resolve_compare_options(prompt, request_options(attn=attn, **flags), error_steps=error_steps, plot=plot)


# The files `compare` writes: an earlier run's files of these kinds that its compare.json lists may be removed
STALE_SUFFIXES = (".mp4", ".png", ".json", ".csv")


def stale_outputs(folder: Path, keep: Collection[Path]) -> list[Path]:
    """The files an earlier `compare` wrote into `folder` that a run writing `keep` leaves behind: those its
    compare.json lists under "files" (by file name, in `folder` itself, of a kind compare writes: STALE_SUFFIXES),
    that exist and are not in `keep`. Nothing without a readable compare.json of a compare run; never a file
    outside `folder`, a folder or a file the JSON does not list."""
    import json

    try:
        data = json.loads((folder / JSON_FILE).read_text())
    except (OSError, ValueError):
        return []
    listed = data.get("files") if isinstance(data, dict) and data.get("command") == "compare" else None
    if not isinstance(listed, dict):
        return []
    kept = {Path(p).name for p in keep}
    out = []
    for value in listed.values():
        name = Path(value).name if isinstance(value, str) else ""
        path = folder / name
        if (name and name not in kept and name.lower().endswith(STALE_SUFFIXES) and path not in out
                and path.is_file() and not path.is_symlink()):
            out.append(path)
    return out
