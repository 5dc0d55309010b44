"""Stage 2: the first frame -> the image-to-video condition y, with the VAE freed after."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import torch
from PIL import Image

from ..loaders.vae_loader import load_vae, load_vae_from_state_dict
from ..wan.conditioning import (
    check_frame_count,
    check_size,
    conditioning_video,
    first_frame_mask,
    image_to_tensor,
)
from ..wan.vae import WanVAE
from .guards import check_finite, vae_precision
from .memory import (ENCODE_BYTES_PER_PIXEL, build_or_release, check_video_fits, release_module, resolve_device,
                     vae_workspace_bytes)

ImageLike = Image.Image | np.ndarray | torch.Tensor
# A VAE weights file, or a state dict already in memory (a core ComfyUI VAE's get_sd()).
VAESource = str | Path | Mapping[str, torch.Tensor]


@dataclass
class I2VCondition:
    y: torch.Tensor  # [20, F_lat, H/8, W/8] float32 on the CPU: 4 mask + 16 latent channels
    frames: int
    height: int
    width: int


def vae_dtype(device: torch.device, precision: str = "fp32") -> torch.dtype:
    """The VAE's dtype: float32 on every device as in the reference, unless ``precision``
    asks for less ("bf16": about half the activation memory, and a decode that differs a little;
    bench/RESULTS.md)."""
    return vae_precision(precision)


CONNECTED_VAE = "the connected VAE"  # how messages name a VAE given as a state dict


def vae_name(source: VAESource) -> str:
    """What messages call a VAE source: its file name, or the connected (core) VAE."""
    return CONNECTED_VAE if isinstance(source, Mapping) else Path(source).name


def open_vae(source: VAESource, device: torch.device, dtype: torch.dtype) -> WanVAE:
    """The pack's WanVAE from a file or from a state dict (then named "the connected VAE" in errors)."""
    if isinstance(source, Mapping):
        return load_vae_from_state_dict(source, device, dtype, source=CONNECTED_VAE)
    return load_vae(source, device, dtype)


# Rows converted at a time: the float temporaries of a whole 8000x8000 frame would be
# gigabytes; a band of rows keeps them to a few megabytes.
_ROWS_PER_BAND = 256


def _to_uint8(array: np.ndarray) -> np.ndarray:
    """Float pixels in 0..1 -> uint8, band by band in one reused buffer (NaN becomes 0)."""
    out = np.empty(array.shape, dtype=np.uint8)
    scratch = np.empty((_ROWS_PER_BAND,) + array.shape[1:], dtype=np.float32)
    for start in range(0, array.shape[0], _ROWS_PER_BAND):
        band = array[start:start + _ROWS_PER_BAND]
        work = scratch[: len(band)]
        np.fmax(band, 0.0, out=work)  # fmax/fmin, unlike clip, turn NaN into the bound
        np.fmin(work, 1.0, out=work)
        work *= 255.0
        work += 0.5
        out[start:start + _ROWS_PER_BAND] = work  # the cast truncates: + 0.5 rounds
    return out


def as_pil(image: ImageLike) -> Image.Image:
    """A ComfyUI IMAGE frame ([H,W,C] float 0..1), a uint8 array or a PIL image -> PIL."""
    if isinstance(image, Image.Image):
        return image
    array = image.detach().cpu().numpy() if isinstance(image, torch.Tensor) else np.asarray(image)
    if array.ndim == 4:  # a batch: the first frame is the one that conditions the video
        array = array[0]
    if array.dtype != np.uint8:
        array = _to_uint8(array)
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    return Image.fromarray(array)


def encode_image(
    vae_file: VAESource,
    image: ImageLike,
    frames: int,
    height: int,
    width: int,
    device: torch.device | str | None = None,
    check_interrupt: Callable[[], None] | None = None,
    precision: str = "fp32",
) -> I2VCondition:
    """``check_interrupt`` runs before every VAE chunk (1 frame, then 4), so a cancel acts
    within one chunk; ``precision`` is "fp32" (the reference) or "bf16"."""
    check_frame_count(frames)
    check_size(height, width)
    check_video_fits(frames, height, width, bytes_per_pixel=ENCODE_BYTES_PER_PIXEL)  # before the clip is allocated
    dtype = vae_dtype(resolve_device(device), precision)
    device = resolve_device(device)
    vae = build_or_release(lambda: open_vae(vae_file, device, dtype))
    try:
        if device.type == "cpu":  # the VAE's own working memory is host memory too: known now
            check_video_fits(frames, height, width, bytes_per_pixel=ENCODE_BYTES_PER_PIXEL,
                             workspace_bytes=vae_workspace_bytes(vae.geometry.dim, height * width, "encode"),
                             workspace_hint=", or encode on a GPU")
        pixels = image_to_tensor(as_pil(image), height, width)
        clip = conditioning_video(pixels, frames)
        if check_interrupt:
            check_interrupt()
        with torch.inference_mode():
            latent = vae.encode(clip[None], cancel=check_interrupt)[0].float().cpu()
    finally:
        release_module(vae)
        del vae
    check_finite(latent, f"the VAE latent of the first frame ({vae_name(vae_file)}, {precision})",
                 "NaN or inf weights in the VAE file, or an overflow in bf16 (use fp32)")
    mask = first_frame_mask(frames, latent.shape[-2], latent.shape[-1])
    return I2VCondition(y=torch.cat([mask, latent]), frames=frames, height=height, width=width)
