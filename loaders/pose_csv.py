"""Camera paths recorded as CSV (a simulator's or robot's camera log): one row per video
frame, the camera's position and orientation in the world.

The first row names the columns (any order, case and surrounding spaces ignored):

- ``x, y, z``: the camera's position in the world;
- ``qx, qy, qz, qw``: its orientation as a unit quaternion that turns camera axes into world
  axes (camera-to-world). The components are read by name, so scalar-first exports
  (Isaac Sim's ``get_world_pose``: w, x, y, z) and scalar-last ones (ROS, scipy) both work;
  scipy's ``Rotation.from_quat`` (scalar last) builds the matrix;
- optionally ``frame``, ``time``, ``timestamp`` or ``t``: rows are put in its order (values
  must be distinct); other columns are ignored.

Camera axes are OpenCV's (x right, y down, z forward) unless the importer is told otherwise
(``pose_import.CAMERA_AXES``). Reading is bounded: at most ``MAX_CSV_BYTES`` and
``MAX_CSV_POSES`` rows; every number must be finite. Errors are CameraError naming the file,
the row and the column.
"""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import numpy as np
from scipy.spatial.transform import Rotation

from ..wan.camera import CameraError
from .numpy_files import MAX_POSES

__all__ = ["MAX_CSV_BYTES", "MAX_CSV_POSES", "POSITION_COLUMNS", "QUATERNION_COLUMNS", "read_pose_csv"]

POSITION_COLUMNS = ("x", "y", "z")
QUATERNION_COLUMNS = ("qx", "qy", "qz", "qw")  # scipy's order (scalar last)
ORDER_COLUMNS = ("frame", "time", "timestamp", "t")
MAX_CSV_POSES = MAX_POSES  # the pose cap of the other pose readers
MAX_CSV_BYTES = 16 * 1024 * 1024  # ~1.6 kB a row at the cap: far more than a pose needs
UNIT_TOLERANCE = 1e-2  # a quaternion further from unit length is a wrong column, not rounding


def _header(row: list[str], path: Path) -> dict[str, int]:
    names = [name.strip().lower() for name in row]
    columns = {name: index for index, name in enumerate(names) if name}
    missing = [name for name in POSITION_COLUMNS + QUATERNION_COLUMNS if name not in columns]
    if missing:
        raise CameraError(f"{path}: the header row names {', '.join(names) or 'nothing'}; missing column(s) "
                          f"{', '.join(missing)} (a camera path CSV has x,y,z,qx,qy,qz,qw and optionally frame "
                          "or time)")
    if len(columns) != len([n for n in names if n]):
        twice = sorted({n for n in names if n and names.count(n) > 1})
        raise CameraError(f"{path}: column(s) {', '.join(twice)} appear twice in the header row")
    return columns


def _number(text: str, path: Path, line: int, column: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise CameraError(f"{path}: line {line}, column {column}: {text.strip()!r} is not a number") from None
    if not math.isfinite(value):
        raise CameraError(f"{path}: line {line}, column {column} is {text.strip()}; give finite numbers")
    return value


def read_pose_csv(path: str | Path) -> np.ndarray:
    """Camera-to-world poses [N, 4, 4] float64 from a CSV camera path (module docstring)."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise CameraError(f"{path}: cannot read the file ({exc})") from exc
    if size > MAX_CSV_BYTES:
        raise CameraError(f"{path}: {size} bytes is more than a camera path CSV of {MAX_CSV_POSES} poses needs "
                          f"(at most {MAX_CSV_BYTES} bytes)")
    try:
        text = path.read_bytes().decode("utf-8-sig")  # a spreadsheet's byte-order mark is not part of a name
    except (OSError, UnicodeDecodeError) as exc:
        raise CameraError(f"{path}: not a UTF-8 text file ({exc})") from exc
    rows = csv.reader(io.StringIO(text, newline=""))
    header: dict[str, int] | None = None
    order_column: str | None = None
    values: list[list[float]] = []
    order: list[float] = []
    for line, row in enumerate(rows, start=1):
        if not any(cell.strip() for cell in row):
            continue
        if header is None:
            header = _header(row, path)
            order_column = next((name for name in ORDER_COLUMNS if name in header), None)
            continue
        if len(values) == MAX_CSV_POSES:
            raise CameraError(f"{path}: more than {MAX_CSV_POSES} poses; the pack reads camera paths of at most "
                              f"{MAX_CSV_POSES} frames")
        wanted = POSITION_COLUMNS + QUATERNION_COLUMNS + ((order_column,) if order_column else ())
        short = [name for name in wanted if header[name] >= len(row)]
        if short:
            raise CameraError(f"{path}: line {line} has {len(row)} fields, no value for column {short[0]}")
        values.append([_number(row[header[name]], path, line, name) for name in POSITION_COLUMNS + QUATERNION_COLUMNS])
        if order_column:
            order.append(_number(row[header[order_column]], path, line, order_column))
    if header is None:
        raise CameraError(f"{path}: the file is empty; expected a header row x,y,z,qx,qy,qz,qw and one row per frame")
    if not values:
        raise CameraError(f"{path}: a header row but no poses")
    table = np.array(values, dtype=np.float64)
    if order_column:
        rank = np.argsort(np.array(order), kind="stable")
        sorted_order = np.array(order)[rank]
        repeated = np.flatnonzero(np.diff(sorted_order) == 0)
        if repeated.size:
            raise CameraError(f"{path}: two rows have {order_column} = {sorted_order[repeated[0]]:g}; give one row "
                              "per frame")
        table = table[rank]
    quaternions = table[:, 3:]
    norms = np.linalg.norm(quaternions, axis=1)
    bad = np.flatnonzero(np.abs(norms - 1.0) > UNIT_TOLERANCE)
    if bad.size:
        i = int(bad[0])
        raise CameraError(f"{path}: pose {i} has the quaternion (qx, qy, qz, qw) = {tuple(quaternions[i].round(4))} "
                          f"of length {norms[i]:.4g}; an orientation is a unit quaternion (check the column names)")
    poses = np.tile(np.eye(4), (len(table), 1, 1))
    poses[:, :3, :3] = Rotation.from_quat(quaternions / norms[:, None]).as_matrix()
    poses[:, :3, 3] = table[:, :3]
    return poses
