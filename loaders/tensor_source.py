"""Read-only views of checkpoint files, one tensor at a time.

``SafetensorsSource`` keeps every file open through safetensors' memory map. A CPU target
gets tensors backed by the page cache, not by anonymous memory; a CUDA target gets each
tensor copied from that map through pinned staging buffers (``pinned_upload``), with no
anonymous CPU copy either. ``TorchFileSource`` does the
same for a legacy ``torch.save`` file via ``torch.load(mmap=True, weights_only=True)``.
Shapes come from the headers, so a loader can check a whole file against the model before it
reads any weight.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, ContextManager, Iterator, Mapping

import torch
from safetensors import safe_open

from .errors import CheckpointError, preview
from .pinned_upload import PinnedUploader, make_uploader
from .state_dict import check_declared_sizes

_SAFETENSORS_DTYPES = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32,
    "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}


def device_string(device: torch.device | str) -> str:
    """``device`` as safetensors wants it; a bare "cuda" becomes the current CUDA device."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return str(device)


class TensorSource:
    """Tensors by key from one or more files; ``read`` returns each on ``device`` if it can."""

    device: str

    def keys(self) -> list[str]:
        raise NotImplementedError

    def file_of(self, key: str) -> Path:
        raise NotImplementedError

    def shape(self, key: str) -> tuple[int, ...]:
        raise NotImplementedError

    def dtype(self, key: str) -> torch.dtype | None:
        raise NotImplementedError

    def read(self, key: str) -> torch.Tensor:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self) -> "TensorSource":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SafetensorsSource(TensorSource):
    """One or several .safetensors files; ``files`` maps each key to the file that holds it.

    With ``files=None`` every key of every file in ``paths`` is offered.
    """

    def __init__(self, paths: list[Path], device: torch.device | str, files: Mapping[str, Path] | None = None) -> None:
        self.device = device_string(device)
        # CUDA targets read through the uploader; safetensors' own CUDA path copies from
        # pageable memory and is slower (1.6× for an NF4 expert on the H100; pinned_upload).
        self._uploader: PinnedUploader | None = make_uploader(self.device)
        read_device = "cpu" if self._uploader is not None else self.device
        self._handles = {}
        self._keys_in: dict[Path, set[str]] = {}
        self._file_of: dict[str, Path] = {}
        for path in paths:
            if not path.is_file():
                raise CheckpointError(path, "weights file not found")
            try:
                handle = safe_open(str(path), framework="pt", device=read_device)
            except Exception as exc:  # SafetensorError for a bad header or a short file
                raise CheckpointError(
                    path, f"cannot be opened as safetensors ({exc}); the file is truncated or corrupt: download it again"
                ) from exc
            self._handles[path] = handle
            self._keys_in[path] = set(handle.keys())
            for key in handle.keys():
                if files is None:
                    if key in self._file_of:
                        raise CheckpointError(path, f"tensor {key!r} is also stored in {self._file_of[key].name}")
                    self._file_of[key] = path
        if files is not None:
            for key, path in files.items():
                if path not in self._handles:
                    raise CheckpointError(path, f"is named for tensor {key!r} but was not opened")
                if key not in self._keys_in[path]:
                    raise CheckpointError(path, f"does not hold tensor {key!r}, which the index assigns to it")
                self._file_of[key] = path

    def keys(self) -> list[str]:
        return list(self._file_of)

    def file_of(self, key: str) -> Path:
        return self._file_of[key]

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._handles[self._file_of[key]].get_slice(key).get_shape())

    def dtype(self, key: str) -> torch.dtype | None:
        return _SAFETENSORS_DTYPES.get(self._handles[self._file_of[key]].get_slice(key).get_dtype())

    def read(self, key: str) -> torch.Tensor:
        tensor = self._handles[self._file_of[key]].get_tensor(key)
        return tensor if self._uploader is None else self._uploader.upload(tensor)

    def close(self) -> None:
        # Tensors already handed out keep their own reference to the mapping.
        self._handles.clear()
        if self._uploader is not None:
            self._uploader.close()
            self._uploader = None


class TorchFileSource(TensorSource):
    """A legacy ``torch.save`` state dict, memory-mapped; tensors arrive on the CPU."""

    def __init__(self, path: Path, device: torch.device | str) -> None:
        self.device = device_string(device)
        self.path = path
        if not path.is_file():
            raise CheckpointError(path, "weights file not found")
        try:
            state = torch.load(str(path), map_location="cpu", mmap=True, weights_only=True)
        except Exception as exc:
            raise CheckpointError(
                path, f"cannot be read as a torch state dict ({exc}); the file is truncated or corrupt"
            ) from exc
        if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise CheckpointError(path, f"holds a {type(state).__name__}, expected a state dict of tensors")
        odd = [k for k in state if not isinstance(k, str)]
        if odd:
            raise CheckpointError(path, f"has non-string keys: {preview(map(repr, odd))}")
        check_declared_sizes(path, state)
        self._state: dict[str, torch.Tensor] = dict(state)

    def keys(self) -> list[str]:
        return list(self._state)

    def file_of(self, key: str) -> Path:
        return self.path

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._state[key].shape)

    def dtype(self, key: str) -> torch.dtype | None:
        return self._state[key].dtype

    def read(self, key: str) -> torch.Tensor:
        return self._state[key]

    def close(self) -> None:
        self._state = {}


@contextlib.contextmanager
def host_view(opener: Callable[[Path, str], ContextManager["TensorSource"]], folder: Path,
              resident: int | None) -> Iterator["TensorSource | None"]:
    """A CPU view of a layout's weights (``opener(folder, "cpu")``) for what block swap keeps
    in RAM; None without block swap (``resident`` None)."""
    if resident is None:
        yield None
        return
    with opener(folder, "cpu") as source:
        yield source
