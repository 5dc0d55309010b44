"""The image condition y built in one call from a VAE and an image tensor: the tests'
reference for the pack's builders (``pipeline/image.py``'s ``encode_image``, the Fast
sources of ``pipeline/fast/conditions.py``). Moved out of ``wan/conditioning.py``, where only
tests used it."""
from __future__ import annotations

from typing import Protocol

import torch

from comfyui_lingbot_world.wan.conditioning import check_size, conditioning_video, first_frame_mask
from comfyui_lingbot_world.wan.geometry import latent_shape


class _Encoder(Protocol):
    def encode(self, video: torch.Tensor) -> torch.Tensor: ...


def build_i2v_condition(vae: _Encoder, image_tensor: torch.Tensor, frames: int) -> torch.Tensor:
    """y [20, F_lat, h/8, w/8] = first-frame mask (4) ⊕ VAE latent of the conditioning clip (16).

    ``vae.encode`` takes [B, 3, F, H, W] in [-1, 1] and returns the normalized latent
    [B, 16, F_lat, H/8, W/8]; the clip is sent to the device of the VAE's parameters.
    """
    check_size(int(image_tensor.shape[-2]), int(image_tensor.shape[-1]))
    video = conditioning_video(image_tensor.float(), frames)[None]
    params = getattr(vae, "parameters", None)
    first = next(iter(params()), None) if callable(params) else None
    if first is not None:
        video = video.to(first.device)
    latent = vae.encode(video)[0]
    n_lat, lat_h, lat_w = latent_shape(frames, video.shape[-2], video.shape[-1])
    if tuple(latent.shape[1:]) != (n_lat, lat_h, lat_w):
        raise ValueError(
            f"VAE latent has shape {list(latent.shape)}; expected [16, {n_lat}, {lat_h}, {lat_w}]"
        )
    mask = first_frame_mask(frames, lat_h, lat_w).to(device=latent.device, dtype=latent.dtype)
    return torch.cat([mask, latent])
