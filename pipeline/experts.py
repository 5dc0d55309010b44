"""Open a DiT expert folder of either layout, and the expert sources used outside ComfyUI:
one expert in memory at a time (``DiskExperts``) or placed on several devices
(``PlacedDiskExperts``). What an expert will occupy is read from its files by
``loaders.expert_size``."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..loaders.layout import layout_of
from .memory import build_or_release, release_module, resolve_device
from .placement import Placement


def load_expert(folder: str | Path, device: torch.device | str, quantize: str | None = None,
                blocks_on_gpu: int | None = None) -> nn.Module:
    """The expert through its layout's loader (``loaders.layout.LAYOUTS``).

    ``quantize``: the weight kind its linears are held in once loaded (None: as stored; "nf4",
    "bf16", "fp8", "int8": converted layer by layer while loading, ``loaders.weight_kind``).
    ``blocks_on_gpu``: blocks kept wholly on a CUDA device, the rest streamed from pinned RAM
    (None: all on the device; see ``wan.runtime.block_swap``).
    """
    folder = Path(folder)
    layout = layout_of(folder)
    return build_or_release(lambda: layout.load(folder, device, quantize=quantize, blocks_on_gpu=blocks_on_gpu))


class DiskExperts:
    """ExpertSource for use outside ComfyUI: loads from disk, one expert in memory at a time.

    ``keep_resident``: an expert stays loaded after use (no reload per window of a long
    video) until ``close``: both experts in memory at once (2 × ~9.6 GB NF4 at A14B), for
    machines that have the room.
    """

    def __init__(self, high: str | Path, low: str | Path, device: torch.device | str | None = None,
                 quantize: str | None = None, blocks_on_gpu: int | None = None, keep_resident: bool = False) -> None:
        self.folders = {"high": Path(high), "low": Path(low)}
        self.device = resolve_device(device)
        self.quantize = quantize
        self.blocks_on_gpu = blocks_on_gpu  # blocks kept on the GPU; None: all
        self.keep_resident = keep_resident
        self._resident: dict[str, nn.Module] = {}

    def acquire(self, name: str) -> nn.Module:
        if name not in self._resident:
            if not self.keep_resident:
                for other in list(self._resident):
                    self.release(other)
            self._resident[name] = load_expert(self.folders[name], self.device, self.quantize,
                                               blocks_on_gpu=self.blocks_on_gpu)
        return self._resident[name]

    def release(self, name: str) -> None:
        if not self.keep_resident:
            self._free(name)

    def _free(self, name: str) -> None:
        release_module(self._resident.pop(name, None))

    def close(self) -> None:
        for name in list(self._resident):
            self._free(name)


class PlacedDiskExperts:
    """ExpertSource for use outside ComfyUI that follows a ``Placement`` (several devices).

    Copies are keyed by (expert, slot). Acquiring an expert first frees the other expert's
    copies on the slots it needs; ``release`` frees an expert only where the placement does
    not keep it resident (``Placement.keep_resident``); ``close`` and ``abort`` free everything.
    """

    def __init__(self, high: str | Path, low: str | Path, placement: Placement, quantize: str | None = None,
                 blocks_on_gpu: int | None = None) -> None:
        self.folders = {"high": Path(high), "low": Path(low)}
        self.placement = placement
        self.quantize = quantize
        self.blocks_on_gpu = blocks_on_gpu
        self._resident: dict[tuple[str, int], nn.Module] = {}

    @property
    def cfg_split(self) -> bool:
        return self.placement.cfg_split

    @property
    def keep_resident(self) -> bool:
        return self.placement.keep_resident

    def resident(self) -> dict[tuple[str, int], nn.Module]:
        return dict(self._resident)

    def _load(self, name: str, slot: int) -> nn.Module:
        key = (name, slot)
        if key not in self._resident:
            self._resident[key] = load_expert(self.folders[name], self.placement.devices[slot], self.quantize,
                                              blocks_on_gpu=self.blocks_on_gpu)
        return self._resident[key]

    def acquire(self, name: str) -> nn.Module:
        other = "low" if name == "high" else "high"
        for slot in self.placement.conflicts(name, other):
            release_module(self._resident.pop((other, slot), None))
        models = [self._load(name, slot) for slot in self.placement.slots(name)]
        return models[0]

    def acquire_uncond(self, name: str) -> nn.Module:
        slots = self.placement.slots(name)
        if len(slots) < 2:
            raise ValueError(f"devices={self.placement.mode} keeps one copy of the {name}-noise expert; "
                             "only cfg_split has a second copy for the unconditional branch")
        return self._load(name, slots[1])

    def release(self, name: str) -> None:
        if self.keep_resident:
            return  # no other expert ever needs its device: it stays for the next run
        self._free(name)

    def _free(self, name: str) -> None:
        for key in [k for k in self._resident if k[0] == name]:
            release_module(self._resident.pop(key))

    def abort(self) -> None:
        for name in ("high", "low"):
            self._free(name)

    close = abort
