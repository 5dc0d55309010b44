"""Image-to-video conditioning: output size, first-frame tensor, mask and condition y
(docs/conventions.md#image-to-video-conditioning).

The first frame is resized to h×w and scaled to [-1, 1]; the clip the VAE encodes is that
frame followed by F−1 frames of zeros (zero in [-1, 1] space, as the reference does). The
4-channel mask marks the first latent frame as given and the rest as to be generated;
y = mask ⊕ VAE latent (20 channels).
"""
from __future__ import annotations

from typing import Union

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from .geometry import PATCH_SIZE, SIZE_MULTIPLE, TRAINED_SIZE, VAE_STRIDE_S, VAE_STRIDE_T

__all__ = [
    "check_frame_count",
    "check_size",
    "conditioning_video",
    "far_aspect",
    "first_frame_mask",
    "given_frames_mask",
    "image_to_tensor",
    "target_size",
    "to_rgb",
]

PATCH = PATCH_SIZE[1]  # DiT patch side in latent cells

ImageInput = Union[Image.Image, np.ndarray, torch.Tensor]


# --------------------------------------------------------------------------- sizes


def target_size(img_w: int, img_h: int, max_area: int) -> tuple[int, int]:
    """Output (h, w) for an img_w×img_h input within ``max_area`` pixels, keeping its aspect.

    Same arithmetic as the reference, floating-point quirks included: an 832×480 image
    with max_area 480·832 gives 464×832 there because √(area·h/w) lands a hair below 480.
    Both sides are multiples of 16 (VAE stride 8 × DiT patch 2).
    """
    if img_w <= 0 or img_h <= 0:
        raise ValueError(f"image size must be positive; got {img_w}×{img_h}")
    if max_area < SIZE_MULTIPLE * SIZE_MULTIPLE:
        raise ValueError(f"max_area must be at least {SIZE_MULTIPLE * SIZE_MULTIPLE} pixels; got {max_area}")
    aspect = img_h / img_w
    lat_h = round(np.sqrt(max_area * aspect) // VAE_STRIDE_S // PATCH * PATCH)
    lat_w = round(np.sqrt(max_area / aspect) // VAE_STRIDE_S // PATCH * PATCH)
    if lat_h < PATCH or lat_w < PATCH:
        raise ValueError(
            f"an image of {img_w}×{img_h} is too elongated for max_area {max_area}: "
            f"the output would be {lat_h * VAE_STRIDE_S}×{lat_w * VAE_STRIDE_S}"
        )
    return lat_h * VAE_STRIDE_S, lat_w * VAE_STRIDE_S


def check_frame_count(frames: int) -> None:
    """Raise ValueError unless ``frames`` = 4n + 1 ≥ 1 (1, 5, 9, …, 81, …)."""
    if isinstance(frames, bool) or not isinstance(frames, (int, np.integer)):
        raise ValueError(f"frame count must be an integer of the form 4n+1; got {frames!r}")
    if frames < 1 or (frames - 1) % VAE_STRIDE_T:
        below = max(1, (frames - 1) // VAE_STRIDE_T * VAE_STRIDE_T + 1)
        raise ValueError(
            f"frame count must be 4n+1 (1, 5, 9, …, 81); got {frames} (nearest below: {below})"
        )


def check_size(h: int, w: int) -> None:
    """Raise ValueError unless h and w are multiples of 16 and at least 16."""
    for name, value in (("height", h), ("width", w)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{name} must be an integer; got {value!r}")
        if value < SIZE_MULTIPLE or value % SIZE_MULTIPLE:
            raise ValueError(
                f"{name} must be a multiple of {SIZE_MULTIPLE} and at least {SIZE_MULTIPLE}; got {value}"
            )


# --------------------------------------------------------------------------- images

# A picture whose long side is more than this many times its short side is far from what the
# model learned: twice the aspect of its training size (832:480, about 1.7:1), so 16:9, 21:9
# and square pictures pass.
MAX_ASPECT = 2 * max(TRAINED_SIZE) / min(TRAINED_SIZE)


def far_aspect(width: int, height: int) -> str | None:
    """Words for a width×height picture whose aspect is far from the model's training size
    (more than ``MAX_ASPECT`` to 1); None when it is near enough."""
    long_side, short_side = max(width, height), max(1, min(width, height))
    if long_side <= MAX_ASPECT * short_side:
        return None
    trained_h, trained_w = TRAINED_SIZE
    return (f"{width}×{height} pixels, an aspect of {long_side / short_side:.1f}:1, far from the {trained_w}×{trained_h} "
            f"({trained_w / trained_h:.1f}:1, or portrait) the model was trained near")


# Modes PIL converts to RGB without losing range (8 bits per sample already).
_EIGHT_BIT_MODES = {"1", "L", "P", "RGB", "CMYK", "YCbCr", "LAB", "HSV", "RGBX"}
_ALPHA_MODES = {"LA", "La", "PA", "RGBA", "RGBa"}


def _float_rgb(image: Image.Image) -> np.ndarray:
    """Any PIL image → float32 [H, W, 3] in [0, 1], keeping 16-bit and float precision.

    Alpha is dropped, not composited: the reference opens inputs with convert("RGB"),
    which does the same, and a transparent region keeps whatever colour it stores.
    """
    mode = image.mode
    if mode in _ALPHA_MODES or (mode == "P" and "transparency" in image.info):
        # Through RGBA so premultiplied modes are undone and palette alpha is resolved.
        rgb = np.asarray(image.convert("RGBA"), dtype=np.float32)[..., :3]
        return rgb / 255.0
    if mode in _EIGHT_BIT_MODES:
        return np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    if mode.startswith("I;16"):
        # 16-bit greyscale (any byte order): full range is 0..65535.
        grey = np.asarray(image).astype(np.float32) / 65535.0
    elif mode == "I":
        # 32-bit integers: PIL uses this for 16-bit PNGs too, so a range above 8 bits is
        # read as 16-bit data; otherwise the values are taken as 8-bit.
        grey = np.asarray(image, dtype=np.float64)
        grey = grey / (65535.0 if grey.max(initial=0) > 255 else 255.0)
    elif mode == "F":
        # Floating point: taken as 0..1 when it fits there, else as 0..255.
        grey = np.nan_to_num(np.asarray(image, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
        grey = grey if grey.max(initial=0) <= 1.0 else grey / 255.0
    else:
        return np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    grey = np.clip(grey, 0.0, 1.0).astype(np.float32)
    return np.repeat(grey[..., None], 3, axis=-1)


def to_rgb(image: Image.Image) -> Image.Image:
    """Any PIL image as 8-bit RGB: 16-bit and float greys are rescaled, not clipped;
    alpha is dropped (see ``_float_rgb``)."""
    if image.mode == "RGB":
        return image
    rgb = _float_rgb(image)
    return Image.fromarray(np.round(rgb * 255.0).astype(np.uint8))


def _array_rgb(array: np.ndarray | torch.Tensor) -> np.ndarray:
    """HW, HWC (C = 1, 3, 4) or 1HWC arrays → float32 [H, W, 3] in [0, 1].

    uint8 is read as 0..255, uint16 as 0..65535, floats as 0..1 (ComfyUI's IMAGE).
    """
    if isinstance(array, torch.Tensor):
        array = array.detach().cpu()
        array = array.float().numpy() if array.is_floating_point() else array.numpy()
    arr = np.asarray(array)
    if arr.ndim == 4 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim == 2:
        arr = arr[..., None]
    if arr.ndim != 3 or arr.shape[-1] not in (1, 3, 4):
        raise ValueError(f"image array must be [H, W], [H, W, C] or [1, H, W, C] with C in 1, 3, 4; got {list(np.shape(array))}")
    if arr.dtype == np.uint8:
        out = arr.astype(np.float32) / 255.0
    elif arr.dtype == np.uint16:
        out = arr.astype(np.float32) / 65535.0
    elif np.issubdtype(arr.dtype, np.floating):
        out = np.nan_to_num(arr.astype(np.float32), nan=0.0, posinf=1.0, neginf=0.0)
    else:
        raise ValueError(f"image array dtype must be uint8, uint16 or float; got {arr.dtype}")
    out = np.clip(out, 0.0, 1.0)
    if out.shape[-1] == 1:
        out = np.repeat(out, 3, axis=-1)
    return out[..., :3]


# Above this many source pixels the float copies the resize works on cost gigabytes (an
# 8000×8000 picture is 768 MB per float32 copy), so such a picture is first shrunk by an
# integer box filter. Pictures up to this size (4K frames included) take the exact
# reference path.
MAX_FULL_RES_PIXELS = 4096 * 4096


def _shrink_huge(image: Image.Image, h: int, w: int) -> Image.Image:
    """A huge picture reduced by the largest integer factor that keeps it at least twice
    the output size in both directions (so bicubic still sees more pixels than it writes)."""
    factor = min(image.width // (2 * w), image.height // (2 * h))
    if image.width * image.height <= MAX_FULL_RES_PIXELS or factor < 2:
        return image
    if image.mode.startswith("I;16"):
        return image  # PIL cannot reduce these; rare enough to take the full-size path
    if image.mode in ("1", "P", "PA"):
        # Averaging palette indices or bits is meaningless: reduce real colours instead.
        has_alpha = image.mode == "PA" or "transparency" in image.info
        image = image.convert("RGBA" if has_alpha else "RGB")
    return image.reduce(factor)


def image_to_tensor(image: ImageInput, h: int, w: int, clamp: bool = False) -> torch.Tensor:
    """First frame → float32 [3, h, w], [-1, 1] before resizing.

    Resampling is what the reference does: bicubic ``torch.nn.functional.interpolate`` on
    the [-1, 1] tensor (align_corners=False, no antialias). Bicubic overshoots a little at
    sharp edges and the reference hands that overshoot to the VAE as it is (docs/conventions.md#reference-behaviours), so
    by default nothing is clamped; ``clamp`` pulls the values back into [-1, 1]. A PIL picture of more than
    ``MAX_FULL_RES_PIXELS`` is box-reduced first (``_shrink_huge``) to bound the memory.
    """
    check_size(h, w)
    if isinstance(image, Image.Image):
        image = _shrink_huge(image, h, w)
    rgb = _float_rgb(image) if isinstance(image, Image.Image) else _array_rgb(image)
    t = torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1).mul(2.0).sub(1.0)
    if t.shape[1:] != (h, w):
        t = F.interpolate(t[None], size=(h, w), mode="bicubic", align_corners=False)[0]
    if clamp:
        t = t.clamp(-1.0, 1.0)
    return t.contiguous()


# --------------------------------------------------------------------------- mask and y


def first_frame_mask(frames: int, lat_h: int, lat_w: int) -> torch.Tensor:
    """Mask [4, F_lat, lat_h, lat_w]: 1 where content is given (the first frame), else 0.

    Per video frame the mask is 1 for frame 0 and 0 after. Frame 0 is repeated 4 times so
    that every latent frame covers 4 mask frames, and those 4 become the channels.
    """
    return given_frames_mask(frames, 1, lat_h, lat_w)


def given_frames_mask(frames: int, given: int, lat_h: int, lat_w: int) -> torch.Tensor:
    """Mask [4, F_lat, lat_h, lat_w]: 1 for the first ``given`` video frames, else 0 (a long
    video's window starts on the previous window's last frames)."""
    check_frame_count(frames)
    if not 1 <= given <= frames:
        raise ValueError(f"given frames must be within 1..{frames}; got {given}")
    per_frame = torch.zeros(frames, lat_h, lat_w)
    per_frame[:given] = 1.0
    padded = torch.cat([per_frame[:1].expand(VAE_STRIDE_T, -1, -1), per_frame[1:]])
    return padded.view(-1, VAE_STRIDE_T, lat_h, lat_w).transpose(0, 1).contiguous()


def conditioning_video(image_tensor: torch.Tensor, frames: int) -> torch.Tensor:
    """Clip for the VAE [3, frames, h, w]: the image, then frames−1 frames of zeros."""
    check_frame_count(frames)
    if image_tensor.ndim != 3 or image_tensor.shape[0] != 3:
        raise ValueError(f"image tensor must be [3, h, w]; got {list(image_tensor.shape)}")
    video = image_tensor.new_zeros(3, frames, *image_tensor.shape[1:])
    video[:, 0] = image_tensor
    return video
