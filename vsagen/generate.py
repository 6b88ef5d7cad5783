"""`vsagen t2v` / `vsagen i2v`: one generation on the orchestrator (`vsagen.pipeline.Session`), then its own part:
VAE decode, mp4, timing JSON.

Data flow: RunConfig -> diffusers WanPipeline (text to video) or WanImageToVideoPipeline (image to video: the input
image, and a last image for first/last-frame video, fitted to the requested size, CLIP-encoded and VAE-encoded into
the condition by diffusers) -> weights placed on the device, or offloaded (`--offload model|group`) -> VAE tiling on
or off (`--vae-tiling`) -> patch every transformer (`vsagen.apply`) -> text encoding -> denoising loop (diffusers'
own, with its tqdm bar) at the crop plan's size -> crop the latent back -> VAE decode -> mp4 + timing JSON.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .config import RunConfig
from .errors import BadInput, RunFailure
from .layout import tile_layout
from .loading import experts, versions
from .pipeline import Conditioning, Session, out_of_memory_as_failure
from .timing import TimingReport


@dataclass
class RunResult:
    """What a run produced: the files and the JSON-ready summary (also written to `json_path`)."""

    video_path: Path
    json_path: Path
    report: TimingReport
    summary: dict[str, Any]


def generate(cfg: RunConfig, *, log: Callable[[str], None] = lambda m: None, progress: bool = True,
             writer: bool = True) -> RunResult | None:
    """Run one text-to-video (or, with `cfg.image`, image-to-video) generation and write the mp4 and its timing
    JSON. Image to video: the image is fitted to the requested size (`cfg.fit`) and handed to diffusers, which
    CLIP-encodes it and VAE-encodes the first-frame condition inside its pipeline call; those two stages are timed
    as "image_encode" and "condition_encode", apart from "denoise" (`time_condition_stages`). A last image
    (`cfg.last_image`, first/last-frame to video) is fitted the same way and handed over as diffusers'
    `last_image`: the condition video ends with it and its mask marks the last frame; a CLIP branch encodes both
    images.
    Under `--ulysses` / `--cfg-parallel` every rank runs this; only the `writer` (rank 0) decodes and writes, the
    others return None; rank 0's report holds every rank's timing row (`TimingReport.ranks`).
    The weights are placed or offloaded as `cfg.offload` says and the VAE tiled as `cfg.vae_tiled` says
    (`load_model`); the JSON records both. The backend's own weights are attached before the weights are placed.

    Raises:
        BadInput: invalid request found only once the model is known (e.g. backend vs dtype).
        ModelNotFound: the checkpoint cannot be loaded.
        RunFailure: the run itself failed (message names the stage).
    """
    import torch

    from . import __version__

    backend = cfg.backend.build()
    check_grid = getattr(backend, "check_grid", None)  # a backend tied to a latent grid (sparse-vdit's file)
    if check_grid is not None and cfg.source.exact_preset:  # the preset's strides are the model's: before loading
        from .layout import plan_crop

        p = cfg.source.preset
        check_grid(plan_crop(cfg.frames, cfg.height, cfg.width, fit=cfg.tile_fit,
                             vae_stride_temporal=p.vae_stride_temporal, vae_stride_spatial=p.vae_stride_spatial,
                             patch_size=p.patch_size).denoise_grid)
    conditioning = (Conditioning.from_files(cfg.image, cfg.last_image, cfg.fit or "crop")
                    if cfg.image is not None else None)
    session = Session.load(cfg, [backend], conditioning=conditioning, progress=progress, log=log)
    for note in session.notes:
        log(f"note: {note}")
    pipe = session.pipe
    plan = session.plan(cfg.tile_fit)
    run = session.run(backend, plan, encode=True, decode=writer)
    untimed = session.untimed(backend)
    ranks = None
    if cfg.processes > 1:  # every rank's DiT / attention / exchange times, to rank 0
        import torch.distributed as dist

        from .parallel.launch import gather_to_writer

        mine = TimingReport.from_records(run.records, cfg.device, untimed=untimed)
        ranks = gather_to_writer(mine.rank_row(dist.get_rank()))
    if not writer:
        return None
    t_write = time.perf_counter()
    with out_of_memory_as_failure("generating", cfg.memory_hints()), torch.inference_mode():
        frames = pipe.video_processor.postprocess_video(run.video.float(), output_type="np")[0]
    from .video import to_uint8_frames, write_json, write_mp4

    frames_u8 = to_uint8_frames(frames)
    if frames_u8.shape[:3] != (cfg.frames, cfg.height, cfg.width):
        raise RunFailure(f"decoded video is {frames_u8.shape[:3]}, expected {(cfg.frames, cfg.height, cfg.width)}")
    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    write_mp4(frames_u8, cfg.out, cfg.fps, overwrite=cfg.overwrite)
    write_s = time.perf_counter() - t_write
    report = TimingReport.from_records(run.records, cfg.device, load_s=session.load_s, write_s=write_s,
                                       warmup_s=run.warmup_s, notes=session.notes, untimed=untimed,
                                       ranks=ranks or [])
    layout = tile_layout(plan.denoise_grid)
    two_experts = getattr(pipe.config, "boundary_ratio", None) is not None
    summary = {
        "video": str(cfg.out), "json": str(cfg.json_out), "model": cfg.model, "attn": cfg.attn,
        "backend": backend.describe(torch.device(cfg.device)),
        "frames": cfg.frames, "height": cfg.height, "width": cfg.width,
        "fps": cfg.fps, "steps": cfg.steps, "guidance": cfg.guidance,
        "guidance_2": cfg.guidance_2 if two_experts else None, "experts": [name for name, _ in experts(pipe)],
        "boundary_ratio": getattr(pipe.config, "boundary_ratio", None),
        "expand_timesteps": bool(getattr(pipe.config, "expand_timesteps", False)),
        "image": str(cfg.image) if cfg.image is not None else None,
        "last_image": str(cfg.last_image) if cfg.last_image is not None else None, "fit": cfg.fit,
        "seed": cfg.seed, "device": cfg.device,
        "dtype": cfg.dtype, "ulysses": cfg.ulysses, "cfg_parallel": cfg.cfg_parallel, "tile_fit": cfg.tile_fit,
        "random_weights": session.model.random_weights,
        "offload": cfg.offload, "vae_tiling": bool(pipe.vae.use_tiling),
        "compile_fullgraph": session.compile_fullgraph,
        "denoised": {"frames": plan.denoise_frames, "height": plan.denoise_height, "width": plan.denoise_width,
                     "latent": list(plan.denoise_latent), **layout.summary()},
        "timing": report.to_dict(), "config": cfg.summary(), "versions": {"vsagen": __version__,
                                                                         **versions(cfg.device)},
    }
    try:
        write_json(summary, cfg.json_out, overwrite=cfg.overwrite)
    except BadInput:
        raise BadInput(f"{cfg.json_out} appeared during the run; the video is at {cfg.out}, the timing was not "
                       "written (pass --overwrite)") from None
    return RunResult(cfg.out, cfg.json_out, report, summary)
