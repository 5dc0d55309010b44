"""The camera of a Play session: the keys held when a chunk starts → the chunk's Plücker
rays, under the Play law (``wan.play_camera``), and the session's action log.

The rays of each latent frame are made exactly as the one-pass camera of a Play-timing
path makes them (``pipeline.camera.PlayLogPath``: the same relative keyframe, the
same default intrinsics, ``keyframe_camera`` one latent frame at a time, float32), so the
log replayed through the Camera node gives the session's camera bit for bit.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np
import torch

from ...wan.camera import keyframe_camera
from ...wan.camera_actions import default_intrinsics
from ...wan.play_camera import PlayCameraLaw, format_actions


class PlayCamera:
    """``next_chunk(keys)`` → the chunk's Plücker tensor [1, 384, 3, h/8, w/8] float32."""

    def __init__(self, height: int, width: int, intrinsics: np.ndarray | None = None) -> None:
        self.height, self.width = height, width
        self.intrinsics = default_intrinsics(height, width) if intrinsics is None else np.asarray(intrinsics)
        self.law = PlayCameraLaw()
        self.chunk_keys: list[frozenset[str]] = []  # the keys that steered each chunk

    def next_chunk(self, keys: Iterable[str] | str) -> torch.Tensor:
        keyframes = self.law.next_chunk(keys)
        self.chunk_keys.append(self.law.keys_per_frame[-1])
        return keyframe_camera(keyframes, self.intrinsics, self.height, self.width, dtype=torch.float32)

    @property
    def frames(self) -> int:
        """Video frames of the chunks made so far."""
        return self.law.frames

    def actions(self) -> str:
        """The per-frame keys so far as an action string ("" before the first chunk)."""
        return format_actions(self.law.keys_per_frame)
