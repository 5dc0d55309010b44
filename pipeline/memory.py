"""Give memory back now: VRAM to the driver and freed heap pages to the OS."""
from __future__ import annotations

import ctypes
import gc
import os
import sys
import traceback
from pathlib import Path
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


def host_room_bytes() -> tuple[int, str] | None:
    """What this process may still allocate on the host, and what sets it; None where the
    OS does not say.

    Physical RAM, lowered by what the OS enforces on this process: a cgroup memory limit
    (containers, systemd) less the group's current use, and the address-space and data
    limits (``ulimit -v`` / ``-d``) less the process's current size. Allocations beyond a
    limit fail inside the allocator, so the check below must know them.
    """
    found: list[tuple[int, str]] = []
    ram = total_ram_bytes()
    if ram is not None:
        found.append((ram, f"this machine's {ram / 2**30:.1f} GiB of RAM"))
    cgroup = _cgroup_room()
    if cgroup is not None:
        found.append((cgroup, f"the {cgroup / 2**30:.1f} GiB left under this process group's memory limit"))
    for name, room in _rlimit_rooms():
        found.append((room, f"the {room / 2**30:.1f} GiB left under its {name} limit"))
    return min(found) if found else None


CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
# (limit, usage, page-cache entry of memory.stat) in cgroup v2 and v1.
_CGROUP_FILES = {"v2": ("memory.max", "memory.current", "file"),
                 "v1": ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_cache")}


def _cgroup_folders() -> list[tuple[str, Path]]:
    """This process's memory cgroup folders (v2 and v1), where mounted; the mount's root as
    a fallback (inside a container the group is often mounted as the root)."""
    found = []
    try:
        lines = PROC_CGROUP.read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        _, controllers, group = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            base, kind = CGROUP_ROOT, "v2"
        elif "memory" in controllers.split(","):
            base, kind = CGROUP_ROOT / "memory", "v1"
        else:
            continue
        for folder in (base / group.strip().lstrip("/"), base):
            if (folder / _CGROUP_FILES[kind][0]).is_file():
                found.append((kind, folder))
                break
    return found


def _cgroup_room() -> int | None:
    """The memory limit of this process's cgroup less what the group uses that cannot be
    reclaimed (its page cache, e.g. memory-mapped checkpoints, can); None without a limit."""
    rooms = []
    for kind, folder in _cgroup_folders():
        limit_file, usage_file, cache_key = _CGROUP_FILES[kind]
        try:
            limit = (folder / limit_file).read_text().strip()
            if limit == "max" or int(limit) >= 2**60:  # v1 writes "no limit" as a huge number
                continue
            stat = dict(line.split()[:2] for line in (folder / "memory.stat").read_text().splitlines() if line.strip())
            used = int((folder / usage_file).read_text()) - int(stat.get(cache_key, 0))
            rooms.append(max(int(limit) - used, 0))
        except (OSError, ValueError):
            continue
    return min(rooms) if rooms else None


def _rlimit_rooms() -> list[tuple[str, int]]:
    """(limit name, bytes left) for the address-space and data limits that are set."""
    try:
        import resource

        page = os.sysconf("SC_PAGE_SIZE")
        size, _, _, _, _, data, _ = (int(v) for v in Path("/proc/self/statm").read_text().split())
    except (ImportError, OSError, ValueError, AttributeError):
        return []
    rooms = []
    for name, limit, used in (("address-space (ulimit -v)", resource.RLIMIT_AS, size * page),
                              ("data (ulimit -d)", resource.RLIMIT_DATA, data * page)):
        soft = resource.getrlimit(limit)[0]
        if soft != resource.RLIM_INFINITY:
            rooms.append((name, max(soft - used, 0)))
    return rooms


# Host bytes per pixel of each frame held at once: float32 RGB frames. Encode holds the
# conditioning clip (12); decode the decoded video and the IMAGE batch made from it (24).
ENCODE_BYTES_PER_PIXEL = 3 * 4
DECODE_BYTES_PER_PIXEL = 2 * 3 * 4
_HOST_BYTES_PER_PIXEL = DECODE_BYTES_PER_PIXEL

# What the VAE itself takes on the host while it runs on the CPU, per pixel of the frame
# (or decode tile) it works on: its activations and convolution buffers for one chunk of
# frames. Measured (peak RSS, float32, chunks of 1+4 frames, 256x256 to 1024x1024) with VAEs
# of base width 8, 16 and 96 (Wan2.1's): about 2 KB plus 160 B (encode) or 210 B (decode)
# per unit of base width; Wan2.1's on the CPU takes ~7 GB (encode) or ~9 GB (decode) at
# 480x832. The real peak has an allocator's slack on top: 25 % is added.
_VAE_BYTES_PER_PIXEL = 2048
_VAE_BYTES_PER_PIXEL_PER_WIDTH = {"encode": 160, "decode": 210}


def vae_workspace_bytes(base_width: int, pixels: int, direction: str) -> int:
    """Host bytes a VAE of ``base_width`` (``VAEGeometry.dim``) running on the CPU takes
    for frames (or tiles) of ``pixels`` pixels; ``direction`` is "encode" or "decode"."""
    per_pixel = _VAE_BYTES_PER_PIXEL + _VAE_BYTES_PER_PIXEL_PER_WIDTH[direction] * int(base_width)
    return int(1.25 * per_pixel * int(pixels))


def check_video_fits(frames: int, height: int, width: int, ram_bytes: int | None = None,
                     bytes_per_pixel: int = _HOST_BYTES_PER_PIXEL, workspace_bytes: int = 0,
                     workspace_hint: str = "") -> None:
    """Refuse, before anything is allocated, a video that cannot fit in what this process
    may allocate on the host (``host_room_bytes``, or ``ram_bytes`` when given).

    The need is the frames held at once (``bytes_per_pixel`` per pixel of every frame) plus
    ``workspace_bytes`` (the VAE's own on the CPU: ``vae_workspace_bytes``). 4096x4096 at
    1601 frames would otherwise try to allocate over 160 GB and take the process down, and
    2048x2048x81 with the VAE on the CPU failed in the allocator after a 7 GB peak; the
    message gives the size, the need and what to change.
    """
    room = host_room_bytes() if ram_bytes is None else (ram_bytes, f"this machine's {ram_bytes / 2**30:.1f} GiB of RAM")
    frames_bytes = int(bytes_per_pixel) * int(frames) * int(height) * int(width)
    need = frames_bytes + int(workspace_bytes)
    if room is not None and need > room[0]:
        parts = (f" ({frames_bytes / 2**30:.1f} GiB for the frames, {workspace_bytes / 2**30:.1f} GiB for the VAE "
                 f"working on the CPU)") if workspace_bytes else " for its frames alone"
        raise ValueError(
            f"width x height x frames = {width}x{height}x{frames} needs about {need / 2**30:.1f} GiB of RAM{parts}, "
            f"more than {room[1]}; reduce width, height or frames{workspace_hint}"
        )
