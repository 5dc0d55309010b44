"""Decoded frames as the page receives them: one base64 JPEG string per frame."""
from __future__ import annotations

import base64
import io

import torch
from PIL import Image

from ..video_file import to_uint8_frames

JPEG_QUALITY = 85


def jpeg_frames(video: torch.Tensor, quality: int = JPEG_QUALITY) -> list[str]:
    """[3, F, H, W] in [-1, 1] → F base64 JPEG strings (the pixels the .mp4 gets)."""
    out = []
    for frame in to_uint8_frames(video):
        buffer = io.BytesIO()
        Image.fromarray(frame).save(buffer, format="JPEG", quality=quality)
        out.append(base64.b64encode(buffer.getvalue()).decode("ascii"))
    return out
