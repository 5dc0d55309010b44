"""Stage 4: latent -> video frames, with the VAE freed after."""
from __future__ import annotations

from typing import Callable, Mapping

import torch

from ..loaders.vae_loader import load_vae, load_vae_from_state_dict
from .image import VAESource, vae_dtype
from .memory import release_module, resolve_device


def decode(
    vae_file: VAESource,
    latent: torch.Tensor,
    device: torch.device | str | None = None,
    tile: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> torch.Tensor:
    """[16, F_lat, h, w] latent -> [3, F, 8h, 8w] float32 video in [-1, 1] on the CPU."""
    if latent.dim() == 5:
        if latent.shape[0] != 1:
            raise ValueError(f"latent batch is {latent.shape[0]}; decode one video at a time")
        latent = latent[0]
    if latent.dim() != 4 or latent.shape[0] != 16:
        raise ValueError(f"latent has shape {tuple(latent.shape)}; expected [16, frames, height/8, width/8]")
    device = resolve_device(device)
    if isinstance(vae_file, Mapping):
        vae = load_vae_from_state_dict(vae_file, device, vae_dtype(device), source="the connected VAE")
    else:
        vae = load_vae(vae_file, device, vae_dtype(device))
    try:
        with torch.inference_mode():
            video = vae.decode(latent[None].to(device, vae_dtype(device)), tile=tile or None, progress=on_progress)
        return video[0].float().cpu()
    finally:
        release_module(vae)
        del vae
