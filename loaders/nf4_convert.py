"""A bf16 expert folder (layout B) written as an NF4 expert folder (layout A), streaming
(docs/conventions.md#checkpoint-layouts).

One tensor at a time comes from the shards' memory map, linear weights are quantized by
bitsandbytes (``loaders.nf4.nf4_tensors``: the same call, settings and serialization as
``load_bf16_expert(..., quantize="nf4")``, so the tensors are bit for bit the ones a
quantize-on-load gives on the same device) and go straight to their place in
``model.safetensors`` (``loaders.safetensors_writer``). Anonymous memory holds one layer,
never the model: on CUDA the host keeps only the layer's packed pieces; on the CPU
bitsandbytes' quantizer works on float32 copies, about 7x the layer's bf16 bytes at the
peak (2.2 GB for A14B's largest layer, time_projection, 315 MB; tests/unit/test_nf4_convert_memory.py).

The file's layout is planned from the headers before any weight is read: bitsandbytes
packs an [out, in] weight into ceil(out·in/2) bytes with one absmax per 64 values, itself
quantized to 8 bits in blocks of 256 (double quantization). Only the quant-state record
(JSON with a float, ~170 bytes) has a length known after quantizing; it gets a bound.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from ..wan.runtime.bnb import bnb
from ..wan.config import CONTROL_NAMES, CONTROL_WEIGHT, DiTConfig, with_control_weight
from .bf16 import open_bf16_weights
from .dit_weights import build_on_meta, check_block_count, check_shapes, linear_layers
from .errors import CheckpointError
from .layout import CONFIG_FILE, NF4_META_FILE, NF4_WEIGHTS_FILE, read_config, require_layout
from .new_file import write_bytes, write_json
from .nf4 import QUANT_STATE_KEY, NF4Meta, nf4_packed_shape, nf4_tensors
from .pinned_upload import make_uploader
from .safetensors_writer import Entry, SafetensorsWriter
from .state_dict import check_keys, expected_tensors
from .weight_kind import linear_around

BLOCKSIZE = 64  # the NF4 package's settings (quantization_meta.json), as quantize-on-load uses
NESTED_BLOCKSIZE = 256  # bitsandbytes' block for the double quantization of the absmax
COMPUTE_DTYPE = torch.bfloat16
# bitsandbytes' quant-state record is ~170 bytes of JSON. The bound keeps its length's digit
# count, so the header sized for the bound is rarely more than a few bytes longer.
QUANT_STATE_MAX_BYTES = 999
_FILE_METADATA = {"format": "pt"}  # what save_file is given in loaders/nf4.py


@dataclass(frozen=True)
class ConversionPlan:
    """What converting one bf16 expert folder will read and write, from its headers."""

    source: Path
    config: DiTConfig  # control_type told by the weights
    entries: tuple[Entry, ...]  # the tensors of the NF4 model.safetensors
    plain: tuple[str, ...]  # tensors copied (floats as bf16)
    linears: tuple[str, ...]  # layers quantized, in the order the file wants them
    source_bytes: int

    @property
    def model_name(self) -> str:
        return CONTROL_NAMES[self.config.control_type]

    @property
    def output_bytes(self) -> int:
        """An upper bound of model.safetensors' size: the data with the quant states at their
        bound, and far more header than the names and numbers need."""
        return sum(e.nbytes() for e in self.entries) + 8 + sum(len(e.name) + 160 for e in self.entries)


@dataclass(frozen=True)
class Progress:
    tensors_done: int  # source tensors handled
    tensors_total: int
    read_bytes: int  # source bytes handled
    read_total: int
    written_bytes: int


def _linear_entries(name: str, linear: nn.Linear) -> list[Entry]:
    values = linear.out_features * linear.in_features
    blocks = math.ceil(values / BLOCKSIZE)
    prefix = f"{name}.weight"
    entries = [
        Entry(prefix, torch.uint8, nf4_packed_shape(linear.out_features, linear.in_features)),
        Entry(f"{prefix}.absmax", torch.uint8, (blocks,)),
        Entry(f"{prefix}.quant_map", torch.float32, (16,)),
        Entry(f"{prefix}.nested_absmax", torch.float32, (math.ceil(blocks / NESTED_BLOCKSIZE),)),
        Entry(f"{prefix}.nested_quant_map", torch.float32, (256,)),
        Entry(f"{name}.{QUANT_STATE_KEY}", torch.uint8, None, QUANT_STATE_MAX_BYTES),
    ]
    if linear.bias is not None:
        entries.append(Entry(f"{name}.bias", COMPUTE_DTYPE, (linear.out_features,)))
    return entries


def plan_conversion(folder: str | Path) -> ConversionPlan:
    """Check a bf16 expert folder as ``load_bf16_expert`` does (config.json against every
    header: block count, keys, shapes; the control type from the camera layer's shape) and
    plan the NF4 file, reading no weight."""
    folder = require_layout(folder, "bf16")
    config_path = folder / CONFIG_FILE
    config = read_config(folder)
    source, described_by = open_bf16_weights(folder, "cpu")
    with source:
        keys = source.keys()
        check_block_count(config_path, config, described_by, keys)
        if CONTROL_WEIGHT in keys:
            try:
                config = with_control_weight(config, source.shape(CONTROL_WEIGHT))
            except ValueError as exc:
                raise CheckpointError(source.file_of(CONTROL_WEIGHT), str(exc)) from exc
        model = build_on_meta(config, config_path)
        expected = expected_tensors(model)
        check_keys(described_by, expected, keys)
        check_shapes(config_path, config, model, {k: source.shape(k) for k in keys}, source.file_of)
        linears = linear_layers(model)
        in_linears = {f"{name}.{leaf}" for name, layer in linears.items() for leaf, _ in layer.named_parameters()}
        plain = sorted(k for k in expected if k not in in_linears)
        entries = [Entry(k, COMPUTE_DTYPE if expected[k].is_floating_point() else source.dtype(k), source.shape(k))
                   for k in plain]
        for name, layer in linears.items():
            entries.extend(_linear_entries(name, layer))
        source_bytes = sum(math.prod(source.shape(k)) * (source.dtype(k) or torch.uint8).itemsize for k in keys)
    # From the first quant state on, the file is written in its own order: its layers by name.
    order = sorted(linears, key=lambda name: f"{name}.weight")
    return ConversionPlan(folder, config, tuple(entries), tuple(plain), tuple(order), source_bytes)


def convert_to_nf4(
    plan: ConversionPlan,
    folder: str | Path,
    device: torch.device | str = "cpu",
    progress: Callable[[Progress], None] | None = None,
) -> Path:
    """Write ``plan``'s expert into ``folder`` (created; the caller's temporary folder) as
    config.json (the source's, unchanged: it keeps fields such as Fast's), model.safetensors
    (read back and checked) and quantization_meta.json. Linear layers are quantized on
    ``device``; everything else is copied on the CPU."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    device = torch.device(device)
    meta = NF4Meta(blocksize=BLOCKSIZE, double_quant=True, compute_dtype=COMPUTE_DTYPE,
                   extra={"quantizer": f"bitsandbytes {bnb.__version__}", "source": plan.source.name,
                          "control": plan.model_name})
    biased = {e.name for e in plan.entries if e.name.endswith(".bias") and e.name[:-5] in plan.linears}
    total = len(plan.plain) + len(plan.linears) + len(biased)
    state = {"tensors": 0, "read": 0, "written": 0}

    def advance(read: torch.Tensor, count: int = 1) -> None:
        state["tensors"] += count
        state["read"] += read.numel() * read.element_size()
        if progress is not None:
            progress(Progress(state["tensors"], total, state["read"], plan.source_bytes, state["written"]))

    source, _ = open_bf16_weights(plan.source, "cpu")
    uploader = make_uploader(device)
    try:
        with source, torch.no_grad(), SafetensorsWriter(folder / NF4_WEIGHTS_FILE, plan.entries,
                                                         _FILE_METADATA) as writer:
            for key in plan.plain:
                tensor = source.read(key)
                out = tensor.to(COMPUTE_DTYPE) if tensor.is_floating_point() else tensor
                writer.write(key, out.contiguous())
                state["written"] += out.numel() * out.element_size()
                advance(tensor)
                del tensor, out
            for name in plan.linears:
                stored = source.read(f"{name}.weight")
                stored_bias = source.read(f"{name}.bias") if f"{name}.bias" in biased else None
                weight = uploader.upload(stored) if uploader is not None else stored.to(device)
                bias = None if stored_bias is None else stored_bias.to(device)
                linear = linear_around(weight.to(COMPUTE_DTYPE), None if bias is None else bias.to(COMPUTE_DTYPE))
                del weight, bias
                for key, tensor in nf4_tensors(linear, f"{name}.", BLOCKSIZE, True, COMPUTE_DTYPE):
                    writer.write(key, tensor)
                    state["written"] += tensor.numel() * tensor.element_size()
                del linear
                advance(stored)
                if stored_bias is not None:
                    advance(stored_bias)
                del stored, stored_bias
            writer.close()
        writer.verify()
    finally:
        if uploader is not None:
            uploader.close()
    write_bytes(folder / CONFIG_FILE, (plan.source / CONFIG_FILE).read_bytes())
    write_json(folder / NF4_META_FILE, meta.to_json())
    return folder
