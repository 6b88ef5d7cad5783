"""`RunConfig`: a `vsagen t2v` / `vsagen i2v` request, resolved (`vsagen.request.resolve.resolve`, one backend,
`--attn auto` allowed) plus the command's own part: the input image(s) of image to video, the mp4 and its JSON."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from ..attention import BackendSpec
from ..errors import BadInput
from ..media.encoding import Encoding, check_encoder
from ..media.formats import FORMATS, VideoFormat, check_format, check_output, output_format, stale_frames
from ..media.paths import check_target, default_out, sheet_path
from ..models.presets import LAST_IMAGE_IGNORED, LAST_IMAGE_NONE, LAST_IMAGE_ONE_IMAGE, LAST_IMAGE_REQUIRED
from ..models.sources import resolve_model
from ..request.options import ImageFit, RequestOptions, request_options
from ..request.resolve import Request, check_last_frame, request_fields, request_size, resolve


# i2v without a prompt: the image is the content
NO_PROMPT_NOTE = ("no prompt: the video starts from the image and the text conditioning is the empty prompt; give a "
                  "PROMPT after the image to steer what moves")


@dataclass(frozen=True, kw_only=True)
class RunConfig(Request):
    """A validated `vsagen t2v` / `vsagen i2v` request (see `Request` for the shared fields). `image` (i2v only)
    is the input image's path and `fit` how it is brought to height x width; `last_image` (optional) the last
    frame's path, fitted the same way (first/last-frame to video); `out` / `json_out` the mp4 and its JSON, written
    at `fps` and encoded as `encoding` says (`--codec`); `sheet_out` the contact sheet beside them (`--sheet`; None:
    none). `images_per_video`: the request a resident image-to-video model loads with (`vsagen serve`): no image of
    its own, each video's request brings one (`resolve_run(images_per_video=True)`)."""

    fps: int
    out: Path
    json_out: Path
    image: Path | None = None
    fit: str | None = None
    last_image: Path | None = None
    sheet_out: Path | None = None
    encoding: Encoding = Encoding()
    video_format: str = "mp4"  # --out's extension: mp4 | webm | gif | png (vsagen.media.formats)
    images_per_video: bool = False

    @property
    def format(self) -> VideoFormat:
        """The video's file format (`--out`'s extension)."""
        return FORMATS[self.video_format]

    def metadata(self) -> dict[str, str]:
        """The video's container metadata: `title` the prompt, `description` one line of the settings, `comment`
        a compact JSON of the prompt, negative prompt, model, backend spec, sampler, steps, seed, size, fps,
        guidance and vsagen's version (what a later run needs to make the video again)."""
        from .. import __version__

        record = {"prompt": self.prompt, "negative_prompt": self.negative_prompt, "model": self.model,
                  "attn": self.backend.text(), "cache": self.cache.text(), "sampler": self.sampler.name,
                  "steps": self.steps, "seed": self.seed, "frames": self.frames, "height": self.height,
                  "width": self.width, "fps": self.fps, "guidance": self.guidance, "guidance_2": self.guidance_2,
                  "image": self.image.name if self.image is not None else None, "vsagen": __version__}
        return {"title": self.prompt, "comment": json.dumps(record, ensure_ascii=False, separators=(",", ":")),
                "description": f"vsagen {__version__}: {self.model}, --attn {self.backend.text()}, "
                               + (f"--quant {self.quant}, " if self.quant != "none" else "") + f"{self.steps} "
                               f"steps {self.sampler.name}, seed {self.seed}, {self.frames}x{self.height}x"
                               f"{self.width}"}

    @property
    def backend(self) -> BackendSpec:
        """The one backend the run uses."""
        return self.backends[0]

    @property
    def image_to_video(self) -> bool:
        """An input image makes it image to video (`resolve_run` refuses image-to-video models without one), as
        does a resident image-to-video model's request, whose videos bring theirs (`images_per_video`)."""
        return self.image is not None or self.images_per_video

    def memory_hints(self) -> list[str]:
        """`--offload` and `--vae-tiling on`, where not given."""
        return (([] if self.offload != "none" else ["--offload group (or model)"])
                + ([] if self.vae_tiling == "on" else ["--vae-tiling on"]))

    @property
    def attn(self) -> str:
        """The backend's name (`--attn`)."""
        return self.backend.name

    @property
    def sparsity(self) -> float | None:
        """The backend's sparsity (sparse backends), else None."""
        return self.backend.sparsity

    @property
    def attn_impl(self) -> str:
        """The backend's `impl` option ("auto" for backends without one)."""
        return self.backend.impl

    def summary(self) -> dict[str, Any]:
        """JSON-ready settings (no Path objects, no preset internals)."""
        d = asdict(self)
        d.pop("samplers")
        d["sampler"] = self.sampler.summary()
        d["flow_shift"] = self.used_flow_shift  # None: a re-noise sampler's sigmas are used as given
        d.pop("caches", None)
        d["cache"] = self.cache.summary()
        for key in ("source", "backends", "tile_fits"):
            d.pop(key)
        d["backend"] = self.backend.summary()
        d["tile_fit"] = self.tile_fit
        d["vae_decoder"] = self.vae_decoder.text()  # `--vae` as given (a weights file absolute)
        d.pop("vae_decoders")  # (compare's list; this command decodes with `vae_decoder` alone)
        d.update(attn=self.attn, sparsity=self.sparsity, attn_impl=self.attn_impl)
        d["model_source"] = {"kind": self.source.kind, "location": self.source.location,
                             "preset": self.source.preset.name,
                             "transformer_files": list(self.transformer_sources)}
        d.pop("transformer_files", None)
        d["out"], d["json_out"] = str(self.out), str(self.json_out)
        d["sheet_out"] = str(self.sheet_out) if self.sheet_out is not None else None
        d["image"] = str(self.image) if self.image is not None else None
        d["last_image"] = str(self.last_image) if self.last_image is not None else None
        return d


def _check_last_image(model: str, src: Any, image: Path | None,
                      last_image: Path | None) -> tuple[Path | None, tuple[int, int] | None]:
    """`--last-image` against what the model does with a last frame (`ModelSource.last_image`): an FLF2V model
    needs one; a model whose CLIP branch takes one image, a text-image-to-video model (diffusers would ignore the
    last image) and a text-to-video request refuse one; the image must be readable. Returns it as a Path, and its
    (width, height) (None, None without one)."""
    use = src.last_image
    if last_image is None:
        if image is not None and use == LAST_IMAGE_REQUIRED:
            raise BadInput(f"--model {model} is a first/last-frame-to-video (FLF2V) model and needs the last frame "
                           "too: add --last-image PATH")
        return None, None
    if image is None or use == LAST_IMAGE_NONE:
        raise BadInput("--last-image is the last frame of image to video: use `vsagen i2v IMAGE PROMPT --last-image "
                       "PATH` with a model that takes one (e.g. --model wan2.1-flf2v-14b-720p)")
    if use == LAST_IMAGE_ONE_IMAGE:
        raise BadInput(f"--last-image: --model {model} is a Wan2.1 image-to-video model whose CLIP image branch takes "
                       "one image; for first/last-frame video use an FLF2V model (e.g. --model wan2.1-flf2v-14b-720p, "
                       "or tiny-flf2v offline)")
    if use == LAST_IMAGE_IGNORED:
        raise BadInput(f"--last-image: --model {model} is a text-image-to-video model (Wan2.2-TI2V-5B style, "
                       "per-token timesteps) and diffusers ignores a last image for it; use an FLF2V model (e.g. "
                       "--model wan2.1-flf2v-14b-720p) or wan2.2-i2v-a14b")
    from ..media.image import open_image

    last_image = Path(last_image)
    try:
        size = open_image(last_image).size  # readable now, or one message naming the path
    except BadInput as e:
        raise BadInput(f"--last-image: {e}") from None
    return last_image, size


def _image_sized(src: Any, options: RequestOptions, image: Path,
                 size: tuple[int, int]) -> tuple[RequestOptions, str | None]:
    """`options` with the video's size taken from the image where the preset sizes by the image (`[defaults]
    image_size = "adaptive"` or "adaptive-floor", `vsagen.media.image.adaptive_size` at the area of its default
    height x width) and
    neither --height nor --width was given; and the run's note saying so (None: `options` unchanged).

    Raises:
        BadInput: an image so elongated that a side of its size passes the model's position tables.
    """
    from ..media.image import adaptive_size
    from ..request.plans import size_limits

    d, m = src.preset.defaults, options.model
    if not d.image_size.startswith("adaptive") or m.height is not None or m.width is not None:
        return options, None
    floor = d.image_size == "adaptive-floor"
    rule = "LightX2V's sizing, sides rounded down" if floor else "TurboDiffusion's --adaptive_resolution"
    height, width = adaptive_size(size, d.height * d.width, src.preset.pixel_multiple, "floor" if floor else "nearest")
    tops = size_limits(src)
    for flag, v in (("--height", height), ("--width", width)):
        if flag in tops and v > tops[flag]:
            raise BadInput(f"image {image} ({size[1]}x{size[0]}, height x width) gives {m.model} a {height}x{width} "
                           f"video at its default area (its aspect kept), past the position tables' {flag} <= "
                           f"{tops[flag]}; give --height and --width")
    note = (f"the video is {height}x{width}: image {image} ({size[1]}x{size[0]}, height x width) at the area of "
            f"{d.height}x{d.width}, its aspect kept ({rule}, as {src.preset.name}'s authors run it); --height / "
            "--width set the size")
    return replace(options, model=replace(m, height=height, width=width)), note


def image_notes(height: int, width: int, fit: str | None,
                images: Sequence[tuple[str, Path | None, tuple[int, int] | None]]) -> tuple[str, ...]:
    """The notes (and refusals) about the input images once the size is known (`vsagen.media.image.check_image_size`: an
    image too small, or blown up by its fit); `images` holds (flag, path or None, (width, height))."""
    from ..media.image import check_image_size, transparency_note

    notes = [note for flag, path, size in images if path is not None
             for note in (check_image_size(path, size, height, width, fit, flag), transparency_note(path, flag))]
    return tuple(n for n in notes if n is not None)


def _check_calibration_target(file: Path, outputs: list[Path | None]) -> None:
    """`mag:calibrate=true:file=` may not name a file this run writes besides it (its mp4, JSON or sheet).

    Raises:
        BadInput: it does.
    """
    same = [o for o in outputs if o is not None and o.resolve() == file.resolve()]
    if same:
        raise BadInput(f"--cache mag:calibrate=true: file={file} is this run's own output; name another .json file "
                       "for the ratios")


PROMPT_BYTES = 16384  # the prompt and the negative prompt each (UTF-8): they go into the mp4's metadata on ffmpeg's
# command line, where one argument may hold 128 KiB (Linux's MAX_ARG_STRLEN); the text encoder reads 512 tokens


def _check_text(text: str, what: str) -> None:
    """Refuse a prompt that holds a NUL character (no file's metadata or command line can carry it) or is longer
    than `PROMPT_BYTES` in UTF-8. Raises BadInput."""
    if "\0" in text:
        raise BadInput(f"{what} holds a NUL character")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > PROMPT_BYTES:
        raise BadInput(f"{what} is {size} bytes long; at most {PROMPT_BYTES} (the text encoder reads its first "
                       "512 tokens)")


def _video_targets(path: Path, out: Any, frames: int) -> tuple[Path, VideoFormat, Path | None, tuple[str, ...]]:
    """The files a t2v / i2v run of `frames` frames writes at `--out path` (`out`: the request's output group),
    checked: the video (`check_output`: its extension picks the format, `check_format`), its JSON, its contact sheet
    with `--sheet`, the encoder (`check_encoder`). Returns (JSON path, format, sheet path or None, notes: an earlier
    run's frame files of the same series that go once this run's are in place, an earlier sheet that `--overwrite`
    leaves as it was, the encoder's note).

    Raises:
        BadInput: a target that exists without `--overwrite`, an unwritable folder, an unknown extension, a format
            or encoder that cannot be written here."""
    json_out = check_output(path, out.overwrite, frames)
    video_format = output_format(path)
    check_format(video_format, out.encoding)
    notes: tuple[str, ...] = ()
    stale = stale_frames(path, frames) if video_format.name == "png" and out.overwrite else []
    if stale:  # (removed at publication: `vsagen.media.formats.write_video`)
        notes += (f"{stale[0]}" + (f" and {len(stale) - 1} more frame file{'s' * (len(stale) > 2)}" if len(stale) > 1
                                   else "") + f" of an earlier run {'go' if len(stale) > 1 else 'goes'} once this "
                  f"run's {frames} frames are in place (--overwrite)",)
    sheet_out = sheet_path(path) if out.sheet else None
    if sheet_out is not None:
        check_target(sheet_out, out.overwrite, "--out")
    elif out.overwrite and sheet_path(path).exists():  # the pair is replaced; an earlier run's sheet is not
        notes += (f"{sheet_path(path)} is an earlier run's contact sheet and stays as it was (this run writes none; "
                  "--sheet replaces it)",)
    check_encoder(out.encoding)
    notes += (out.encoding.note(),) if out.encoding.note() is not None else ()
    return json_out, video_format, sheet_out, notes


def resolve_run(prompt: str, options: RequestOptions, *, image: Path | None = None, fit: ImageFit | str = "crop",
                last_image: Path | None = None, images_per_video: bool = False) -> RunConfig:
    """Resolve a `vsagen t2v` / `vsagen i2v` request: the shared part (`vsagen.request.resolve.resolve`: one backend,
    `--attn auto` the default) and its own: `image` (a PNG / JPEG / WebP path) makes it image to video, so the
    model must be an image-to-video one (and the reverse), and then the prompt may be left out ("": a note says so; one
    of spaces only is refused); `fit` (crop | resize, see `vsagen.media.image`) says how the image is brought to the
    size; `last_image` (with `image`) makes it first/last-frame to video, only where diffusers does it
    (`vsagen.models.presets.last_image_use`): FLF2V models need it, image-to-video models without a CLIP branch
    (Wan2.2-I2V-A14B style) take it optionally, others refuse it. `options.output.out` is the mp4 (default
    `vsagen-<model>-<attn>-seed<seed>.mp4`), its JSON goes beside it, and with `options.output.sheet` its contact sheet
    (`vsagen.media.paths.sheet_path`); none of them may exist unless `overwrite`. `images_per_video` (no `image`):
    the request a resident model loads with (`vsagen serve`), an image-to-video one taken without an image: each
    of its videos' requests brings one.

    Raises:
        BadInput: any invalid setting (one message naming the flag and what would be valid), before anything
            is loaded or written.
    """
    for text, what in ((prompt, "the prompt"), (options.sampling.negative_prompt or "", "the negative prompt")):
        _check_text(text, what)
    if not prompt.strip() and image is None:
        raise BadInput("the prompt is empty")
    if prompt and not prompt.strip():  # spaces only: a mistake, where no prompt at all is a choice
        raise BadInput("the prompt is blank: leave it out (the image is then the content) or say what moves")
    fit = ImageFit.parse(fit, "--fit")
    model = options.model.model
    src = resolve_model(model)
    if image is not None and not src.takes_image:
        raise BadInput(f"--model {model} is a text-to-video model and takes no image; use `vsagen t2v PROMPT`, "
                       "or an image-to-video model (e.g. --model tiny-i2v)")
    if image is None and src.image_to_video and not images_per_video:
        raise BadInput(f"--model {model} is an image-to-video model; use `vsagen i2v IMAGE PROMPT`")
    image_size, size_note = None, None
    if image is not None:
        from ..media.image import open_image

        image = Path(image)
        image_size = open_image(image).size  # readable now, or one message naming the path
        options, size_note = _image_sized(src, options, image, image_size)
    last_image, last_image_size = _check_last_image(model, src, image, last_image)
    # what needs the size but not the device is checked before `resolve` resolves `--device auto`, which imports
    # torch to ask for CUDA (seconds): the images' sizes and a given --out are refused before anything heavy loads
    height, width, frames = request_size(src, options.model)
    images = image_notes(height, width, fit.value,
                         [("image", image, image_size), ("--last-image", last_image, last_image_size)])
    out = options.output
    targets = _video_targets(out.out, out, frames) if out.out is not None else None
    req = resolve(src, options, prompt=prompt)
    if last_image is not None:
        check_last_frame(req, "--last-image")
    notes = ((size_note,) if size_note is not None else ()) + req.notes + images
    if image is not None and not prompt.strip():
        notes = (NO_PROMPT_NOTE,) + notes
    path = out.out if out.out is not None else default_out(model, _name_part(req), req.seed, out.overwrite)
    json_out, video_format, sheet_out, target_notes = targets or _video_targets(path, out, req.frames)
    if req.cache.name == "mag" and req.cache.options.calibrate:
        _check_calibration_target(req.cache.options.file, [path, json_out, sheet_out])
    notes += target_notes
    return RunConfig(**{**request_fields(req), "notes": notes}, fps=src.preset.defaults.fps if out.fps is None
                     else out.fps, out=path, json_out=json_out, image=image,
                     fit=fit.value if image is not None else None, last_image=last_image, sheet_out=sheet_out,
                     encoding=out.encoding, video_format=video_format.name,
                     images_per_video=images_per_video and image is None and src.image_to_video)


def _name_part(req: Any) -> str:
    """What a default file name says of the run between the model and the seed: the backend (and a VSA cube other
    than 4x4x4, a fine-stage precision other than bf16), the linears' precision where it is not the model's default
    (`--quant`), a few-step sampler and a step cache. A dmd run and a default one, a cached run and an uncached one,
    a MagCache calibration and a MagCache run, runs with two cubes or two precisions are different videos; the
    default run's name is `<backend>` alone ("full", "vsa")."""
    from ..request.quantization import resolve_quant

    options = req.backends[0].options
    tile, precision = getattr(options, "tile", "4x4x4"), getattr(options, "precision", "bf16")
    default_quant, _ = resolve_quant("auto", req.device, req.source, req.random_weights)
    return (req.backends[0].name + (f"-tile-{tile}" if tile != "4x4x4" else "")
            + (f"-{precision}" if precision != "bf16" else "")
            + (f"-{req.quant if req.quant != 'none' else req.dtype}-linears" if req.quant != default_quant else "")
            + (f"-{req.sampler.name}" if req.sampler.renoise else "")
            + (f"-{req.cache.name}" if req.cache.enabled else "")
            + ("-calibrate" if req.cache.name == "mag" and req.cache.options.calibrate else ""))


# One video's own values a request made for several videos may set (`vsagen serve`'s requests, `t2v --prompts`'s
# lines), by keyword -> the option group that checks it.
VIDEO_VALUES = {"height": "model", "width": "model", "frames": "model", "steps": "sampling", "seed": "sampling",
                "guidance": "sampling", "negative_prompt": "sampling"}


def video_options(options: RequestOptions, **values: Any) -> RequestOptions:
    """`options` with one video's own values (`VIDEO_VALUES`; None: keep `options`' own) put into their groups,
    each group checking them as it checks the command line's flags (the same words).

    Raises:
        BadInput: a value its group refuses. TypeError: a keyword not in VIDEO_VALUES.
    """
    unknown = sorted(set(values) - set(VIDEO_VALUES))
    if unknown:
        raise TypeError(f"not a video's own value: {', '.join(unknown)}")
    groups = {}
    for group in set(VIDEO_VALUES.values()):
        given = {k: v for k, v in values.items() if VIDEO_VALUES[k] == group and v is not None}
        if given:
            groups[group] = replace(getattr(options, group), **given)
    return replace(options, **groups)


def seed_out(path: Path, seed: int) -> Path:
    """Where one seed of `--seeds` goes with `--out NAME.ext`: `NAME-seed{seed}.ext` beside it."""
    return path.with_name(f"{path.stem}-seed{seed}{path.suffix}")


def resolve_runs(prompt: str, options: RequestOptions, *, image: Path | None = None, fit: ImageFit | str = "crop",
                 last_image: Path | None = None) -> list[RunConfig]:
    """`resolve_run` for each seed of `options.sampling.seeds` (`--seeds 1,2,3`, in the order given), or for the one
    seed without it. Each seed's request is the single-seed one of `--seed N`: its default name carries the seed,
    and `--out NAME.ext` becomes `NAME-seedN.ext` (`seed_out`). Every seed's targets are checked here, before
    anything is loaded: none may exist without `overwrite`; no two seeds share a file (a seed given twice is refused
    when the options are built, `vsagen.request.options.parse_seeds`).

    Raises:
        BadInput: see `resolve_run`; with several seeds also `--gpus` / `--ulysses` / `--cfg-parallel` (the seeds
            run in one process), `--random-weights` (drawn from the seed: a model per seed) and a MagCache
            calibration (one ratios file, not one per seed).
    """
    seeds = options.sampling.seeds
    if seeds is None:
        return [resolve_run(prompt, options, image=image, fit=fit, last_image=last_image)]
    out = options.output.out
    cfgs = [resolve_run(prompt, replace(options, sampling=replace(options.sampling, seed=seed, seeds=None),
                                        output=replace(options.output, out=None if out is None
                                                       else seed_out(out, seed))),
                        image=image, fit=fit, last_image=last_image) for seed in seeds]
    first = cfgs[0]
    if first.processes > 1:
        raise BadInput("--seeds runs its seeds in one process; leave out --gpus / --ulysses / --cfg-parallel, or "
                       "run once per --seed")
    if first.random_weights:  # the weights and the prompt embeddings are drawn from the seed: a model per seed
        raise BadInput("--random-weights draws the weights from the seed, so each seed is another model; run once "
                       "per --seed")
    if first.cache.name == "mag" and first.cache.options.calibrate:
        raise BadInput("--cache mag:calibrate=true writes one ratios file; calibrate with one --seed")
    return cfgs


def resolve_generate(prompt: str, *, image: Path | None = None, fit: str = "crop", last_image: Path | None = None,
                     **flags: Any) -> RunConfig:
    """`resolve_run` with the shared options as keyword arguments named as the flags (`vsagen.request.options.FLAGS`:
    model, attn, sparsity, height, steps, device, out, ...), for Python callers.

    Raises:
        BadInput: see `resolve_run`.
        TypeError: an unknown keyword.
    """
    return resolve_run(prompt, request_options(**flags), image=image, fit=fit, last_image=last_image)
