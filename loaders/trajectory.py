"""Read a camera trajectory (poses.npy + intrinsics.npy) safely: no pickles, bounded sizes,
clear errors (``numpy_files`` reads each header before its data)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import CheckpointError
from .numpy_files import read_npy_numbers


def read_npy(path: str | Path, what: str) -> np.ndarray:
    """A float64 array from an .npy file of real numbers; never unpickles objects."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(path, f"{what} file not found")
    return read_npy_numbers(path, what)


def read_trajectory(poses_path: str | Path, intrinsics_path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    return read_npy(poses_path, "poses"), read_npy(intrinsics_path, "intrinsics")


def read_intrinsics_row(path: str | Path, field: str = "intrinsics") -> np.ndarray:
    """The first (fx, fy, cx, cy) row of an intrinsics .npy of shape [N, 4] or [4]."""
    k = read_npy(path, field)
    if k.ndim not in (1, 2) or k.shape[-1] != 4 or k.size < 4:
        raise CheckpointError(path, f"{field} has shape {list(k.shape)}; expected [N, 4] or [4] (fx, fy, cx, cy)")
    return k.reshape(-1, 4)[0]
