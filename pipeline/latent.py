"""The pack's latent <-> ComfyUI's Wan 2.1 LATENT convention.

The pack's VAE encodes to, and its DiT works on, the normalized latent (mu - mean) / std.
ComfyUI's LATENT dicts hold the raw VAE latent (``comfy.latent_formats.Wan21``: the model
sees ``process_in(raw)``), so core VAE Decode reads what the sampler returns once it is
``to_comfy_latent``'d.
"""
from __future__ import annotations

import torch

from ..wan.vae import LATENT_MEAN, LATENT_STD


def _stats(latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if latent.dim() < 4 or latent.shape[-4] != len(LATENT_MEAN):
        raise ValueError(
            f"latent has shape {tuple(latent.shape)}; expected [..., {len(LATENT_MEAN)}, frames, height/8, width/8]"
        )
    shape = (len(LATENT_MEAN), 1, 1, 1)  # the channel axis is the 4th from the end
    mean = torch.tensor(LATENT_MEAN, dtype=torch.float32, device=latent.device).view(shape)
    std = torch.tensor(LATENT_STD, dtype=torch.float32, device=latent.device).view(shape)
    return mean, std


def to_comfy_latent(normalized: torch.Tensor) -> torch.Tensor:
    """Normalized latent -> raw Wan 2.1 VAE latent (``Wan21.process_out``), float32."""
    mean, std = _stats(normalized)
    return normalized.float() * std + mean


def from_comfy_latent(raw: torch.Tensor) -> torch.Tensor:
    """Raw Wan 2.1 VAE latent (a ComfyUI LATENT) -> the normalized latent (``Wan21.process_in``), float32."""
    mean, std = _stats(raw)
    return (raw.float() - mean) / std
