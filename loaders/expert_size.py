"""What a DiT expert will occupy once loaded, from its file headers and config.json alone:
device bytes, and the pinned host bytes block swap keeps in RAM. Nothing is loaded; ComfyUI
plans its memory with these numbers before the expert streams in."""
from __future__ import annotations

import math
from pathlib import Path

import torch
from safetensors import safe_open

from ..wan.runtime.block_swap import resident_blocks, swapped_weight_keys
from .bf16 import open_bf16_weights
from .dit_weights import build_on_meta
from .layout import CONFIG_FILE, detect_expert_layout, read_config
from .nf4 import open_nf4_weights, read_quantization_meta

WEIGHT_SUFFIXES = (".safetensors", ".pt")

# NF4 keeps 4 bits per weight plus one 8-bit absmax per 64-weight block (double quant).
NF4_BYTES_PER_WEIGHT = 0.5 + 1 / 64


def expert_memory(folder: str | Path, quantize: str | None = None,
                  blocks_on_gpu: int | None = None) -> tuple[int, int]:
    """(device bytes, pinned host bytes) of an expert once loaded, from headers only."""
    host = expert_host_bytes(folder, quantize, blocks_on_gpu)
    return _loaded_bytes(Path(folder), quantize) - host, host


def expert_size_bytes(folder: str | Path, quantize: str | None = None, blocks_on_gpu: int | None = None) -> int:
    """Bytes an expert occupies on the device once loaded: its files, or for a bf16 folder
    quantized on load, the files with every 2-D (linear) weight counted at NF4 size; with
    block swap, less the weights kept in RAM (``expert_host_bytes``)."""
    return expert_memory(folder, quantize, blocks_on_gpu)[0]


def expert_host_bytes(folder: str | Path, quantize: str | None = None, blocks_on_gpu: int | None = None) -> int:
    """Bytes of weights that block swap keeps in pinned RAM (0 without block swap), from the
    file headers and config.json; nothing is loaded."""
    if blocks_on_gpu is None:
        return 0
    folder = Path(folder)
    config = read_config(folder)
    resident = resident_blocks(blocks_on_gpu, config.num_layers, "cuda")  # sizes as a CUDA load lays them out
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
