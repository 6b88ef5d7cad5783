"""The closed sets of option values: `Choice`, a `str` Enum that Typer accepts as an option type and a Python caller
may pass as plain strings, `check_choice`, and the choices of the request's options (device, dtype, tile fit,
offload, quant, the VAE's tiling / dtype / decoder, image fit, report format). `vsagen.request.options` re-exports
them with the option groups that hold them. Imports neither torch nor diffusers.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, TypeVar

from ..errors import BadInput

C = TypeVar("C", bound="Choice")


class Choice(str, Enum):
    """A closed set of option values; members are their strings (`Device.CPU == "cpu"`)."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        """The accepted strings, in declaration order."""
        return tuple(m.value for m in cls)

    @classmethod
    def parse(cls: type[C], value: Any, flag: str) -> C:
        """`value` (a member or its string) as a member.

        Raises:
            BadInput: "<flag> must be one of a, b, c, got 'x'" (`check_choice`).
        """
        if isinstance(value, cls):
            return value
        check_choice(flag, value, cls.values())
        return cls(value)


def check_choice(flag: str, value: Any, choices: tuple[str, ...]) -> None:
    """Raise BadInput naming `flag` and its valid values unless `value` is one of `choices`."""
    if value not in choices:
        raise BadInput(f"{flag} must be one of {', '.join(choices)}, got {value!r}")


class Device(Choice):
    """`--device`: where the run computes ("auto": CUDA when available, else the CPU)."""

    AUTO = "auto"
    CUDA = "cuda"
    CPU = "cpu"


class Dtype(Choice):
    """`--dtype`: the pipeline's dtype ("auto": bf16 on CUDA, fp32 on the CPU)."""

    AUTO = "auto"
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"


class TileFit(Choice):
    """`--tile-fit`: how a latent grid that is not a multiple of the tile is covered (`vsagen.layout.plan_crop`)."""

    PARTIAL = "partial"
    CROP = "crop"


class Offload(Choice):
    """`--offload`: where the weights live between uses (`vsagen.models.loading.place_pipeline`)."""

    NONE = "none"
    MODEL = "model"
    GROUP = "group"


class Quant(Choice):
    """`--quant`: the precision of the transformer blocks' linears (`vsagen.quant`): "auto" (int8 for a `-quant`
    preset, whose files hold TurboDiffusion's int8 weights, where the device runs int8; else none), "none" (the
    run's dtype; `-quant` weights dequantized at load), "fp8" (FP8 e4m3 W8A8, GPUs with FP8 tensor cores), "int8"
    (TurboDiffusion's int8 W8A8 with 128 x 128 block scales; a `-quant` file's own int8 weights)."""

    AUTO = "auto"
    NONE = "none"
    FP8 = "fp8"
    INT8 = "int8"


class VaeTiling(Choice):
    """`--vae-tiling`: diffusers' spatially tiled VAE ("auto": for frames larger than 480 x 832)."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


class VaeDtype(Choice):
    """`--vae-dtype`: the VAE's dtype: "auto" (the preset's: `decode_dtype` where the VAE only decodes, bf16 for the
    real text-to-video models, else `vae_dtype`, float32 as Wan runs it; `vsagen.models.loading.resolve_vae_dtype`), or
    "fp32", "bf16", "fp16" (the decode and, for image to video, the condition encode)."""

    AUTO = "auto"
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


class VaeDecoder(Choice):
    """`--vae`'s decoder (`vsagen.decode.decoder_choice.choose_decoder`): "auto" (the preset's lightweight decoder
    where it has one by default and the folder holds it, else the stock VAE's), "light" (that lightweight decoder, or
    bad input), "stock" (the model's own VAE decoder) or "tiny" (the TAEHV family's, `vsagen.decode.tiny_decoder`)."""

    AUTO = "auto"
    LIGHT = "light"
    STOCK = "stock"
    TINY = "tiny"


class ImageFit(Choice):
    """`--fit` of `vsagen i2v`: how an input image becomes the video's size (`vsagen.media.image.fit_image`)."""

    CROP = "crop"
    RESIZE = "resize"


class ReportFormat(Choice):
    """`--format` of `vsagen profile`."""

    TABLE = "table"
    MARKDOWN = "markdown"
    CSV = "csv"
    JSON = "json"
