"""bf16 experts (layout B, docs/conventions.md#checkpoint-layouts): diffusers-style safetensors shards plus an index.

Reading opens every shard as a memory map and streams each tensor onto the target device.
With ``quantize="nf4"`` each linear layer is quantized the moment its weight arrives, so the
peak stays about one bf16 layer above the finished NF4 model.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import torch
from safetensors.torch import save_file
from torch import nn

from ..wan.runtime.block_swap import BlockSwapper, host_weights_for, resident_blocks
from ..wan.runtime.bnb import Linear4bit
from ..wan.config import CONTROL_WEIGHT, DiTConfig
from ..wan.model import LingBotDiT
from .dit_weights import (build_on_meta, check_block_count, check_shapes, config_with_control, float_dtype,
                          linear_layers)
from .errors import CheckpointError, preview
from .json_file import read_json_object
from .new_file import partial_name, write_json
from .layout import BF16_INDEX_FILE, BF16_SINGLE_FILE, CONFIG_FILE, read_config, require_layout, write_config
from .state_dict import check_keys, check_loaded, expected_tensors, materialize
from .tensor_source import SafetensorsSource
from .weight_kind import check_kind, convert_linear, host_bytes, host_spec, move_weight_to_host

DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3
_SHARD_NAME = "diffusion_pytorch_model-{index:05d}-of-{total:05d}.safetensors"


# --- reading ------------------------------------------------------------------------------

def _read_index(path: Path) -> dict[str, str]:
    """weight_map of the index file (key -> shard file name), validated."""
    data = read_json_object(path, "a sharded bf16 expert folder needs its index")
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(path, "has no 'weight_map' object (tensor name -> shard file)")
    for key, name in weight_map.items():
        if not isinstance(name, str) or Path(name).name != name or not name.endswith(".safetensors"):
            raise CheckpointError(path, f"weight_map assigns {key!r} to {name!r}, which is not a shard file name")
    return weight_map


def open_bf16_weights(folder: Path, device: torch.device | str) -> tuple[SafetensorsSource, Path]:
    """The expert's shards as one source, and the file to name in errors about the whole set."""
    index = folder / BF16_INDEX_FILE
    if not index.is_file():
        return SafetensorsSource([folder / BF16_SINGLE_FILE], device), folder / BF16_SINGLE_FILE
    weight_map = _read_index(index)
    shard_names = sorted(set(weight_map.values()))
    missing = [name for name in shard_names if not (folder / name).is_file()]
    if missing:
        raise CheckpointError(index, f"names {len(missing)} shard file(s) that are not in the folder: {preview(missing)}")
    files = {key: folder / name for key, name in weight_map.items()}
    source = SafetensorsSource([folder / name for name in shard_names], device, files=files)
    return source, index


def open_bf16_source(folder: Path, device: torch.device | str) -> SafetensorsSource:
    """``open_bf16_weights`` without the file to name (the layout table's ``open``)."""
    return open_bf16_weights(Path(folder), device)[0]


def bf16_linear_weight_bytes(source: SafetensorsSource, key: str) -> int:
    """Bytes a stored linear weight takes in the shards."""
    shape = source.shape(key)
    return shape[0] * shape[1] * torch.bfloat16.itemsize


def bf16_host_weight_bytes(folder: Path, shapes: Mapping[str, tuple[int, int]], quantize: str | None) -> int:
    """Pinned bytes of these linear weights ([out, in] each) under block swap, held as
    ``quantize`` (None: bf16)."""
    return sum(host_bytes(quantize or "bf16", *shape) for shape in shapes.values())


def _control_config(config: DiTConfig, source: SafetensorsSource, described_by: Path) -> DiTConfig:
    """``config`` with the control type of the stored control weight (header only)."""
    if CONTROL_WEIGHT not in source.keys():
        return config
    return config_with_control(config, source.shape(CONTROL_WEIGHT), source.file_of(CONTROL_WEIGHT))


def read_bf16_config(folder: str | Path) -> DiTConfig:
    """config.json of a layout-B expert, with ``control_type`` (Base-Cam or Act) read off the
    shards' headers; no tensor is read."""
    folder = require_layout(folder, "bf16")
    config = read_config(folder)
    source, described_by = open_bf16_weights(folder, "cpu")
    with source:
        return _control_config(config, source, described_by)


def load_bf16_expert(
    folder: str | Path,
    device: torch.device | str,
    dtype: torch.dtype = torch.bfloat16,
    quantize: str | None = None,
    blocks_on_gpu: int | None = None,
) -> LingBotDiT:
    """Load a layout-B expert onto ``device`` (eval mode, no gradients).

    ``quantize="nf4"`` turns every nn.Linear into a bitsandbytes NF4 Linear4bit while loading
    (blocksize 64, double quantization, compute dtype ``dtype``), as the NF4 package stores them;
    ``"fp8"`` / ``"int8"`` into an 8-bit ``Linear8bit`` (per-channel scales); None or
    ``"bf16"`` keeps them as stored.

    ``blocks_on_gpu=K`` keeps only blocks 0..K-1 wholly on ``device`` (CUDA); the linear weights
    of the others live in pinned RAM and stream in during each forward (see
    ``wan.runtime.block_swap``). Unquantized, they are read from the memory map straight into pinned
    RAM; with ``quantize="nf4"`` each is quantized on the GPU and its packed bytes moved out.
    None (or K >= num_layers) keeps everything on the device; on a CPU device it is ignored.
    """
    check_kind(quantize)
    kind = None if quantize == "bf16" else quantize
    folder = require_layout(folder, "bf16")
    config_path = folder / CONFIG_FILE
    config = read_config(folder)
    device = torch.device(device)
    resident = resident_blocks(blocks_on_gpu, config.num_layers, device)
    source, described_by = open_bf16_weights(folder, device)
    with source:
        keys = source.keys()
        check_block_count(config_path, config, described_by, keys)  # config against the header, before building
        config = _control_config(config, source, described_by)  # Base-Cam or Act: by the weight's shape
        model = build_on_meta(config, config_path)
        expected = expected_tensors(model)
        check_keys(described_by, expected, keys)
        check_shapes(config_path, config, model, {k: source.shape(k) for k in keys}, source.file_of)

        linears = linear_layers(model) if kind else {}
        deferred = {f"{name}.weight" for name in linears}
        host: dict[str, torch.Tensor] = {}
        if resident is not None:
            def spec(key: str) -> tuple[tuple[int, ...], torch.dtype]:
                if key in deferred:  # stored as ``kind``: its bytes go to RAM
                    return host_spec(kind, *expected[key].shape, dtype)
                return tuple(expected[key].shape), dtype
            host = host_weights_for(model, resident, spec)
        plain = {k: t for k, t in expected.items() if k not in deferred}
        on_device = {k: t for k, t in plain.items() if k not in host}
        materialize(model, described_by, list(on_device), source.read, device, float_dtype(dtype), expected=on_device)
        in_host = {k: t for k, t in plain.items() if k in host}
        if in_host:
            host_source, _ = open_bf16_weights(folder, "cpu")
            with host_source:
                materialize(model, described_by, list(in_host), lambda key: host[key].copy_(host_source.read(key)),
                            "cpu", float_dtype(dtype), expected=in_host)
        for name, linear in linears.items():
            # One bf16 weight on the device at a time, quantized and dropped before the next.
            materialize(linear, source.file_of(f"{name}.weight"), ["weight"],
                        lambda _key, n=name: source.read(f"{n}.weight"), device, float_dtype(dtype),
                        expected={"weight": linear.weight})
            layer = convert_linear(linear, kind, dtype)
            packed_into = host.get(f"{name}.weight")
            if packed_into is not None:
                move_weight_to_host(layer, packed_into, name)
            model.set_submodule(name, layer)
            linear.weight = None  # type: ignore[assignment]
    check_loaded(model, described_by)
    if resident is not None:
        BlockSwapper(model, resident, device)
    return model.eval().requires_grad_(False)


# --- writing ------------------------------------------------------------------------------

class ShardWriter:
    """Collect tensors into shards of at most ``max_shard_bytes`` and write each when full.

    Shards are written under temporary names and renamed once their total count is known;
    ``finish()`` writes the index. Only the shard being filled is held in memory.
    """

    def __init__(self, folder: Path, max_shard_bytes: int) -> None:
        if max_shard_bytes <= 0:
            raise ValueError("max_shard_bytes must be positive")
        self.folder = folder
        self.max_shard_bytes = max_shard_bytes
        self._pending: dict[str, torch.Tensor] = {}
        self._pending_bytes = 0
        self._written: list[tuple[Path, list[str]]] = []
        self.total_size = 0

    def add(self, key: str, tensor: torch.Tensor) -> None:
        size = tensor.numel() * tensor.element_size()
        if self._pending and self._pending_bytes + size > self.max_shard_bytes:
            self._flush()
        self._pending[key] = tensor.detach().to("cpu").contiguous()
        self._pending_bytes += size
        self.total_size += size

    def _flush(self) -> None:
        path = partial_name(self.folder / f"shard-{len(self._written) + 1:05d}")
        path.unlink(missing_ok=True)  # a crashed run's; save_file would write into it
        save_file(self._pending, str(path), metadata={"format": "pt"})
        self._written.append((path, list(self._pending)))
        self._pending, self._pending_bytes = {}, 0

    def finish(self) -> list[Path]:
        if self._pending or not self._written:
            self._flush()
        total = len(self._written)
        weight_map: dict[str, str] = {}
        shards = []
        for index, (partial, keys) in enumerate(self._written, start=1):
            name = _SHARD_NAME.format(index=index, total=total)
            os.replace(partial, self.folder / name)
            shards.append(self.folder / name)
            weight_map.update({key: name for key in keys})
        index_data = {"metadata": {"total_size": self.total_size}, "weight_map": dict(sorted(weight_map.items()))}
        write_json(self.folder / BF16_INDEX_FILE, index_data)
        return shards


def write_bf16_files(
    folder: str | Path,
    config: DiTConfig,
    tensors: Iterable[tuple[str, torch.Tensor]],
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    config_fields: Mapping[str, Any] | None = None,
) -> Path:
    """Write config.json, the shards and the index from a stream of (key, tensor);
    ``config_fields``: config.json as given (``layout.write_config``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    writer = ShardWriter(folder, max_shard_bytes)
    for key, tensor in tensors:
        writer.add(key, tensor)
    writer.finish()
    write_config(folder, config, config_fields)
    return folder


def bf16_tensors(module: nn.Module, dtype: torch.dtype = torch.bfloat16) -> Iterator[tuple[str, torch.Tensor]]:
    """(key, tensor) of ``module``'s state dict, floats cast to ``dtype`` one at a time."""
    quantized = [name for name, m in module.named_modules() if isinstance(m, Linear4bit)]
    if quantized:
        raise ValueError(f"layers {preview(quantized)} are 4-bit; a bf16 expert needs the unquantized model")
    for key, tensor in module.state_dict().items():
        yield key, tensor.to(dtype) if tensor.is_floating_point() else tensor
