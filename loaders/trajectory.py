"""Read a camera trajectory (poses.npy + intrinsics.npy, and the Act checkpoint's action.npy)
safely: no pickles, clear errors.

The one place the pack reads .npy camera files (the Camera node, the CLI and the tests all
come here); what the arrays must hold is checked by ``wan.camera.validate_trajectory`` and,
for the W/A/S/D keys of action.npy, ``wan.act_control.check_wasd``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..wan.camera import CameraError
from .errors import CheckpointError


class TrajectoryFileError(CheckpointError, CameraError):
    """A pose or intrinsics file that cannot be used. Worded like the trajectory checks
    ("poses in <file>: ..."), and both a CheckpointError (it names the file) and a
    CameraError (catching camera problems catches it too)."""

    def __init__(self, path: str | Path, what: str, problem: str) -> None:
        self.path, self.what, self.problem = str(path), what, problem
        ValueError.__init__(self, f"{what} in {self.path}: {problem}")


def read_npy(path: str | Path, what: str) -> np.ndarray:
    """A numeric array from an .npy file as float64; never unpickles objects."""
    path = Path(path)
    if not path.is_file():
        raise TrajectoryFileError(path, what, f"{what} file not found")
    try:
        array = np.load(path, allow_pickle=False)
    except ValueError as exc:  # object arrays need pickle, which we refuse
        raise TrajectoryFileError(path, what, f"{what} is not a plain numeric .npy array ({exc})") from exc
    except Exception as exc:
        raise TrajectoryFileError(path, what, f"{what} cannot be read as .npy ({exc})") from exc
    if not isinstance(array, np.ndarray) or not np.issubdtype(array.dtype, np.number):
        raise TrajectoryFileError(path, what, f"{what} holds {getattr(array, 'dtype', type(array))}, expected numbers")
    if np.issubdtype(array.dtype, np.complexfloating):  # casting would silently drop the imaginary part
        raise TrajectoryFileError(path, what, f"{what} holds complex numbers ({array.dtype}); save real "
                                  "float32/float64 values")
    return array.astype(np.float64)


def read_trajectory(poses_path: str | Path, intrinsics_path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(poses, intrinsics) as stored, float64; their content is checked by the caller."""
    return read_npy(poses_path, "poses"), read_npy(intrinsics_path, "intrinsics")


def read_intrinsics(path: str | Path) -> np.ndarray:
    """The first (fx, fy, cx, cy) row of an intrinsics .npy of shape [4] or [N, 4]."""
    k = read_npy(path, "intrinsics")
    if k.shape[-1:] != (4,) or k.size == 0:
        raise TrajectoryFileError(path, "intrinsics", f"intrinsics has shape {list(k.shape)}; expected [N, 4] or [4] "
                                  "(fx, fy, cx, cy in pixels of 832x480)")
    return k.reshape(-1, 4)[0]


ACTION_FILE = "action.npy"  # the Act checkpoint's keys, beside poses.npy (the official examples' name)


def read_action(path: str | Path) -> np.ndarray:
    """action.npy [F, 4]: the W/A/S/D key states (columns w, a, s, d; 0 released, 1 held) of
    each video frame, as float64. Its values are checked by ``wan.act_control.check_wasd``."""
    keys = read_npy(path, "action")
    if keys.ndim != 2 or keys.shape[1] != 4 or keys.shape[0] < 1:
        raise TrajectoryFileError(path, "action", f"action has shape {list(keys.shape)}; expected [frames, 4] "
                                  "(one row per video frame, columns w, a, s, d)")
    return keys
