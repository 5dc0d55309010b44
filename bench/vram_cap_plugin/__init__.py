"""Bench-only ComfyUI custom node package: the server behaves as on a card of
``LINGBOT_VRAM_CAP_GB`` GiB on a larger GPU (bench/play_client.py ``--vram-cap-gb``; never
shipped, loaded only through the ``--extra-model-paths-config`` that script writes).

The in-process benches cap the allocator with ``torch.cuda.set_per_process_memory_fraction``
(shared/GPU.md: past the cap an allocation is a real out-of-memory). In a server ComfyUI also
plans with what it reads of the card, so the cap must show there too: its total memory (the
pack's memory plan reads ``get_total_memory``) and its free memory (its model loads read
``get_free_memory``: the cap less what this process holds active, when that is less than the
driver's figure) are read through the cap for CUDA devices.
"""
from __future__ import annotations

import logging
import os

import torch

import comfy.model_management as mm

log = logging.getLogger("lingbot_vram_cap_plugin")
GIB = 1 << 30
CAP_BYTES = int(float(os.environ["LINGBOT_VRAM_CAP_GB"]) * GIB)


def _is_cuda(dev) -> bool:
    dev = mm.get_torch_device() if dev is None else dev
    return getattr(dev, "type", None) == "cuda"


def _capped_total(real):
    def get_total_memory(dev=None, torch_total_too=False):
        out = real(dev, torch_total_too)
        if not _is_cuda(dev):
            return out
        return (min(out[0], CAP_BYTES), min(out[1], CAP_BYTES)) if torch_total_too else min(out, CAP_BYTES)
    return get_total_memory


def _capped_free(real):
    def get_free_memory(dev=None, torch_free_too=False):
        free_total, free_torch = real(dev, True)
        if _is_cuda(dev):
            device = mm.get_torch_device() if dev is None else dev
            active = torch.cuda.memory_stats(device).get("active_bytes.all.current", 0)
            free_total = min(free_total, max(0, CAP_BYTES - active))
        return (free_total, free_torch) if torch_free_too else free_total
    return get_free_memory


def install() -> None:
    for index in range(torch.cuda.device_count()):
        total = torch.cuda.get_device_properties(index).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, CAP_BYTES / total), index)
    mm.get_total_memory = _capped_total(mm.get_total_memory)
    mm.get_free_memory = _capped_free(mm.get_free_memory)
    mm.total_vram = min(mm.total_vram, CAP_BYTES / (1 << 20))  # MB, read by ComfyUI's own checks


install()
log.info("lingbot vram cap plugin: CUDA devices capped at %.1f GiB", CAP_BYTES / GIB)

NODE_CLASS_MAPPINGS: dict = {}
NODE_DISPLAY_NAME_MAPPINGS: dict = {}
