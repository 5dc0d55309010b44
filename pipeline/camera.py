"""Camera stage: a trajectory (files or a preset) -> the Plücker tensor the DiT reads."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..loaders.trajectory import read_trajectory
from ..wan.camera import CameraError, camera_tensor, preset_trajectory, usable_frames, validate_trajectory
from ..wan.conditioning import check_frame_count, check_size
from .memory import check_video_fits


@dataclass
class CameraCondition:
    plucker: torch.Tensor  # [1, 384, F_lat, H/8, W/8] float32 on the CPU
    frames: int
    height: int
    width: int
    poses: np.ndarray  # [frames, 4, 4] the part of the source trajectory in use, for drawing


def _build(poses: np.ndarray, intrinsics: np.ndarray, frames: int, height: int, width: int, source: str) -> CameraCondition:
    check_frame_count(frames)
    check_size(height, width)
    check_video_fits(frames, height, width)  # the Plücker tensor grows with the video, like its frames
    validate_trajectory(poses, intrinsics, source=source)
    covered = usable_frames(frames, len(poses))
    if covered < frames:
        raise CameraError(
            f"{source or 'poses'}: {len(poses)} poses cover only {covered} frames but {frames} were asked; "
            f"use frames <= {covered} or a longer trajectory"
        )
    plucker = camera_tensor(poses, intrinsics, frames, height, width, dtype=torch.float32)
    return CameraCondition(plucker=plucker, frames=frames, height=height, width=width, poses=poses[:frames])


def camera_from_files(
    poses_path: str | Path, intrinsics_path: str | Path, frames: int, height: int, width: int
) -> CameraCondition:
    poses, intrinsics = read_trajectory(poses_path, intrinsics_path)
    return _build(poses, intrinsics, frames, height, width, source=f"{Path(poses_path).name}/{Path(intrinsics_path).name}")


def camera_from_preset(name: str, speed: float, frames: int, height: int, width: int) -> CameraCondition:
    poses, intrinsics = preset_trajectory(name, frames, speed)
    return _build(poses, intrinsics, frames, height, width, source=f"preset {name!r}")
