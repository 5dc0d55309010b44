"""Camera paths from video-pose tools: ViPE output folders and plain pose exports.

Accepted sources (camera-to-world matrices in OpenCV axes: x right, y down, z forward):

- a ViPE output folder: ``pose/<name>.npz`` (``data`` [N,4,4] camera-to-world, ``inds``
  frame indices) and ``intrinsics/<name>.npz`` (``data`` [N,4] fx, fy, cx, cy in pixels of
  the source video); with several clips in the folder, pick one with ``name``;
- one of those ``pose/<name>.npz`` files directly (its intrinsics found beside, in
  ``../intrinsics/<name>.npz``, when present);
- an ``.npz`` with ``poses`` (or ``c2w``/``data``) [N,4,4] and optionally ``intrinsics``
  [N,4] or [4] — the same arrays as poses.npy / intrinsics.npy;
- a ``poses.npy`` [N,4,4] (intrinsics.npy beside it is used when present);
- a ``.csv`` camera log: a header row naming x, y, z, qx, qy, qz, qw (position and
  camera-to-world quaternion) and optionally frame or time, one row per frame
  (``loaders.pose_csv``).

Camera axes: a graphics camera (OpenGL, a USD camera prim as Isaac Sim shows it, Blender:
x right, y up, looking down −z) is turned into OpenCV axes with ``camera_axes="opengl"``:
each pose is multiplied on the right by diag(1, −1, −1) (180° about the camera's x axis).
A camera pose with x forward and z up (Isaac Sim's "world" camera axes, a robot body frame)
takes ``camera_axes="x_forward_z_up"``. The world's axes need no change: the model reads each
pose relative to the first.

Intrinsics of a pose tool (ViPE's intrinsics/<name>.npz) are in pixels of the video it
tracked; they are converted to the 480×832 frame the camera code expects, given the source
size or, without it, taking the principal point as the image centre (source = 2·cy × 2·cx).
intrinsics.npy and an export's ``intrinsics`` array are taken as 480×832 pixels (the
poses.npy convention) unless a source size is given. ``normalize_scale`` rescales
translations so the median frame-to-frame step is ``MOVE_PER_FRAME`` (the action-string
step): tracker units are arbitrary (ViPE's are near-metric), and a common unit lets the
preview and a mix of sources agree. Arrays are read header first (``loaders.numpy_files``):
real numbers only, never unpickled, at most ``numpy_files.MAX_POSES`` (10,000) poses, and only the arrays
named above. Problems raise CameraError or CheckpointError, naming the file and the field.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..wan.camera import INTRINSICS_HEIGHT, INTRINSICS_WIDTH, CameraError, validate_trajectory
from ..wan.camera_actions import MOVE_PER_FRAME
from .numpy_files import NpzNumbers, read_npy_numbers
from .pose_csv import read_pose_csv

__all__ = ["CAMERA_AXES", "ImportedPath", "import_poses", "normalize_translation"]

# Camera axes of a pose file -> OpenCV's (x right, y down, z forward): the pose is multiplied
# on the right by this matrix, whose columns are OpenCV's camera axes in the file's axes.
CAMERA_AXES = {
    "opencv": np.eye(4),  # also ROS optical frames (Isaac Sim's "ros" camera axes)
    "opengl": np.diag([1.0, -1.0, -1.0, 1.0]),  # x right, y up, looking down -z: USD camera prims, Blender
    # looking down +x, z up (y left): Isaac Sim's "world" camera axes, a robot's body frame (ROS REP 103)
    "x_forward_z_up": np.array([[0.0, 0.0, 1.0, 0.0], [-1.0, 0.0, 0.0, 0.0], [0.0, -1.0, 0.0, 0.0],
                                [0.0, 0.0, 0.0, 1.0]]),
}

POSE_KEYS = ("poses", "c2w", "c2ws", "cam_c2w", "data")
INTRINSICS_KEYS = ("intrinsics", "K", "Ks", "data")


@dataclass
class ImportedPath:
    poses: np.ndarray  # [N, 4, 4] float64 camera-to-world, OpenCV axes
    intrinsics: np.ndarray | None  # [4] fx, fy, cx, cy in 480×832 pixels, or None (use the default)
    source: str
    scale: float  # factor the translations were multiplied by (1.0 without normalization)


def _load(path: Path, wanted: tuple[tuple[tuple[str, ...], str], ...]) -> dict[str, np.ndarray] | np.ndarray:
    """An .npy file's array, or from an .npz the first present member of each ``(keys,
    field)`` in ``wanted``, by field; read header first (``numpy_files``), nothing else read."""
    if path.suffix.lower() != ".npz":
        return read_npy_numbers(path, wanted[0][1])
    with NpzNumbers(path) as archive:
        found = {}
        for keys, field in wanted:
            name = next((k for k in keys if k in archive.names), None)
            if name is not None:
                found[field] = archive.read(name, field)
            elif field == "poses":
                raise CameraError(f"{path}: no poses array; expected one of {', '.join(keys)} (found: "
                                  f"{', '.join(archive.names) or 'nothing'})")
        return found


def _vipe_files(folder: Path, name: str | None) -> tuple[Path, Path | None]:
    clips = sorted(p.stem for p in (folder / "pose").glob("*.npz"))
    if not clips:
        raise CameraError(f"{folder}: no pose/*.npz (a ViPE output folder has pose/<clip>.npz)")
    if name is None:
        if len(clips) > 1:
            raise CameraError(f"{folder}: {len(clips)} clips in pose/ ({', '.join(clips[:5])}); choose one by name")
        name = clips[0]
    elif name not in clips:
        raise CameraError(f"{folder}: no pose/{name}.npz; clips: {', '.join(clips[:10])}")
    intr = folder / "intrinsics" / f"{name}.npz"
    return folder / "pose" / f"{name}.npz", intr if intr.is_file() else None


def _to_reference_frame(k: np.ndarray, source_size: tuple[int, int] | None) -> np.ndarray:
    """(fx, fy, cx, cy) in pixels of a source_size = (height, width) video → 480×832 pixels."""
    k = np.asarray(k, dtype=np.float64).reshape(-1, 4)[0]
    if source_size is None:
        height, width = 2.0 * k[3], 2.0 * k[2]
        if height <= 0 or width <= 0:
            raise CameraError(f"intrinsics: principal point ({k[2]:g}, {k[3]:g}) cannot give the source size; "
                              "pass the source video's width and height")
    else:
        height, width = float(source_size[0]), float(source_size[1])
    sx, sy = INTRINSICS_WIDTH / width, INTRINSICS_HEIGHT / height
    return np.array([k[0] * sx, k[1] * sy, k[2] * sx, k[3] * sy])


def normalize_translation(poses: np.ndarray, step: float = MOVE_PER_FRAME) -> tuple[np.ndarray, float]:
    """Poses with translations scaled so the median non-zero frame-to-frame step is ``step``
    (positions relative to the first camera are scaled; rotations are untouched)."""
    poses = np.array(poses, dtype=np.float64)
    steps = np.linalg.norm(np.diff(poses[:, :3, 3], axis=0), axis=1)
    moving = steps[steps > 1e-12]
    if moving.size == 0:
        return poses, 1.0
    factor = step / float(np.median(moving))
    origin = poses[0, :3, 3].copy()
    poses[:, :3, 3] = origin + (poses[:, :3, 3] - origin) * factor
    return poses, factor


def import_poses(
    source: str | os.PathLike,
    name: str | None = None,
    source_size: tuple[int, int] | None = None,
    normalize_scale: bool = True,
    world_to_camera: bool = False,
    camera_axes: str = "opencv",
) -> ImportedPath:
    """Read a camera path from a ViPE folder or a pose export (see the module docstring).

    ``world_to_camera``: the file holds world-to-camera matrices (COLMAP's convention);
    they are inverted. ``camera_axes``: the file's camera axes, a key of ``CAMERA_AXES``
    (converted after any inversion). Raises CameraError (CheckpointError for an unreadable
    array) naming the file and the problem.
    """
    if camera_axes not in CAMERA_AXES:
        raise CameraError(f"camera_axes: {camera_axes!r} is not one of {', '.join(CAMERA_AXES)}")
    path = Path(source)
    intr_path: Path | None = None
    if path.is_dir():
        if (path / "pose").is_dir():
            path, intr_path = _vipe_files(path, name)
        elif (path / "poses.npy").is_file():
            path = path / "poses.npy"
        else:
            raise CameraError(f"{path}: neither a ViPE output folder (pose/, intrinsics/) nor a folder with poses.npy")
    if not path.is_file():
        raise CameraError(f"{path}: no such file")
    if path.parent.name == "pose" and intr_path is None:
        beside = path.parent.parent / "intrinsics" / path.name
        intr_path = beside if beside.is_file() else None
    if path.suffix.lower() == ".csv":
        data = read_pose_csv(path)
    else:
        data = _load(path, ((POSE_KEYS, "poses"), (INTRINSICS_KEYS[:3], "intrinsics")))
    k = None
    # A pose tool's intrinsics are in pixels of the video it tracked; intrinsics.npy and an
    # export's "intrinsics" array follow poses.npy's convention (480×832) unless a source
    # size is given.
    k_in_source_pixels = source_size is not None
    if isinstance(data, dict):
        poses, k = data["poses"], data.get("intrinsics")
    else:
        poses = data
        beside = path.with_name("intrinsics.npy")
        if path.name == "poses.npy" and beside.is_file():
            k = read_npy_numbers(beside, "intrinsics")
    if intr_path is not None:
        intrinsics = _load(intr_path, ((INTRINSICS_KEYS, "intrinsics"),))
        if not isinstance(intrinsics, dict) or "intrinsics" not in intrinsics:
            raise CameraError(f"{intr_path}: no intrinsics array; expected one of {', '.join(INTRINSICS_KEYS)}")
        k = intrinsics["intrinsics"]
        k_in_source_pixels = True
    poses = np.asarray(poses, dtype=np.float64)
    if poses.ndim == 3 and poses.shape[1:] == (3, 4):  # 3×4 exports: add the last row
        poses = np.concatenate([poses, np.tile([[[0.0, 0.0, 0.0, 1.0]]], (len(poses), 1, 1))], axis=1)
    if world_to_camera:
        validate_trajectory(poses, np.array([1.0, 1.0, 0.0, 0.0]), source=str(path))
        poses = np.linalg.inv(poses)
    if k is not None:
        k = np.asarray(k, dtype=np.float64)
        if k.ndim == 3 and k.shape[1:] == (3, 3):  # 3×3 K matrices
            k = np.stack([k[:, 0, 0], k[:, 1, 1], k[:, 0, 2], k[:, 1, 2]], axis=1)
        elif k.shape == (3, 3):
            k = np.array([k[0, 0], k[1, 1], k[0, 2], k[1, 2]])
    validate_trajectory(poses, k if k is not None else np.array([1.0, 1.0, 0.0, 0.0]), source=str(path))
    poses = poses @ CAMERA_AXES[camera_axes]  # rigid stays rigid: no second check needed
    if k is None:
        k_ref = None
    elif k_in_source_pixels:
        k_ref = _to_reference_frame(k, source_size)
    else:
        k_ref = np.asarray(k, dtype=np.float64).reshape(-1, 4)[0]
    factor = 1.0
    if normalize_scale:
        poses, factor = normalize_translation(poses)
    return ImportedPath(poses=poses, intrinsics=k_ref, source=str(path), scale=factor)
