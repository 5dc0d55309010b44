"""What a DiT expert will occupy once loaded, from its file headers and config.json alone:
device bytes, and the pinned host bytes block swap keeps in RAM. Nothing is loaded; ComfyUI
plans its memory with these numbers before the expert streams in. Each layout answers for
its own files (``loaders.layout.LAYOUTS``); each weight kind for its bytes
(``wan/runtime/dense.py`` ``GEMM_KINDS``)."""
from __future__ import annotations

from pathlib import Path

from ..wan.runtime.block_swap import resident_blocks, swapped_weight_keys
from ..wan.runtime.dense import weight_bytes
from .dit_weights import build_on_meta, linear_layers
from .layout import CONFIG_FILE, layout_of, read_config

WEIGHT_SUFFIXES = (".safetensors", ".pt")
__all__ = ["expert_memory", "expert_size_bytes", "expert_host_bytes"]


def expert_memory(folder: str | Path, quantize: str | None = None,
                  blocks_on_gpu: int | None = None) -> tuple[int, int]:
    """(device bytes, pinned host bytes) of an expert once loaded, from headers only."""
    host = expert_host_bytes(folder, quantize, blocks_on_gpu)
    return _loaded_bytes(Path(folder), quantize) - host, host


def expert_size_bytes(folder: str | Path, quantize: str | None = None, blocks_on_gpu: int | None = None) -> int:
    """Bytes an expert occupies on the device once loaded: its files, or for an expert
    converted on load (``quantize``: another weight kind than the stored one), the files with
    every linear weight counted at that kind's size; with block swap, less the weights kept
    in RAM (``expert_host_bytes``)."""
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
    layout = layout_of(folder)
    meta = build_on_meta(layout.read_config(folder), folder / CONFIG_FILE)
    shapes = {f"{name}.weight": (layer.out_features, layer.in_features) for name, layer in linear_layers(meta).items()}
    keys = [key for block in swapped_weight_keys(meta, resident) for key in block]
    return layout.host_weight_bytes(folder, {k: shapes[k] for k in keys}, _converted(layout, quantize))


def _converted(layout, quantize: str | None) -> str | None:
    """The kind the linears are converted to on load (None: kept as stored)."""
    return None if quantize is None or quantize == layout.stored_kind else quantize


def _loaded_bytes(folder: Path, quantize: str | None) -> int:
    """The whole expert's size once loaded (files, or the linears at the converted kind)."""
    on_disk = sum(p.stat().st_size for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES)
    layout = layout_of(folder)
    kind = _converted(layout, quantize)
    if kind is None:
        return on_disk
    meta = build_on_meta(layout.read_config(folder), folder / CONFIG_FILE)
    saved = 0
    with layout.open(folder, "cpu") as source:
        present = set(source.keys())
        for name, layer in linear_layers(meta).items():
            key = f"{name}.weight"
            if key in present:
                shape = (layer.out_features, layer.in_features)
                saved += layout.linear_weight_bytes(source, key) - weight_bytes(kind, shape)
    return on_disk - saved
