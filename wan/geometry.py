"""The model's fixed numbers, each written once (docs/conventions.md): how the Wan2.1 VAE and
the DiT cut a video (strides, patch, latent channels), the size it was trained near,
LingBot-World Fast's chunk, the text encoder's token limit and the seed range. Everything else computes from these;
``tests/unit/test_facts.py`` refuses a second definition or a stray ``// 4`` / ``// 8``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = [
    "CHUNK_FRAMES",
    "LATENT_CHANNELS",
    "MAX_SEED",
    "MAX_TOKENS",
    "PATCH_SIZE",
    "SIZE_MULTIPLE",
    "TRAINED_SIZE",
    "VAE_STRIDE_S",
    "VAE_STRIDE_T",
    "check_seed",
    "latent_frames",
    "latent_shape",
    "latent_size",
    "pixel_size",
    "video_frames",
    "video_tokens",
]

VAE_STRIDE_T = 4  # video frames per latent frame (after the first, which is alone)
VAE_STRIDE_S = 8  # pixels per latent cell, each side
PATCH_SIZE = (1, 2, 2)  # the DiT's patch in latent cells (frames, height, width)
SIZE_MULTIPLE = VAE_STRIDE_S * PATCH_SIZE[1]  # 16: the sides of a video the DiT can take
LATENT_CHANNELS = 16  # channels of the VAE's latent (z_dim)
CHUNK_FRAMES = 3  # latent frames per chunk of LingBot-World Fast (12 video frames)
MAX_TOKENS = 512  # umT5's prompt length: the tokenizer pads/cuts to it, the DiT's text_len
TRAINED_SIZE = (480, 832)  # (height, width) the model was trained near (portrait: 832×480)
MAX_SEED = 2**64 - 1  # seeds are unsigned 64-bit (torch.Generator.manual_seed, ComfyUI's seed widgets)


def latent_frames(frames: int) -> int:
    """Latent frames for ``frames`` video frames (the VAE packs 4 frames after the first)."""
    return (int(frames) - 1) // VAE_STRIDE_T + 1


def video_frames(latent: int) -> int:
    """Video frames that ``latent`` latent frames decode to (the inverse of ``latent_frames``
    on 4n + 1 counts)."""
    return VAE_STRIDE_T * (int(latent) - 1) + 1


def latent_size(height: int, width: int) -> tuple[int, int]:
    """(lat_h, lat_w): latent cells of a height×width picture."""
    return int(height) // VAE_STRIDE_S, int(width) // VAE_STRIDE_S


def pixel_size(lat_h: int, lat_w: int) -> tuple[int, int]:
    """(height, width) in pixels of a lat_h×lat_w latent."""
    return int(lat_h) * VAE_STRIDE_S, int(lat_w) * VAE_STRIDE_S


def latent_shape(frames: int, height: int, width: int) -> tuple[int, int, int]:
    """(F_lat, lat_h, lat_w) of a frames×height×width video."""
    return (latent_frames(frames), *latent_size(height, width))


def video_tokens(f_lat: int, lat_h: int, lat_w: int, patch: Sequence[int] = PATCH_SIZE) -> int:
    """The DiT's sequence length for a latent of f_lat×lat_h×lat_w cells (one token per patch)."""
    pt, ph, pw = patch
    return (int(f_lat) // pt) * (int(lat_h) // ph) * (int(lat_w) // pw)


def check_seed(seed: object, field: str = "seed") -> int:
    """``seed`` as an int within 0..MAX_SEED; ValueError naming ``field`` otherwise."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) <= MAX_SEED:
        raise ValueError(f"{field} must be a whole number within 0..{MAX_SEED} (2**64 - 1), got {seed!r}")
    return int(seed)
