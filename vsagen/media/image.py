"""Input images for `vsagen i2v`: open (PNG, JPEG, WebP via PIL) and fit to the requested pixel size.

Fit modes (the aspect ratio is always kept; the result is exactly height x width):
* `crop`: scale to cover the target, then center-crop the overflow (nothing added, edges may be lost).
* `resize`: scale to fit inside the target, then pad the rest with black, centered (nothing lost, borders added).

With `--tile-fit crop` the video is denoised at a larger size and cropped back to its top-left corner before
decoding; the fitted image is then extended to that size by repeating its last row and column
(`extend_to`), so the cropped first frame is exactly the fitted image.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BadInput

FITS = ("crop", "resize")
FORMATS = ("PNG", "JPEG", "WEBP")
# Input images smaller than this on a side are refused: a picture of a few pixels carries no content to animate,
# and scaled to the video's size it is a flat blur (a 1x1 image is one colour).
MIN_IMAGE_SIDE = 16
# A fit that scales the image up by more than this (each side) gets a note: the first frame is visibly blurry.
MAX_UPSCALE = 4.0
# A crop that cuts more than this share of the image's width or height (its aspect differs from the video's) gets a
# note: the picture the video starts from is not the whole image.
MAX_ASPECT_CHANGE = 0.02


def open_image(path: Path):
    """Open and fully decode an image as RGB. Raises BadInput (naming the path) if it is missing, not a file,
    or not a readable PNG / JPEG / WebP."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    if not path.exists():
        raise BadInput(f"image {path} does not exist")
    if not path.is_file():
        raise BadInput(f"image {path} is not a file")
    try:
        with warnings.catch_warnings():  # large but allowed images: PIL's bomb warning is not for our users
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                fmt = im.format
                if fmt not in FORMATS:
                    raise BadInput(f"image {path}: format {fmt} is not supported; use PNG, JPEG or WebP")
                im.load()
                return _as_rgb(im)
    except BadInput:
        raise
    except Image.DecompressionBombError:
        raise BadInput(f"image {path} is too large to decode safely (more than {2 * Image.MAX_IMAGE_PIXELS:,} "
                       "pixels); scale it down first") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise BadInput(f"cannot read image {path}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                       "; use a PNG, JPEG or WebP file") from None


def _as_rgb(im):
    """A decoded PIL image as 8-bit RGB: 16-bit grayscale ("I;16*", and "I" as PIL opens 16-bit PNGs) scaled by
    1/257 (PIL's convert clips it at 255: every pixel above 255 of 65535 came out white); alpha dropped, as
    diffusers' `load_image` drops it (`transparency_note` says so)."""
    import numpy as np
    from PIL import Image

    if im.mode.startswith("I"):
        levels = np.asarray(im, dtype=np.float64) / 257.0
        return Image.fromarray(np.clip(np.rint(levels), 0, 255).astype(np.uint8), "L").convert("RGB")
    return im.convert("RGB")


def transparency_note(path: Path, flag: str = "image") -> str | None:
    """A note when the image at `path` (readable: `open_image` checked it) has pixels that are not opaque: the run
    drops the alpha channel, as diffusers' `load_image` does, so the colour stored under transparent pixels shows in
    the frame the image becomes (the first; the last for `flag` "--last-image"). None for opaque images."""
    from PIL import Image

    with Image.open(path) as im:
        if im.mode not in ("RGBA", "LA", "PA") and "transparency" not in im.info:
            return None
        alpha = im.convert("RGBA").getchannel("A")
        if alpha.getextrema()[0] == 255:
            return None
    frame, verb = ("last", "end on") if flag == "--last-image" else ("first", "start from")
    return (f"{flag} {path} has transparent pixels: their alpha is dropped (as diffusers' load_image drops it), so "
            f"the colour stored under them shows in the {frame} frame; flatten it onto a background first if that is "
            f"not what the video should {verb}")


def fit_image(image, height: int, width: int, fit: str):
    """`image` (PIL, RGB) at exactly height x width, its aspect ratio kept (see the module doc for `fit`)."""
    from PIL import Image

    if fit not in FITS:
        raise BadInput(f"--fit must be one of {', '.join(FITS)}, got {fit!r}")
    w0, h0 = image.size
    scale = fit_scale(image.size, height, width, fit)
    nw, nh = max(1, round(w0 * scale)), max(1, round(h0 * scale))
    scaled = image.resize((nw, nh), Image.Resampling.LANCZOS)
    if fit == "crop":
        left, top = (nw - width) // 2, (nh - height) // 2
        return scaled.crop((left, top, left + width, top + height))
    canvas = Image.new("RGB", (width, height))
    canvas.paste(scaled, ((width - nw) // 2, (height - nh) // 2))
    return canvas


def adaptive_size(size: tuple[int, int], area: int, stride: int, rounding: str = "nearest") -> tuple[int, int]:
    """The video's (height, width) for an image of `size` (width, height) under TurboDiffusion's
    `--adaptive_resolution` (turbodiffusion/inference/wan2.2_i2v_infer.py:101-117, @aaecff5): the image's aspect
    r = h0 / w0 at the pixel area `area` (their 720p 16:9 entry, 1280 x 720), each side rounded to the nearest
    multiple of `stride` (their VAE's spatial factor x 2 = 16): height = stride x round(sqrt(area r) / stride),
    width = stride x round(sqrt(area / r) / stride), ties to even (as their numpy-float `round`); at least one
    stride a side. `rounding="floor"` rounds each side down instead: LightX2V's Wan I2V sizing
    (`lightx2v/models/runners/wan/wan_runner.py:804-811`, ModelTC/LightX2V @f8aee98: latent side =
    sqrt(area r) // vae_stride // patch x patch, so the pixel side is stride x floor(sqrt(area r) / stride)).

    Args:
        size: the image's (width, height) in pixels, each >= 1.
        area: the target pixel count (height x width of the preset's default size).
        stride: what both sides must be multiples of (the preset's pixel multiple).
        rounding: "nearest" (TurboDiffusion) or "floor" (LightX2V).

    Returns:
        (height, width) in pixels, multiples of `stride`; the image is then fitted to it (`fit_image`): a crop of
        what the rounding leaves over (at most about stride / 2 x (1 / height + 1 / width) of a side: under 2% at
        720p's area up to 3:1), where TurboDiffusion resizes to the size without keeping the aspect.
    """
    w0, h0 = size
    aspect = h0 / w0
    to_int = math.floor if rounding == "floor" else round
    height = max(1, to_int(math.sqrt(area * aspect) / stride)) * stride
    width = max(1, to_int(math.sqrt(area / aspect) / stride)) * stride
    return height, width


def fit_scale(size: tuple[int, int], height: int, width: int, fit: str) -> float:
    """The factor `fit_image` scales an image of `size` (width, height) by to bring it to height x width."""
    w0, h0 = size
    return (max if fit == "crop" else min)(width / w0, height / h0)


def check_image_size(path: Path, size: tuple[int, int], height: int, width: int, fit: str,
                     flag: str = "image") -> str | None:
    """Refuse an input image too small to start a video from; say so when the fit blows it up.

    Args:
        path: the image's path (named in the message).
        size: its (width, height) in pixels.
        height, width: the video's size; fit: "crop" or "resize" (`fit_image`).
        flag: how the message names the image ("image", "--last-image").

    Returns:
        A note for the run when the fit changes the picture visibly: it scales the image up by more than
        `MAX_UPSCALE`, or (`crop`, the default) its aspect differs from the video's so that the crop cuts more than
        `MAX_ASPECT_CHANGE` of its width or height; else None. (`resize` pads on purpose: no note for that.)

    Raises:
        BadInput: a side shorter than `MIN_IMAGE_SIDE` pixels.
    """
    w0, h0 = size
    if min(w0, h0) < MIN_IMAGE_SIDE:
        raise BadInput(f"{flag} {path} is {h0}x{w0} pixels (height x width): too small to start a {height}x{width} "
                       f"video from; give an image of at least {MIN_IMAGE_SIDE} pixels a side (ideally "
                       f"{height}x{width})")
    scale = fit_scale(size, height, width, fit)
    said = []
    if scale > MAX_UPSCALE:
        said.append(f"is scaled up {scale:.1f}x to fit the {height}x{width} video (--fit {fit}): its frames will look "
                    f"blurry; an image of {height}x{width} or more keeps the detail")
    side, share = max((("width", 1 - width / (w0 * scale)), ("height", 1 - height / (h0 * scale))),
                      key=lambda x: x[1])
    if fit == "crop" and share > MAX_ASPECT_CHANGE:
        said.append(f"loses {100 * share:.0f}% of its {side} to the crop that fits it to the {height}x{width} video "
                    "(--height / --width set the video's size; --fit resize keeps the image whole, with black bars)")
    return f"{flag} {path} ({h0}x{w0}, height x width) " + "; it ".join(said) if said else None


def extend_to(image, height: int, width: int):
    """`image` (PIL, RGB, h x w) extended to height x width (>= h, w) at the bottom and right by repeating its
    last row and column; the top-left h x w corner is `image` unchanged.

    Raises:
        ValueError: a target smaller than the image.
    """
    import numpy as np
    from PIL import Image

    arr = np.asarray(image)
    dh, dw = height - arr.shape[0], width - arr.shape[1]
    if dh < 0 or dw < 0:
        raise ValueError(f"cannot extend a {arr.shape[0]}x{arr.shape[1]} image to {height}x{width}")
    if dh == 0 and dw == 0:
        return image
    return Image.fromarray(np.pad(arr, ((0, dh), (0, dw), (0, 0)), mode="edge"))


def synthetic_image(height: int, width: int, seed: int = 0):
    """A deterministic RGB test picture (PIL, height x width): smooth colour ramps plus seeded noise. It conditions
    image-to-video models in `vsagen profile`, whose DiT cost does not depend on the picture."""
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    ramps = np.stack([x / max(width - 1, 1), y / max(height - 1, 1), 0.5 + 0.5 * np.sin((x + y) / 17.0)], -1)
    noise = np.random.default_rng(seed).normal(0.0, 0.05, ramps.shape)
    return Image.fromarray((np.clip(ramps + noise, 0.0, 1.0) * 255).astype(np.uint8), "RGB")


@dataclass(frozen=True)
class Conditioning:
    """The picture(s) an image-to-video run starts from (and, first/last-frame models, ends at): PIL images,
    brought to the request's height x width by `fit` ("crop" | "resize", `vsagen.media.image.fit_image`; None: already
    that size)."""

    image: Any
    last_image: Any | None = None
    fit: str | None = "crop"

    @classmethod
    def from_files(cls, image: Path, last_image: Path | None, fit: str) -> "Conditioning":
        """The user's image (and last image) files, read now.

        Raises:
            BadInput: a file that cannot be read as an image.
        """
        return cls(open_image(image), open_image(last_image) if last_image is not None else None, fit)

    @classmethod
    def synthetic(cls, height: int, width: int, seed: int, last: bool) -> "Conditioning":
        """Seeded test pictures of the requested size (`vsagen.media.image.synthetic_image`; seed + 1 for the last
        frame), for timing image-to-video models: the DiT's cost does not depend on the picture."""
        return cls(synthetic_image(height, width, seed),
                   synthetic_image(height, width, seed + 1) if last else None, None)

    def arguments(self, height: int, width: int, plan: Any) -> dict[str, Any]:
        """diffusers' `image` (and `last_image`) call arguments: each picture fitted to height x width, then
        extended to the plan's denoised size (`plan`: a `vsagen.layout.CropPlan`; `--tile-fit crop` denoises a
        larger video whose top-left corner is kept)."""
        def prepare(picture: Any) -> Any:
            fitted = picture if self.fit is None else fit_image(picture, height, width, self.fit)
            return extend_to(fitted, plan.denoise_height, plan.denoise_width)

        out = {"image": prepare(self.image)}
        if self.last_image is not None:  # first/last frame: diffusers puts it in the condition (and CLIP input)
            out["last_image"] = prepare(self.last_image)
        return out
