"""Open a DiT expert folder of either layout, and a source that keeps one expert resident."""
from __future__ import annotations

import math
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from ..loaders.bf16 import load_bf16_expert, open_bf16_weights
from ..loaders.dit_weights import build_on_meta
from ..loaders.layout import CONFIG_FILE, detect_expert_layout, read_config
from ..loaders.nf4 import load_nf4_expert, open_nf4_weights, read_quantization_meta
from ..wan.runtime.block_swap import resident_blocks, swapped_weight_keys
from .memory import build_or_release, release_module, resolve_device
from .placement import Placement

WEIGHT_SUFFIXES = (".safetensors", ".pt")


def load_expert(folder: str | Path, device: torch.device | str, quantize: str | None = None,
                block_swap: int | None = None) -> nn.Module:
    """NF4 folders (layout A) load as they are; bf16 folders (layout B) optionally quantize.

    ``block_swap``: blocks kept wholly on a CUDA device, the rest streamed from pinned RAM
    (None: all on the device; see ``wan.runtime.block_swap``).
    """
    folder = Path(folder)
    if detect_expert_layout(folder) == "nf4":
        return build_or_release(lambda: load_nf4_expert(folder, device, block_swap=block_swap))
    return build_or_release(lambda: load_bf16_expert(folder, device, quantize=quantize, block_swap=block_swap))


# NF4 keeps 4 bits per weight plus one 8-bit absmax per 64-weight block (double quant).
NF4_BYTES_PER_WEIGHT = 0.5 + 1 / 64


def expert_memory(folder: str | Path, quantize: str | None = None,
                  block_swap: int | None = None) -> tuple[int, int]:
    """(device bytes, pinned host bytes) of an expert once loaded, from headers only."""
    host = expert_host_bytes(folder, quantize, block_swap)
    return _loaded_bytes(Path(folder), quantize) - host, host


def expert_size_bytes(folder: str | Path, quantize: str | None = None, block_swap: int | None = None) -> int:
    """Bytes an expert occupies on the device once loaded: its files, or for a bf16 folder
    quantized on load, the files with every 2-D (linear) weight counted at NF4 size; with
    block swap, less the weights kept in RAM (``expert_host_bytes``)."""
    return expert_memory(folder, quantize, block_swap)[0]


def expert_host_bytes(folder: str | Path, quantize: str | None = None, block_swap: int | None = None) -> int:
    """Bytes of weights that block swap keeps in pinned RAM (0 without block swap), from the
    file headers and config.json; nothing is loaded."""
    if block_swap is None:
        return 0
    folder = Path(folder)
    config = read_config(folder)
    resident = resident_blocks(block_swap, config.num_layers, "cuda")  # sizes as a CUDA load lays them out
    if resident is None:
        return 0
    keys = [key for block in swapped_weight_keys(build_on_meta(config, folder / CONFIG_FILE), resident)
            for key in block]
    if detect_expert_layout(folder) == "nf4":
        float_size = read_quantization_meta(folder).compute_dtype.itemsize
        with open_nf4_weights(folder, "cpu") as source:
            return sum(_bytes(source.shape(k), source.dtype(k), float_size) for k in keys)
    source, _ = open_bf16_weights(folder, "cpu")
    with source:
        if quantize == "nf4":  # packed two 4-bit values a byte; the absmax stays on the GPU
            return sum((math.prod(source.shape(k)) + 1) // 2 for k in keys)
        return sum(math.prod(source.shape(k)) * torch.bfloat16.itemsize for k in keys)


def _bytes(shape: tuple[int, ...], dtype: torch.dtype | None, float_size: int) -> int:
    """Size once loaded: floats in the compute dtype, packed 4-bit bytes as they are."""
    size = float_size if dtype is None or dtype.is_floating_point else dtype.itemsize
    return math.prod(shape) * size


def _loaded_bytes(folder: Path, quantize: str | None) -> int:
    """The whole expert's size once loaded (files, or NF4-sized linears when quantizing)."""
    on_disk = sum(p.stat().st_size for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES)
    if quantize != "nf4" or detect_expert_layout(folder) == "nf4":
        return on_disk
    saved = 0
    for shard in folder.glob("*.safetensors"):
        with safe_open(str(shard), framework="pt") as f:
            for key in f.keys():
                shape = f.get_slice(key).get_shape()
                if key.endswith(".weight") and len(shape) == 2:
                    numel = shape[0] * shape[1]
                    saved += int(numel * (2 - NF4_BYTES_PER_WEIGHT))
    return on_disk - saved


class DiskExperts:
    """ExpertSource for use outside ComfyUI: loads from disk, one expert in memory at a time.

    ``keep_resident``: an expert stays loaded after use (no reload per window of a long
    video) until ``close``: both experts in memory at once (2 × ~9.6 GB NF4 at A14B), for
    machines that have the room.
    """

    def __init__(self, high: str | Path, low: str | Path, device: torch.device | str | None = None,
                 quantize: str | None = None, block_swap: int | None = None, keep_resident: bool = False) -> None:
        self.folders = {"high": Path(high), "low": Path(low)}
        self.device = resolve_device(device)
        self.quantize = quantize
        self.block_swap = block_swap  # blocks kept on the GPU; None: all
        self.keep_resident = keep_resident
        self._resident: dict[str, nn.Module] = {}

    def acquire(self, name: str) -> nn.Module:
        if name not in self._resident:
            if not self.keep_resident:
                for other in list(self._resident):
                    self.release(other)
            self._resident[name] = load_expert(self.folders[name], self.device, self.quantize,
                                               block_swap=self.block_swap)
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
                 block_swap: int | None = None) -> None:
        self.folders = {"high": Path(high), "low": Path(low)}
        self.placement = placement
        self.quantize = quantize
        self.block_swap = block_swap
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
                                              block_swap=self.block_swap)
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
