"""Read a camera trajectory (poses.npy + intrinsics.npy) safely: no pickles, clear errors."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import CheckpointError


def read_npy(path: str | Path, what: str) -> np.ndarray:
    """A numeric array from an .npy file; never unpickles objects."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(path, f"{what} file not found")
    try:
        array = np.load(path, allow_pickle=False)
    except ValueError as exc:  # object arrays need pickle, which we refuse
        raise CheckpointError(path, f"{what} is not a plain numeric .npy array ({exc})") from exc
    except Exception as exc:
        raise CheckpointError(path, f"{what} cannot be read as .npy ({exc})") from exc
    if not isinstance(array, np.ndarray) or not np.issubdtype(array.dtype, np.number):
        raise CheckpointError(path, f"{what} holds {getattr(array, 'dtype', type(array))}, expected numbers")
    if np.issubdtype(array.dtype, np.complexfloating):  # casting would silently drop the imaginary part
        raise CheckpointError(path, f"{what} holds complex numbers ({array.dtype}); save real float32/float64 values")
    return array.astype(np.float64)


def read_trajectory(poses_path: str | Path, intrinsics_path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    return read_npy(poses_path, "poses"), read_npy(intrinsics_path, "intrinsics")
