"""Stage 4: latent -> video frames, with the VAE freed after."""
from __future__ import annotations

from typing import Callable, Mapping

import torch

from ..loaders.vae_loader import load_vae, load_vae_from_state_dict
from ..wan.geometry import LATENT_CHANNELS, pixel_size, video_frames
from .guards import check_finite
from .latent import check_latent_shape
from .image import CONNECTED_VAE, VAESource, vae_dtype, vae_name
from .memory import (DECODE_BYTES_PER_PIXEL, build_or_release, check_video_fits, release_module, resolve_device,
                     vae_workspace_bytes)


def decode(
    vae_file: VAESource,
    latent: torch.Tensor,
    device: torch.device | str | None = None,
    tile: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    check_interrupt: Callable[[], None] | None = None,
    precision: str = "fp32",
) -> torch.Tensor:
    """[16, F_lat, h, w] latent -> [3, F, 8h, 8w] float32 video in [-1, 1] on the CPU.

    ``check_interrupt`` runs before every decoded latent frame (of every tile);
    ``precision`` is "fp32" (the reference) or "bf16".
    """
    if latent.dim() == 5:
        if latent.shape[0] != 1:
            raise ValueError(f"latent batch is {latent.shape[0]}; decode one video at a time")
        latent = latent[0]
    if latent.dim() != 4 or latent.shape[0] != LATENT_CHANNELS:
        raise ValueError(f"latent has shape {tuple(latent.shape)}; expected [{LATENT_CHANNELS}, frames, height/8, "
                         "width/8]")
    check_latent_shape(latent)
    frames, (height, width) = video_frames(latent.shape[1]), pixel_size(latent.shape[2], latent.shape[3])
    check_video_fits(frames, height, width, bytes_per_pixel=DECODE_BYTES_PER_PIXEL)
    check_finite(latent, "the latent to decode", "a sampler run that diverged (NaN weights, extreme intrinsics)")
    device = resolve_device(device)
    dtype = vae_dtype(device, precision)
    if isinstance(vae_file, Mapping):
        vae = build_or_release(lambda: load_vae_from_state_dict(vae_file, device, dtype, source=CONNECTED_VAE))
    else:
        vae = build_or_release(lambda: load_vae(vae_file, device, dtype))
    try:
        if device.type == "cpu":  # the VAE's own working memory is host memory too: known now
            tile_height, tile_width = pixel_size(tile, tile) if tile else (height, width)  # a tile is in latent cells
            region = min(height, tile_height) * min(width, tile_width)
            check_video_fits(frames, height, width, bytes_per_pixel=DECODE_BYTES_PER_PIXEL,
                             workspace_bytes=vae_workspace_bytes(vae.geometry.dim, region, "decode"),
                             workspace_hint=", set a decode tile (e.g. 32), or decode on a GPU")
        with torch.inference_mode():
            video = vae.decode(latent[None].to(device, dtype), tile=tile or None, progress=on_progress,
                               cancel=check_interrupt)
        video = video[0].float().cpu()
    finally:
        release_module(vae)
        del vae
    check_finite(video, f"the decoded video ({vae_name(vae_file)}, {precision})",
                 "NaN or inf weights in the VAE file, or an overflow in bf16 (use fp32)")
    return video
