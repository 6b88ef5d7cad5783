"""Contact sheets: a PNG that shows a video at a glance, without a player. A grid of evenly spaced frames (by default
8, first and last included, 4 to a row), each tile labelled with its frame index and time, under a title line (the
model, the backend, the size, the seed). Drawn with Pillow and its built-in font, as compare's side-by-side labels.

Tiles are the frames scaled by a whole factor (`tile_scale`), so a tile is exactly its frame where the frame is of a
usual size: frames whose longer side exceeds TILE_MAX pixels are reduced by the factor k = ceil(side / TILE_MAX),
each tile pixel the mean of a k x k block (Pillow's `Image.reduce`); frames whose longer side is below TILE_MIN are
enlarged by k = TILE_MIN // side, each pixel repeated k x k times (the tiny models' frames stay as they are).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SHEET_FRAMES = 8  # tiles of a sheet (fewer when the video has fewer frames)
COLUMNS = 4  # tiles per row
TILE_MAX = 256  # longest tile side before a frame is reduced (832 wide: 208; 1280: 256)
TILE_MIN = 96  # shortest longer side: smaller frames are enlarged by a whole factor to at least this
MARGIN = 8  # pixels around the grid and between the title and it
GAP = 6  # pixels between tiles (and below a tile's label)
FONT_SIZE = 13
BACKGROUND = (24, 24, 24)
TITLE_COLOUR = (255, 255, 255)
LABEL_COLOUR = (200, 200, 200)


def frame_indices(frames: int, count: int = SHEET_FRAMES) -> list[int]:
    """`count` evenly spaced frame indices of a video of `frames` frames: the first and the last included, each
    index round(i * (frames - 1) / (count - 1)); every frame when there are no more than `count`.

    Raises:
        ValueError: no frame, or `count` below 1."""
    if frames < 1 or count < 1:
        raise ValueError(f"a contact sheet needs frames and a tile count of at least 1, got {frames}, {count}")
    if frames <= count:
        return list(range(frames))
    if count == 1:
        return [0]
    return [round(i * (frames - 1) / (count - 1)) for i in range(count)]


def tile_scale(height: int, width: int) -> tuple[int, int]:
    """(up, down): the whole factors a frame of `height` x `width` pixels is enlarged (pixel repeat) or reduced
    (block mean) by to make its tile (module docstring); one of them is 1."""
    side = max(height, width)
    if side > TILE_MAX:
        return 1, math.ceil(side / TILE_MAX)
    if side < TILE_MIN:
        return TILE_MIN // side, 1
    return 1, 1


def tile_of(frame: np.ndarray) -> np.ndarray:
    """A frame's tile: (H, W, 3) uint8 -> (H * up, W * up, 3) or (ceil(H / down), ceil(W / down), 3) uint8, as
    `tile_scale` says (a reduced edge block narrower than `down` averages the pixels it has)."""
    from PIL import Image

    up, down = tile_scale(*frame.shape[:2])
    if down > 1:
        return np.asarray(Image.fromarray(frame).reduce(down))
    return np.repeat(np.repeat(frame, up, axis=0), up, axis=1) if up > 1 else frame


def _font() -> Any:
    from PIL import ImageFont

    return ImageFont.load_default(size=FONT_SIZE)


def _text_width(font: Any, text: str) -> int:
    return math.ceil(font.getlength(text))


def _line_height(font: Any) -> int:
    ascent, descent = font.getmetrics()
    return ascent + descent


def _wrap(font: Any, text: str, width: int) -> list[str]:
    """`text` in lines no wider than `width` pixels, broken only after its " | " separators (a field is never cut;
    one wider than `width` stands on a line of its own, and the sheet widens to it)."""
    fields = text.split(" | ")
    lines = [fields[0]]
    for field in fields[1:]:
        joined = f"{lines[-1]} | {field}"
        if _text_width(font, joined) <= width:
            lines[-1] = joined
        else:
            lines[-1] += " |"
            lines.append(field)
    return lines


@dataclass(frozen=True)
class SheetLayout:
    """Where everything of a sheet goes, in pixels from the top-left corner.

    Attributes:
        width, height: the PNG's size.
        tile: (height, width) of every tile.
        indices: the frames shown, in reading order (left to right, then down).
        tiles: the top-left corner (x, y) of each shown frame's tile.
        labels: each tile's label, and the top-left corner (x, y) of its text (below the tile).
        title: the title's lines, from (MARGIN, MARGIN) down, one `line_height` apart.
        line_height: pixels from one text line to the next.
    """

    width: int
    height: int
    tile: tuple[int, int]
    indices: list[int]
    tiles: list[tuple[int, int]]
    labels: list[tuple[str, tuple[int, int]]]
    title: list[str]
    line_height: int


def label_of(index: int, fps: float) -> str:
    """A tile's label: "frame <index>, <index / fps> s" (the time the frame is shown from, 2 decimals)."""
    return f"frame {index}, {index / fps:.2f} s"


def sheet_layout(frames: int, height: int, width: int, fps: float, title: str,
                 count: int = SHEET_FRAMES) -> SheetLayout:
    """The layout of a sheet of a video of `frames` frames of `height` x `width` pixels shown at `fps`: the title
    (wrapped at the grid's width), then `frame_indices(frames, count)` in rows of COLUMNS tiles, each tile's label
    under it. A column is as wide as its tile or its widest label, whichever is wider.

    Raises:
        ValueError: no frame, a size or fps that is not positive."""
    if height < 1 or width < 1 or not fps > 0:
        raise ValueError(f"a contact sheet needs a positive size and fps, got {height} x {width} at {fps}")
    indices = frame_indices(frames, count)
    font = _font()
    up, down = tile_scale(height, width)
    th, tw = (height * up, width * up) if up > 1 else (-(-height // down), -(-width // down))
    texts = [label_of(i, fps) for i in indices]
    column = max(tw, *(_text_width(font, t) for t in texts))
    cols = min(COLUMNS, len(indices))
    rows = -(-len(indices) // cols)
    line = _line_height(font)
    grid_w = cols * column + (cols - 1) * GAP
    lines = _wrap(font, title, grid_w)
    sheet_w = 2 * MARGIN + max(grid_w, *(_text_width(font, x) for x in lines))
    top = MARGIN + len(lines) * line + MARGIN
    cell_h = th + 2 + line + GAP
    tiles, labels = [], []
    for n, (index, text) in enumerate(zip(indices, texts)):
        x = MARGIN + (n % cols) * (column + GAP)
        y = top + (n // cols) * cell_h
        tiles.append((x, y))
        labels.append((text, (x, y + th + 2)))
    return SheetLayout(width=sheet_w, height=top + rows * cell_h - GAP + MARGIN, tile=(th, tw), indices=indices,
                       tiles=tiles, labels=labels, title=lines, line_height=line)


def contact_sheet(frames: np.ndarray, fps: float, title: str, count: int = SHEET_FRAMES) -> np.ndarray:
    """The sheet of a video as an image.

    Args:
        frames: (F, H, W, 3) uint8, the video's frames.
        fps: the video's frame rate (the labels' times).
        title: the line above the grid (wrapped after its " | " separators where wider than the grid).
        count: how many frames to show (`frame_indices`).

    Returns:
        (height, width, 3) uint8 (`sheet_layout`'s size): each shown frame's `tile_of` at its place in the layout.

    Raises:
        ValueError: frames that are not (F, H, W, 3) uint8 with F >= 1, an fps that is not positive.
    """
    from PIL import Image, ImageDraw

    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or len(frames) == 0:
        raise ValueError(f"a contact sheet needs (F, H, W, 3) uint8 frames, got {frames.shape} {frames.dtype}")
    layout = sheet_layout(len(frames), frames.shape[1], frames.shape[2], fps, title, count)
    img = Image.new("RGB", (layout.width, layout.height), BACKGROUND)
    for index, corner in zip(layout.indices, layout.tiles):
        img.paste(Image.fromarray(tile_of(frames[index])), corner)
    draw = ImageDraw.Draw(img)
    font = _font()
    for n, text in enumerate(layout.title):
        draw.text((MARGIN, MARGIN + n * layout.line_height), text, fill=TITLE_COLOUR, font=font)
    for text, corner in layout.labels:
        draw.text(corner, text, fill=LABEL_COLOUR, font=font)
    return np.asarray(img)


def save_sheet(frames: np.ndarray, path: Path, fps: float, title: str, count: int = SHEET_FRAMES) -> None:
    """Write `contact_sheet(frames, fps, title, count)` to `path` as PNG, in place (for
    `vsagen.media.video.Outputs.add`, which publishes it atomically with the run's other files)."""
    from PIL import Image

    Image.fromarray(contact_sheet(frames, fps, title, count)).save(path, format="PNG", optimize=True)


def sheet_title(model: str, backend: str, frames: int, height: int, width: int, steps: int, seed: int,
                *more: str) -> str:
    """The title line of a run's sheet: "<model> | attn <backend> | <frames>x<height>x<width> (frames x height x
    width) | <steps> steps | seed <seed>", then each non-empty entry of `more`, all joined by " | "."""
    parts = [model, f"attn {backend}", f"{frames}x{height}x{width} (frames x height x width)",
             f"{steps} step{'s' if steps != 1 else ''}", f"seed {seed}", *more]
    return " | ".join(p for p in parts if p)
