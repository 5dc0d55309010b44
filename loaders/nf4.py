"""NF4 experts (layout A, docs/conventions.md#checkpoint-layouts): every nn.Linear in
bitsandbytes' 4-bit serialization, the rest bf16.

Reading builds the DiT on the meta device and fills it tensor by tensor from the memory map
of ``model.safetensors`` (or a legacy ``model.pt``) straight onto the target device; each
4-bit layer becomes a ``bnb.nn.Linear4bit`` whose weight is made by bitsandbytes'
``Params4bit.from_prequantized`` from that layer's tensors only. Writing quantizes with
bitsandbytes itself and stores what ``Linear4bit.state_dict()`` produces, so any tool that
reads bitsandbytes checkpoints reads ours.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch
from safetensors.torch import save_file
from torch import nn

from ..wan.runtime.block_swap import BlockSwapper, host_weights_for, resident_blocks
from ..wan.runtime.bnb import Linear4bit, Params4bit, unpack_tensor_to_dict
from ..wan.runtime.weights4 import BLOCKSIZE, DOUBLE_QUANT, finish_layer, quantize_linear
from ..wan.runtime.weights4 import packed_shape as nf4_packed_shape
from ..wan.config import CONTROL_WEIGHT, DiTConfig
from ..wan.model import LingBotDiT
from .dit_weights import (build_on_meta, check_block_count, check_shapes, config_with_control, float_dtype,
                          linear_layers)
from .errors import CheckpointError
from .json_file import read_json_object
from .new_file import new_file, write_json
from .layout import (
    CONFIG_FILE,
    NF4_LEGACY_WEIGHTS_FILE,
    NF4_META_FILE,
    NF4_WEIGHTS_FILE,
    read_config,
    require_layout,
    write_config,
)
from .state_dict import check_keys, check_loaded, expected_tensors, materialize
from .tensor_source import SafetensorsSource, TensorSource, TorchFileSource, host_view
from .weight_kind import check_kind, convert_linear, host_bytes, host_spec, move_weight_to_host

NF4_FORMAT = "bnb_nf4"
VALID_BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)  # what bitsandbytes accepts
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}

# Per 4-bit layer, the keys bitsandbytes writes after "<layer>." (docs/conventions.md#checkpoint-layouts).
QUANT_STATE_KEY = "weight.quant_state.bitsandbytes__nf4"
QUANT_KEYS = ("weight", "weight.absmax", "weight.quant_map", QUANT_STATE_KEY)
NESTED_QUANT_KEYS = ("weight.nested_absmax", "weight.nested_quant_map")
_FP4_STATE_KEY = "weight.quant_state.bitsandbytes__fp4"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def as_dtype(value: torch.dtype | str | None) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    if value not in DTYPES:
        raise ValueError(f"compute dtype {value!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[value]


# --- quantization_meta.json ---------------------------------------------------------------

@dataclass(frozen=True)
class NF4Meta:
    blocksize: int = BLOCKSIZE
    double_quant: bool = DOUBLE_QUANT
    compute_dtype: torch.dtype = torch.bfloat16
    extra: Mapping[str, Any] = field(default_factory=dict)  # provenance, kept as written

    def to_json(self) -> dict[str, Any]:
        core = {
            "format": NF4_FORMAT,
            "double_quant": self.double_quant,
            "compute_dtype": _dtype_name(self.compute_dtype),
            "blocksize": self.blocksize,
        }
        clash = sorted(set(self.extra) & set(core))
        if clash:
            raise ValueError(f"provenance may not set {', '.join(clash)}: they describe the quantization itself")
        return {**core, **self.extra}


def read_quantization_meta(folder: str | Path) -> NF4Meta:
    """Parse and validate ``quantization_meta.json``; errors name the field at fault."""
    path = Path(folder) / NF4_META_FILE
    data = read_json_object(path, "an NF4 expert folder needs it next to model.safetensors")
    for name in ("format", "blocksize", "double_quant"):
        if name not in data:
            raise CheckpointError(path, f"field {name!r} is missing")
    if data["format"] != NF4_FORMAT:
        raise CheckpointError(path, f"field 'format' is {data['format']!r}; only {NF4_FORMAT!r} is supported")
    blocksize = data["blocksize"]
    if isinstance(blocksize, bool) or blocksize not in VALID_BLOCKSIZES:
        raise CheckpointError(path, f"field 'blocksize' is {blocksize!r}; bitsandbytes uses one of {VALID_BLOCKSIZES}")
    if not isinstance(data["double_quant"], bool):
        raise CheckpointError(path, f"field 'double_quant' is {data['double_quant']!r}; expected true or false")
    compute = data.get("compute_dtype", "bfloat16")
    if compute not in DTYPES:
        raise CheckpointError(path, f"field 'compute_dtype' is {compute!r}; expected one of {', '.join(DTYPES)}")
    extra = {k: v for k, v in data.items() if k not in ("format", "blocksize", "double_quant", "compute_dtype")}
    return NF4Meta(blocksize=blocksize, double_quant=data["double_quant"], compute_dtype=DTYPES[compute], extra=extra)


def write_nf4_files(
    folder: str | Path,
    config: DiTConfig,
    tensors: dict[str, torch.Tensor],
    meta: NF4Meta,
    config_fields: Mapping[str, Any] | None = None,
) -> Path:
    """Write model.safetensors (atomically), config.json and quantization_meta.json;
    ``config_fields``: config.json as given (``layout.write_config``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with new_file(folder / NF4_WEIGHTS_FILE) as partial:
        save_file(tensors, str(partial), metadata={"format": "pt"})
    write_config(folder, config, config_fields)
    write_json(folder / NF4_META_FILE, meta.to_json())
    return folder


# --- quantizing ---------------------------------------------------------------------------

def _check_layer_settings(name: str, layer: Linear4bit, blocksize: int, double_quant: bool) -> None:
    state = layer.weight.quant_state
    if state is None or state.quant_type != "nf4":
        raise ValueError(f"{name} is not an NF4 layer (quant type {getattr(state, 'quant_type', None)})")
    nested = bool(getattr(state, "original_nested", state.nested))
    if state.blocksize != blocksize or nested != double_quant:
        raise ValueError(
            f"{name} is quantized with blocksize={state.blocksize}, double_quant={nested}; "
            f"the file is being written with blocksize={blocksize}, double_quant={double_quant}"
        )


def _cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu").contiguous()


def nf4_tensors(
    module: nn.Module,
    prefix: str = "",
    blocksize: int = BLOCKSIZE,
    double_quant: bool = DOUBLE_QUANT,
    compute_dtype: torch.dtype = torch.bfloat16,
    plain_dtype: torch.dtype = torch.bfloat16,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Layout-A tensors of ``module`` (CPU), one layer at a time.

    Plain nn.Linear layers are quantized on the fly; Linear4bit layers are written as they
    are; other parameters and persistent buffers become ``plain_dtype`` (floats only).
    """
    if isinstance(module, Linear4bit):
        _check_layer_settings(prefix.rstrip(".") or "layer", module, blocksize, double_quant)
        for key, value in module.state_dict().items():  # bitsandbytes' own serialization
            yield prefix + key, _cpu(value.to(plain_dtype) if key == "bias" else value)
        return
    if isinstance(module, nn.Linear):
        yield from nf4_tensors(quantize_linear(module, blocksize, double_quant, compute_dtype), prefix,
                               blocksize, double_quant, compute_dtype, plain_dtype)
        return
    for name, param in module.named_parameters(recurse=False):
        yield prefix + name, _cpu(param.to(plain_dtype) if param.is_floating_point() else param)
    for name, buffer in module.named_buffers(recurse=False):
        if name not in module._non_persistent_buffers_set:
            yield prefix + name, _cpu(buffer.to(plain_dtype) if buffer.is_floating_point() else buffer)
    for name, child in module.named_children():
        yield from nf4_tensors(child, f"{prefix}{name}.", blocksize, double_quant, compute_dtype, plain_dtype)


# --- loading ------------------------------------------------------------------------------

def open_nf4_weights(folder: Path, device: torch.device | str) -> TensorSource:
    """model.safetensors when present, else the legacy model.pt, as a one-tensor-at-a-time source."""
    if (folder / NF4_WEIGHTS_FILE).is_file():
        return SafetensorsSource([folder / NF4_WEIGHTS_FILE], device)
    return TorchFileSource(folder / NF4_LEGACY_WEIGHTS_FILE, device)


def _stored_bytes(shape: tuple[int, ...], dtype: torch.dtype | None, float_size: int) -> int:
    """Size once loaded as stored: floats in the compute dtype, packed 4-bit bytes as they are."""
    size = float_size if dtype is None or dtype.is_floating_point else dtype.itemsize
    return math.prod(shape) * size


def nf4_linear_weight_bytes(source: TensorSource, key: str) -> int:
    """Bytes a stored linear weight (packed 4-bit, or a float kept as it is) takes in the file."""
    return math.prod(source.shape(key)) * (source.dtype(key) or torch.uint8).itemsize


def nf4_host_weight_bytes(folder: Path, shapes: Mapping[str, tuple[int, int]], quantize: str | None) -> int:
    """Pinned bytes of these linear weights (logical [out, in] shapes) under block swap, held
    as ``quantize`` (None or "nf4": as stored)."""
    if quantize not in (None, "nf4"):
        return sum(host_bytes(quantize, *shape) for shape in shapes.values())
    float_size = read_quantization_meta(folder).compute_dtype.itemsize
    with open_nf4_weights(Path(folder), "cpu") as source:
        return sum(_stored_bytes(source.shape(k), source.dtype(k), float_size) for k in shapes)


def _quantized_layer_names(source: TensorSource, model: nn.Module, weights: Path) -> list[str]:
    """Names of the linear layers that the file stores in 4 bits."""
    keys = source.keys()
    fp4 = [k for k in keys if k.endswith("." + _FP4_STATE_KEY)]
    if fp4:
        raise CheckpointError(weights, f"layer {fp4[0][: -len(_FP4_STATE_KEY) - 1]} is stored as FP4; "
                                       f"only NF4 ({NF4_FORMAT}) is supported")
    marker_suffixes = ("." + QUANT_STATE_KEY, ".weight.absmax")
    names = {k[: -len(s)] for k in keys for s in marker_suffixes if k.endswith(s)}
    linears = linear_layers(model)
    # Names that are not linear layers of the model show up as unexpected keys later.
    return sorted(n for n in names if n in linears)


def _expected_keys(model: nn.Module, quantized: list[str], double_quant: bool) -> set[str]:
    expected = set(expected_tensors(model))
    suffixes = QUANT_KEYS + (NESTED_QUANT_KEYS if double_quant else ())
    for name in quantized:
        expected.update(f"{name}.{s}" for s in suffixes)
    return expected


def _read_quant_info(source: TensorSource, name: str, weights: Path, meta: NF4Meta, meta_path: Path) -> dict:
    """The non-tensor part of a layer's quant state (JSON packed into a uint8 tensor), validated."""
    key = f"{name}.{QUANT_STATE_KEY}"
    try:
        info = unpack_tensor_to_dict(source.read(key))
    except Exception as exc:
        raise CheckpointError(weights, f"quant state {key!r} is not readable ({exc}); the file is corrupt") from exc
    shape = info.get("shape") if isinstance(info, dict) else None
    if not isinstance(shape, list) or len(shape) != 2 or not all(isinstance(v, int) and v > 0 for v in shape):
        raise CheckpointError(weights, f"quant state {key!r} has no valid 2-D 'shape' ({shape!r}); the file is corrupt")
    if info.get("quant_type") != "nf4" or info.get("dtype") not in DTYPES:
        raise CheckpointError(
            weights, f"quant state {key!r} says quant_type={info.get('quant_type')!r}, dtype={info.get('dtype')!r}; "
                     "expected nf4 with a float dtype")
    if info.get("blocksize") != meta.blocksize:
        raise CheckpointError(meta_path, f"says blocksize={meta.blocksize} but layer {name} in {weights} "
                                         f"uses blocksize {info.get('blocksize')}")
    if ("nested_blocksize" in info) != meta.double_quant:
        raise CheckpointError(meta_path, f"says double_quant={str(meta.double_quant).lower()} but layer {name} in "
                                         f"{weights} is stored {'with' if 'nested_blocksize' in info else 'without'} "
                                         "double quantization")
    return info


def _control_config(config: DiTConfig, source: TensorSource, weights: Path, meta: NF4Meta,
                    meta_path: Path) -> DiTConfig:
    """``config`` with the control type of the stored control weight. Stored in 4 bits, its
    tensor is the packed bytes [n, 1]: the original [dim, in_features] is the quant state's
    "shape" (the small JSON tensor bitsandbytes writes beside it)."""
    name = CONTROL_WEIGHT[: -len(".weight")]
    keys = set(source.keys())
    if f"{name}.{QUANT_STATE_KEY}" in keys:
        shape = _read_quant_info(source, name, weights, meta, meta_path)["shape"]
    elif CONTROL_WEIGHT in keys:  # kept unquantized
        shape = source.shape(CONTROL_WEIGHT)
    else:
        return config
    return config_with_control(config, shape, weights)


def read_nf4_config(folder: str | Path) -> DiTConfig:
    """config.json of a layout-A expert, with ``control_type`` (Base-Cam or Act) read off the
    weights file: its header and one layer's quant state, nothing else."""
    folder = require_layout(folder, "nf4")
    meta = read_quantization_meta(folder)
    config = read_config(folder)
    weights = folder / NF4_WEIGHTS_FILE
    if not weights.is_file():
        weights = folder / NF4_LEGACY_WEIGHTS_FILE
    with open_nf4_weights(folder, "cpu") as source:
        return _control_config(config, source, weights, meta, folder / NF4_META_FILE)


def _check_packed_sizes(source: TensorSource, name: str, info: dict, weights: Path) -> None:
    """The packed tensors of a layer must be as large as its quant state says."""
    out_features, in_features = info["shape"]
    values = out_features * in_features
    packed_bits = math.prod(source.shape(f"{name}.weight")) * (source.dtype(f"{name}.weight") or torch.uint8).itemsize * 8
    blocks = math.ceil(values / info["blocksize"])
    wanted = {"weight.absmax": blocks, "weight.quant_map": 16}
    if "nested_blocksize" in info:
        wanted["weight.nested_absmax"] = math.ceil(blocks / info["nested_blocksize"])
        wanted["weight.nested_quant_map"] = 256
    problems = [] if packed_bits >= 4 * values else [f"{name}.weight holds {packed_bits // 8} bytes, "
                                                       f"{math.ceil(values / 2)} needed for shape {tuple(info['shape'])}"]
    for suffix, count in wanted.items():
        found = math.prod(source.shape(f"{name}.{suffix}"))
        if found != count:
            problems.append(f"{name}.{suffix} has {found} values, {count} expected")
    if problems:
        raise CheckpointError(weights, "4-bit layer does not match its own quant state: " + "; ".join(problems))


def _linear4bit_from_file(
    linear: nn.Linear, name: str, source: TensorSource, info: dict, device: torch.device, compute_dtype: torch.dtype,
    packed_into: torch.Tensor | None = None,
) -> Linear4bit:
    """A Linear4bit with no meta tensors, its weight built by bitsandbytes from this layer's tensors.

    With ``packed_into`` (a host tensor, for block swap) the packed weight is copied there
    and stays in host memory; the quant state still goes to ``device``. ``source`` should
    then give CPU tensors, so nothing takes a detour through the GPU.
    """
    nested = "nested_blocksize" in info
    layer = Linear4bit(
        linear.in_features, linear.out_features, bias=linear.bias is not None, compute_dtype=compute_dtype,
        compress_statistics=nested, quant_type="nf4", device="meta",
    )
    suffixes = ("absmax", "quant_map") + (("nested_absmax", "nested_quant_map") if nested else ())
    try:
        stats = {**info, **{s: source.read(f"{name}.weight.{s}") for s in suffixes}}
        packed = source.read(f"{name}.weight")
    except Exception as exc:
        raise CheckpointError(source.file_of(f"{name}.weight"),
                              f"cannot read 4-bit layer {name} ({exc}); the file may be truncated or corrupt") from exc
    if packed_into is None:
        layer.weight = Params4bit.from_prequantized(packed, stats, requires_grad=False, device=device, module=layer)
    else:
        if tuple(packed.shape) != tuple(packed_into.shape):
            raise CheckpointError(source.file_of(f"{name}.weight"), f"{name}.weight has shape {tuple(packed.shape)}, "
                                                                    f"expected {tuple(packed_into.shape)}")
        packed_into.copy_(packed)
        layer.weight = Params4bit.from_prequantized(packed_into, stats, requires_grad=False,
                                                    device=packed_into.device, module=layer)
        layer.weight.quant_state.to(device)  # in place: the layer's own quant_state is this object
    if linear.bias is not None:
        layer.bias = linear.bias  # already on the device, in compute dtype
    return finish_layer(layer, info["blocksize"])


def load_nf4_expert(
    folder: str | Path,
    device: torch.device | str,
    compute_dtype: torch.dtype | str | None = None,
    blocks_on_gpu: int | None = None,
    quantize: str | None = None,
) -> LingBotDiT:
    """Load an NF4 expert folder onto ``device`` (eval mode, no gradients).

    ``quantize``: the weight kind the 4-bit linears are held in once loaded (None or "nf4":
    as stored; "bf16", "fp8", "int8": each layer converted on the device as it is built,
    ``loaders.weight_kind``).

    ``compute_dtype`` (default: the one in quantization_meta.json) is the dtype of the 4-bit
    matmuls and of every non-quantized tensor. Nothing is loaded before the whole file has
    been checked against config.json from its header.

    ``blocks_on_gpu=K`` keeps only blocks 0..K-1 wholly on ``device`` (CUDA): the linear weights
    of the other blocks go from the memory map straight into pinned RAM, never through the
    GPU, and a ``wan.runtime.block_swap.BlockSwapper`` streams them in during each forward. None (or
    K >= num_layers) keeps everything on the device; on a CPU device it is ignored.
    """
    check_kind(quantize)
    kind = None if quantize == "nf4" else quantize
    folder = require_layout(folder, "nf4")
    meta = read_quantization_meta(folder)
    config_path = folder / CONFIG_FILE
    config = read_config(folder)
    dtype = as_dtype(compute_dtype) or meta.compute_dtype
    device = torch.device(device)
    weights = folder / NF4_WEIGHTS_FILE
    if not weights.is_file():
        weights = folder / NF4_LEGACY_WEIGHTS_FILE
    resident = resident_blocks(blocks_on_gpu, config.num_layers, device)
    with open_nf4_weights(folder, device) as source, host_view(open_nf4_weights, folder, resident) as host_source:
        keys = source.keys()
        check_block_count(config_path, config, weights, keys)  # config against the header, before building
        config = _control_config(config, source, weights, meta, folder / NF4_META_FILE)  # Base-Cam or Act
        model = build_on_meta(config, config_path)
        quantized = _quantized_layer_names(source, model, weights)
        # Quant states first: a blocksize or double-quant disagreement with quantization_meta.json
        # deserves its own message rather than a list of odd keys.
        present = set(keys)
        infos = {
            name: _read_quant_info(source, name, weights, meta, folder / NF4_META_FILE)
            for name in quantized if f"{name}.{QUANT_STATE_KEY}" in present
        }
        check_keys(weights, _expected_keys(model, quantized, meta.double_quant), keys)
        quant_keys = {f"{name}.{s}" for name in quantized for s in QUANT_KEYS + NESTED_QUANT_KEYS}
        stored = {k: source.shape(k) for k in keys if k not in quant_keys}
        stored.update({f"{name}.weight": tuple(info["shape"]) for name, info in infos.items()})
        check_shapes(config_path, config, model, stored, lambda _key: weights)
        for name, info in infos.items():
            _check_packed_sizes(source, name, info, weights)

        packed_weights = {f"{name}.weight" for name in quantized}
        host: dict[str, torch.Tensor] = {}
        if resident is not None:
            def spec(key: str) -> tuple[tuple[int, ...], torch.dtype]:
                if key in packed_weights and kind is not None:  # converted: its bytes go to RAM
                    return host_spec(kind, *infos[key[: -len(".weight")]]["shape"], dtype)
                if key in packed_weights:
                    return source.shape(key), source.dtype(key) or torch.uint8
                return source.shape(key), dtype
            host = host_weights_for(model, resident, spec)
        plain = {k: t for k, t in expected_tensors(model).items() if k not in packed_weights}
        on_device = {k: t for k, t in plain.items() if k not in host}
        materialize(model, weights, list(on_device), source.read, device, float_dtype(dtype), expected=on_device)
        in_host = {k: t for k, t in plain.items() if k in host}
        if in_host:
            materialize(model, weights, list(in_host), lambda key: host[key].copy_(host_source.read(key)),
                        "cpu", float_dtype(dtype), expected=in_host)
        for name in quantized:
            packed_into = host.get(f"{name}.weight")
            if kind is not None:  # built on the device, converted, then (block swap) moved out
                layer = convert_linear(_linear4bit_from_file(model.get_submodule(name), name, source, infos[name],
                                                             device, dtype), kind, dtype)
                if packed_into is not None:
                    move_weight_to_host(layer, packed_into, name)
            else:
                layer = _linear4bit_from_file(model.get_submodule(name), name,
                                              source if packed_into is None else host_source,
                                              infos[name], device, dtype, packed_into)
            model.set_submodule(name, layer)
    check_loaded(model, weights)
    if resident is not None:
        BlockSwapper(model, resident, device)
    return model.eval().requires_grad_(False)
