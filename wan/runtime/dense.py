"""A linear layer's weight as one dense matrix, reused across the token chunks of a block.

The DiT runs its per-token work in chunks (see ``model.TOKEN_CHUNK``). Calling a
bitsandbytes ``Linear4bit`` once per chunk dequantizes its whole weight once per chunk;
at 480x832x81 that is ~100 dequantize kernels per block. ``dense`` dequantizes once per
block and sub-layer, and ``Dense.__call__`` writes the product straight into a slice of
a preallocated buffer (``torch.addmm(..., out=)``), which saves the copy a chunked
``layer(x)`` followed by ``buffer[s:e] = ...`` costs.

A LoRA attached to the layer (``wan.runtime.lora.attach_lora``) is added to the dense copy here
(``W + scale * B A``), never to the layer's own weight.

``GEMM_KINDS`` is the table of weight kinds a linear layer may hold and how each multiplies
(the place to add one, its math in a module of its own): bf16 (a plain floating-point
weight), NF4 (``wan.runtime.weights4``: bitsandbytes, dequantized once per block), fp8 and
int8 (``wan.runtime.weights8``: 8-bit × 8-bit products with per-token activation scales).
``dense(layer)`` picks the row by what the layer holds; the loaders convert a layer to a
kind, and size what block swap keeps of it, through the row alone (``loaders/weight_kind.py``).
Only the NF4 row knows about bitsandbytes; it imports it lazily, and only for a weight that
carries a bitsandbytes quant state (so bitsandbytes is installed).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import weights4
from .lora import LORA_ATTR, add_lora_delta
from .weights8 import Linear8bit, QuantizedRows, fp8_linear, int8_linear, kind_of_dtype, quantize_once, storage_dtype


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


@dataclass
class Dense8:
    """An 8-bit weight [out, in] (fp8 or int8) with its per-channel scales, ready for the
    8-bit GEMM; LoRA adapters on the layer are added beside the product (``x Aᵀ Bᵀ · s``),
    never into the 8-bit weight. Called as ``Dense`` is."""

    weight: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor | None
    kind: str
    dtype: torch.dtype
    adapters: tuple = ()

    def _product(self, x2d: "torch.Tensor | QuantizedRows") -> torch.Tensor:
        y = GEMM_KINDS[self.kind].product(x2d, self.weight, self.scale, self.bias, self.dtype)
        plain = x2d.x if isinstance(x2d, QuantizedRows) else x2d
        for f in self.adapters:
            down, up = f.down.to(plain.device, self.dtype), f.up.to(plain.device, self.dtype)
            y = torch.addmm(y, plain.to(self.dtype) @ down.t(), up.t(), alpha=f.scale)
        return y

    def __call__(self, x: "torch.Tensor | QuantizedRows", out: torch.Tensor | None = None,
                 gelu: bool = False) -> torch.Tensor:
        """As ``Dense.__call__``; ``x`` may also be ``QuantizedRows`` (``shared_input``)."""
        if gelu and out is not None:
            raise ValueError("Dense: gelu and out cannot be combined")
        lead = x.shape[:-1]
        x2d = x if isinstance(x, QuantizedRows) else x.reshape(-1, x.shape[-1])
        if out is not None and not self.adapters and out.is_contiguous() and out.dtype == self.dtype:
            # The product writes into out's rows (the fp8 kernel itself: no product tensor and copy).
            GEMM_KINDS[self.kind].product(x2d, self.weight, self.scale, self.bias, self.dtype,
                                          out=out.view(-1, out.shape[-1]))
            return out
        y = self._product(x2d)
        if gelu:
            y = F.gelu(y, approximate="tanh")
        if out is None:
            return y.reshape(*lead, -1)
        out.view(-1, out.shape[-1]).copy_(y)
        return out


def _dense_plain(layer: nn.Module) -> Dense:
    weight = layer.weight
    matrix = add_lora_delta(layer, weight.detach())  # inference only; out= products refuse autograd inputs
    bias = layer.bias
    return Dense(matrix, None if bias is None else bias.detach().to(weight.dtype))


def _dense_nf4(layer: nn.Module) -> Dense:
    matrix = weights4.dequantize(layer)
    matrix = add_lora_delta(layer, matrix)  # a new tensor when adapters hang on the layer
    bias = layer.bias
    return Dense(matrix, None if bias is None else bias.detach().to(matrix.dtype))


def _dense_8bit(layer: nn.Module) -> Dense8:
    weight = layer.weight.detach()
    kind = kind_of_dtype(weight.dtype)
    assert kind is not None
    dtype = getattr(layer, "compute_dtype", None) or torch.bfloat16
    bias = layer.bias
    scale = layer.weight_scale.to(weight.device, torch.float32)  # once per block, not per product
    return Dense8(weight, scale, None if bias is None else bias.detach().to(dtype), kind, dtype,
                  tuple(getattr(layer, LORA_ATTR, ())))


def _make_8bit(kind: str) -> Callable[[nn.Module, torch.dtype], nn.Module]:
    def make(layer: nn.Module, dtype: torch.dtype) -> nn.Module:
        bias = layer.bias
        return Linear8bit.from_weight(layer.weight.detach(), None if bias is None else bias.detach(), kind, dtype)
    return make


def _make_plain(layer: nn.Module, dtype: torch.dtype) -> nn.Module:
    linear = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None, device="meta")
    linear.weight = nn.Parameter(layer.weight.detach().to(dtype), requires_grad=False)
    if layer.bias is not None:
        linear.bias = nn.Parameter(layer.bias.detach().to(dtype), requires_grad=False)
    return linear


def _make_nf4(layer: nn.Module, dtype: torch.dtype) -> nn.Module:
    return weights4.quantize_linear(layer, compute_dtype=dtype)  # the package's blocksize and double quant


# (out, in, compute dtype) -> (shape, dtype) of the weight tensor block swap keeps in pinned RAM.
HostWeight = Callable[[int, int, torch.dtype], tuple[tuple[int, ...], torch.dtype]]


def _host_8bit(kind: str) -> HostWeight:
    return lambda out_f, in_f, dtype: ((out_f, in_f), storage_dtype(kind))


@dataclass(frozen=True)
class GemmKind:
    """One weight kind a linear layer can hold: how to recognise it, how its product runs,
    where it can run, what it occupies (on the device and under block swap in pinned RAM),
    how to make it from a floating-point layer and back."""

    name: str
    holds: Callable[[nn.Module], bool]  # the layer holds this kind of weight
    build: Callable[[nn.Module], "Dense | Dense8"]  # the reusable product for one block
    weight_bytes: Callable[[int, int], int]  # bytes of an [out, in] weight once loaded
    host_weight: HostWeight  # the weight tensor block swap keeps in pinned RAM
    float_weight: Callable[[nn.Module], torch.Tensor]  # the layer's weight [out, in] as floats
    # From a floating-point layer (any nn.Linear) into a layer of this kind computing in the
    # given dtype: what the loaders convert with while an expert loads.
    make: Callable[[nn.Module, torch.dtype], nn.Module]
    # Least CUDA compute capability whose tensor cores run the product; None: any device.
    min_capability: tuple[int, int] | None = None
    runs_on_cpu: bool = True
    speed_rank: int = 0  # larger is faster on a card that supports it (weights auto picks by it)
    # The product of a kind that multiplies as it is held (``Dense8``): (x or QuantizedRows,
    # weight, per-channel scale, bias, out dtype, out=None) -> [M, N]; None: ``build``
    # makes a floating-point ``Dense``.
    product: Callable[..., torch.Tensor] | None = None


def _holds_8bit(kind: str) -> Callable[[nn.Module], bool]:
    return lambda layer: kind_of_dtype(layer.weight.dtype) == kind


def _row_8bit(kind: str, min_capability: tuple[int, int], speed_rank: int, product: Callable) -> GemmKind:
    return GemmKind(kind, _holds_8bit(kind), _dense_8bit, lambda out_f, in_f: out_f * in_f + 4 * out_f,
                    _host_8bit(kind), lambda layer: layer.dequantized(), _make_8bit(kind),
                    min_capability=min_capability, speed_rank=speed_rank, product=product)


GEMM_KINDS: dict[str, GemmKind] = {
    "bf16": GemmKind("bf16", lambda layer: not weights4.holds_nf4(layer) and layer.weight.dtype.is_floating_point
                     and kind_of_dtype(layer.weight.dtype) is None, _dense_plain,
                     lambda out_f, in_f: out_f * in_f * 2, lambda out_f, in_f, dtype: ((out_f, in_f), dtype),
                     lambda layer: layer.weight.detach(), _make_plain, speed_rank=2),
    "nf4": GemmKind("nf4", weights4.holds_nf4, _dense_nf4,
                    lambda out_f, in_f: int(out_f * in_f * weights4.BYTES_PER_WEIGHT),
                    lambda out_f, in_f, dtype: (weights4.packed_shape(out_f, in_f), torch.uint8),
                    weights4.dequantize, _make_nf4, speed_rank=1),
    "fp8": _row_8bit("fp8", (8, 9), 4, fp8_linear),
    "int8": _row_8bit("int8", (8, 0), 3, int8_linear),
}


def gemm_kind(layer: nn.Module) -> GemmKind:
    """The row of ``GEMM_KINDS`` for what ``layer`` holds; TypeError naming the weight otherwise."""
    for kind in GEMM_KINDS.values():
        if kind.holds(layer):
            return kind
    weight = layer.weight
    raise TypeError(f"{type(layer).__name__} holds a {weight.dtype} weight {tuple(weight.shape)} of no known kind "
                    f"({', '.join(GEMM_KINDS)}); add a row to wan/runtime/dense.py GEMM_KINDS")


def runs_on(kind: str, capability: tuple[int, int] | None) -> bool:
    """Whether kind ``kind``'s product runs on a CUDA device of ``capability`` (None: the CPU)."""
    row = GEMM_KINDS[kind]
    if capability is None:
        return row.runs_on_cpu
    return row.min_capability is None or tuple(capability) >= row.min_capability


def weight_bytes(kind: str, shape: tuple[int, int]) -> int:
    """Bytes an [out, in] linear weight of kind ``kind`` occupies once loaded."""
    return GEMM_KINDS[kind].weight_bytes(*shape)


def shared_input(x: torch.Tensor, *weights: "Dense | Dense8 | None") -> "torch.Tensor | QuantizedRows":
    """``x`` [M, K] for several products (a block's q, k and v read the same normalized
    tokens): quantized once when every given weight is 8-bit of one kind, else as it is."""
    kinds = {w.kind if isinstance(w, Dense8) else None for w in weights if w is not None}
    if len(kinds) != 1 or None in kinds or x.dim() != 2:
        return x
    return quantize_once(x, kinds.pop())


def dense(layer: nn.Module) -> "Dense | Dense8":
    """The weight and bias of an ``nn.Linear`` (or a quantized layer) for reuse, through the
    ``GEMM_KINDS`` row of what it holds.

    A plain layer's own tensors are returned (no copy); a 4-bit weight is dequantized
    once into its compute dtype; an 8-bit weight stays 8-bit (its product quantizes the
    activation). Callers drop the result when the sub-layer is done."""
    return gemm_kind(layer).build(layer)
