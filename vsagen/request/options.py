"""What a command asks for, as typed option groups: the model and its size, sampling, placement (device, dtype,
offload, compile, parallelism), attention, output. Each group is a frozen dataclass holding what was asked (None:
not given, the preset decides) and checks, when it is built, every bound it owns that needs no model: so every
command refuses the same value with the same line, before anything loads. The choices are `str` Enums (`Choice`,
`vsagen.request.choices`, re-exported here) that Typer accepts as option types; a Python caller may pass their plain
strings.

`vsagen.request.resolve.resolve` turns the groups into a validated request against the model's preset. This
module imports neither torch nor diffusers: the command line builds the groups before any heavy import.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BadInput
from ..models.lora_spec import LoraSpec, parse_loras
from ..models.sources import DEFAULT_MODEL

from .choices import (Choice, Device, Dtype, ImageFit, Offload, Quant, ReportFormat, TileFit,  # noqa: F401
                      VaeDecoder, VaeDtype, VaeTiling, check_choice)  # (re-exported: the option groups' choices)
from .bounds import MAX_FLOW_SHIFT, MAX_FPS, MAX_GUIDANCE, MAX_SEED, MAX_STEPS  # noqa: F401 - re-exported
from .lists import split_list
from .quantization import QUANT_LIST_EXAMPLE, QuantList

if TYPE_CHECKING:
    from .backends import AttnList
    from ..cache.cache_spec import CacheList
    from .sampling import SamplerList

VAE_METAVAR = "auto|light|stock|tiny[:weights=FILE|:name=NAME]"


@dataclass(frozen=True)
class VaeSpec:
    """`--vae`, parsed once: `auto | light | stock | tiny[:weights=FILE | :name=NAME]`.

    Attributes:
        kind: the decoder (`VaeDecoder`).
        weights: `tiny:weights=FILE`: the TAEHV decoder's weights (.safetensors, or .pth / .pt read by torch's
            weights-only loader), an existing file, absolute.
        name: `tiny:name=NAME`: a published decoder (`vsagen.decode.tiny_files.PUBLISHED`: taew2_1, taew2_2,
            lighttaew2_1, lighttaew2_2) read from the Hugging Face cache. Neither: the published one of the model's
            latent width (madebyollin's `taew2_1` for 16 channels, `taew2_2` for 48).
    """

    kind: VaeDecoder = VaeDecoder.AUTO
    weights: Path | None = None
    name: str | None = None

    @classmethod
    def parse(cls, value: Any, flag: str = "--vae") -> "VaeSpec":
        """`value` (a VaeSpec, a `VaeDecoder`, or its text) as a VaeSpec.

        Raises:
            BadInput: one line: an unknown decoder, an option on another decoder than tiny, an unknown or empty
                option, an unknown published name, a weights file that is missing, a folder, or of another format.
        """
        if isinstance(value, cls):
            return value
        text = str(getattr(value, "value", value)).strip()
        head, sep, option = text.partition(":")
        kind = VaeDecoder.parse(head.strip(), flag)
        if not sep:
            return cls(kind)
        usage = "tiny takes one option, weights=FILE or name=NAME (e.g. --vae tiny:weights=taew2_1.safetensors)"
        key, eq, arg = (part.strip() for part in option.partition("="))
        if kind != VaeDecoder.TINY or not eq or key not in ("weights", "name") or not arg:
            raise BadInput(f"{flag} {text}: {usage}")
        if key == "name":
            from ..decode.tiny_files import PUBLISHED

            check_choice(f"{flag} tiny:name", arg, tuple(PUBLISHED))
            return cls(kind, name=arg)
        from ..decode.tiny_files import WEIGHT_SUFFIXES
        from ..models.transformer_files import weights_file

        return cls(kind, weights=weights_file(arg, f"{flag} {text}", "a TAEHV decoder", WEIGHT_SUFFIXES))

    def text(self) -> str:
        """The value as `--vae` takes it (a weights file absolute)."""
        option = f":weights={self.weights}" if self.weights is not None else f":name={self.name}" if self.name else ""
        return f"{self.kind.value}{option}"

    def short_text(self) -> str:
        """The value in a few words, for labels and file names: a weights file by its name alone
        (`tiny:weights=taew2_1.safetensors`), a published name as given (`tiny:name=lighttaew2_1`)."""
        return f"{self.kind.value}:weights={self.weights.name}" if self.weights is not None else self.text()


VAE_LIST_EXAMPLE = "stock,tiny or stock,tiny:name=lighttaew2_1,light"


@dataclass(frozen=True)
class VaeList:
    """`--vae` as parsed once (`parse_vaes`): the text as given and one `VaeSpec` per comma-separated entry, in order.
    Whether a list is taken is the command's (`one`: t2v, i2v, profile; `several`: `vsagen compare`, whose first
    entry is the reference decoder)."""

    text: str
    specs: tuple[VaeSpec, ...]

    def one(self) -> VaeSpec:
        """The decoder of a command that decodes with one.

        Raises:
            BadInput: a list.
        """
        if len(self.specs) > 1:
            raise BadInput(f"--vae {self.text!r}: this command decodes with one decoder; `vsagen compare` compares "
                           "several on the same latents (comma-separated)")
        return self.specs[0]

    def several(self) -> tuple[VaeSpec, ...]:
        """The decoders of `vsagen compare`, in order (one entry: `auto` allowed, as for one decoder).

        Raises:
            BadInput: `auto` in a list of several (it is light or stock by the model: name the decoder), a decoder
                written twice.
        """
        if len(self.specs) > 1:
            for i, spec in enumerate(self.specs):
                if spec.kind == VaeDecoder.AUTO:
                    raise BadInput(f"--vae {self.text!r}: a list names its decoders (auto is light or stock by the "
                                   f"model); e.g. --vae {VAE_LIST_EXAMPLE}")
                if spec in self.specs[:i]:
                    raise BadInput(f"--vae {self.text!r} lists {spec.short_text()} twice")
        return self.specs


def parse_vaes(value: Any, flag: str = "--vae") -> VaeList:
    """`--vae` (one entry or a comma-separated list; a `VaeSpec`, a `VaeDecoder` or text) as its `VaeList`, each
    entry parsed once (`VaeSpec.parse`). A weights file's name cannot hold a comma.

    Raises:
        BadInput: an empty list or entry; see `VaeSpec.parse`.
    """
    if isinstance(value, VaeSpec):
        return VaeList(value.text(), (value,))
    text = str(getattr(value, "value", value)).strip()
    items = tuple(x.strip() for x in text.split(","))
    if not text or not all(items):
        raise BadInput(f"{flag} {text!r} has an empty entry; give one decoder or a comma-separated list "
                       f"(e.g. {VAE_LIST_EXAMPLE})")
    return VaeList(text, tuple(VaeSpec.parse(x, flag) for x in items))


def _number(value: Any, flag: str, lo: float, hi: float, *, lo_open: bool = False, what: str = "a number") -> None:
    """Refuse `value` unless it is a finite number in [lo, hi] ((lo, hi] with `lo_open`)."""
    ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
          and (lo < value if lo_open else lo <= value) and value <= hi)
    if not ok:
        bounds = f"({lo:g}, {hi:g}]" if lo_open else f"[{lo:g}, {hi:g}]"
        raise BadInput(f"{flag} must be {what} in {bounds}, got {value}")


def _integer(value: Any, flag: str, lo: int, hi: int) -> None:
    """Refuse `value` unless it is an integer in [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise BadInput(f"{flag} must be in [{lo}, {hi}], got {value}")


def _file_list(value: Any, flag: str) -> tuple[str, ...]:
    """A list of files given as one comma-separated string, a path, or a sequence of them, as a tuple of str.

    Raises:
        BadInput: an empty entry, or a value that is no text nor path."""
    items = [value] if isinstance(value, (str, os.PathLike)) else value
    if not isinstance(items, (list, tuple)):
        raise BadInput(f"{flag} takes FILE[,FILE], got {value!r}")
    out: list[str] = []
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise BadInput(f"{flag} takes FILE[,FILE], got {item!r}")
        parts = [os.fspath(item)] if isinstance(item, os.PathLike) else str(item).split(",")
        if not all(p.strip() for p in parts):
            raise BadInput(f"{flag} has an empty entry in {os.fspath(item)!r}; give FILE[,FILE]")
        out += [p.strip() for p in parts]
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class ModelOptions:
    """The model and the video's size.

    Attributes:
        model: a preset name (`vsagen presets`), a local diffusers folder or a hub id.
        height, width: pixels; frames: video frames (the preset's strides decide which are valid); None: the
            preset's.
        tile_fits: how the latent grid is covered, one per configuration run (`vsagen profile` takes several; a
            comma-separated string is accepted).
        random_weights: the preset's architecture with random weights (timing without a download).
        allow_pickle: also load pickle weights (they can run code).
        transformer: transformer-only weight files replacing the model's transformer(s), one per expert (the high-noise
            expert first; a comma-separated string or a sequence of paths; `vsagen.models.transformer_files`).
        lora: LoRAs loaded into the transformer(s) (`--lora`, repeatable): texts or `LoraSpec`s, held parsed
            (`vsagen.models.lora_spec.parse_loras`, once, here).

    Raises:
        BadInput: an empty model or --transformer entry, a --lora the parser refuses, a size that is not a positive
            integer, an unknown, empty or repeated tile fit.
    """

    model: str = DEFAULT_MODEL
    height: int | None = None
    width: int | None = None
    frames: int | None = None
    tile_fits: tuple[TileFit, ...] = (TileFit.PARTIAL,)
    random_weights: bool = False
    allow_pickle: bool = False
    transformer: tuple[str, ...] = ()
    lora: tuple[LoraSpec, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "transformer", _file_list(self.transformer, "--transformer"))
        object.__setattr__(self, "lora", parse_loras(self.lora))
        if not isinstance(self.model, str):
            raise BadInput(f"--model must be a preset name (vsagen presets), a folder or a hub id, got {self.model!r}")
        if not self.model.strip():
            raise BadInput("--model is empty; give a preset name (vsagen presets), a folder or a hub id")
        object.__setattr__(self, "model", str(self.model).strip())
        for flag, value in (("--height", self.height), ("--width", self.width), ("--frames", self.frames)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise BadInput(f"{flag} must be an integer, got {value!r}")
        fits = self.tile_fits if not isinstance(self.tile_fits, (str, TileFit)) else (self.tile_fits,)
        if len(fits) == 1 and isinstance(fits[0], str) and "," in fits[0]:
            fits = fits[0]
        entries = split_list(fits if isinstance(fits, str) else [str(f.value if isinstance(f, TileFit) else f)
                                                                 for f in fits], "--tile-fit", "partial,crop")
        object.__setattr__(self, "tile_fits", tuple(TileFit.parse(f, "--tile-fit") for f in entries))


def parse_seeds(text: str | tuple[int, ...]) -> tuple[int, ...]:
    """`--seeds` as seeds: `"1,2,3"` (or a tuple of ints) -> (1, 2, 3), in the order given.

    Raises:
        BadInput: an empty list or entry, an entry that is no integer in [0, 2^63), a seed given twice.
    """
    entries = [e.strip() for e in text.split(",")] if isinstance(text, str) else list(text)
    seeds = [int(e) if isinstance(e, str) and e.isascii() and e.isdigit() else e for e in entries]
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < MAX_SEED for s in seeds):
        raise BadInput(f"--seeds takes comma-separated integers in [0, 2^63) such as 1,2,3; got {text!r}")
    if len(set(seeds)) != len(seeds):
        raise BadInput(f"--seeds names a seed twice ({text!r}): each seed is one video")
    return tuple(seeds)


@dataclass(frozen=True, kw_only=True)
class SamplingOptions:
    """How the denoising runs.

    Attributes:
        steps: denoising steps (timed steps for `vsagen profile`); warmup: untimed steps before them.
        guidance: the CFG scale (> 1 runs two DiT passes a step); guidance_2: the second expert's (two-expert
            models only).
        flow_shift: the flow-matching timestep shift of the scheduler.
        negative_prompt: the negative prompt of CFG.
        seed: the seed of the initial noise (and, + 2, of a re-noise sampler's draws); None: not given (0).
        seeds: several seeds, one video each (`vsagen t2v` / `vsagen i2v` `--seeds 1,2,3`): given as text, held
            parsed as a tuple of ints (once, here); None: one video, of `seed`.
        sampler: how the denoising walks (`--sampler`: `default`, `dmd`, `dmd:sigmas=...`; see `vsagen.samplers`);
            `vsagen compare` takes a comma-separated list. Given as text, held parsed
            (`vsagen.request.sampling.SamplerList`, once, here).
        cache: the step cache (`--cache NAME[:KEY=VALUE...]`, `vsagen.cache.cache_spec`; None: none); `vsagen profile` and
            `vsagen compare` take a comma-separated list. Given as text, held parsed
            (`vsagen.cache.cache_spec.CacheList`, once, here).
        None: the preset's (the command's for `warmup`).

    Raises:
        BadInput: steps outside [1, MAX_STEPS], warmup outside [0, MAX_STEPS], a CFG scale outside [0,
            MAX_GUIDANCE], a flow shift outside (0, MAX_FLOW_SHIFT], a seed outside [0, 2^63), `seed` and `seeds`
            together, a `seeds` list that is empty, repeats a seed or holds a non-integer, a sampler entry that
            does not parse (`vsagen.request.sampling.parse_sampler`), a cache entry that does not parse.
    """

    steps: int | None = None
    warmup: int | None = None
    guidance: float | None = None
    guidance_2: float | None = None
    flow_shift: float | None = None
    negative_prompt: str | None = None
    seed: int | None = None
    seeds: str | tuple[int, ...] | None = None
    sampler: str | SamplerList | None = None
    cache: str | CacheList | None = None

    def __post_init__(self) -> None:
        from ..cache.cache_spec import CacheList, parse_caches
        from .sampling import SamplerList, parse_sampler_list  # (it imports this module's bounds)

        if self.cache is not None and not isinstance(self.cache, CacheList):
            object.__setattr__(self, "cache", parse_caches(self.cache))
        if self.sampler is not None and not isinstance(self.sampler, SamplerList):
            if not isinstance(self.sampler, str) or not self.sampler.strip():
                raise BadInput("--sampler is empty; give default, dmd, dmd-hummingbird or dmd:sigmas=1.0,0.75,0.5")
            object.__setattr__(self, "sampler", parse_sampler_list(self.sampler))
        if self.steps is not None:
            _integer(self.steps, "--steps", 1, MAX_STEPS)
        if self.warmup is not None:
            _integer(self.warmup, "--warmup", 0, MAX_STEPS)
        for flag, value in (("--guidance", self.guidance), ("--guidance-2", self.guidance_2)):
            if value is not None:
                _number(value, flag, 0, MAX_GUIDANCE)
        if self.flow_shift is not None:
            _number(self.flow_shift, "--flow-shift", 0, MAX_FLOW_SHIFT, lo_open=True)
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed < MAX_SEED):
            raise BadInput(f"--seed must be in [0, 2^63), got {self.seed}")
        if self.seeds is not None:
            if self.seed is not None:
                raise BadInput("--seed and --seeds together: give one (--seeds 1,2,3 makes a video per seed)")
            object.__setattr__(self, "seeds", parse_seeds(self.seeds))


@dataclass(frozen=True, kw_only=True)
class PlacementOptions:
    """Where and how the pipeline computes.

    Attributes:
        device, dtype: `Device`, `Dtype`.
        offload: `Offload` (CUDA only; t2v / i2v).
        vae_tiling: `VaeTiling` (commands that decode).
        vae: `VaeList` (`parse_vaes`), given as it, as a `VaeSpec` or as text (commands that decode; `vsagen compare`
            takes several).
        vae_dtype: `VaeDtype` (commands that decode).
        compile: torch.compile the transformer blocks.
        quant: the precision of the transformer blocks' linears: a `QuantList` of `Quant`s, given as it, as a
            `Quant` or as text (one entry or a comma-separated list, each parsed once, here) (`vsagen compare` takes several; resolved against the device and the model by
            `vsagen.request.quantization.resolve_quants`).
        fused_blocks: vsagen's compiled elementwise regions in eager CUDA runs (`vsagen.blocks`).
        ulysses: ranks the sequence is split across (None: not given; `vsagen.request.resolve` makes it 1, or
            derives it from `gpus`); cfg_parallel: the CFG passes on two halves of the ranks.
        gpus: processes vsagen starts itself for the run (`--gpus` / `--nproc`; one per GPU on CUDA; None: this
            process alone, or a launcher's such as torchrun).

    Raises:
        BadInput: an unknown device, dtype, offload, VAE tiling, decoder (or its options: `VaeSpec.parse`), dtype or
            quant (or an empty or repeated entry of a list), or a Ulysses degree or process count below 1.
    """

    device: Device = Device.AUTO
    dtype: Dtype = Dtype.AUTO
    offload: Offload = Offload.NONE
    vae_tiling: VaeTiling = VaeTiling.AUTO
    vae: VaeList | VaeSpec | str = VaeSpec()
    vae_dtype: VaeDtype = VaeDtype.AUTO
    compile: bool = False
    quant: QuantList | Quant | str = Quant.AUTO
    fused_blocks: bool = True
    ulysses: int | None = None
    cfg_parallel: bool = False
    gpus: int | None = None

    def __post_init__(self) -> None:
        for name, cls, flag in (("device", Device, "--device"), ("dtype", Dtype, "--dtype"),
                                ("offload", Offload, "--offload"), ("vae_tiling", VaeTiling, "--vae-tiling"),
                                ("vae_dtype", VaeDtype, "--vae-dtype")):
            object.__setattr__(self, name, cls.parse(getattr(self, name), flag))
        if not isinstance(self.quant, QuantList):  # one entry, or a list (`vsagen compare`): each parsed once, here
            text = str(self.quant).strip()
            items = split_list(text, "--quant", QUANT_LIST_EXAMPLE) if "," in text else (text,)
            object.__setattr__(self, "quant", QuantList(text, tuple(Quant.parse(x, "--quant") for x in items)))
        if not isinstance(self.vae, VaeList):
            object.__setattr__(self, "vae", parse_vaes(self.vae))
        for flag, value in (("--ulysses", self.ulysses), ("--gpus", self.gpus)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise BadInput(f"{flag} must be an integer of at least 1, got {value!r}")
        object.__setattr__(self, "cfg_parallel", bool(self.cfg_parallel))


@dataclass(frozen=True, kw_only=True)
class AttentionOptions:
    """The self-attention backend(s).

    Attributes:
        attn: one `NAME[:KEY=VALUE...]` entry ("auto": the backend the checkpoint was trained for), or a
            comma-separated list of them for the commands that run several (`vsagen profile`, `vsagen compare`):
            given as text (or an already parsed `vsagen.request.backends.AttnList`), held parsed: every name checked
            against the registry and every option typed once, here (`parse_attn`); whether a list or `auto` is
            taken is the command's (`AttnList.one`, `AttnList.several`).
        sparsity: sets the `sparsity` option of the sparse backends named (None: not given).
        attn_impl: sets the `impl` option of the backends that have it ("auto": not given); one of the
            implementations some registered backend offers (`vsagen.request.backends.known_impls`).

    Raises:
        BadInput: a sparsity outside [0, 1), an implementation no backend has, an unknown backend name or option, a
            value not of its option's type.
    """

    attn: str | AttnList = "auto"
    sparsity: float | None = None
    attn_impl: str = "auto"

    def __post_init__(self) -> None:
        from .backends import AttnList, check_impl, known_impls, parse_attn  # (it imports this module)

        if self.sparsity is not None and (isinstance(self.sparsity, bool) or not isinstance(self.sparsity, (int, float))
                                          or not 0.0 <= self.sparsity < 1.0):
            raise BadInput(f"--sparsity must be in [0, 1), got {self.sparsity}")
        object.__setattr__(self, "attn_impl", str(getattr(self.attn_impl, "value", self.attn_impl)).strip())
        check_impl(self.attn_impl, known_impls())
        if not isinstance(self.attn, AttnList):
            object.__setattr__(self, "attn", parse_attn(str(getattr(self.attn, "value", self.attn)).strip()))


@dataclass(frozen=True, kw_only=True)
class OutputOptions:
    """What a command writes.

    Attributes:
        out: the file or folder to write (each command says which; None: its default name).
        overwrite: replace existing files.
        fps: frames per second of the mp4s (None: the preset's).
        sheet: also write each video's contact sheet (`vsagen.media.sheet`), a PNG beside its mp4.
        codec: how the mp4s are encoded: `NAME[:preset=P][:crf=N]` text (None: the defaults), parsed once into a
            `vsagen.media.video.Encoding`, which the field then holds (an `Encoding` is also taken as is).

    Raises:
        BadInput: fps outside [1, MAX_FPS], a codec text `Encoding.parse` refuses.
    """

    out: Path | None = None
    overwrite: bool = False
    fps: int | None = None
    sheet: bool = False
    codec: Any = None

    @property
    def encoding(self) -> Any:
        """The parsed `codec` (`vsagen.media.video.Encoding`)."""
        return self.codec

    def __post_init__(self) -> None:
        from ..media.encoding import Encoding

        if not isinstance(self.codec, Encoding):  # parsed once here: a bad --codec is refused with the other options
            object.__setattr__(self, "codec", Encoding.parse(self.codec))
        if self.fps is not None and (isinstance(self.fps, bool) or not isinstance(self.fps, int)
                                     or not 1 <= self.fps <= MAX_FPS):
            raise BadInput(f"--fps must be an integer in [1, {MAX_FPS}], got {self.fps}")
        if self.out is not None:  # `a/../b.mp4` -> `b.mp4` before any folder is made for it
            from ..media.paths import normal_path

            object.__setattr__(self, "out", normal_path(Path(self.out).expanduser()))


@dataclass(frozen=True, kw_only=True)
class RequestOptions:
    """Every group a command that runs a Wan pipeline takes (`vsagen.request.resolve.resolve`); a group not given is
    its defaults (built when the options are, not at import: the attention group reads the registry)."""

    model: ModelOptions = field(default_factory=ModelOptions)
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    placement: PlacementOptions = field(default_factory=PlacementOptions)
    attention: AttentionOptions = field(default_factory=AttentionOptions)
    output: OutputOptions = field(default_factory=OutputOptions)


GROUPS: dict[str, type] = {"model": ModelOptions, "sampling": SamplingOptions, "placement": PlacementOptions,
                           "attention": AttentionOptions, "output": OutputOptions}
# Every shared option by its keyword (the flag's name, `-` as `_`: `--tile-fit` is `tile_fit`) -> (group, field).
# The command line declares these options once (`vsagen.cli.shared_options`) and routes them here; Python callers
# use the same keywords (`request_options`).
FLAGS: dict[str, tuple[str, str]] = {
    **{k: ("model", k) for k in ("model", "height", "width", "frames", "random_weights", "allow_pickle",
                                 "transformer", "lora")},
    "tile_fit": ("model", "tile_fits"),
    **{k: ("sampling", k) for k in ("steps", "warmup", "guidance", "guidance_2", "flow_shift", "negative_prompt",
                                    "seed", "seeds", "sampler", "cache")},
    **{k: ("placement", k) for k in ("device", "dtype", "offload", "vae_tiling", "vae", "vae_dtype", "compile",
                                     "quant", "fused_blocks", "ulysses",
                                     "cfg_parallel", "gpus")},
    **{k: ("attention", k) for k in ("attn", "sparsity", "attn_impl")},
    **{k: ("output", k) for k in ("out", "overwrite", "fps", "sheet", "codec")},
}


def request_options(**flags: Any) -> RequestOptions:
    """The option groups of keyword arguments named as the flags (`FLAGS`); None means not given (the group's
    default). Each group checks its values as it is built.

    Raises:
        TypeError: a keyword that is no shared option.
        BadInput: a value a group refuses.
    """
    unknown = sorted(set(flags) - set(FLAGS))
    if unknown:
        raise TypeError(f"not an option of a request: {', '.join(unknown)}")
    by_group: dict[str, dict[str, Any]] = {g: {} for g in GROUPS}
    for key, value in flags.items():
        if value is not None:
            group, name = FLAGS[key]
            by_group[group][name] = value
    return RequestOptions(**{g: cls(**by_group[g]) for g, cls in GROUPS.items()})
