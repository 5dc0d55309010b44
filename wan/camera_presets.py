"""Built-in camera moves for users without a pose file: a table of motions and the one
function that turns a row of it into poses.

Axes are OpenCV's (x right, y down, z forward); the first pose is the identity. The model
only sees translation directions (``camera.relative_poses`` rescales the largest step to
unit length), so ``speed`` changes how far pans, tilts and orbits turn, while a dolly's
speed is normalized away.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.spatial.transform import Rotation

from .camera import DEFAULT_INTRINSICS

__all__ = ["CAMERA_PRESETS", "CameraMove", "preset_trajectory"]

# Motion per video frame at speed 1 (81 frames -> 40 degree pan, 24 degree tilt, 4 units dolly).
PAN_DEG_PER_FRAME = 0.5
TILT_DEG_PER_FRAME = 0.3
DOLLY_PER_FRAME = 0.05
ORBIT_DEG_PER_FRAME = 0.5
ORBIT_RADIUS = 2.0


@dataclass(frozen=True)
class CameraMove:
    """One preset: ``kind`` is "still", "turn" (rotate about camera ``axis``: 0 = x, 1 = y),
    "dolly" (move along z) or "orbit" (circle a point ORBIT_RADIUS ahead, facing it);
    ``per_frame`` is the signed degrees (turn, orbit) or units (dolly) per frame at speed 1."""

    kind: str
    per_frame: float = 0.0
    axis: int = 1


# About y, positive angles turn the view (z) towards +x; about x, towards -y (up, since y
# points down). An orbit to the left turns the camera right to keep facing the point.
CAMERA_PRESETS: dict[str, CameraMove] = {
    "static": CameraMove("still"),
    "pan_left": CameraMove("turn", -PAN_DEG_PER_FRAME, axis=1),
    "pan_right": CameraMove("turn", PAN_DEG_PER_FRAME, axis=1),
    "tilt_up": CameraMove("turn", TILT_DEG_PER_FRAME, axis=0),
    "tilt_down": CameraMove("turn", -TILT_DEG_PER_FRAME, axis=0),
    "dolly_in": CameraMove("dolly", DOLLY_PER_FRAME),
    "dolly_out": CameraMove("dolly", -DOLLY_PER_FRAME),
    "orbit_left": CameraMove("orbit", ORBIT_DEG_PER_FRAME),
    "orbit_right": CameraMove("orbit", -ORBIT_DEG_PER_FRAME),
}


def _rotations(axis: int, deg: np.ndarray) -> np.ndarray:
    """Rotation matrices [N, 3, 3] about camera axis ``axis`` by ``deg`` degrees."""
    rotvec = np.zeros((len(deg), 3))
    rotvec[:, axis] = np.radians(deg)
    return Rotation.from_rotvec(rotvec).as_matrix()


def preset_trajectory(name: str, frames: int, speed: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """The move ``name`` over ``frames`` poses (camera-to-world, first pose = identity).

    Returns (poses [frames, 4, 4] float32, intrinsics [frames, 4] float32 for 480x832).
    """
    key = str(name).strip().lower()
    if key not in CAMERA_PRESETS:
        raise ValueError(f"unknown camera preset {name!r}; choose one of {', '.join(CAMERA_PRESETS)}")
    if isinstance(frames, bool) or int(frames) != frames or frames < 1:
        raise ValueError(f"frames must be a positive integer; got {frames!r}")
    if not math.isfinite(float(speed)):
        raise ValueError(f"speed must be a finite number; got {speed!r}")
    move = CAMERA_PRESETS[key]
    frames = int(frames)
    step = np.arange(frames, dtype=np.float64) * float(speed)
    poses = np.tile(np.eye(4), (frames, 1, 1))
    amount = move.per_frame * step
    if move.kind == "turn":
        poses[:, :3, :3] = _rotations(move.axis, amount)
    elif move.kind == "dolly":
        poses[:, 2, 3] = amount
    elif move.kind == "orbit":
        rot = _rotations(1, amount)
        target = np.array([0.0, 0.0, ORBIT_RADIUS])
        poses[:, :3, :3] = rot
        poses[:, :3, 3] = target - rot @ target
    intrinsics = np.tile(np.asarray(DEFAULT_INTRINSICS, dtype=np.float64), (frames, 1))
    return poses.astype(np.float32), intrinsics.astype(np.float32)
