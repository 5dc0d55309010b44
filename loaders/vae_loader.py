"""Load the Wan2.1 VAE from the official ``Wan2.1_VAE.pth`` or ComfyUI's ``wan_2.1_vae.safetensors``.

Both files hold the same key names. Either is memory-mapped (``torch.load(mmap=True)`` or
safetensors' ``safe_open``), the model is built on the meta device with the geometry read off
the tensor shapes, and the tensors are copied one by one straight to the target device.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

import torch
from safetensors import safe_open

from ..wan.vae import VAEGeometry, WanVAE
from .errors import CheckpointError
from .live import track
from .state_dict import check_loaded, materialize
from .t5_loader import read_torch_state_dict

EXPECTED_FILES = "Wan2.1_VAE.pth or wan_2.1_vae.safetensors"


def _open_safetensors(path: Path):
    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except Exception as exc:  # safetensors raises its own SafetensorError for bad headers / sizes
        raise CheckpointError(
            path, f"cannot be read as a safetensors file: it is truncated, corrupt or not safetensors ({exc})"
        ) from exc


def _build(
    path: Path,
    tensors: Mapping[str, torch.Tensor],
    read: Callable[[str], torch.Tensor],
    device: torch.device | str,
    dtype: torch.dtype,
) -> WanVAE:
    try:
        geometry = VAEGeometry.from_state_dict(tensors)
    except ValueError as exc:
        raise CheckpointError(path, f"{exc} (expected the Wan2.1 VAE: {EXPECTED_FILES})") from exc
    with torch.device("meta"):
        vae = track(WanVAE(geometry))
    materialize(vae, path, tensors.keys(), read, device, dtype_for=lambda key, tensor: dtype)
    check_loaded(vae, path)
    return vae.eval().requires_grad_(False)


def load_vae(path: str | Path, device: torch.device | str, dtype: torch.dtype = torch.bfloat16) -> WanVAE:
    """A ready, eval-mode :class:`WanVAE` on ``device`` with its weights cast to ``dtype``.

    ``.safetensors`` files are read with safetensors, anything else with ``torch.load``.
    """
    path = Path(path)
    if not path.is_file():
        problem = "is a folder" if path.is_dir() else "file not found"
        raise CheckpointError(path, f"{problem} (expected the Wan2.1 VAE: {EXPECTED_FILES})")
    if path.suffix == ".safetensors":
        with _open_safetensors(path) as handle:
            try:
                # Shapes only (meta tensors): the geometry needs no data.
                shapes = {key: torch.empty(handle.get_slice(key).get_shape(), device="meta") for key in handle.keys()}
            except Exception as exc:
                raise CheckpointError(path, f"has an unreadable tensor header ({exc})") from exc
            return _build(path, shapes, handle.get_tensor, device, dtype)
    tensors = read_torch_state_dict(path)
    return _build(path, tensors, tensors.__getitem__, device, dtype)


def load_vae_from_state_dict(
    tensors: Mapping[str, torch.Tensor],
    device: torch.device | str,
    dtype: torch.dtype = torch.float32,
    source: str = "VAE state dict",
) -> WanVAE:
    """A :class:`WanVAE` built from an in-memory state dict, e.g. a core ComfyUI VAE's ``get_sd()``.

    ComfyUI's Wan 2.1 VAE uses the key names of ``wan_2.1_vae.safetensors``, which
    :func:`load_vae` already reads; ``source`` names the origin in error messages.
    """
    if not isinstance(tensors, Mapping) or not tensors:
        raise CheckpointError(source, f"holds no tensors (expected the Wan2.1 VAE: {EXPECTED_FILES})")
    return _build(Path(source), tensors, tensors.__getitem__, device, dtype)
