"""Device choice and working room for the stages that load a model outside ComfyUI's manager.

T5 and the VAE are loaded by the pipeline itself and freed right after, so ComfyUI never
counts them. Before such a stage we ask ComfyUI to evict what it holds on that device
(other workflows' models, a resident expert) until the stage's weights plus working
memory fit; the working memory is estimated in ``pipeline/memory.py``.
"""
from __future__ import annotations

from pathlib import Path

import torch

import comfy.model_management as mm

from ...pipeline.memory import TEXT_WORKSPACE, VAE_WORKSPACE  # noqa: F401  (the estimates' owner)

DEVICE_CHOICES = ("auto", "gpu", "cpu")
DEVICE_TOOLTIP = (
    "auto: the device ComfyUI computes on; gpu: the same, but fail if ComfyUI runs on the CPU; "
    "cpu: run this stage on the CPU (slow, but spares VRAM)."
)


def pick_device(choice: str, field: str = "device") -> torch.device:
    comfy_device = mm.get_torch_device()
    if choice == "auto":
        return comfy_device
    if choice == "cpu":
        return torch.device("cpu")
    if choice == "gpu":
        if comfy_device.type == "cpu":
            raise ValueError(f"{field}=gpu, but ComfyUI computes on the CPU (no GPU found, or started with --cpu); choose auto or cpu")
        return comfy_device
    raise ValueError(f"{field}: {choice!r} is not one of {', '.join(DEVICE_CHOICES)}")


def make_room(device: torch.device, weights: str | Path | int, workspace: int) -> None:
    """Have ComfyUI unload models from ``device`` until the weights (a file, or a byte count) plus ``workspace`` fit."""
    size = weights if isinstance(weights, int) else Path(weights).stat().st_size
    needed = size + workspace
    mm.free_memory(needed, device)


def check_interrupt() -> None:
    """Raises ComfyUI's interrupt exception when the user pressed Cancel (never catch it)."""
    mm.throw_exception_if_processing_interrupted()
