"""loaders/image_file.py, the pack's one picture opener: a photo comes out upright by its EXIF
orientation, as ComfyUI's Load Image shows it with either decoder it has used (Pillow, and PyAV
since 0.21); Pillow's decompression-bomb guard and an aspect far from the model's are worded
for a person; a file that is not a picture fails naming it."""
from __future__ import annotations

import warnings
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image, ImageOps, ImageSequence

from comfyui_lingbot_world.loaders.image_file import open_image

ORIENTATION = 0x0112
# How a camera stores an upright picture under each EXIF orientation (the inverse of what a
# viewer does to show it): 3 upside down, 6 turned a quarter counter-clockwise, 8 clockwise.
STORED = {3: Image.Transpose.ROTATE_180, 6: Image.Transpose.ROTATE_90, 8: Image.Transpose.ROTATE_270}


def upright_picture() -> Image.Image:
    """A portrait picture (48 wide, 96 tall) no turn or mirror maps onto itself: a bright block
    at the top left, a gradient down the side."""
    pixels = np.zeros((96, 48, 3), np.uint8)
    pixels[..., 2] = np.linspace(0, 200, 96, dtype=np.uint8)[:, None]
    pixels[:16, :16] = (250, 250, 250)
    return Image.fromarray(pixels)


def phone_photo(path: Path, orientation: int) -> Image.Image:
    """``upright_picture`` stored as a camera does with EXIF ``orientation``; returns the upright one."""
    upright = upright_picture()
    exif = Image.Exif()
    exif[ORIENTATION] = orientation
    upright.transpose(STORED[orientation]).save(path, quality=95, exif=exif.tobytes())
    return upright


def load_image_pil(path: Path) -> np.ndarray:
    """ComfyUI's Load Image on Pillow (before 0.21, and for what PyAV cannot read): first frame,
    exif_transpose, RGB."""
    with Image.open(path) as file:
        return np.asarray(ImageOps.exif_transpose(next(ImageSequence.Iterator(file))).convert("RGB"))


def load_image_pyav(path: Path) -> np.ndarray:
    """ComfyUI's Load Image on PyAV (0.21 and later, VideoFromFile.get_components): the first
    frame as rgb24, turned by the frame's rotation (which FFmpeg reads from the EXIF orientation)."""
    with av.open(str(path)) as container:
        frame = next(container.decode(video=0))
        pixels = frame.to_ndarray(format="rgb24")
        return np.rot90(pixels, k=int(round(frame.rotation // 90)), axes=(0, 1)).copy()


def _difference(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


@pytest.mark.parametrize("orientation", sorted(STORED))
def test_a_phone_photo_comes_out_upright_as_load_image_shows_it_with_either_decoder(tmp_path, orientation):
    path = tmp_path / "photo.jpg"
    upright = np.asarray(phone_photo(path, orientation))
    notes: list[str] = []
    opened = np.asarray(open_image(path, notes.append).convert("RGB"))
    assert opened.shape == upright.shape == (96, 48, 3) and notes == []
    assert np.array_equal(opened, load_image_pil(path))  # the same decoder: the same pixels
    # PyAV's JPEG decoder rounds differently (a few levels), never by a quarter turn: a turned or
    # mirrored picture would differ by far more (the block and the gradient move).
    assert _difference(opened, load_image_pyav(path)) < 3
    assert _difference(opened, upright) < 3
    assert _difference(np.asarray(upright_picture().transpose(Image.Transpose.FLIP_TOP_BOTTOM)), upright) > 30


def test_a_picture_without_exif_and_a_png_open_as_stored(tmp_path):
    path = tmp_path / "plain.png"
    upright_picture().save(path)
    assert np.array_equal(np.asarray(open_image(path, [].append)), np.asarray(upright_picture()))


def test_a_picture_far_from_the_models_aspect_gets_a_note(tmp_path):
    notes: list[str] = []
    path = tmp_path / "strip.png"
    Image.new("RGB", (16, 4000)).save(path)
    open_image(path, notes.append)
    assert notes == ["strip.png is 16×4000 pixels, an aspect of 250.0:1, far from the 832×480 (1.7:1, or portrait) "
                     "the model was trained near"]
    for size in ((832, 480), (480, 832), (1920, 1080), (2560, 1080), (512, 512)):  # 16:9, 21:9, square: no note
        Image.new("RGB", size).save(path)
        assert open_image(path, notes.append) and len(notes) == 1, size


def test_a_huge_picture_gets_a_clear_note_not_pillows_warning(tmp_path):
    path = tmp_path / "huge.png"
    Image.new("1", (10000, 10000)).save(path)  # 100 megapixels; a bilevel image keeps the test small
    notes: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)  # raised, were it not handled
        picture = open_image(path, notes.append)
    assert picture.size == (10000, 10000)
    assert len(notes) == 1 and notes[0].startswith("huge.png is 10000×10000 pixels (100 megapixels), above the 89 "
                                                   "megapixels at which Pillow warns")


def test_a_picture_beyond_pillows_limit_and_a_non_picture_fail_naming_the_file(tmp_path):
    path = tmp_path / "bomb.png"
    Image.new("1", (20000, 10000)).save(path)
    with pytest.raises(ValueError, match=r"bomb.png holds more than 179 megapixels, more than Pillow reads .* shrink it"):
        open_image(path, [].append)
    text = tmp_path / "notes.jpg"
    text.write_text("not a picture")
    with pytest.raises(ValueError, match=r"notes.jpg is not a picture Pillow can read"):
        open_image(text, [].append)
