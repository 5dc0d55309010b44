"""Give memory back now: VRAM to the driver and freed heap pages to the OS."""
from __future__ import annotations

import ctypes
import gc
import sys

import torch
from torch import nn


def empty_device_cache() -> None:
    """Collect garbage, return cached CUDA blocks and cached pinned host memory (block
    swap's weights), and trim the C heap (glibc only)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        _empty_pinned_cache()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # musl or no glibc: nothing to trim
            pass


def _empty_pinned_cache() -> None:
    # PyTorch keeps freed pinned blocks for reuse; without this a released block-swapped
    # expert would keep holding its page-locked RAM.
    empty = getattr(getattr(torch, "accelerator", None), "empty_host_cache", None)  # torch >= 2.9
    if empty is None:
        empty = getattr(torch._C, "_host_emptyCache", None)
    if empty is not None:
        empty()


def release_module(module: nn.Module | None) -> None:
    """Drop every tensor a module holds so its memory is freed even if the module lingers.

    A node output or a traceback may keep a reference to the module object; clearing its
    parameters and buffers makes sure the weights themselves go.
    """
    if module is None:
        return
    for sub in module.modules():
        for name in list(sub._parameters):
            sub._parameters[name] = None
        for name in list(sub._buffers):
            sub._buffers[name] = None
    empty_device_cache()


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def resolve_device(device: torch.device | str | None) -> torch.device:
    if device is None or str(device) == "auto":
        return default_device()
    return torch.device(device)
