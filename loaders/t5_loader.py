"""Load the umT5 encoder from the official ``models_t5_umt5-xxl-enc-bf16.pth``, or from
ComfyUI's ``umt5_xxl_*.safetensors`` (see ``comfy_t5``).

The file is opened with ``torch.load(mmap=True)``: tensors stay in the page cache (reclaimable,
not anonymous memory) and each one is copied straight to its destination. The official
loader instead reads the whole file and builds the model on the CPU, twice the file in RAM.
"""
from __future__ import annotations

import pickle
from pathlib import Path
from typing import Mapping

import torch

from ..wan.t5 import T5Geometry, UMT5Encoder
from .comfy_t5 import ComfyT5File, is_comfy_t5_file, load_comfy_t5
from .errors import CheckpointError
from .live import track
from .state_dict import check_declared_sizes, check_loaded, materialize

EXPECTED_FILE = "models_t5_umt5-xxl-enc-bf16.pth"
# Training scripts sometimes wrap the weights one level down under one of these.
_WRAPPER_KEYS = ("state_dict", "model")


def read_torch_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Memory-map a ``torch.save`` state dict; tensors are views of the file, not copies."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(path, "file not found")
    if path.is_dir():
        raise CheckpointError(path, "is a folder; expected a .pth file saved with torch.save")
    if path.suffix == ".safetensors":
        raise CheckpointError(
            path,
            f"is a safetensors file; this reader takes torch.save files such as {EXPECTED_FILE} "
            "(load_t5 reads ComfyUI's umt5_xxl_*.safetensors with loaders.comfy_t5)",
        )
    try:
        loaded = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(path, f"holds Python objects other than tensors and was not loaded ({exc})") from exc
    except Exception as exc:  # torch raises RuntimeError / EOFError / ValueError for broken zips
        raise CheckpointError(
            path,
            f"cannot be read as a PyTorch checkpoint: the file is truncated, corrupt or not a torch.save file ({exc})",
        ) from exc
    tensors = _unwrap(path, loaded)
    check_declared_sizes(path, tensors)  # before anything is copied or allocated
    return tensors


def _unwrap(path: Path, loaded: object) -> dict[str, torch.Tensor]:
    if not isinstance(loaded, Mapping):
        raise CheckpointError(path, f"holds a {type(loaded).__name__}, expected a state dict of tensors")
    for wrapper in _WRAPPER_KEYS:
        inner = loaded.get(wrapper)
        if isinstance(inner, Mapping) and not any(isinstance(v, torch.Tensor) for v in loaded.values()):
            loaded = inner
            break
    not_tensors = [str(k) for k, v in loaded.items() if not isinstance(v, torch.Tensor)]
    if not_tensors:
        raise CheckpointError(path, f"entries that are not tensors: {', '.join(sorted(not_tensors)[:5])}")
    return dict(loaded)


def t5_width(path: str | Path) -> int:
    """Features per token the encoder in ``path`` puts out (its embedding width), from the
    file's header or tensor index alone; CheckpointError when that cannot be read."""
    if is_comfy_t5_file(path):
        file = ComfyT5File(path)
        key = "shared.weight"
        shape = file.shape(key) if key in file.keys else ()
    else:
        tensors = read_torch_state_dict(path)
        key = "token_embedding.weight"
        shape = tuple(tensors[key].shape) if key in tensors else ()
    if len(shape) != 2 or shape[1] < 1:
        raise CheckpointError(path, f"has no usable tensor {key!r} (found shape {shape or 'none'}): not a umT5 encoder")
    return int(shape[1])


def load_t5(path: str | Path, device: torch.device | str, dtype: torch.dtype = torch.bfloat16) -> UMT5Encoder:
    """Build the encoder on the meta device, then fill it tensor by tensor on ``device``.

    A ``.safetensors`` file is read as ComfyUI's umT5 file (HF key names, fp16 or fp8 scaled).
    """
    if is_comfy_t5_file(path):
        return load_comfy_t5(path, device, dtype)
    tensors = read_torch_state_dict(path)
    try:
        geometry = T5Geometry.from_state_dict(tensors)
    except ValueError as exc:
        raise CheckpointError(path, f"{exc} (expected the umT5 encoder file {EXPECTED_FILE})") from exc
    with torch.device("meta"):
        encoder = track(UMT5Encoder(geometry))
    materialize(encoder, path, tensors.keys(), tensors.__getitem__, device, dtype_for=lambda key, tensor: dtype)
    check_loaded(encoder, path)
    return encoder.eval().requires_grad_(False)
