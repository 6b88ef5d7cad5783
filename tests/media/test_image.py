"""vsagen.media.image: opening input images (PNG, JPEG, WebP; refusals name the path), fitting them to a size (crop,
resize), extending them to the denoised size, and the synthetic test picture."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vsagen.errors import BadInput
from vsagen.media.image import (MAX_UPSCALE, MIN_IMAGE_SIDE, adaptive_size, check_image_size, fit_image, fit_scale,
                                open_image)


@pytest.mark.parametrize("fit", ["crop", "resize"])
@pytest.mark.parametrize("src", [(200, 50), (30, 90), (64, 64)])
def test_fit_image_gives_exactly_the_size(fit, src):
    im = Image.fromarray(np.full((src[1], src[0], 3), 200, np.uint8))
    out = fit_image(im, 48, 80, fit)
    assert out.size == (80, 48) and out.mode == "RGB"
    arr = np.asarray(out)
    if fit == "crop":
        assert (arr == 200).all()  # scaled to cover, then cropped: no padding
    else:
        assert (arr == 0).any() and (arr == 200).any()  # scaled to fit inside, letterboxed (no source aspect fits)


def test_extend_to_keeps_the_image_in_the_top_left_corner():
    from vsagen.media.image import extend_to

    rng = np.random.default_rng(3)
    src = Image.fromarray(rng.integers(0, 256, (5, 7, 3), dtype=np.uint8))
    big = np.asarray(extend_to(src, 8, 11))
    assert big.shape == (8, 11, 3)
    assert np.array_equal(big[:5, :7], np.asarray(src))
    assert np.array_equal(big[5:, :7], np.repeat(np.asarray(src)[4:5], 3, axis=0))  # last row repeated
    assert np.array_equal(big[:, 7:], np.repeat(big[:, 6:7], 4, axis=1))  # last column repeated
    assert extend_to(src, 5, 7) is src
    with pytest.raises(ValueError):
        extend_to(src, 4, 7)


def test_synthetic_image_is_deterministic_and_sized():
    import numpy as np

    from vsagen.media.image import synthetic_image

    a, b, c = synthetic_image(24, 40, 0), synthetic_image(24, 40, 0), synthetic_image(24, 40, 1)
    assert a.size == (40, 24) and a.mode == "RGB"
    assert np.array_equal(np.asarray(a), np.asarray(b)) and not np.array_equal(np.asarray(a), np.asarray(c))
    assert np.asarray(a).std() > 10  # a picture, not a constant


@pytest.mark.parametrize("suffix", ["png", "jpg", "webp"])
def test_open_image_reads_each_format_as_rgb(tmp_path, suffix):
    rng = np.random.default_rng(5)
    src = rng.integers(0, 256, (30, 44, 3), dtype=np.uint8)
    path = tmp_path / f"in.{suffix}"
    Image.fromarray(src).convert("RGBA" if suffix == "png" else "RGB").save(path)
    im = open_image(path)
    assert im.mode == "RGB" and im.size == (44, 30)
    if suffix == "png":  # lossless
        assert np.array_equal(np.asarray(im), src)


def test_open_image_refusals_name_the_path(tmp_path):
    with pytest.raises(BadInput, match="does not exist"):
        open_image(tmp_path / "nope.png")
    with pytest.raises(BadInput, match="is not a file"):
        open_image(tmp_path)
    (tmp_path / "bad.png").write_bytes(b"not an image")
    with pytest.raises(BadInput, match=r"cannot read image .*bad\.png.*PNG, JPEG or WebP"):
        open_image(tmp_path / "bad.png")
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / "x.bmp")
    with pytest.raises(BadInput, match="format BMP is not supported"):
        open_image(tmp_path / "x.bmp")


def test_fit_modes_keep_the_aspect_and_center(tmp_path):
    # a 100 x 50 picture, left half black and right half white, into 40 x 40
    arr = np.zeros((50, 100, 3), np.uint8)
    arr[:, 50:] = 255
    im = Image.fromarray(arr)
    crop = np.asarray(fit_image(im, 40, 40, "crop"))  # scaled to 80 x 40, 20 px cut on each side
    assert crop[:, :15].max() == 0 and crop[:, 25:].min() == 255
    resize = np.asarray(fit_image(im, 40, 40, "resize"))  # scaled to 40 x 20, black bars of 10 px above and below
    assert resize[:9].max() == 0 and resize[31:].max() == 0 and resize[12:28, 25:].min() == 255
    with pytest.raises(BadInput, match="--fit must be one of crop, resize"):
        fit_image(im, 40, 40, "stretch")


def test_fit_scale_is_the_scale_fit_image_applies():
    im = Image.fromarray(np.zeros((20, 30, 3), np.uint8))  # 30 x 20
    for fit in ("crop", "resize"):
        s = fit_scale(im.size, 96, 160, fit)
        assert s == (160 / 30 if fit == "crop" else 96 / 20)
    assert fit_scale((30, 20), 40, 40, "crop") == 2.0 and fit_scale((30, 20), 40, 40, "resize") == 40 / 30


def test_check_image_size_refuses_tiny_images_and_notes_large_upscales(tmp_path):
    path = tmp_path / "in.png"
    with pytest.raises(BadInput, match=rf"^--last-image {path} is 1x1 pixels \(height x width\): too small to start a 480x832 video from; give an image of at least "
                                       rf"{MIN_IMAGE_SIDE} pixels a side"):
        check_image_size(path, (1, 1), 480, 832, "crop", "--last-image")
    with pytest.raises(BadInput, match=r"is 15x832 pixels \(height x width\)"):
        check_image_size(path, (832, 15), 480, 832, "resize")
    assert check_image_size(path, (208, 120), 480, 832, "crop") is None  # exactly MAX_UPSCALE: no note
    note = check_image_size(path, (100, 100), 480, 832, "crop")  # 8.32x up to cover 832 wide
    assert note.startswith(f"image {path} (100x100, height x width) is scaled up 8.3x to fit the 480x832 video (--fit crop)")
    assert "an image of 480x832 or more keeps the detail" in note
    assert "scaled up 4.8x" in check_image_size(path, (100, 100), 480, 832, "resize")  # fits inside: 480 / 100
    assert 480 / 128 < MAX_UPSCALE and check_image_size(path, (128, 128), 480, 832, "resize") is None


def test_a_crop_that_cuts_the_image_is_a_note(tmp_path):
    """Issue 29: i2v cropped a 320x200 (width x height) image to 96x160 without a word. Sizes are said height x
    width, as everywhere else (a new-user trial: this said 160x96, width first)."""
    path = tmp_path / "in.png"
    note = check_image_size(path, (320, 200), 96, 160, "crop")  # covers 160 x 100: 4 of 100 rows cut
    assert note == (f"image {path} (200x320, height x width) loses 4% of its height to the crop that fits it to the 96x160 video "
                    "(--height / --width set the video's size; --fit resize keeps the image whole, with black bars)")
    assert "loses 50% of its width" in check_image_size(path, (400, 100), 100, 200, "crop")  # 400x100 -> 2:1 cut
    assert check_image_size(path, (320, 200), 96, 160, "resize") is None  # padding was asked for
    assert check_image_size(path, (322, 193), 96, 160, "crop") is None  # under MAX_ASPECT_CHANGE
    both = check_image_size(path, (40, 20), 480, 832, "crop")
    assert "is scaled up 24.0x" in both and "; it loses 13% of its width" in both  # 960 wide, 832 kept


def test_16_bit_grayscale_is_scaled_not_clipped_white(tmp_path):
    """A 16-bit grayscale PNG: PIL's convert("RGB") clipped every level above 255 (of 65535) to white, so the run
    started from a white picture without a word (new-user trial); the levels are scaled by 1/257 instead."""
    import numpy as np
    from PIL import Image

    from vsagen.media.image import open_image

    levels = np.array([[0, 8000, 32768, 65535]] * 4, dtype=np.uint16).repeat(4, axis=1)
    path = tmp_path / "gray16.png"
    Image.fromarray(levels).save(path)  # a 16-bit grayscale PNG (PIL reopens it as "I;16" or "I")
    with Image.open(path) as im:
        assert im.mode.startswith("I")
    got = np.asarray(open_image(path))
    assert got.shape == (4, 16, 3) and (got[..., 0] == got[..., 1]).all() and (got[..., 1] == got[..., 2]).all()
    assert got[0, ::4, 0].tolist() == [0, round(8000 / 257), round(32768 / 257), 255]


def test_transparent_pixels_get_a_note_opaque_ones_none(tmp_path):
    """Alpha is dropped as diffusers' load_image drops it (the colour under transparent pixels shows): said in a note
    (it was silent: a new-user trial); an RGBA image that is all opaque, or an RGB one, gets none."""
    from PIL import Image

    from vsagen.commands.generate_config import image_notes
    from vsagen.media.image import open_image, transparency_note

    clear = tmp_path / "clear.png"
    Image.new("RGBA", (64, 64), (255, 0, 0, 0)).save(clear)
    assert open_image(clear).getpixel((0, 0)) == (255, 0, 0)  # as diffusers: the stored colour
    assert "has transparent pixels" in transparency_note(clear)
    assert "shows in the first frame" in transparency_note(clear) and "should start from" in transparency_note(clear)
    last = transparency_note(clear, "--last-image")  # a new-user trial: this said "first frame" too
    assert last.startswith(f"--last-image {clear} has transparent pixels")
    assert "shows in the last frame" in last and "first frame" not in last and last.endswith("the video should end on")
    opaque, rgb = tmp_path / "opaque.png", tmp_path / "rgb.png"
    Image.new("RGBA", (64, 64), (0, 0, 255, 255)).save(opaque)
    Image.new("RGB", (64, 64), (0, 0, 255)).save(rgb)
    assert transparency_note(opaque) is None and transparency_note(rgb) is None
    notes = image_notes(64, 64, "crop", [("image", clear, (64, 64)), ("--last-image", opaque, (64, 64))])
    assert len(notes) == 1 and notes[0].startswith(f"image {clear} has transparent pixels")


def _turbodiffusion_adaptive(w0: int, h0: int, base_w: int, base_h: int, stride: int) -> tuple[int, int]:
    """TurboDiffusion's --adaptive_resolution re-enacted (turbodiffusion/inference/wan2.2_i2v_infer.py:103-117,
    @aaecff5): numpy float64 sides from the aspect h0 / w0 at base_w x base_h's area, `round` of the numpy float."""
    area = base_w * base_h
    aspect = h0 / w0
    ideal_w, ideal_h = np.sqrt(area / aspect), np.sqrt(area * aspect)
    return round(ideal_h / stride) * stride, round(ideal_w / stride) * stride


def _lightx2v_size(w0: int, h0: int, area: int) -> tuple[int, int]:
    """LightX2V's Wan I2V sizing re-enacted (lightx2v/models/runners/wan/wan_runner.py:805-811, 854-855 @f8aee98):
    latent sides round(sqrt(area r) // vae_stride 8 // patch 2 * 2) in numpy float64, pixels latent x 8."""
    aspect = h0 / w0
    lat_h = round(np.sqrt(area * aspect) // 8 // 2 * 2)
    lat_w = round(np.sqrt(area / aspect) // 8 // 2 * 2)
    return lat_h * 8, lat_w * 8


@pytest.mark.parametrize("w0,h0", [(1280, 720), (720, 1280), (1024, 1024), (1000, 1500), (640, 480), (1023, 677),
                                   (333, 1999), (4000, 3000), (1279, 721)])
def test_adaptive_floor_size_is_lightx2vs_rule(w0, h0):
    """`adaptive-floor` (the LightX2V Wan2.2 I2V preset): the sides rounded down where TurboDiffusion's round to
    nearest; a 16:9 image gets 720 x 1280 under both."""
    got = adaptive_size((w0, h0), 720 * 1280, 16, "floor")
    assert got == _lightx2v_size(w0, h0, 720 * 1280)
    near = adaptive_size((w0, h0), 720 * 1280, 16)
    assert got[0] <= near[0] and got[1] <= near[1] and got[0] % 16 == 0 == got[1] % 16
    if (w0, h0) == (1280, 720):
        assert got == near == (720, 1280)
    if (w0, h0) == (1000, 1500):
        assert (got, near) == ((1168, 768), (1168, 784))  # where the two rules part


@pytest.mark.parametrize("w0,h0", [(1280, 720), (720, 1280), (1024, 1024), (1000, 1500), (640, 480), (1023, 677),
                                   (333, 1999), (4000, 3000)])
def test_adaptive_size_is_turbodiffusions_rule(w0, h0):
    """The size of TurboWan2.2 I2V's default run: the image's aspect at the 720p 16:9 area (1280 x 720), sides
    multiples of 16; a 16:9 image gets their fixed 1280 x 720."""
    height, width = adaptive_size((w0, h0), 720 * 1280, 16)
    assert (height, width) == _turbodiffusion_adaptive(w0, h0, 1280, 720, 16)
    assert height % 16 == 0 == width % 16 and abs(height * width / (720 * 1280) - 1) < 0.08
    assert abs(height * w0 / (width * h0) - 1) < 16 / min(height, width)  # the aspect kept, to within a stride
    if (w0, h0) == (1280, 720):
        assert (height, width) == (720, 1280)
