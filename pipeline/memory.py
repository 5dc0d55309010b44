"""Give memory back now: VRAM to the driver and freed heap pages to the OS."""
from __future__ import annotations

import ctypes
import gc
import os
import sys
import traceback
from typing import Callable, TypeVar

import torch
from torch import nn

T = TypeVar("T")


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


def build_or_release(build: Callable[[], T]) -> T:
    """``build()``; if it fails, the half-built model is freed before the error goes on.

    A loader that fails midway (a truncated shard, a CUDA OOM) holds the partly filled
    model in its local variables, and the traceback keeps those frames (and so the weights)
    alive for as long as the error is kept: by ComfyUI, until the next prompt. Clearing the
    frames below this one drops them now.
    """
    try:
        return build()
    except BaseException as exc:
        if exc.__traceback__ is not None:
            traceback.clear_frames(exc.__traceback__.tb_next)
        empty_device_cache()
        raise


def total_ram_bytes() -> int | None:
    """Physical memory of this machine, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        try:
            import psutil  # ComfyUI depends on it; Windows has no sysconf

            return int(psutil.virtual_memory().total)
        except Exception:  # noqa: BLE001
            return None


# float32 RGB frames held at once on the host: the conditioning clip (or the decoded video)
# and the copy handed on to ComfyUI (an IMAGE batch).
_HOST_BYTES_PER_PIXEL = 2 * 3 * 4


def check_video_fits(frames: int, height: int, width: int, ram_bytes: int | None = None) -> None:
    """Refuse, before anything is allocated, a video whose frames alone cannot fit in RAM.

    4096x4096 at 1601 frames would otherwise try to allocate over 160 GB and take the
    process down; the message gives the size, the need and what to change.
    """
    ram = total_ram_bytes() if ram_bytes is None else ram_bytes
    need = _HOST_BYTES_PER_PIXEL * int(frames) * int(height) * int(width)
    if ram is not None and need > ram:
        raise ValueError(
            f"width x height x frames = {width}x{height}x{frames} needs about {need / 2**30:.1f} GiB of RAM for its "
            f"frames alone, more than this machine's {ram / 2**30:.1f} GiB; reduce width, height or frames"
        )

