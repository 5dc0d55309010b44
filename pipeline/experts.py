"""Open a DiT expert folder of either layout, and a source that keeps one expert resident."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from ..loaders.bf16 import load_bf16_expert
from ..loaders.layout import detect_expert_layout
from ..loaders.nf4 import load_nf4_expert
from .memory import release_module, resolve_device

WEIGHT_SUFFIXES = (".safetensors", ".pt")


def load_expert(folder: str | Path, device: torch.device | str, quantize: str | None = None) -> nn.Module:
    """NF4 folders (layout A) load as they are; bf16 folders (layout B) optionally quantize."""
    folder = Path(folder)
    if detect_expert_layout(folder) == "nf4":
        return load_nf4_expert(folder, device)
    return load_bf16_expert(folder, device, quantize=quantize)


# NF4 keeps 4 bits per weight plus one 8-bit absmax per 64-weight block (double quant).
NF4_BYTES_PER_WEIGHT = 0.5 + 1 / 64


def expert_size_bytes(folder: str | Path, quantize: str | None = None) -> int:
    """Bytes an expert occupies once loaded: its files, or for a bf16 folder quantized on
    load, the files with every 2-D (linear) weight counted at NF4 size."""
    folder = Path(folder)
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
    """ExpertSource for use outside ComfyUI: loads from disk, one expert in memory at a time."""

    def __init__(self, high: str | Path, low: str | Path, device: torch.device | str | None = None,
                 quantize: str | None = None) -> None:
        self.folders = {"high": Path(high), "low": Path(low)}
        self.device = resolve_device(device)
        self.quantize = quantize
        self._resident: dict[str, nn.Module] = {}

    def acquire(self, name: str) -> nn.Module:
        if name not in self._resident:
            for other in list(self._resident):
                self.release(other)
            self._resident[name] = load_expert(self.folders[name], self.device, self.quantize)
        return self._resident[name]

    def release(self, name: str) -> None:
        release_module(self._resident.pop(name, None))

    def close(self) -> None:
        for name in list(self._resident):
            self.release(name)
