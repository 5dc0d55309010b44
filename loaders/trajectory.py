"""Read a camera trajectory (poses.npy + intrinsics.npy, and the Act checkpoint's action.npy)
safely: no pickles, bounded sizes, clear errors (``numpy_files`` reads each header before its
data).

The one place the pack reads .npy camera files (the Camera node, the CLI and the tests all
come here); what the arrays must hold is checked by ``wan.camera.validate_trajectory`` and,
for the W/A/S/D keys of action.npy, ``wan.act_control.check_wasd``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..wan.camera import CameraError
from .errors import CheckpointError
from .numpy_files import read_npy_numbers


class TrajectoryFileError(CheckpointError, CameraError):
    """A pose or intrinsics file that cannot be used. Worded like the trajectory checks
    ("poses in <file>: ..."), and both a CheckpointError (it names the file) and a
    CameraError (catching camera problems catches it too)."""

    def __init__(self, path: str | Path, what: str, problem: str) -> None:
        self.path, self.what, self.problem = str(path), what, problem
        ValueError.__init__(self, f"{what} in {self.path}: {problem}")


def read_npy(path: str | Path, what: str) -> np.ndarray:
    """A float64 array from an .npy file of real numbers; never unpickles objects."""
    path = Path(path)
    if not path.is_file():
        raise TrajectoryFileError(path, what, f"{what} file not found")
    try:
        return read_npy_numbers(path, what)
    except CheckpointError as exc:
        raise TrajectoryFileError(path, what, exc.problem) from exc


def read_trajectory(poses_path: str | Path, intrinsics_path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(poses, intrinsics) as stored, float64; their content is checked by the caller."""
    return read_npy(poses_path, "poses"), read_npy(intrinsics_path, "intrinsics")


def read_intrinsics_row(path: str | Path, field: str = "intrinsics") -> np.ndarray:
    """The first (fx, fy, cx, cy) row of an intrinsics .npy of shape [N, 4] or [4]."""
    k = read_npy(path, field)
    if k.ndim not in (1, 2) or k.shape[-1] != 4 or k.size < 4:
        raise TrajectoryFileError(path, field, f"{field} has shape {list(k.shape)}; expected [N, 4] or [4] "
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
