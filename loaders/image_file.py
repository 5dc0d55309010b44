"""Picture files: the pack's one opener (the command line's --image, the benchmarks; the nodes
get pictures from ComfyUI's Load Image, which decodes them the same way).

A picture is decoded as ComfyUI's Load Image decodes a still one: its first frame, with the
EXIF orientation applied (``ImageOps.exif_transpose``; Load Image on PyAV applies the same
rotation), so a portrait phone photo, stored lying on its side with Orientation 6, comes out
upright. Pillow's guard against decompression bombs is worded for a person: a picture above its
warning size is read with a note saying so; one above its error size is refused naming the file.
A picture whose aspect is far from the model's gets a note too (``wan.conditioning.far_aspect``).
"""
from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Callable

from PIL import Image, ImageOps, ImageSequence, UnidentifiedImageError

from ..wan.conditioning import far_aspect

logger = logging.getLogger(__name__)

Note = Callable[[str], None]


def _megapixels(pixels: float) -> str:
    return f"{pixels / 1e6:.0f} megapixels"


def open_image(path: str | Path, note: Note = logger.warning) -> Image.Image:
    """The picture at ``path``, upright and decoded (its pixels loaded, the file closed).

    ``note`` receives a sentence for each thing a person should know (a very large picture, an
    aspect far from the model's); ValueError names the file when it is not a picture Pillow reads
    or is too large to read."""
    path = Path(path)
    limit = Image.MAX_IMAGE_PIXELS
    try:
        with warnings.catch_warnings():
            # Pillow's own warning (a raw line with a class name) is replaced by the note below.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as file:
                picture = ImageOps.exif_transpose(next(ImageSequence.Iterator(file)))
                picture.load()
    except Image.DecompressionBombError:
        raise ValueError(f"{path} holds more than {_megapixels(2 * limit)}, more than Pillow reads (its guard "
                         "against decompression bombs); shrink it first (the video is at most a few megapixels "
                         "anyway)") from None
    except (UnidentifiedImageError, OSError, SyntaxError, StopIteration) as exc:  # SyntaxError: a damaged header
        raise ValueError(f"{path} is not a picture Pillow can read ({exc})") from None
    width, height = picture.size
    if limit and width * height > limit:
        note(f"{path.name} is {width}×{height} pixels ({_megapixels(width * height)}), above the "
             f"{_megapixels(limit)} at which Pillow warns of a decompression bomb: it is read whole anyway (that "
             "takes memory and time) and reduced to the video's size")
    aspect = far_aspect(width, height)
    if aspect is not None:
        note(f"{path.name} is {aspect}")
    return picture
