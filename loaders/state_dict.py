"""Put tensors into a module built on the meta device, one tensor at a time.

The tensors come from a memory map (safetensors or ``torch.load(mmap=True)``), so each one is
read from the page cache straight into its destination: no whole state dict in RAM. On the
way to CUDA a CPU tensor goes through pinned staging buffers (``pinned_upload``), faster
than copying from the memory map directly (bench/RESULTS.md).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, Mapping

import torch
from torch import nn

from .errors import CheckpointError, preview
from .pinned_upload import PinnedUploader, make_uploader


def expected_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and persistent buffer of ``module`` by state-dict key."""
    return dict(module.state_dict(keep_vars=True))


def check_keys(path: str | Path, expected: Iterable[str], found: Iterable[str]) -> None:
    """Raise a CheckpointError listing a few missing and unexpected keys."""
    expected, found = set(expected), set(found)
    missing, unexpected = expected - found, found - expected
    if not missing and not unexpected:
        return
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing key(s): {preview(missing)}")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected key(s): {preview(unexpected)}")
    raise CheckpointError(path, "does not match the model; " + "; ".join(parts))


def set_tensor(module: nn.Module, key: str, value: torch.Tensor) -> None:
    """Replace the parameter or buffer ``key`` (dotted) of ``module`` by ``value``."""
    owner_name, _, leaf = key.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    if leaf in owner._parameters:
        owner._parameters[leaf] = nn.Parameter(value, requires_grad=False)
    elif leaf in owner._buffers:
        owner._buffers[leaf] = value
    else:
        raise KeyError(key)


def materialize(
    module: nn.Module,
    path: str | Path,
    keys: Iterable[str],
    read: Callable[[str], torch.Tensor],
    device: torch.device | str,
    dtype_for: Callable[[str, torch.Tensor], torch.dtype | None] = lambda key, t: None,
    expected: Mapping[str, torch.Tensor] | None = None,
) -> nn.Module:
    """Fill a meta-built ``module`` from ``read(key)``, checking names, shapes and dtypes.

    ``dtype_for(key, tensor)`` returns the dtype to cast to, or None to keep the file's.
    ``expected`` narrows the tensors to fill (default: all of ``module``'s state dict), for
    loaders that put some layers in by other means (e.g. 4-bit linears).
    """
    expected = expected_tensors(module) if expected is None else dict(expected)
    keys = list(keys)
    check_keys(path, expected, keys)
    device = torch.device(device)
    uploader: PinnedUploader | None = None  # made on the first CPU tensor bound for CUDA
    tried_uploader = False
    try:
        for key in keys:
            try:
                source = read(key)
            except Exception as exc:  # a truncated or corrupt file fails here, per tensor
                raise CheckpointError(path, f"cannot read tensor {key!r} ({exc}); the file may be truncated or corrupt") from exc
            want = expected[key]
            if tuple(source.shape) != tuple(want.shape):
                raise CheckpointError(
                    path, f"tensor {key!r} has shape {tuple(source.shape)}, the model expects {tuple(want.shape)}"
                )
            if source.is_floating_point() != want.is_floating_point():
                raise CheckpointError(path, f"tensor {key!r} has dtype {source.dtype}, the model expects {want.dtype}")
            dtype = dtype_for(key, source) or source.dtype
            if device.type == "cuda" and source.device.type == "cpu":
                if not tried_uploader:
                    uploader, tried_uploader = make_uploader(device), True
                if uploader is not None:
                    source = uploader.upload(source)
            set_tensor(module, key, source.to(device=device, dtype=dtype, copy=False))
    finally:
        if uploader is not None:
            uploader.close()
    return module


def check_loaded(module: nn.Module, path: str | Path) -> None:
    """Fail if any parameter or buffer is still on the meta device."""
    left = [k for k, t in expected_tensors(module).items() if t.is_meta]
    if left:
        raise CheckpointError(path, f"{len(left)} tensor(s) were never loaded: {preview(left)}")


def check_declared_sizes(path: str | Path, tensors: Mapping[str, torch.Tensor]) -> None:
    """Refuse a ``torch.save`` file whose tensors declare more data than the file holds.

    A tensor saved as a stride-0 (or otherwise overlapping) view of a tiny storage reads as
    gigabytes: copying it to a device would allocate all of them, from a 50 KB file. Every
    tensor must fit in its own storage, and none can be larger than the file. Shapes and
    storage sizes only: nothing is read or allocated.
    """
    file_size = Path(path).stat().st_size
    for key, tensor in tensors.items():
        declared = tensor.numel() * tensor.element_size()
        stored = tensor.untyped_storage().nbytes()
        if declared > stored or declared > file_size:
            raise CheckpointError(
                path,
                f"tensor {key} declares shape {tuple(tensor.shape)} ({declared:,} bytes) but the file stores "
                f"{min(stored, file_size):,} bytes for it (file size {file_size:,}): an overlapping or stride-0 "
                "view, not real weights; the file is corrupt or crafted. Download it again",
            )

