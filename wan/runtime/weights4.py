"""4-bit NF4 linear weights, held by bitsandbytes' ``Linear4bit``: the math of ``dense.py``'s
``nf4`` row.

A float layer becomes NF4 with the package's settings (blocks of 64 values, the absmax of
each block quantized again: double quantization); its packed weight is one uint8 tensor
[out * in / 2, 1] (two values a byte) with the quant state beside it; a block dequantizes it
once into the compute dtype. bitsandbytes is imported here only when a layer is made or read
(``wan/runtime/bnb.py``), so a pack without it runs every other kind.
"""
from __future__ import annotations

import torch
from torch import nn

BLOCKSIZE = 64  # the package's (and the community NF4 package's) quantization block
DOUBLE_QUANT = True
BYTES_PER_WEIGHT = 0.5 + 1 / 64  # 4 bits a weight plus one 8-bit absmax per 64 (double quant)
# bitsandbytes repacks a 4-bit weight for its AVX512-BF16 CPU kernel on the first eval-mode
# forward; that repacking assumes in_features divisible by the blocksize and out_features by
# 32 and crashes otherwise (small layers of test geometries). Such layers keep the generic path.
_CPU_REPACK_OUT_MULTIPLE = 32


def finish_layer(layer: nn.Module, blocksize: int) -> nn.Module:
    """A freshly built ``Linear4bit`` made ready for inference (made here or read from a file)."""
    if layer.in_features % blocksize or layer.out_features % _CPU_REPACK_OUT_MULTIPLE:
        layer.support_avx512bf16_for_cpu = False
    # Params4bit.module points back at the layer: a reference cycle that keeps a dropped
    # model's (GPU) memory alive until the garbage collector runs. The link only serves
    # quantization, which is done; bitsandbytes' own Params4bit.to() leaves it unset too.
    layer.weight.module = None
    return layer


def quantize_linear(linear: nn.Linear, blocksize: int = BLOCKSIZE, double_quant: bool = DOUBLE_QUANT,
                    compute_dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    """A new NF4 ``Linear4bit`` holding ``linear``'s weights, quantized on their own device.

    bitsandbytes does the quantization (``Params4bit.to(device)``); the weight is cast to
    ``compute_dtype`` first, which is also the dtype the layer dequantizes to.
    """
    from .bnb import Linear4bit, Params4bit

    weight = linear.weight.detach()
    if weight.is_meta:
        raise ValueError("cannot quantize a layer that is still on the meta device")
    layer = Linear4bit(
        linear.in_features, linear.out_features, bias=linear.bias is not None, compute_dtype=compute_dtype,
        compress_statistics=double_quant, quant_type="nf4", device="meta",
    )
    param = Params4bit(
        weight.to(compute_dtype), requires_grad=False, blocksize=blocksize,
        compress_statistics=double_quant, quant_type="nf4", module=layer,
    )
    layer.weight = param.to(weight.device)
    if linear.bias is not None:
        layer.bias = nn.Parameter(linear.bias.detach().to(compute_dtype), requires_grad=False)
    return finish_layer(layer, blocksize)


def packed_shape(out_features: int, in_features: int) -> tuple[int, int]:
    """Shape of the uint8 tensor bitsandbytes packs an [out, in] NF4 weight into (two values a byte)."""
    return ((out_features * in_features + 1) // 2, 1)


def holds_nf4(layer: nn.Module) -> bool:
    """The layer's weight carries a bitsandbytes quant state (so bitsandbytes is installed)."""
    return getattr(layer.weight, "quant_state", None) is not None


def dequantize(layer: nn.Module) -> torch.Tensor:
    """The layer's NF4 weight [out, in] as floats in its compute dtype."""
    from .bnb import bnb

    weight = layer.weight
    data, quant_state = weight.data, weight.quant_state
    if getattr(quant_state, "packing_format_for_cpu", False):
        # The layer's own CPU forward repacked the weight for bitsandbytes' AVX512 kernel;
        # dequantize a copy in the standard layout (the layer is left as it is).
        data, quant_state = bnb.functional._convert_weight_packed_for_cpu_inverse(data, quant_state)
    matrix = bnb.functional.dequantize_4bit(data, quant_state)
    return matrix.to(getattr(layer, "compute_dtype", None) or matrix.dtype)


__all__ = ["BLOCKSIZE", "BYTES_PER_WEIGHT", "DOUBLE_QUANT", "dequantize", "finish_layer", "holds_nf4",
           "packed_shape", "quantize_linear"]
