"""`vsagen t2v` / `vsagen i2v`: one generation on the orchestrator (`vsagen.pipeline.Session`), then its own part:
VAE decode, mp4, timing JSON.

Data flow: RunConfig -> diffusers WanPipeline (text to video) or WanImageToVideoPipeline (image to video: the input
image, and a last image for first/last-frame video, fitted to the requested size, CLIP-encoded and VAE-encoded into
the condition by diffusers) -> weights placed on the device, or offloaded (`--offload model|group`) -> VAE tiling on
or off (`--vae-tiling`) -> patch every transformer (`vsagen.apply`) -> text encoding -> denoising loop (diffusers'
own, with its tqdm bar) at the crop plan's size -> crop the latent back -> VAE decode -> mp4 + timing JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ..architecture import experts
from ..decode.decoder_choice import vae_summary
from ..errors import BadInput, RunFailure, out_of_memory_as_failure
from ..estimate import cpu_time_estimate
from ..layout import tile_layout
from ..models.loading import versions
from ..pipeline import Conditioning, Session
from ..quant.swap import precision_summary
from ..timing import TimingReport
from .generate_config import RunConfig


@dataclass
class RunResult:
    """What a run produced: the files and the JSON-ready summary (also written to `json_path`)."""

    video_path: Path
    json_path: Path
    report: TimingReport
    summary: dict[str, Any]


def nonfinite_latents_note(latents: Any) -> str | None:
    """The run note when the denoised latents hold NaN or infinity (the decoded video is then black or garbage):
    how many values, and what usually causes it. None when every value is finite.

    Args:
        latents: the denoised latents, any shape (a torch tensor).
    """
    import torch

    bad = int((~torch.isfinite(latents)).sum())
    if not bad:
        return None
    return (f"the denoised latents hold {bad} of {latents.numel()} values that are NaN or infinite, so the video is "
            "black or garbage: the weights (e.g. a --transformer file) may hold non-finite values, or the run's "
            "dtype overflows (try --dtype bf16 or fp32)")


def generate(cfg: RunConfig, *, log: Callable[[str], None] = lambda m: None, progress: bool = True,
             writer: bool = True, cancelled: Callable[[], bool] = lambda: False) -> RunResult | None:
    """Run one text-to-video (or, with `cfg.image`, image-to-video) generation and write the mp4 and its timing
    JSON. Image to video: the image is fitted to the requested size (`cfg.fit`) and handed to diffusers, which
    CLIP-encodes it and VAE-encodes the first-frame condition inside its pipeline call; those two stages are timed
    as "image_encode" and "condition_encode", apart from "denoise" (`time_condition_stages`). A last image
    (`cfg.last_image`, first/last-frame to video) is fitted the same way and handed over as diffusers'
    `last_image`: the condition video ends with it and its mask marks the last frame; a CLIP branch encodes both
    images.
    Under `--ulysses` / `--cfg-parallel` every rank runs this; only the `writer` (rank 0) decodes and writes, the
    others return None; rank 0's report holds every rank's timing row (`TimingReport.ranks`).
    The mp4 and the JSON (and a MagCache calibration's file, `Denoised.calibration`) are published together,
    unless `cancelled()` says an interrupt arrived that Python dropped (one raised inside a finalizer): then
    KeyboardInterrupt, nothing written.
    The weights are placed or offloaded as `cfg.offload` says (`load_model`) and the VAE decodes tiled as
    `cfg.vae_tiling` says, `auto` decided when the decode starts (`Session.decide_vae_tiling`); the JSON records
    both. The backend's own weights are attached before the weights are placed.

    Raises:
        BadInput: invalid request found only once the model is known (e.g. backend vs dtype).
        ModelNotFound: the checkpoint cannot be loaded.
        RunFailure: the run itself failed (message names the stage).
    """
    backend = cfg.backend.build()
    session = _load_session(cfg, backend, progress=progress, writer=writer, log=log)
    plan = session.plan(cfg.tile_fit)
    run = _denoise(cfg, session, backend, plan, log, encode=True, writer=writer)
    untimed = session.untimed(backend)
    ranks = None
    if cfg.processes > 1:  # every rank's DiT / attention / exchange times, to rank 0
        import torch.distributed as dist

        from ..parallel.launch import gather_to_writer

        mine = TimingReport.from_records(run.records, cfg.device, untimed=untimed)
        ranks = gather_to_writer(mine.rank_row(dist.get_rank()))
    if not writer:
        return None
    report, summary = _write_outputs(cfg, session, backend, plan, run, untimed, ranks, log=log, cancelled=cancelled)
    return RunResult(_video_path(cfg), cfg.json_out, report, summary)


def generate_seeds(cfgs: Sequence[RunConfig], *, log: Callable[[str], None] = lambda m: None, progress: bool = True,
                   cancelled: Callable[[], bool] = lambda: False,
                   published: Callable[[RunConfig, RunResult], None] = lambda c, r: None) -> list[RunResult]:
    """`vsagen t2v` / `i2v` `--seeds`: one video per request of `cfgs` (`resolve_runs`: the same request but for its
    seed and its files; never random weights, which come from the seed), on one process. The model is loaded once
    (from `cfgs[0]`) and the prompt encoded once (host clock, outside each video's timed total; a note says so),
    then each seed denoises, decodes and publishes its files as `generate` does: the latents, and so the video, are
    those of `generate(cfg)` for that seed alone. Each seed's set of files is published (and handed to `published`
    with its request) before the next seed starts, so an interrupt keeps the finished ones.

    Raises:
        BadInput, ModelNotFound, RunFailure: as `generate`; KeyboardInterrupt: as `generate`, the seeds already
            published staying on disk.
    """
    first = cfgs[0]
    backend = first.backend.build()
    session = _load_session(first, backend, progress=progress, writer=True, log=log)
    plan = session.plan(first.tile_fit)
    untimed = session.untimed(backend)
    loaded = session.notes[len(_request_notes(first)):]  # the load's own, after the request's
    results = []
    for i, cfg in enumerate(cfgs):
        session = replace(session, request=cfg)  # the prompt embeddings kept: the seed only draws the noise
        session.notes[:] = _request_notes(cfg) + loaded  # each video's JSON: its request's, the load's, its run's
        log(f"seed {cfg.seed} ({i + 1} of {len(cfgs)})")
        for note in _request_notes(cfg):
            if note not in _request_notes(first):  # (the first's were said with the load's)
                log(f"note: {note}")
        session.prompts()  # encoded on the first seed only
        session.notes.append(f"--seeds: the prompt was encoded once for the {len(cfgs)} seeds "
                             f"({session.text_encode_s:.2f} s, outside this video's timed total)")
        run = _denoise(cfg, session, backend, plan, log, encode=False)
        report, summary = _write_outputs(cfg, session, backend, plan, run, untimed, None, log=log,
                                         cancelled=cancelled, final=i == len(cfgs) - 1)
        results.append(RunResult(_video_path(cfg), cfg.json_out, report, summary))
        published(cfg, results[-1])
    return results


@dataclass
class TwoModes:
    """A text-image-to-video model (Wan2.2-TI2V-5B family) taking text and image requests on one load (`vsagen
    serve`): text requests run the loaded `WanPipeline` as `vsagen t2v` does, image requests a
    `WanImageToVideoPipeline` over the same components as `vsagen i2v` does (`image_to_video_pipeline`: the
    transformer(s), text encoder and scheduler are the same objects; nothing loads twice). The one component the
    two may hold differently is the VAE: under `--vae-dtype auto` a preset with a `decode_dtype` decodes text
    videos in it and keeps image videos (encode and decode) in its `vae_dtype` (`resolve_vae_dtype`). Then the load
    holds the image requests' VAE and text requests decode with a copy in theirs (`decode_vae_copy`).

    Attributes:
        load_request: the request to load (the served one, its VAE dtype the image requests' where they differ).
        text_vae_dtype: the dtype of the text requests' VAE copy; None: one VAE for both.
        note: what the load did, for every video's JSON (`build` sets it).
        text, image: the `LoadedModel` of each kind of request, sharing their notes (`build` sets them).
    """

    load_request: RunConfig
    text_vae_dtype: str | None = None
    note: str = ""
    text: Any = None
    image: Any = None

    @classmethod
    def plan(cls, cfg: RunConfig) -> "TwoModes":
        """What to load for `cfg` (a text request of a text-image-to-video model) to serve both kinds."""
        from ..models.loading import resolve_vae_dtype

        text, image = (resolve_vae_dtype(cfg.vae_dtype, cfg.source.preset, i2v) for i2v in (False, True))
        if text == image:
            return cls(cfg)
        return cls(replace(cfg, vae_dtype=image), text)

    def build(self, model: Any) -> None:
        """The two requests' models of the loaded `model` (`vsagen.models.loading.LoadedModel`: the `WanPipeline`
        of `load_request`); the text requests' VAE copied in `text_vae_dtype` where they hold their own."""
        from ..models.loading import decode_vae_copy, image_to_video_pipeline, place_pipeline

        pipe = model.pipe
        self.image = replace(model, pipe=image_to_video_pipeline(pipe))
        self.text = model
        cfg = self.load_request
        what = (f"--model {cfg.model} takes text and image requests on this one load: text runs the loaded "
                "WanPipeline (as vsagen t2v), an image diffusers' WanImageToVideoPipeline over the same components "
                "(as vsagen i2v)")
        if self.text_vae_dtype is not None:
            pipe.register_modules(vae=decode_vae_copy(pipe.vae, self.text_vae_dtype, cfg.device))
            if cfg.offload == "model":  # the copy joins the text pipeline's offload hooks
                place_pipeline(pipe, cfg.offload, cfg.device)
            what += (f"; the VAE is held twice, as the two commands hold it: in {cfg.vae_dtype} for images, a copy in "
                     f"{self.text_vae_dtype} decoding text requests")
        self.note = what


@dataclass(frozen=True)
class LoadedFacts:
    """What a video's request is checked against without the pipeline at hand (`vsagen serve --ray`'s front, whose
    replicas hold the model): the request the model was loaded with, the facts a backend is prepared with
    (`vsagen.api.run_info` of the loaded pipeline, no grid, steps or model), the load's seconds. A `Resident` has
    one (`Resident.facts`); it pickles (the replicas send theirs).

    Attributes:
        request: the loaded request (`Resident.request`); run: `RunInfo` of the loaded transformers (device, dtype,
            experts with their architectures); load_s: the seconds the load took; takes_images: whether a video's
            request may bring an image (an image-to-video model's must, a text-image-to-video model's may where it
            was loaded for both kinds, `TwoModes`).
    """

    # the fields of `RunConfig` a video may set apart from the loaded request (its content, size, walk, files)
    PER_VIDEO = frozenset({"prompt", "negative_prompt", "height", "width", "frames", "steps", "guidance", "seed",
                           "samplers", "notes", "out", "json_out", "sheet_out", "overwrite", "attn_note",
                           "attn_requested"})
    # ... and of an image-to-video model's videos: their image and how it is fitted
    PER_IMAGE = frozenset({"image", "fit", "images_per_video"})

    request: RunConfig
    run: Any  # vsagen.attention.base.RunInfo
    load_s: float = 0.0
    takes_images: bool = False

    def differs(self, cfg: RunConfig) -> list[str]:
        """The fields of `cfg` outside `PER_VIDEO` (and, where a video may bring an image (`takes_images`),
        `PER_IMAGE`) that differ from the loaded request's ([] when `cfg` runs on this model as loaded): its backend
        where it differs in more than a run can change (`fixed_changes`), an image where none is taken, none for an
        image-to-video model; with random weights the seed too (it drew the weights and the prompt embeddings)."""
        from dataclasses import fields

        from ..request.backends import fixed_changes

        own = self.PER_VIDEO | (self.PER_IMAGE if self.takes_images or self.request.images_per_video else frozenset())
        wrong = [f.name for f in fields(RunConfig) if f.name not in own
                 and getattr(cfg, f.name) != getattr(self.request, f.name)]
        if "backends" in wrong and len(cfg.backends) == 1 and not fixed_changes(self.request.backend, cfg.backend):
            wrong.remove("backends")
        if self.request.images_per_video and cfg.image is None:
            wrong.append("image")
        return wrong + (["seed"] if self.request.random_weights and cfg.seed != self.request.seed else [])

    def backend_for(self, cfg: RunConfig, plan: Any = None) -> Any:
        """A fresh backend of `cfg`'s spec prepared for the video (`AttentionBackend.prepare` with `run` and the
        video's grid and steps) as `Resident.backend_for` prepares one; None for the loaded spec (the loaded
        backend is the holder's). `plan`: the video's crop plan (default: `cfg`'s under its tile fit, from the
        transformer's patch size).

        Raises:
            BadInput: the backend refuses the run (device, dtype, grid).
        """
        if cfg.backend == self.request.backend:
            return None
        from ..pipeline import denoise_plan

        backend = cfg.backend.build()
        if plan is None:
            plan = denoise_plan(cfg, None, cfg.tile_fit, patch_size=self.run.experts[0].architecture["patch_size"])
        steps = len(cfg.sampler.sigmas) if cfg.sampler.renoise else cfg.steps
        backend.prepare(replace(self.run, grid=tuple(plan.denoise_grid), steps=steps, model=cfg.model))
        return backend


class Resident:
    """One `vsagen t2v` configuration loaded once and kept for many videos (`vsagen serve`): the model, backend,
    sampler, step cache, decoder, device and dtype of the request it was loaded with stay; each video's request
    (`resolve_run` of the same options with its own prompt, negative prompt, size, frames, steps, seed, CFG scale
    and files) runs on the loaded session as `generate` runs one: the prompt encoded in the timed run, the latents
    decoded as the video is written, the video and its JSON published together or not at all. An image-to-video
    model is loaded from a request without an image (`RunConfig.images_per_video`), and each video's request brings
    its own (`image`, `fit`), read when the video runs; a text-image-to-video model loaded with `images` takes
    requests with and without one, each run as `vsagen i2v` / `vsagen t2v` runs it (`TwoModes`). A video's backend
    may differ from the loaded one in the options a run can change (`vsagen.request.backends.per_run_options`: e.g.
    vsa's sparsity); it runs on the loaded session as `vsagen compare` runs its backends, a fresh backend object
    prepared for the run.

    Attributes:
        request: the request it was loaded with.
        session: the loaded session (`Session.load`); `load_s` the load's seconds, in every video's JSON.
        loaded_notes: the load's notes, in every video's JSON after the video's request's own (a caller may add
            its own).
        facts: what a video's request is checked against (`LoadedFacts`: `differs`, a per-run backend's refusal).
        modes: a text-image-to-video model's two kinds of request (`TwoModes`), or None (one kind).
    """

    PER_VIDEO, PER_IMAGE = LoadedFacts.PER_VIDEO, LoadedFacts.PER_IMAGE
    modes: TwoModes | None = None  # a text-image-to-video model loaded for both kinds of request (`images`)

    def __init__(self, cfg: RunConfig, *, log: Callable[[str], None] = lambda m: None, images: bool = False) -> None:
        """Load `cfg`'s pipeline (after `vsagen.models.loading.prepare_model_files`). `images`: a text-image-to-video
        model's image requests are taken too (`vsagen serve`), on the same load (`TwoModes`).

        Raises:
            BadInput: a request with an image of its own, or what `generate` refuses at load.
            ModelNotFound, RunFailure: as `generate`.
        """
        from ..api import run_info

        if cfg.image is not None:
            raise BadInput(f"--model {cfg.model}: a resident model is loaded without an image; each video brings its "
                           "own (resolve_run(images_per_video=True))")
        self.request = cfg
        self.backend = cfg.backend.build()
        both = images and cfg.source.takes_image and not cfg.images_per_video
        self.modes = TwoModes.plan(cfg) if both else None
        loaded = self.modes.load_request if self.modes is not None else cfg
        self.session = _load_session(loaded, self.backend, progress=False, writer=True, log=log)
        self.loaded_notes = self.session.notes[len(_request_notes(cfg)):]  # the load's own (each video's JSON has them)
        if self.modes is not None:
            self.modes.build(self.session.model)
            self.loaded_notes.append(self.modes.note)
        self._untimed = self.session.untimed(self.backend)
        self.facts = LoadedFacts(cfg, run_info(self.session.pipe), self.session.load_s,
                                 takes_images=cfg.images_per_video or self.modes is not None)

    @property
    def load_s(self) -> float:
        """The seconds the load took."""
        return self.session.load_s

    @property
    def takes_images(self) -> bool:
        """Whether a video's request may bring an image (`LoadedFacts.takes_images`)."""
        return self.facts.takes_images

    def pipe_for(self, cfg: RunConfig) -> Any:
        """The pipeline a video of `cfg` runs on: the loaded one, or for an image request to a text-image-to-video
        model its image-to-video pipeline over the same components (`TwoModes`)."""
        return self._model_for(cfg).pipe

    def _model_for(self, cfg: RunConfig) -> Any:
        if self.modes is None:
            return self.session.model
        return self.modes.image if cfg.image is not None else self.modes.text

    def differs(self, cfg: RunConfig) -> list[str]:
        """`LoadedFacts.differs` of the loaded request."""
        return self.facts.differs(cfg)

    def generate(self, cfg: RunConfig, *, log: Callable[[str], None] = lambda m: None,
                 cancelled: Callable[[], bool] = lambda: False, final: bool = True) -> RunResult:
        """One video of `cfg` on the loaded session: its image read (image to video), its backend the loaded one
        or, where it differs per run, a fresh one (`backend_for`), its files published together (`cfg.out`,
        `cfg.json_out`, `cfg.sheet_out`), its JSON's notes the request's, the load's and the run's. `final`: the
        command's last video (as `_write_outputs`'s: before it, a signal after the publication still stops the
        command).

        Raises:
            BadInput: `cfg` differs from the loaded request outside `PER_VIDEO` (naming the fields), its image cannot
                be read, or its backend refuses the video's grid; RunFailure, KeyboardInterrupt: as `generate`.
        """
        wrong = self.differs(cfg)
        if wrong:
            raise BadInput(f"this request changes {', '.join(wrong)} of the loaded model; a video may set only its "
                           "prompt, negative prompt, size, frames, steps, seed, CFG scale, the options of its "
                           "backend a run can change and, for a model that takes one, its image")
        conditioning = (Conditioning.from_files(cfg.image, None, cfg.fit or "crop") if cfg.image is not None
                        else None)
        session = replace(self.session, model=self._model_for(cfg), request=cfg, _prompts=None,
                          conditioning=conditioning)
        session.notes[:] = _request_notes(cfg) + self.loaded_notes
        plan = session.plan(cfg.tile_fit)
        backend = self.backend_for(cfg, plan)
        run = _denoise(cfg, session, backend, plan, log, encode=True)
        untimed = self._untimed if backend is self.backend else session.untimed(backend)
        report, summary = _write_outputs(cfg, session, backend, plan, run, untimed, None, log=log,
                                         cancelled=cancelled, final=final)
        return RunResult(_video_path(cfg), cfg.json_out, report, summary)

    def backend_for(self, cfg: RunConfig, plan: Any = None) -> Any:
        """The backend object a video of `cfg` runs: the loaded one for the loaded spec, else a fresh one of
        `cfg`'s spec (same backend, options a run can change) prepared for the run on the loaded transformers
        (`LoadedFacts.backend_for`), as `Session.load` prepares the loaded one; `plan` the video's crop plan
        (default: `cfg`'s under its tile fit).

        Raises:
            BadInput: the backend refuses the run (device, dtype, grid).
        """
        if cfg.backend == self.request.backend:
            return self.backend
        from ..pipeline import denoise_plan

        return self.facts.backend_for(cfg, denoise_plan(cfg, self.session.pipe, cfg.tile_fit) if plan is None else plan)


def _load_session(cfg: RunConfig, backend: Any, *, progress: bool, writer: bool,
                  log: Callable[[str], None]) -> Session:
    """Load the run's session (with the image-to-video conditioning), then say what the run will be: the CPU time
    estimate (the writer only, once the model loaded: a bad request stays one error line) and every note so far,
    `--attn auto`'s and the request's own first."""
    conditioning = (Conditioning.from_files(cfg.image, cfg.last_image, cfg.fit or "crop")
                    if cfg.image is not None else None)
    session = Session.load(cfg, [backend], conditioning=conditioning, progress=progress, log=log)
    if cfg.device == "cpu" and writer:  # once the model loaded (a bad request stays one error line)
        warning = cpu_time_estimate(cfg)
        if warning is not None:
            log(warning)
    # --attn auto: which backend and why, first among the run's notes; then the request's own (config.resolve)
    session.notes[0:0] = _request_notes(cfg)
    for note in session.notes:
        log(f"note: {note}")
    return session


def _request_notes(cfg: RunConfig) -> list[str]:
    """The request's own notes: `--attn auto`'s (which backend and why), then `resolve_run`'s."""
    return [n for n in (cfg.attn_note, *cfg.notes) if n is not None]


def _denoise(cfg: RunConfig, session: Session, backend: Any, plan: Any, log: Callable[[str], None], *,
             encode: bool, writer: bool = True) -> Any:
    """The run on the session (prompts encoded inside it when `encode`, else the session's; not decoded: the mp4
    decodes as it is written, by the `writer` rank, whose warm-up also decodes two latent frames untimed), then the
    run's own notes said: a MagCache calibration to be written, non-finite latents, and what the run noted."""
    noted = len(session.notes)
    run = session.run(backend, plan, encode=encode, decode=False, log=log, warm_decode=writer)
    if run.calibration is not None:  # MagCache's ratios: written with the video below, or not at all
        session.notes.append(f"--cache mag: the calibrated ratios of {cfg.model} ({cfg.steps} steps, "
                             f"{cfg.sampler.name} sampler) are written to {run.calibration[0]} with the video; "
                             "--cache mag reads them")
    finite_note = nonfinite_latents_note(run.latents)
    if finite_note is not None:
        session.notes.append(finite_note)
    for note in session.notes[noted:]:  # the run's own (e.g. sparse-vdit mapping its file's step ranges)
        log(f"note: {note}")
    return run


def _write_outputs(cfg: RunConfig, session: Session, backend: Any, plan: Any, run: Any, untimed: Any, ranks: Any, *,
                   log: Callable[[str], None], cancelled: Callable[[], bool],
                   final: bool = True) -> tuple[TimingReport, dict[str, Any]]:
    """Decode the run's latents as a stream into the video, and publish it with its timing JSON (and the contact
    sheet, and a MagCache calibration) together, or nothing (`vsagen.media.video.Outputs`). Returns the report and
    the JSON's object. `final`: the command's last set of files (`--seeds`: the last seed's; before it, a signal
    still stops the command once the files are in place, `vsagen.interrupts.Guard.published`).

    Raises:
        RunFailure: the decode gave another number of frames than asked.
        KeyboardInterrupt: `cancelled()` says an interrupt was swallowed on its way; nothing is written.
        BadInput: the files could not be published ("...: nothing was written").
    """
    from ..decode.stream import streams
    from ..media import video
    from ..media.formats import write_video

    noted = len(session.notes)
    session.decide_vae_tiling(run.latents, streamed=streams(session.pipe.vae))  # --vae-tiling auto: by memory now
    for note in session.notes[noted:]:
        log(f"note: {note}")
    # a lightweight decoder (`--vae light`) streams by its temporal windows, where it decodes in windows
    log(f"decoding the video (VAE, {cfg.frames} frame{'s' if cfg.frames != 1 else ''})"
        + (", encoding it as it decodes" if streams(session.pipe.vae) else ""))
    log(f"writing {_video_path(cfg)} and {cfg.json_out}" if cfg.sheet_out is None else
        f"writing {_video_path(cfg)}, {cfg.json_out} and {cfg.sheet_out}")
    kept: list[Any] = []  # every frame, for the contact sheet only
    # the files appear together or not at all; Ctrl-C / SIGTERM meanwhile: held to a safe point (between chunks)
    video.find_ffmpeg()  # resolved (and cached) while a signal still interrupts at once
    with video.Outputs(overwrite=cfg.overwrite, final=final) as outputs:
        times = write_video(outputs, cfg.format, cfg.out, _frame_chunks(session.pipe, run.latents, cfg), cfg.fps,
                            cfg.encoding, frames=cfg.frames, metadata=cfg.metadata() if cfg.format.metadata else None,
                            keep=kept.append if cfg.sheet_out is not None else None)
        if times.frames != cfg.frames:
            raise RunFailure(f"decoded video has {times.frames} frames, expected {cfg.frames}")
        records = [*run.records, ("vae_decode", -1, times.produce_s), ("total", -1, times.produce_s)]
        report = TimingReport.from_records(records, cfg.device, load_s=session.load_s, write_s=times.encode_s,
                                           decode_write_s=times.wall_s, warmup_s=run.warmup_s,
                                           warmup_parts_s=run.warmup_parts, notes=session.notes, untimed=untimed,
                                           ranks=ranks or [])
        summary = _summary(cfg, session, backend, plan, report)
        text = video.json_text(summary)
        outputs.add(cfg.json_out, lambda tmp: tmp.write_text(text), ".json")
        if cfg.sheet_out is not None:  # the contact sheet, published with the pair
            _add_sheet(outputs, cfg, kept)
        if run.calibration is not None:  # last: it replaces an earlier calibration, once the others are accepted
            path, ratios = run.calibration
            outputs.add(path, lambda tmp: tmp.write_text(ratios), ".json", replace=True)
        if cancelled():  # an interrupt swallowed on its way (KeyboardInterrupt inside a finalizer)
            raise KeyboardInterrupt
        try:
            outputs.publish()
        except BadInput as e:
            raise BadInput(f"{e}: nothing was written") from None
    return report, summary


def _add_sheet(outputs: Any, cfg: RunConfig, kept: list[Any]) -> None:
    """Add the contact sheet of the `kept` frame chunks ((f, H, W, 3) uint8 each) to `outputs`, titled with the
    run's model, backend, size, steps, seed and image."""
    from ..media.sheet import save_sheet, sheet_title

    title = sheet_title(cfg.model, cfg.backend.short_text(), cfg.frames, cfg.height, cfg.width, cfg.steps,
                        cfg.seed, f"from {cfg.image.name}" if cfg.image is not None else "")
    import numpy as np

    frames_u8 = np.concatenate(kept)
    outputs.add(cfg.sheet_out, lambda tmp: save_sheet(frames_u8, tmp, cfg.fps, title), ".png")


def _video_path(cfg: RunConfig) -> Path:
    """Where the video went: `--out`, or for PNG frames their ffmpeg pattern (`NAME-%04d.png`)."""
    from ..media.formats import frame_pattern

    return frame_pattern(cfg.out, cfg.frames) if cfg.video_format == "png" else cfg.out


def _frame_chunks(pipe: Any, latents: Any, cfg: RunConfig) -> Iterator[Any]:
    """The run's latents decoded as a stream of (f, H, W, 3) uint8 chunks (`vsagen.decode.stream`); a chunk of
    another height and width than the request's is a RunFailure. Each chunk is decoded under inference mode entered
    and left around that step alone: a context held across a `yield` would stay on in the caller's thread while the
    generator waits (and for good, were it left unfinished by an interrupt)."""
    import torch

    from ..decode.stream import decode_chunks, host_frames

    chunks = host_frames(pipe.video_processor, decode_chunks(pipe.vae, latents))
    try:
        while True:
            with out_of_memory_as_failure("decoding", cfg.memory_hints()), torch.inference_mode():
                frames = next(chunks, None)
                if frames is None:
                    return
            if frames.shape[1:3] != (cfg.height, cfg.width):
                raise RunFailure(f"decoded frames are {frames.shape[1]}x{frames.shape[2]}, expected "
                                 f"{cfg.height}x{cfg.width}")
            yield frames
    finally:
        chunks.close()  # the VAE's feature cache is cleared now, not whenever the generator is collected


def _sampler_record(cfg: Any, pipe: Any) -> dict[str, Any]:
    """The JSON's `sampler`: `Sampler.summary()`, and for the checkpoint's own scheduler what it ran: its class, the
    flow shift, the steps and the timesteps of the (last) run."""
    record = cfg.sampler.summary()
    if not cfg.sampler.renoise:
        timesteps = getattr(pipe.scheduler, "timesteps", None)
        record.update(scheduler=type(pipe.scheduler).__name__, flow_shift=cfg.flow_shift, steps=cfg.steps,
                      timesteps=[float(t) for t in timesteps] if timesteps is not None else None)
    return record


def _summary(cfg: Any, session: Any, backend: Any, plan: Any, report: TimingReport) -> dict[str, Any]:
    """The run's JSON object (what `vsagen t2v --json` prints and the timing file holds)."""
    import torch

    from .. import __version__

    pipe = session.pipe
    layout = tile_layout(plan.denoise_grid, tuple(backend.tile))  # the backend's cubes ((4, 4, 4) for the others)
    two_experts = getattr(pipe.config, "boundary_ratio", None) is not None
    return {
        "video": str(_video_path(cfg)), "format": cfg.video_format, "json": str(cfg.json_out),
        "sheet": str(cfg.sheet_out) if cfg.sheet_out is not None else None, "model": cfg.model, "attn": cfg.attn,
        "attn_requested": cfg.attn_requested,
        # the step cache (`--cache`): its name and options; timing says what it computed and reused
        "cache": cfg.cache.summary(),
        "backend": backend.report(torch.device(cfg.device)).info,
        # layers that got the backend's own trained weights (VSA gates, SLA's proj_l), of all the transformers' layers
        "backend_weight_layers": session.model.weight_layers.get(backend.name, 0),
        "layers": sum(len(t.blocks) for _, t in experts(pipe)),
        "frames": cfg.frames, "height": cfg.height, "width": cfg.width,
        "fps": cfg.fps, "steps": cfg.steps, "guidance": cfg.guidance,
        # how the denoising walked (`vsagen.samplers`): a re-noise sampler's sigmas and timesteps; CFG on or off
        "sampler": _sampler_record(cfg, pipe), "cfg": cfg.guidance > 1,
        "guidance_2": cfg.guidance_2 if two_experts else None, "experts": [name for name, _ in experts(pipe)],
        "boundary_ratio": getattr(pipe.config, "boundary_ratio", None),
        "expand_timesteps": bool(getattr(pipe.config, "expand_timesteps", False)),
        "image": str(cfg.image) if cfg.image is not None else None,
        "last_image": str(cfg.last_image) if cfg.last_image is not None else None, "fit": cfg.fit,
        "seed": cfg.seed, "device": cfg.device,
        "dtype": cfg.dtype, "ulysses": cfg.ulysses, "cfg_parallel": cfg.cfg_parallel, "tile_fit": cfg.tile_fit,
        # random weights: --random-weights, or a tiny model (built offline with random weights, text encoder too);
        # random prompt embeddings only with --random-weights (the tiny model's text encoder runs)
        "random_weights": session.model.random_weights or cfg.source.kind == "tiny",
        "random_prompt_embeddings": session.model.random_weights,
        # --quant resolved, and how many block linears of each transformer ran in each precision
        "quant": {"precision": cfg.quant, **{name: precision_summary(t) for name, t in experts(pipe)}},
        # --lora: each file's sha256, scale, expert, the components it went into, fused or not
        "lora": session.model.loras,
        "offload": cfg.offload, **vae_summary(pipe.vae),  # what --vae / --vae-dtype / --vae-tiling resolved to
        # --vae-tiling's decision and why (auto: the untiled decode's estimated peak against the free memory)
        "vae_tiling_choice": session.vae_tiling.summary() if session.vae_tiling is not None else None,
        "compile_fullgraph": session.compile_fullgraph,
        "denoised": {"frames": plan.denoise_frames, "height": plan.denoise_height, "width": plan.denoise_width,
                     "latent": list(plan.denoise_latent), **layout.summary()},
        "timing": report.to_dict(), "config": cfg.summary(), "versions": {"vsagen": __version__,
                                                                         **versions(cfg.device)},
    }
