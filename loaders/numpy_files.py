"""Read camera arrays from .npy files and .npz members: the header first, then the data.

``np.load`` allocates an array of whatever shape its header declares before it reads a byte
of data, and on an ``.npz`` it is asked for every member: an 8.7 MB .npz inflated to
20 M poses (6.7 GB), and a 210-byte one declaring 2·10⁹ poses failed inside numpy's
allocator. Here each array's header (shape, dtype, order; ``numpy.lib.format``) is read and
checked first: real numbers only (no Python objects, which are never unpickled, no complex
values, whose imaginary part a cast would drop), at most ``MAX_POSES`` entries along the
first axis, and only then exactly the bytes the header declares are read. Only the members a
caller asks for are read. Every problem is a ``CheckpointError`` naming the file, the member
and the field.
"""
from __future__ import annotations

import zipfile
import zlib
from pathlib import Path
from typing import IO

import numpy as np
from numpy.lib import format as npy_format

from .errors import CheckpointError

# Imported camera paths may hold at most this many poses (and intrinsics rows). A video has
# at most 961 frames (wan.long_video.MAX_FRAMES); a pose tool's export of a longer clip
# (5 minutes at 30 fps is 9,000 poses) still fits, and the cap keeps a file's arrays to a
# few megabytes (10,000 poses of 4x4 float64 are 1.3 MB).
MAX_POSES = 10_000
# Entries per row of the largest array read here: a 4x4 pose.
_MAX_ROW_ELEMENTS = 16
_NUMBER_KINDS = "iuf"  # signed and unsigned integers, floats


def _where(member: str | None) -> str:
    return f" (array {member!r} of the .npz)" if member else ""


def _check_header(path: Path, field: str, member: str | None, shape: tuple[int, ...], dtype: np.dtype) -> int:
    """Refuse what should not be read; returns the number of data bytes to read."""
    kind = ".npz member" if member else ".npy"
    if dtype.hasobject:
        raise CheckpointError(path, f"{field}{_where(member)} is not a plain numeric {kind} array (it holds Python "
                              "objects, which are never unpickled); save float32 or float64 numbers")
    if dtype.kind == "c":  # casting would silently drop the imaginary part
        raise CheckpointError(path, f"{field}{_where(member)} holds complex numbers ({dtype}); save real "
                              "float32/float64 values")
    if dtype.names is not None or dtype.kind not in _NUMBER_KINDS:
        raise CheckpointError(path, f"{field}{_where(member)} holds {dtype}, expected numbers (float32 or float64)")
    rows = shape[0] if shape else 1
    count = int(np.prod(shape, dtype=np.float64)) if shape else 1  # float64: no overflow on crafted shapes
    if rows > MAX_POSES or count > MAX_POSES * _MAX_ROW_ELEMENTS:
        raise CheckpointError(path, f"{field}{_where(member)} declares shape {list(shape)}: more than the "
                              f"{MAX_POSES:,} poses an imported camera path may hold (a video has at most 961 "
                              "frames); keep only the poses the video uses")
    return count * dtype.itemsize


def _read_array(stream: IO[bytes], path: Path, field: str, member: str | None, available: int | None) -> np.ndarray:
    """The array at the stream's position, as float64; ``available``: the bytes the file
    holds from there (None: read what the stream gives)."""
    try:
        version = npy_format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = npy_format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran, dtype = npy_format.read_array_header_2_0(stream)
        else:
            raise ValueError(f"format version {version[0]}.{version[1]} (only 1.0 and 2.0 hold plain numbers)")
    except (ValueError, EOFError, SyntaxError, zipfile.BadZipFile, zlib.error) as exc:
        raise CheckpointError(path, f"{field}{_where(member)} is not a readable .npy array ({exc})") from exc
    nbytes = _check_header(path, field, member, tuple(shape), np.dtype(dtype))
    header_end = stream.tell() if available is not None else 0
    if available is not None and available - header_end < nbytes:
        raise CheckpointError(path, f"{field}{_where(member)} is truncated: its header declares shape {list(shape)} "
                              f"({nbytes:,} bytes) but the file holds {max(available - header_end, 0):,}")
    try:
        data = stream.read(nbytes)
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:  # a cut or corrupt zip member
        raise CheckpointError(path, f"{field}{_where(member)} cannot be read ({exc}); the file is truncated or "
                              "corrupt") from exc
    if len(data) != nbytes:
        raise CheckpointError(path, f"{field}{_where(member)} is truncated: its header declares shape "
                              f"{list(shape)} ({nbytes:,} bytes) but only {len(data):,} follow")
    array = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
    return array.astype(np.float64)


def read_npy_numbers(path: str | Path, field: str) -> np.ndarray:
    """The float64 array of an .npy file; CheckpointError naming the file and ``field``."""
    path = Path(path)
    try:
        with open(path, "rb") as stream:
            return _read_array(stream, path, field, None, path.stat().st_size)
    except OSError as exc:
        raise CheckpointError(path, f"{field} cannot be read ({exc.strerror or exc})") from exc


class NpzNumbers:
    """An .npz archive whose members are read one by one, on request, header first.

    ``names``: the array names (as ``np.savez`` gave them, without ``.npy``). Use as a
    context manager, or call ``close``.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self._zip = zipfile.ZipFile(self.path)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
            raise CheckpointError(self.path, f"is not a complete .npz archive ({exc}); the file is truncated or "
                                  "not an .npz: save it again with numpy.savez") from exc
        self._members = {info.filename[: -len(".npy")]: info for info in self._zip.infolist()
                         if info.filename.endswith(".npy")}
        self.names = list(self._members)

    def read(self, name: str, field: str) -> np.ndarray:
        info = self._members[name]
        try:
            with self._zip.open(info) as stream:
                return _read_array(stream, self.path, field, name, None)
        except (zipfile.BadZipFile, OSError, EOFError, zlib.error, NotImplementedError) as exc:
            raise CheckpointError(self.path, f"{field}{_where(name)} cannot be read ({exc}); the file is truncated "
                                  "or corrupt") from exc

    def close(self) -> None:
        self._zip.close()

    def __enter__(self) -> "NpzNumbers":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
