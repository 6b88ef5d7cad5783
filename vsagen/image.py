"""Input images for `vsagen i2v`: open (PNG, JPEG, WebP via PIL) and fit to the requested pixel size.

Fit modes (the aspect ratio is always kept; the result is exactly height x width):
* `crop`: scale to cover the target, then center-crop the overflow (nothing added, edges may be lost).
* `resize`: scale to fit inside the target, then pad the rest with black, centered (nothing lost, borders added).
"""

from __future__ import annotations

from pathlib import Path

from .errors import BadInput

FITS = ("crop", "resize")
FORMATS = ("PNG", "JPEG", "WEBP")


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
        with Image.open(path) as im:
            fmt = im.format
            if fmt not in FORMATS:
                raise BadInput(f"image {path}: format {fmt} is not supported; use PNG, JPEG or WebP")
            im.load()
            return im.convert("RGB")
    except BadInput:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise BadInput(f"cannot read image {path}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                       "; use a PNG, JPEG or WebP file") from None


def fit_image(image, height: int, width: int, fit: str):
    """`image` (PIL, RGB) at exactly height x width, its aspect ratio kept (see the module doc for `fit`)."""
    from PIL import Image

    if fit not in FITS:
        raise BadInput(f"--fit must be one of {', '.join(FITS)}, got {fit!r}")
    w0, h0 = image.size
    scale = (max if fit == "crop" else min)(width / w0, height / h0)
    nw, nh = max(1, round(w0 * scale)), max(1, round(h0 * scale))
    scaled = image.resize((nw, nh), Image.Resampling.LANCZOS)
    if fit == "crop":
        left, top = (nw - width) // 2, (nh - height) // 2
        return scaled.crop((left, top, left + width, top + height))
    canvas = Image.new("RGB", (width, height))
    canvas.paste(scaled, ((width - nw) // 2, (height - nh) // 2))
    return canvas
