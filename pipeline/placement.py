"""Where the two experts live when more than one GPU is used, as plain data (no ComfyUI).

A placement names device *slots* (0, 1, ...) and maps them to real devices; the rules are
about slots, so a CPU test can give two slots the same device and still check the plan.

- ``single``: one device; the experts take turns on it (today's behaviour).
- ``expert_per_gpu``: high-noise expert on slot 0, low-noise on slot 1. They share no
  device, so neither is freed when the other takes over, and both may stay resident
  between runs (ComfyUI's memory manager still evicts them when it needs the memory).
- ``cfg_split``: the running expert on slots 0 and 1; the conditional branch runs on slot
  0, the unconditional one on slot 1, in the same step; the result is combined on slot 0.
  At the boundary both copies of the high-noise expert are freed before the low-noise
  expert loads on both slots.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

PLACEMENTS = ("single", "expert_per_gpu", "cfg_split")
GPUS_NEEDED = {"single": 1, "expert_per_gpu": 2, "cfg_split": 2}
EXPERTS = ("high", "low")
# Slots holding each expert; for cfg_split the first slot runs the conditional branch.
_SLOTS = {
    "single": {"high": (0,), "low": (0,)},
    "expert_per_gpu": {"high": (0,), "low": (1,)},
    "cfg_split": {"high": (0, 1), "low": (0, 1)},
}


@dataclass(frozen=True)
class Switch:
    """What happens at the boundary from one expert to the other, as (expert, slot) pairs."""

    free: tuple[tuple[str, int], ...]  # copies dropped before the next expert loads
    load: tuple[tuple[str, int], ...]  # copies of the next expert brought in
    keep: tuple[tuple[str, int], ...]  # copies of the previous expert that stay resident
    latent_from: int  # slot the latent leaves (the previous expert's first slot)
    latent_to: int  # slot it moves to


@dataclass(frozen=True)
class Placement:
    mode: str
    devices: tuple[torch.device, ...]  # slot -> device

    def __post_init__(self) -> None:
        if self.mode not in PLACEMENTS:
            raise ValueError(f"devices: {self.mode!r} is not one of {', '.join(PLACEMENTS)}")
        if len(self.devices) < GPUS_NEEDED[self.mode]:
            raise ValueError(f"devices={self.mode} needs {GPUS_NEEDED[self.mode]} devices, got {len(self.devices)}")

    def slots(self, expert: str) -> tuple[int, ...]:
        if expert not in EXPERTS:
            raise ValueError(f"unknown expert {expert!r}; expected 'high' or 'low'")
        return _SLOTS[self.mode][expert]

    def devices_of(self, expert: str) -> tuple[torch.device, ...]:
        """The devices holding ``expert``; the first runs the conditional branch."""
        return tuple(self.devices[s] for s in self.slots(expert))

    @property
    def cfg_split(self) -> bool:
        return self.mode == "cfg_split"

    def conflicts(self, expert: str, other: str) -> tuple[int, ...]:
        """Slots of ``other`` that ``expert`` needs: those copies go before ``expert`` loads."""
        mine = set(self.slots(expert))
        return tuple(s for s in self.slots(other) if s in mine)

    @property
    def keep_resident(self) -> bool:
        """True when the experts share no slot: neither ever has to give way to the other, so
        both stay resident (the sources' ``keep_resident``)."""
        return not self.conflicts("low", "high")

    def switch(self, previous: str, following: str) -> Switch:
        freed = self.conflicts(following, previous)
        return Switch(
            free=tuple((previous, s) for s in freed),
            load=tuple((following, s) for s in self.slots(following)),
            keep=tuple((previous, s) for s in self.slots(previous) if s not in freed),
            latent_from=self.slots(previous)[0],
            latent_to=self.slots(following)[0],
        )


def single(device: torch.device | str) -> Placement:
    return Placement("single", (torch.device(device),))


def cuda_placement(mode: str, device_count: int, first: int = 0) -> Placement:
    """The placement ``mode`` on CUDA GPUs ``first``, ``first + 1``, ... (wrapping), checking the count."""
    if mode not in PLACEMENTS:
        raise ValueError(f"devices: {mode!r} is not one of {', '.join(PLACEMENTS)}")
    needed = GPUS_NEEDED[mode]
    if device_count < needed:
        raise ValueError(
            f"devices={mode} needs {needed} CUDA GPUs, but torch.cuda.device_count() is {device_count}; "
            f"choose devices=single, or start ComfyUI where {needed} GPUs are visible (CUDA_VISIBLE_DEVICES)"
        )
    order = [(first + i) % device_count for i in range(device_count)]
    return Placement(mode, tuple(torch.device("cuda", i) for i in order[:max(needed, 1)]))


def placement_on(mode: str, devices: Sequence[torch.device | str]) -> Placement:
    """The placement ``mode`` on explicit devices (tests, benchmarks: e.g. two CPU slots)."""
    return Placement(mode, tuple(torch.device(d) for d in devices))
