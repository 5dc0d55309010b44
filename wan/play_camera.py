"""The Play camera law: the camera of a live keyboard session, decided chunk by chunk
(docs/conventions.md#play-camera-per-chunk).

The official act2cam camera (``camera_actions.act2cam_*``) samples its keyframes at
``linspace(0, F, F_lat)`` and divides the translations by the video's largest step; both
need the whole video, so a session that learns its keys as it goes cannot use them. Play
uses a causal law instead, and so does the Camera node's "per chunk (Play)" keyframe
timing, which is what makes a session replayable:

* Per-frame poses from ``ActionIntegrator`` (the same integrator as action strings): p_0 is
  the start, p_k the pose after k action frames.
* Latent frame i uses pose p_{4i}: chunk c (latent frames 3c, 3c+1, 3c+2) uses p_{12c},
  p_{12c+4}, p_{12c+8}. An F-frame video takes F − 1 action frames (F poses).
* The keys held when chunk c starts drive action frames 12c − 4 … 12c + 7 (chunk 0: frames
  0 … 7), i.e. everything between the previous chunk's last keyframe and this chunk's last.
* Frame-to-frame relative poses as ``wan.camera.relative_poses`` composes them (relative to
  the first keyframe, then consecutive, in float32), with translations divided by a FIXED
  unit, ``PLAY_UNIT`` = 4 frames × 0.05 = 0.2 (a straight walk gives steps of ~1, as under
  the official normalisation), instead of the largest step.
* Each keyframe's relative pose is computed on its own, one 4×4 product at a time, so a
  chunk's numbers do not depend on how many keyframes are computed together: the live
  session and the whole-video replay give the same bits.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import torch

from .camera import rigid_inverse
from .camera_actions import KEYS, MOVE_PER_FRAME, ActionError, ActionIntegrator, action_keys, integrate_keys, key_set
from .conditioning import check_frame_count
from .geometry import CHUNK_FRAMES, VAE_STRIDE_T

__all__ = [
    "PLAY_UNIT",
    "PlayCameraLaw",
    "chunk_action_frames",
    "format_actions",
    "integrate_keys",
    "play_action_frames",
    "play_keyframes",
    "play_keys",
    "relative_keyframe",
]

PLAY_UNIT = VAE_STRIDE_T * MOVE_PER_FRAME  # 0.2: one latent frame of a straight walk


def play_action_frames(frames: int) -> int:
    """Action frames an F-frame video takes under the Play law: F − 1 (poses p_0 … p_{F−1})."""
    check_frame_count(frames)
    return int(frames) - 1


def chunk_action_frames(chunk: int, chunk_latent: int = CHUNK_FRAMES) -> range:
    """The action frames the keys held when ``chunk`` starts drive: 12c − 4 … 12c + 7
    (chunk 0: 0 … 7), for chunks of 3 latent frames."""
    if chunk < 0:
        raise ValueError(f"chunk must be 0 or more, got {chunk}")
    span = VAE_STRIDE_T * chunk_latent
    stop = span * (chunk + 1) - VAE_STRIDE_T
    return range(max(0, stop - span), stop)


def _as_float32(pose: np.ndarray) -> torch.Tensor:
    # The float64 pose rounded to float32 as ``interpolate_poses`` hands poses on.
    return torch.from_numpy(np.asarray(pose, dtype=np.float64).astype(np.float32))


def relative_keyframe(keyframes: Sequence[torch.Tensor], index: int, unit: float = PLAY_UNIT) -> torch.Tensor:
    """Relative keyframe ``index`` [4, 4] float32 of absolute keyframes (float32 [4, 4] each)
    in ``relative_poses``' order: every pose relative to the first (the first itself the
    identity), then ``previous⁻¹ · current``; the translation divided by ``unit``."""
    if index == 0:
        return torch.eye(4, dtype=torch.float32)
    inv_first = rigid_inverse(keyframes[0])
    previous = torch.eye(4, dtype=torch.float32) if index == 1 else inv_first @ keyframes[index - 1]
    rel = rigid_inverse(previous) @ (inv_first @ keyframes[index])
    rel[:3, 3] = rel[:3, 3] / unit
    return rel


def play_keys(text: str, frames: int) -> list[frozenset[str]]:
    """The per-frame keys of an action string under the Play law: its frames, then no keys,
    to F − 1 frames. A string longer than that is refused (ActionError naming both)."""
    keys = action_keys(text)
    total = play_action_frames(frames)
    if len(keys) > total:
        raise ActionError(f"action string holds {len(keys)} action frames, but a {frames}-frame video takes "
                          f"{total} under the per-chunk (Play) timing (a session's log holds exactly that many); "
                          f"set frames to {len(keys) + 1 + (-len(keys)) % VAE_STRIDE_T} or shorten the string")
    return keys + [frozenset()] * (total - len(keys))


def play_keyframes(per_frame_keys: Iterable[Iterable[str] | str], frames: int, unit: float = PLAY_UNIT
                   ) -> torch.Tensor:
    """Relative keyframes [F_lat, 4, 4] float32 of an F-frame video under the Play law, from
    the keys of its F − 1 action frames (``play_keys`` pads an action string)."""
    keys = list(per_frame_keys)
    total = play_action_frames(frames)
    if len(keys) != total:
        raise ActionError(f"the per-chunk (Play) timing of a {frames}-frame video takes {total} action frames, "
                          f"got {len(keys)}")
    poses = integrate_keys(keys)
    keyframes = [_as_float32(poses[i]) for i in range(0, len(poses), VAE_STRIDE_T)]
    return torch.stack([relative_keyframe(keyframes, i, unit) for i in range(len(keyframes))])


class PlayCameraLaw:
    """The Play law advanced live, one chunk at a time.

    ``next_chunk(keys)`` applies ``keys`` to the chunk's action frames and returns the
    chunk's relative keyframes [3, 4, 4] float32; ``keys_per_frame`` is the log (one key set
    per action frame, F − 1 after the chunks of an F-frame video).
    """

    def __init__(self, chunk_latent: int = CHUNK_FRAMES, unit: float = PLAY_UNIT) -> None:
        self.chunk_latent, self.unit = chunk_latent, unit
        self.integrator = ActionIntegrator()
        self.keys_per_frame: list[frozenset[str]] = []
        self._keyframes: list[torch.Tensor] = [_as_float32(self.integrator.pose)]  # p_0, p_4, ...
        self.chunks = 0

    @property
    def frames(self) -> int:
        """Video frames of the chunks made so far (0 before the first)."""
        return len(self.keys_per_frame) + 1 if self.chunks else 0

    def next_chunk(self, keys: Iterable[str] | str) -> torch.Tensor:
        held = key_set(keys)
        span = chunk_action_frames(self.chunks, self.chunk_latent)
        for _ in span:
            pose = self.integrator.step(held)
            self.keys_per_frame.append(held)
            if len(self.keys_per_frame) % VAE_STRIDE_T == 0:
                self._keyframes.append(_as_float32(pose))
        first_latent = self.chunk_latent * self.chunks
        out = torch.stack([relative_keyframe(self._keyframes, i, self.unit)
                           for i in range(first_latent, first_latent + self.chunk_latent)])
        self.chunks += 1
        return out


def format_actions(per_frame_keys: Iterable[Iterable[str] | str]) -> str:
    """Per-frame keys as an action string (runs joined: ``"w-12,wj-12,none-9"``), keys in
    the order w a s d i j k l; parsing it back gives the same per-frame keys."""
    runs: list[list] = []
    for keys in per_frame_keys:
        held = key_set(keys)
        if runs and runs[-1][0] == held:
            runs[-1][1] += 1
        else:
            runs.append([held, 1])
    return ",".join(f"{''.join(k for k in KEYS if k in held) or 'none'}-{count}" for held, count in runs)
