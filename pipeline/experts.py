"""Open a DiT expert folder of either layout, and the expert sources used outside ComfyUI:
one expert in memory at a time (``DiskExperts``) or placed on several devices
(``PlacedDiskExperts``). What an expert will occupy is read from its files by
``loaders.expert_size``."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
from torch import nn

from ..loaders.expert_size import expert_memory
from ..loaders.layout import layout_of
from ..loaders.weight_kind import WEIGHT_KINDS
from ..wan.runtime.dense import GEMM_KINDS, runs_on
from .memory import build_or_release, release_module, resolve_device, weights_budget
from .placement import Placement


AS_STORED = "as stored"
WEIGHT_CHOICES = (AS_STORED, "auto") + WEIGHT_KINDS


def choose_weight_kind(choice: str, stored_kind: str, bf16_quantize: str | None,
                       capability: tuple[int, int] | None, device_bytes: Callable[[str], int],
                       total_bytes: int | None) -> str | None:
    """The weight kind an expert is loaded in (None: as stored): the one decider of the
    ``weights`` choice, for both DiT loaders, the command line and the bench (through
    ``weight_kind_for``).

    ``choice``: "as stored" (a bf16 folder follows ``bf16_quantize``, others load as they
    are), a kind of ``GEMM_KINDS`` (refused, naming the card, where its product does not
    run), or "auto": on a CUDA card of ``capability`` the fastest kind (the rows'
    ``speed_rank``) whose weights (``device_bytes(kind)``, after block swap) fit
    ``pipeline.memory.weights_budget`` of ``total_bytes``; nothing fits: the smallest. Off
    CUDA auto is "as stored".
    """
    if choice not in WEIGHT_CHOICES:
        raise ValueError(f"weights: {choice!r} is not one of {', '.join(WEIGHT_CHOICES)}")
    as_stored = bf16_quantize if stored_kind == "bf16" else None
    if choice == AS_STORED or (choice == "auto" and capability is None):
        return None if as_stored == stored_kind else as_stored
    if choice != "auto":
        if not runs_on(choice, capability):
            where = "the CPU" if capability is None else f"a card of compute capability {capability[0]}.{capability[1]}"
            need = GEMM_KINDS[choice].min_capability
            raise ValueError(f"weights: {choice} does not run on {where}"
                             + (f" (it needs {need[0]}.{need[1]} or newer)" if need else "")
                             + "; choose auto, nf4 or bf16")
        return None if choice == stored_kind else choice
    budget = None if total_bytes is None else weights_budget(total_bytes)
    able = sorted((k for k in GEMM_KINDS if runs_on(k, capability)), key=lambda k: -GEMM_KINDS[k].speed_rank)
    sizes = {kind: device_bytes(kind) for kind in able}
    fitting = [kind for kind in able if budget is None or sizes[kind] <= budget]
    kind = fitting[0] if fitting else min(able, key=lambda k: sizes[k])
    return None if kind == stored_kind else kind


def weight_kind_for(folder: str | Path, device: torch.device | str, choice: str, bf16_quantize: str | None,
                    blocks_on_gpu: int | None = None) -> str | None:
    """``choose_weight_kind`` for an expert folder on a device (its capability and memory)."""
    folder = Path(folder)
    device = torch.device(device)
    if choice == AS_STORED:  # nothing about the device matters (and nothing of it is asked)
        return choose_weight_kind(choice, layout_of(folder).stored_kind, bf16_quantize, None, lambda _kind: 0, None)
    cuda = device.type == "cuda" and torch.cuda.is_available()
    capability = torch.cuda.get_device_capability(device) if cuda else None
    total = torch.cuda.get_device_properties(device).total_memory if cuda else None
    swap = blocks_on_gpu if cuda else None
    return choose_weight_kind(choice, layout_of(folder).stored_kind, bf16_quantize, capability,
                              lambda kind: expert_memory(folder, kind, swap)[0], total)


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

    ``weights``: a ``WEIGHT_CHOICES`` entry, decided per expert folder on this device by
    ``weight_kind_for`` (``quantize``: what "as stored" does to a bf16 folder).
    ``keep_resident``: an expert stays loaded after use (no reload per window of a long
    video) until ``close``: both experts in memory at once (2 × ~9.6 GB NF4 at A14B), for
    machines that have the room.
    """

    def __init__(self, high: str | Path, low: str | Path, device: torch.device | str | None = None,
                 quantize: str | None = None, blocks_on_gpu: int | None = None, keep_resident: bool = False,
                 weights: str = AS_STORED) -> None:
        self.folders = {"high": Path(high), "low": Path(low)}
        self.device = resolve_device(device)
        self.quantize = quantize
        self.blocks_on_gpu = blocks_on_gpu  # blocks kept on the GPU; None: all
        self.keep_resident = keep_resident
        self.kinds = {name: weight_kind_for(folder, self.device, weights, quantize, blocks_on_gpu)
                      for name, folder in self.folders.items()}  # headers only: a wrong choice fails now
        self._resident: dict[str, nn.Module] = {}

    def acquire(self, name: str) -> nn.Module:
        if name not in self._resident:
            if not self.keep_resident:
                for other in list(self._resident):
                    self.release(other)
            self._resident[name] = load_expert(self.folders[name], self.device, self.kinds[name],
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
