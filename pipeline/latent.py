"""The pack's latent <-> ComfyUI's Wan 2.1 LATENT convention.

The pack's VAE encodes to, and its DiT works on, the normalized latent (mu - mean) / std.
ComfyUI's LATENT dicts hold the raw VAE latent (``comfy.latent_formats.Wan21``: the model
sees ``process_in(raw)``), so core VAE Decode reads what the sampler returns once it is
``to_comfy_latent``'d.
"""
from __future__ import annotations

import torch

from ..wan.vae import LATENT_MEAN, LATENT_STD


def check_latent_shape(latent: torch.Tensor, field: str = "latent") -> None:
    """[..., 16, frames, height/8, width/8] with no empty axis; ValueError naming ``field``.

    Checked where a latent enters (a LATENT from another node, the decoder's input): an
    axis of size 0 otherwise fails deep inside the VAE with a raw torch error.
    """
    if latent.dim() < 4 or latent.shape[-4] != len(LATENT_MEAN):
        raise ValueError(
            f"{field}: latent has shape {tuple(latent.shape)}; expected [..., {len(LATENT_MEAN)}, frames, height/8, "
            "width/8]"
        )
    empty = [axis for axis, size in zip(("frames", "height/8", "width/8"), latent.shape[-3:]) if size == 0]
    empty += ["batch"] if latent.dim() > 4 and 0 in latent.shape[:-4] else []
    if empty:
        raise ValueError(
            f"{field}: latent has shape {tuple(latent.shape)}, with no {' and no '.join(empty)}: an empty latent; "
            "connect a sampler's LATENT (at least one frame of at least 1x1 latent pixels)"
        )


def _stats(latent: torch.Tensor, field: str = "latent") -> tuple[torch.Tensor, torch.Tensor]:
    check_latent_shape(latent, field)
    shape = (len(LATENT_MEAN), 1, 1, 1)  # the channel axis is the 4th from the end
    mean = torch.tensor(LATENT_MEAN, dtype=torch.float32, device=latent.device).view(shape)
    std = torch.tensor(LATENT_STD, dtype=torch.float32, device=latent.device).view(shape)
    return mean, std


def to_comfy_latent(normalized: torch.Tensor) -> torch.Tensor:
    """Normalized latent -> raw Wan 2.1 VAE latent (``Wan21.process_out``), float32."""
    mean, std = _stats(normalized)
    return normalized.float() * std + mean


def from_comfy_latent(raw: torch.Tensor, field: str = "latent") -> torch.Tensor:
    """Raw Wan 2.1 VAE latent (a ComfyUI LATENT) -> the normalized latent (``Wan21.process_in``),
    float32; ``field`` names the input in errors."""
    mean, std = _stats(raw, field)
    return (raw.float() - mean) / std
