"""The loaders' ``devices`` on this host: the GPUs ComfyUI may use (its own first, then the
next visible ones) and the one rule of ``pipeline/placement.decide_devices`` applied to them,
with the link measured by the worker pool (``workers.measured_link``) when ``auto`` asks."""
from __future__ import annotations

import torch

import comfy.model_management as mm

from ...pipeline.placement import DevicesDecision, check_devices, decide_devices
from .workers import measured_link, settle_link_pool


def usable_gpus() -> tuple[list[torch.device], str]:
    """The CUDA GPUs a ``devices`` mode may use, ComfyUI's first (none when ComfyUI computes
    on the CPU), and how many there are in words, for messages."""
    comfy_device = mm.get_torch_device()
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if comfy_device.type != "cuda":
        return [], f"ComfyUI computes on {comfy_device.type}, torch.cuda.device_count() is {count}"
    first = comfy_device.index or 0
    return [torch.device("cuda", (first + i) % count) for i in range(count)], f"torch.cuda.device_count() is {count}"


def check_choice(devices: str, model: str) -> None:
    """Refuse an unknown ``devices`` or too few GPUs before any file is read."""
    gpus, host = usable_gpus()
    check_devices(devices, model, len(gpus), host)


def decide(devices: str, model: str, heads: int) -> DevicesDecision:
    """What ``devices`` runs for ``model``'s loader (``pipeline.placement.BASE`` or ``FAST``)
    on this host. A pool started only to measure the link is stopped unless the mode runs on it."""
    gpus, host = usable_gpus()
    decision = None
    try:
        decision = decide_devices(devices, model, gpus, heads, host, lambda group: measured_link(group)["gbps"])
    finally:  # a refusal after the measurement stops its pool too
        settle_link_pool(keep=decision is not None and decision.mode.strategy == "ulysses")
    return decision


def describe(decision: DevicesDecision) -> str:
    """The decision in the words of the log and of model_info ("" for ``single`` as asked)."""
    if decision.said:
        return f"devices {decision.said}"
    if decision.mode.name == "single":
        return ""
    return f"devices {decision.mode.name} on {', '.join(str(d) for d in decision.devices)}"


__all__ = ["check_choice", "decide", "describe", "usable_gpus"]
