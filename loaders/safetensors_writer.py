"""Write a .safetensors file one tensor at a time, its header computed first.

safetensors' own writers (``save_file``, ``serialize_file``; none streams, as of 0.8) take
every tensor at once, so a 9.6 GB NF4 expert made from a 37 GB bf16 one would sit in RAM
whole. The format is small (huggingface.co/docs/safetensors, "Format"): 8 bytes
little-endian N, then N bytes of JSON header (``__metadata__`` first when given, then per
tensor ``dtype``, ``shape`` and ``data_offsets`` [begin, end) counted from the byte after the
header), padded with spaces so the data starts on a multiple of 8, then the tensors' bytes
back to back. This writer lays the file out as ``save_file`` does (its order: dtype rank,
larger first, then name; its compact JSON), so the same tensors give the same bytes
(tests/unit/test_safetensors_writer.py), and puts each tensor where it belongs when it comes.

A size known only once the tensor exists (bitsandbytes' quant-state record is JSON holding
a float) is declared with ``shape=None`` and an upper bound ``max_len``: the header is then
sized for the bound, written last and padded with spaces (the format allows trailing
whitespace), and from that entry on the file is written in its order.
"""
from __future__ import annotations

import json
import os
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import torch
from safetensors import safe_open

# safetensors' dtype names; their order is its Dtype enum's, which save_file sorts by.
_RANKED_DTYPES = (
    (torch.bool, "BOOL"), (torch.uint8, "U8"), (torch.int8, "I8"), (torch.float8_e5m2, "F8_E5M2"),
    (torch.float8_e4m3fn, "F8_E4M3"), (torch.int16, "I16"), (torch.uint16, "U16"), (torch.float16, "F16"),
    (torch.bfloat16, "BF16"), (torch.int32, "I32"), (torch.uint32, "U32"), (torch.float32, "F32"),
    (torch.float64, "F64"), (torch.int64, "I64"), (torch.uint64, "U64"),
)
DTYPE_NAMES = dict(_RANKED_DTYPES)
_RANK = {dtype: rank for rank, (dtype, _) in enumerate(_RANKED_DTYPES)}
_ALIGN = 8


@dataclass(frozen=True)
class Entry:
    """One tensor of the file: a fixed ``shape``, or ``shape=None`` for a 1-D tensor of at
    most ``max_len`` elements whose length is known only when it is written."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...] | None
    max_len: int = 0

    def nbytes(self, shape: Sequence[int] | None = None) -> int:
        shape = self.shape if shape is None else shape
        count = 1
        for n in shape if shape is not None else (self.max_len,):
            count *= n
        return count * self.dtype.itemsize


def file_order(entries: Iterable[Entry]) -> list[Entry]:
    """``entries`` in the order save_file stores them."""
    return sorted(entries, key=lambda e: (-_RANK[e.dtype], e.name))


def _header(entries: Sequence[Entry], shapes: Mapping[str, Sequence[int]],
            metadata: Mapping[str, str] | None) -> bytes:
    """Compact JSON header (unpadded) for ``entries`` in file order with these shapes."""
    doc: dict[str, object] = {} if metadata is None else {"__metadata__": dict(metadata)}
    offset = 0
    for entry in entries:
        shape = list(shapes[entry.name])
        size = entry.nbytes(shape)
        doc[entry.name] = {"dtype": DTYPE_NAMES[entry.dtype], "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _padded_length(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _raw_bytes(tensor: torch.Tensor) -> memoryview:
    flat = tensor.detach().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


class SafetensorsWriter:
    """``write(name, tensor)`` for every entry (any order, except from the first ``shape=None``
    entry on: file order), then ``close()``. The file is complete only after ``close``; the
    caller writes it under a temporary name and renames it."""

    def __init__(self, path: str | Path, entries: Iterable[Entry], metadata: Mapping[str, str] | None = None) -> None:
        if sys.byteorder != "little":
            raise RuntimeError("safetensors stores little-endian data; this writer copies memory as it is")
        self.path = Path(path)
        self.metadata = None if metadata is None else dict(metadata)
        self._order = file_order(entries)
        names = [e.name for e in self._order]
        if len(set(names)) != len(names):
            raise ValueError("duplicate tensor names")
        for entry in self._order:
            if entry.dtype not in _RANK:
                raise ValueError(f"tensor {entry.name!r}: dtype {entry.dtype} is not one safetensors stores here")
            if entry.shape is None and entry.max_len <= 0:
                raise ValueError(f"tensor {entry.name!r}: an entry without a shape needs max_len > 0")
        self._index = {e.name: i for i, e in enumerate(self._order)}
        open_at = [i for i, e in enumerate(self._order) if e.shape is None]
        self._sequential_from = open_at[0] if open_at else len(self._order)
        # Offsets (from the data start) of everything before the first open entry.
        self._fixed_offsets: list[int] = []
        offset = 0
        for entry in self._order[: self._sequential_from]:
            self._fixed_offsets.append(offset)
            offset += entry.nbytes()
        self._cursor = offset  # where the next entry of the sequential part goes
        self._next_sequential = self._sequential_from
        bound = {e.name: (e.shape if e.shape is not None else (e.max_len,)) for e in self._order}
        self._header_length = _padded_length(len(_header(self._order, bound, self.metadata)))
        self._data_start = 8 + self._header_length
        self._shapes: dict[str, tuple[int, ...]] = {}
        self.checksums: dict[str, int] = {}  # CRC-32 of each tensor's bytes, for the read-back check
        # "x": a new file only; writing into an existing one would reach every hard link of it
        # (loaders/new_file.py). The caller writes under a temporary name and renames it.
        self._file = open(self.path, "xb")

    def write(self, name: str, tensor: torch.Tensor) -> None:
        if name not in self._index:
            raise KeyError(f"{self.path.name}: tensor {name!r} is not in the file's plan")
        if name in self._shapes:
            raise ValueError(f"{self.path.name}: tensor {name!r} was already written")
        position = self._index[name]
        entry = self._order[position]
        shape = tuple(tensor.shape)
        if tensor.dtype != entry.dtype or (entry.shape is not None and shape != tuple(entry.shape)):
            want = f"{tuple(entry.shape)}" if entry.shape is not None else f"1-D, at most {entry.max_len}"
            raise ValueError(f"{self.path.name}: tensor {name!r} is {tensor.dtype} {shape}, the plan says "
                             f"{entry.dtype} {want}")
        if entry.shape is None and (len(shape) != 1 or shape[0] > entry.max_len):
            raise ValueError(f"{self.path.name}: tensor {name!r} has shape {shape}; at most {entry.max_len} "
                             "elements in one dimension were reserved for it")
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            raise ValueError(f"{self.path.name}: tensor {name!r} must be a contiguous CPU tensor")
        if position < self._sequential_from:
            offset = self._fixed_offsets[position]
        else:
            if position != self._next_sequential:
                expected = self._order[self._next_sequential].name
                raise ValueError(f"{self.path.name}: tensor {name!r} came before {expected!r}; from "
                                 f"{self._order[self._sequential_from].name!r} on, tensors go in file order")
            offset = self._cursor
            self._cursor += entry.nbytes(shape)
            self._next_sequential += 1
        data = _raw_bytes(tensor)
        self._file.seek(self._data_start + offset)
        self._file.write(data)
        self._shapes[name] = shape
        self.checksums[name] = zlib.crc32(data)

    @property
    def written(self) -> int:
        return len(self._shapes)

    def close(self) -> int:
        """Write the header, check every entry was written, flush to disk; the file's size."""
        missing = [e.name for e in self._order if e.name not in self._shapes]
        if missing:
            self.abort()
            raise ValueError(f"{self.path.name}: {len(missing)} tensor(s) never written, e.g. {missing[0]!r}")
        header = _header(self._order, self._shapes, self.metadata)
        if len(header) > self._header_length:  # cannot happen: every number is at most its bound
            self.abort()
            raise AssertionError(f"{self.path.name}: header outgrew its reservation")
        data_end = sum(e.nbytes(self._shapes[e.name]) for e in self._order)
        self._file.seek(0)
        self._file.write(self._header_length.to_bytes(8, "little"))
        self._file.write(header.ljust(self._header_length, b" "))
        self._file.truncate(self._data_start + data_end)
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        return self._data_start + data_end

    def verify(self) -> None:
        """Read the closed file back with safetensors itself: the same names, dtypes, shapes,
        metadata and bytes (CRC-32) as written, or a ValueError naming the first difference."""
        try:
            with safe_open(str(self.path), framework="pt", device="cpu") as handle:
                names = set(handle.keys())
                if names != set(self._shapes):
                    raise ValueError(f"holds {len(names)} tensors, {len(self._shapes)} were written")
                if (handle.metadata() or None) != (self.metadata or None):
                    raise ValueError(f"metadata reads back as {handle.metadata()!r}")
                for entry in self._order:
                    tensor = handle.get_tensor(entry.name)
                    if tensor.dtype != entry.dtype or tuple(tensor.shape) != self._shapes[entry.name]:
                        raise ValueError(f"tensor {entry.name!r} reads back as {tensor.dtype} {tuple(tensor.shape)}")
                    if zlib.crc32(_raw_bytes(tensor)) != self.checksums[entry.name]:
                        raise ValueError(f"tensor {entry.name!r} reads back with other bytes than were written")
        except Exception as exc:
            raise ValueError(f"{self.path}: the written file does not read back as written ({exc}); "
                             "the disk or the filesystem lost data") from exc

    def abort(self) -> None:
        """Close without completing (the caller deletes the file)."""
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> "SafetensorsWriter":
        return self

    def __exit__(self, exc_type, *rest: object) -> None:
        if exc_type is not None:
            self.abort()
