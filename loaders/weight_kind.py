"""Turn a loaded linear layer into another weight kind while an expert loads.

The weight kinds are the rows of ``wan/runtime/dense.py`` ``GEMM_KINDS`` (bf16, nf4, fp8,
int8), and everything here goes through the row: a loader that is asked for another kind
than the one its file stores converts each linear layer the moment it is built, one layer at
a time on the target device, so the peak stays one layer above the finished model: through
the float weight (the held kind's ``float_weight``) into the wanted kind (its ``make``);
block swap keeps each weight in pinned RAM as the row's ``host_weight`` says.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..wan.runtime.dense import GEMM_KINDS, gemm_kind

WEIGHT_KINDS = tuple(GEMM_KINDS)  # bf16, nf4, fp8, int8


def check_kind(kind: str | None, what: str = "quantize") -> str | None:
    """``kind`` itself (None: as stored), or ValueError naming the choices."""
    if kind is not None and kind not in GEMM_KINDS:
        raise ValueError(f"{what}={kind!r}: the weight kind must be None (as stored) or one of {', '.join(GEMM_KINDS)}")
    return kind


def float_weight(layer: nn.Module) -> torch.Tensor:
    """The layer's weight [out, in] as floats, whatever kind it holds."""
    return gemm_kind(layer).float_weight(layer)


def linear_around(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    """An nn.Linear around existing tensors (no allocation, no reference to any model)."""
    out_features, in_features = weight.shape
    with torch.device("meta"):
        linear = nn.Linear(in_features, out_features, bias=bias is not None)
    linear.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        linear.bias = nn.Parameter(bias, requires_grad=False)
    return linear


def convert_linear(layer: nn.Module, kind: str, dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    """``layer`` holding kind ``kind`` (the layer itself when it already does), computing in
    ``dtype``, on the device its weight is on."""
    check_kind(kind)
    if gemm_kind(layer).name == kind:
        return layer
    bias = None if layer.bias is None else layer.bias.detach().to(dtype)
    linear = linear_around(float_weight(layer).to(dtype), bias)
    return GEMM_KINDS[kind].make(linear, dtype)


def host_spec(kind: str, out_features: int, in_features: int,
              dtype: torch.dtype = torch.bfloat16) -> tuple[tuple[int, ...], torch.dtype]:
    """(shape, dtype) of a linear weight of kind ``kind`` as block swap keeps it in pinned RAM."""
    return GEMM_KINDS[kind].host_weight(out_features, in_features, dtype)


def host_bytes(kind: str, out_features: int, in_features: int, dtype: torch.dtype = torch.bfloat16) -> int:
    """Pinned bytes of one such weight (``host_spec``'s size)."""
    shape, stored = host_spec(kind, out_features, in_features, dtype)
    return math.prod(shape) * stored.itemsize


def move_weight_to_host(layer: nn.Module, host: torch.Tensor, name: str) -> None:
    """Put a freshly built layer's weight into ``host`` (pinned RAM, for block swap); its
    scales or quant state stay on the device."""
    data = layer.weight.data
    if tuple(data.shape) != tuple(host.shape) or data.dtype != host.dtype:
        raise RuntimeError(f"{name}: the weight was built as {tuple(data.shape)} {data.dtype}, block swap expected "
                           f"{tuple(host.shape)} {host.dtype}; this bitsandbytes version is not supported with "
                           "block swap")
    host.copy_(data)
    layer.weight.data = host
