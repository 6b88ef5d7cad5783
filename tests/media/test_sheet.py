"""vsagen.media.sheet: the contact sheet's frame choice, tile scaling, layout (every tile, label and title line in its
place, none overlapping) and pixels (each tile is its frame, scaled as the module says), and its atomic PNG write."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vsagen.errors import BadInput
from vsagen.media.sheet import (BACKGROUND, COLUMNS, MARGIN, contact_sheet, frame_indices, label_of, sheet_layout,
                                save_sheet, sheet_title, tile_of, tile_scale)
from vsagen.media.video import write_with


def random_frames(f, h, w, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (f, h, w, 3), dtype=np.uint8)


def test_frame_indices_are_evenly_spaced_with_both_ends():
    assert frame_indices(17) == [0, 2, 5, 7, 9, 11, 14, 16]  # the tiny model's 17 frames
    assert frame_indices(81) == [0, 11, 23, 34, 46, 57, 69, 80]
    assert frame_indices(5) == [0, 1, 2, 3, 4]  # no more frames than tiles: every frame
    assert frame_indices(9, count=1) == [0] and frame_indices(1) == [0]
    with pytest.raises(ValueError):
        frame_indices(0)


@pytest.mark.parametrize("size, scale", [((96, 160), (1, 1)), ((480, 832), (1, 4)), ((720, 1280), (1, 5)),
                                         ((256, 256), (1, 1)), ((16, 24), (4, 1)), ((8, 8), (12, 1))])
def test_tile_scale_is_a_whole_factor_into_the_bounds(size, scale):
    assert tile_scale(*size) == scale


def _regions(layout):
    """Every drawn box (x0, y0, x1, y1): the tiles, and each title line and label as one text line's height."""
    th, tw = layout.tile
    boxes = [(x, y, x + tw, y + th) for x, y in layout.tiles]
    boxes += [(x, y, x + 1, y + layout.line_height) for _, (x, y) in layout.labels]
    boxes += [(MARGIN, MARGIN + n * layout.line_height, MARGIN + 1, MARGIN + (n + 1) * layout.line_height)
              for n in range(len(layout.title))]
    return boxes


def test_layout_of_the_tiny_video_rows_of_four_tiles_under_the_title():
    layout = sheet_layout(17, 96, 160, 8, "tiny | attn full | 17x96x160 | seed 0")
    assert layout.tile == (96, 160) and layout.indices == frame_indices(17) and len(layout.title) == 1
    xs, ys = sorted({x for x, _ in layout.tiles}), sorted({y for _, y in layout.tiles})
    assert len(xs) == COLUMNS and len(ys) == 2  # 8 tiles: 2 rows of 4, in reading order
    assert layout.tiles == [(x, y) for y in ys for x in xs]
    assert [text for text, _ in layout.labels] == [label_of(i, 8) for i in layout.indices]
    assert label_of(14, 8) == "frame 14, 1.75 s"
    for (x, y), (_, (lx, ly)) in zip(layout.tiles, layout.labels):  # each label just under its tile
        assert lx == x and y + 96 <= ly <= y + 96 + 4
    boxes = _regions(layout)
    for i, a in enumerate(boxes):  # inside the sheet, none overlapping another
        assert 0 <= a[0] < a[2] <= layout.width and 0 <= a[1] < a[3] <= layout.height
        for b in boxes[i + 1:]:
            assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (a, b)
    assert max(y for _, y in layout.tiles) + 96 + layout.line_height <= layout.height - MARGIN + 2


def test_each_tile_is_its_frame_and_the_text_is_drawn_in_its_place():
    frames = random_frames(17, 96, 160)
    title = "tiny | attn full | 17x96x160 | seed 0"
    sheet = contact_sheet(frames, 8, title)
    layout = sheet_layout(17, 96, 160, 8, title)
    assert sheet.shape == (layout.height, layout.width, 3) and sheet.dtype == np.uint8
    for index, (x, y) in zip(layout.indices, layout.tiles):
        assert np.array_equal(sheet[y:y + 96, x:x + 160], frames[index]), index
    background = np.array(BACKGROUND, dtype=np.uint8)
    for _, (x, y) in layout.labels:  # the label's line has text in it (light pixels), right of its corner
        line = sheet[y:y + layout.line_height, x:x + 100]
        assert (line.max(axis=-1) > 150).sum() > 20
    title_band = sheet[MARGIN:MARGIN + layout.line_height, MARGIN:]
    assert (title_band.min(axis=-1) > 200).sum() > 50  # white title text
    gap = sheet[layout.tiles[0][1]:layout.tiles[0][1] + 96, layout.tiles[0][0] + 160:layout.tiles[1][0]]
    assert gap.size and (gap == background).all()  # between two tiles: background only


def test_large_frames_are_block_means_small_frames_repeated_pixels():
    big = random_frames(3, 272, 264, seed=1)  # longer side 272 > 256: reduced by 2
    tile = tile_of(big[0])
    means = big[0].reshape(136, 2, 132, 2, 3).astype(np.float64).mean(axis=(1, 3))
    assert tile.shape == (136, 132, 3) and np.abs(tile - means).max() <= 0.5 + 1e-9
    small = random_frames(2, 16, 24, seed=2)  # longer side 24 < 96: enlarged by 4
    tile = tile_of(small[1])
    assert tile.shape == (64, 96, 3)
    assert all(np.array_equal(tile[dy::4, dx::4], small[1]) for dy in range(4) for dx in range(4))
    sheet = contact_sheet(big, 16, "big")
    layout = sheet_layout(3, 272, 264, 16, "big")
    for index, (x, y) in zip(layout.indices, layout.tiles):
        assert np.array_equal(sheet[y:y + 136, x:x + 132], tile_of(big[index]))


def test_a_long_title_wraps_between_its_fields_never_inside_one():
    title = sheet_title("wan2.1-t2v-1.3b", "sparse-vdit:patterns=wan13b.json", 81, 480, 832, 50, 12345, "", "x")
    fields = ["wan2.1-t2v-1.3b", "attn sparse-vdit:patterns=wan13b.json", "81x480x832 (frames x height x width)",
              "50 steps", "seed 12345", "x"]
    assert title == " | ".join(fields)  # the empty entry left out
    layout = sheet_layout(9, 16, 16, 16, title)  # a narrow grid: 4 tiles of 96 pixels
    assert len(layout.title) > 1
    assert [f.strip() for line in layout.title for f in line.rstrip(" |").split(" | ")] == fields
    assert sheet_title("tiny", "full", 1, 16, 16, 1, 0) == ("tiny | attn full | 1x16x16 (frames x height x width) | "
                                                            "1 step | seed 0")


def write_sheet(frames, path, fps, title, overwrite=False):
    """The sheet written atomically, as a run publishes it (save_sheet into a temporary file, then moved)."""
    write_with(path, lambda tmp: save_sheet(frames, tmp, fps, title), overwrite=overwrite)


def test_a_saved_sheet_is_a_png_of_the_sheet_and_keeps_an_existing_file(tmp_path):
    frames = random_frames(5, 32, 48, seed=3)
    path = tmp_path / "v.sheet.png"
    write_sheet(frames, path, 8, "t")
    assert np.array_equal(np.asarray(Image.open(path).convert("RGB")), contact_sheet(frames, 8, "t"))
    with pytest.raises(BadInput, match="exists"):
        write_sheet(frames[:1], path, 8, "t")
    write_sheet(frames[:1], path, 8, "other", overwrite=True)
    assert np.array_equal(np.asarray(Image.open(path).convert("RGB")), contact_sheet(frames[:1], 8, "other"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.sheet.png"]  # no temporary file left


def test_bad_frames_are_refused():
    with pytest.raises(ValueError, match="uint8"):
        contact_sheet(np.zeros((2, 8, 8, 3), dtype=np.float32), 8, "t")
    with pytest.raises(ValueError):
        contact_sheet(np.zeros((0, 8, 8, 3), dtype=np.uint8), 8, "t")
    with pytest.raises(ValueError, match="fps"):
        sheet_layout(3, 8, 8, 0, "t")
