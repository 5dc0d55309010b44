"""fp8 experts (layout C): every linear weight in float8_e4m3fn with one float32 scale per
output channel, the rest bf16, in one ``model_fp8.safetensors`` beside config.json.

Per linear layer ``<name>``: ``<name>.weight`` (F8_E4M3, [out, in]), ``<name>.weight_scale``
(F32, [out]) and ``<name>.bias`` (BF16). The weight is ``weight.float() * weight_scale[:, None]``.
ComfyUI's own scaled-fp8 files name the scale ``weight_scale`` too (one per tensor there,
one per output channel here). The file's metadata says ``quantization: fp8_e4m3fn_rowwise``.

Writing (``convert_to_fp8``) streams one tensor at a time from a bf16 or NF4 folder into the
file (``loaders.safetensors_writer``): RAM holds a layer, not the model. Reading builds the
DiT on the meta device and fills it tensor by tensor from the memory map, each linear as a
``wan.runtime.weights8.Linear8bit`` whose 8-bit bytes stay 8-bit on the device.
"""
from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Callable, Mapping

import torch
from torch import nn

from ..wan.config import CONTROL_WEIGHT, DiTConfig
from ..wan.model import LingBotDiT
from ..wan.runtime.block_swap import BlockSwapper, host_weights_for, resident_blocks
from ..wan.runtime.weights8 import FP8, Linear8bit, quantize_rows
from .dit_weights import build_on_meta, check_block_count, check_shapes, config_with_control, float_dtype, linear_layers
from .errors import CheckpointError
from .layout import CONFIG_FILE, FP8_WEIGHTS_FILE, LAYOUTS, detect_expert_layout, read_config, require_layout
from .safetensors_writer import Entry, SafetensorsWriter
from .state_dict import check_keys, check_loaded, expected_tensors, materialize
from .tensor_source import SafetensorsSource, TensorSource, host_view
from .weight_kind import check_kind, convert_linear, float_weight, host_bytes, host_spec, move_weight_to_host

SCALE_KEY = "weight_scale"
FP8_FORMAT = "fp8_e4m3fn_rowwise"
FILE_METADATA = {"format": "pt", "quantization": FP8_FORMAT}
COMPUTE_DTYPE = torch.bfloat16


def open_fp8_weights(folder: Path, device: torch.device | str) -> TensorSource:
    """model_fp8.safetensors as a one-tensor-at-a-time source."""
    return SafetensorsSource([Path(folder) / FP8_WEIGHTS_FILE], device)


def fp8_linear_weight_bytes(source: TensorSource, key: str) -> int:
    """Bytes a stored linear weight takes in the file (one a value)."""
    return math.prod(source.shape(key)) * (source.dtype(key) or FP8).itemsize


def fp8_host_weight_bytes(folder: Path, shapes: Mapping[str, tuple[int, int]], quantize: str | None) -> int:
    """Pinned bytes of these linear weights under block swap, held as ``quantize`` (None: fp8)."""
    return sum(host_bytes(quantize or "fp8", *shape) for shape in shapes.values())


def _control_config(config: DiTConfig, source: TensorSource, weights: Path) -> DiTConfig:
    if CONTROL_WEIGHT not in source.keys():
        return config
    return config_with_control(config, source.shape(CONTROL_WEIGHT), weights)


def read_fp8_config(folder: str | Path) -> DiTConfig:
    """config.json of a layout-C expert, with ``control_type`` read off the file's header."""
    folder = require_layout(folder, "fp8")
    config = read_config(folder)
    with open_fp8_weights(folder, "cpu") as source:
        return _control_config(config, source, folder / FP8_WEIGHTS_FILE)


def _check_scaled(source: TensorSource, model: nn.Module, names: list[str], weights: Path) -> None:
    linears = linear_layers(model)
    for name in names:
        layer = linears[name]
        problems = []
        if source.dtype(f"{name}.weight") != FP8:
            problems.append(f"{name}.weight is {source.dtype(f'{name}.weight')}, expected float8_e4m3fn")
        if tuple(source.shape(f"{name}.{SCALE_KEY}")) != (layer.out_features,):
            problems.append(f"{name}.{SCALE_KEY} has shape {tuple(source.shape(f'{name}.{SCALE_KEY}'))}, "
                            f"expected ({layer.out_features},): one scale per output channel")
        if problems:
            raise CheckpointError(weights, "fp8 layer does not match the model: " + "; ".join(problems))


def load_fp8_expert(
    folder: str | Path,
    device: torch.device | str,
    dtype: torch.dtype = COMPUTE_DTYPE,
    blocks_on_gpu: int | None = None,
    quantize: str | None = None,
) -> LingBotDiT:
    """Load a layout-C expert onto ``device`` (eval mode, no gradients), its linears as
    8-bit ``Linear8bit`` layers (or converted to ``quantize``: "bf16", "nf4", "int8").

    ``blocks_on_gpu=K`` keeps only blocks 0..K-1 wholly on ``device`` (CUDA); the other
    blocks' weights live in pinned RAM and stream in during each forward."""
    check_kind(quantize)
    kind = None if quantize == "fp8" else quantize
    folder = require_layout(folder, "fp8")
    config_path = folder / CONFIG_FILE
    config = read_config(folder)
    device = torch.device(device)
    weights = folder / FP8_WEIGHTS_FILE
    resident = resident_blocks(blocks_on_gpu, config.num_layers, device)
    with open_fp8_weights(folder, device) as source, host_view(open_fp8_weights, folder, resident) as host_source:
        keys = source.keys()
        check_block_count(config_path, config, weights, keys)
        config = _control_config(config, source, weights)
        model = build_on_meta(config, config_path)
        present = set(keys)
        scaled = sorted(name for name in linear_layers(model) if f"{name}.{SCALE_KEY}" in present)
        expected = expected_tensors(model)
        check_keys(weights, set(expected) | {f"{name}.{SCALE_KEY}" for name in scaled}, keys)
        check_shapes(config_path, config, model, {k: source.shape(k) for k in keys if not k.endswith(SCALE_KEY)},
                     lambda _key: weights)
        _check_scaled(source, model, scaled, weights)
        eight = {f"{name}.weight" for name in scaled}
        host: dict[str, torch.Tensor] = {}
        if resident is not None:
            def spec(key: str) -> tuple[tuple[int, ...], torch.dtype]:
                if key in eight:
                    return host_spec(kind or "fp8", *source.shape(key), dtype)
                return tuple(expected[key].shape), dtype
            host = host_weights_for(model, resident, spec)
        plain = {k: t for k, t in expected.items() if k not in eight}
        on_device = {k: t for k, t in plain.items() if k not in host}
        materialize(model, weights, list(on_device), source.read, device, float_dtype(dtype), expected=on_device)
        in_host = {k: t for k, t in plain.items() if k in host}
        if in_host:
            materialize(model, weights, list(in_host), lambda key: host[key].copy_(host_source.read(key)),
                        "cpu", float_dtype(dtype), expected=in_host)
        for name in scaled:
            linear = model.get_submodule(name)
            layer: nn.Module = Linear8bit.from_quantized(source.read(f"{name}.weight"),
                                                         source.read(f"{name}.{SCALE_KEY}").float(),
                                                         linear.bias, "fp8", dtype)
            if kind is not None:
                layer = convert_linear(layer, kind, dtype)
            packed_into = host.get(f"{name}.weight")
            if packed_into is not None:
                move_weight_to_host(layer, packed_into, name)
            model.set_submodule(name, layer)
    check_loaded(model, weights)
    if resident is not None:
        BlockSwapper(model, resident, device)
    return model.eval().requires_grad_(False)


# --- writing ------------------------------------------------------------------------------

def fp8_entries(model: nn.Module) -> list[Entry]:
    """The tensors of model_fp8.safetensors for a model of this geometry (a meta model will do)."""
    linears = linear_layers(model)
    in_linears = {f"{name}.{leaf}" for name, layer in linears.items() for leaf, _ in layer.named_parameters()}
    entries = [Entry(k, COMPUTE_DTYPE if t.is_floating_point() else t.dtype, tuple(t.shape))
               for k, t in expected_tensors(model).items() if k not in in_linears]
    for name, layer in linears.items():
        entries.append(Entry(f"{name}.weight", FP8, (layer.out_features, layer.in_features)))
        entries.append(Entry(f"{name}.{SCALE_KEY}", torch.float32, (layer.out_features,)))
        if layer.bias is not None:
            entries.append(Entry(f"{name}.bias", COMPUTE_DTYPE, (layer.out_features,)))
    return entries


def convert_to_fp8(source_folder: str | Path, folder: str | Path, device: torch.device | str = "cpu",
                   progress: Callable[[int, int], None] | None = None) -> Path:
    """Write the expert in ``source_folder`` (any layout of ``LAYOUTS``) into ``folder``
    (created: the caller's temporary folder) as config.json (the source's, unchanged) and
    model_fp8.safetensors (read back and checked). Each linear is built on ``device`` in its
    stored kind, rescaled per output channel into fp8 there, written and dropped; everything
    else is copied as bf16. ``progress(done, total)`` after each tensor group."""
    source_folder, folder = Path(source_folder), Path(folder)
    layout = LAYOUTS[detect_expert_layout(source_folder)]
    config = layout.read_config(source_folder)
    folder.mkdir(parents=True, exist_ok=True)
    device = torch.device(device)
    # The source model, built from its own loader one layer at a time would need the whole
    # model in memory; instead its tensors are read by key. NF4 layers need their quant
    # state, so an NF4 source is loaded (4-bit, ~1/4 of bf16) on the CPU or the device.
    with torch.no_grad():
        meta = build_on_meta(config, source_folder / CONFIG_FILE)
        entries = fp8_entries(meta)
        linears = linear_layers(meta)
        in_linears = {f"{name}.{leaf}" for name, layer in linears.items() for leaf, _ in layer.named_parameters()}
        plain = [e.name for e in entries if e.name not in in_linears and not e.name.endswith(SCALE_KEY)]
        total, done = len(plain) + len(linears), 0
        with SafetensorsWriter(folder / FP8_WEIGHTS_FILE, entries, FILE_METADATA) as writer:
            if layout.name == "bf16":
                with layout.open(source_folder, "cpu") as source:
                    for key in plain:
                        tensor = source.read(key)
                        writer.write(key, (tensor.to(COMPUTE_DTYPE) if tensor.is_floating_point() else tensor)
                                     .contiguous())
                        done += 1
                        if progress:
                            progress(done, total)
                    for name, layer in sorted(linears.items()):
                        weight = source.read(f"{name}.weight").to(device)
                        _write_linear(writer, name, weight, source.read(f"{name}.bias")
                                      if layer.bias is not None else None)
                        done += 1
                        if progress:
                            progress(done, total)
            else:
                model = layout.load(source_folder, device)
                state = expected_tensors(model)
                for key in plain:
                    tensor = state[key].detach()
                    writer.write(key, (tensor.to(COMPUTE_DTYPE) if tensor.is_floating_point() else tensor)
                                 .to("cpu").contiguous())
                for name, layer in sorted(linear_layers(model).items()):
                    _write_linear(writer, name, float_weight(layer), layer.bias)
                del model
                if progress:
                    progress(total, total)
            writer.close()
        writer.verify()
    shutil.copyfile(source_folder / CONFIG_FILE, folder / CONFIG_FILE)
    return folder


def _write_linear(writer: SafetensorsWriter, name: str, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    values, scales = quantize_rows(weight, "fp8")
    writer.write(f"{name}.weight", values.to("cpu").contiguous())
    writer.write(f"{name}.{SCALE_KEY}", scales.to("cpu").contiguous())
    if bias is not None:
        writer.write(f"{name}.bias", bias.detach().to(COMPUTE_DTYPE).to("cpu").contiguous())
