"""A linear layer's weight as one dense matrix, reused across the token chunks of a block.

The DiT runs its per-token work in chunks (see ``model.TOKEN_CHUNK``). Calling a
bitsandbytes ``Linear4bit`` once per chunk dequantizes its whole weight once per chunk;
at 480x832x81 that is ~100 dequantize kernels per block. ``dense`` dequantizes once per
block and sub-layer, and ``Dense.__call__`` writes the product straight into a slice of
a preallocated buffer (``torch.addmm(..., out=)``), which saves the copy a chunked
``layer(x)`` followed by ``buffer[s:e] = ...`` costs.

A LoRA attached to the layer (``wan.runtime.lora.attach_lora``) is added to the dense copy here
(``W + scale * B A``), never to the layer's own weight.

Only ``dense`` knows about 4-bit weights; it imports bitsandbytes lazily, and only for a
weight that carries a bitsandbytes quant state (so bitsandbytes is installed).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .lora import add_lora_delta


@dataclass
class Dense:
    """weight [out, in] and bias [out] in the layer's compute dtype."""

    weight: torch.Tensor
    bias: torch.Tensor | None

    @property
    def dtype(self) -> torch.dtype:
        return self.weight.dtype

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None, gelu: bool = False) -> torch.Tensor:
        """x [..., in] -> [..., out] (in ``out`` when given: same shape, contiguous).

        ``gelu``: tanh-approximated GELU applied to the result; on CUDA in the matmul's
        cuBLASLt epilogue (one pass fewer over the FFN's widest activation). PyTorch's
        CPU ``_addmm_activation`` uses the erf GELU instead, so the CPU keeps two steps."""
        x = x.to(self.dtype)
        lead = x.shape[:-1]
        x2d = x.reshape(-1, x.shape[-1])
        if gelu:
            if out is not None:
                raise ValueError("Dense: gelu and out cannot be combined")
            if x2d.is_cuda and self.bias is not None and hasattr(torch, "_addmm_activation"):
                y = torch._addmm_activation(self.bias, x2d, self.weight.t(), use_gelu=True)
            else:
                y = F.gelu(F.linear(x2d, self.weight, self.bias), approximate="tanh")
            return y.reshape(*lead, -1)
        if out is None:
            return F.linear(x, self.weight, self.bias)
        target = out.view(-1, out.shape[-1])
        if self.bias is None:
            torch.mm(x2d, self.weight.t(), out=target)
        else:
            torch.addmm(self.bias, x2d, self.weight.t(), out=target)
        return out


def dense(layer: nn.Module) -> Dense:
    """The weight and bias of an ``nn.Linear`` (or bitsandbytes ``Linear4bit``) for reuse.

    A plain layer's own tensors are returned (no copy); a 4-bit weight is dequantized
    once into its compute dtype. Callers drop the result when the sub-layer is done."""
    weight = layer.weight
    quant_state = getattr(weight, "quant_state", None)
    if quant_state is not None:
        from .bnb import bnb

        bnb_functional = bnb.functional

        data = weight.data
        if getattr(quant_state, "packing_format_for_cpu", False):
            # The layer's own CPU forward repacked the weight for bitsandbytes' AVX512 kernel;
            # dequantize a copy in the standard layout (the layer is left as it is).
            data, quant_state = bnb_functional._convert_weight_packed_for_cpu_inverse(data, quant_state)
        matrix = bnb_functional.dequantize_4bit(data, quant_state)
        dtype = getattr(layer, "compute_dtype", None) or matrix.dtype
        matrix = matrix.to(dtype)
    else:
        matrix = weight.detach()  # inference only; out= products refuse autograd inputs
        dtype = weight.dtype
    matrix = add_lora_delta(layer, matrix)  # a new tensor when adapters hang on the layer
    bias = layer.bias
    return Dense(matrix, None if bias is None else bias.detach().to(dtype))
