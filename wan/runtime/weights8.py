"""8-bit linear weights (fp8 e4m3 and int8) and their scaled GEMMs, in pure PyTorch.

A ``Linear8bit`` holds its weight in one byte per value with one float32 scale per output
channel (row): ``W ≈ weight.float() * weight_scale[:, None]``; the bias stays in the compute
dtype (bf16). The 8-bit bytes are what stays in memory: an A14B transformer of 18.5 B
linear weights is ~18.5 GB this way, against ~37 GB in bf16 and ~9.6 GB in NF4.

The products (``fp8_linear``, ``int8_linear``) quantize the activation per token (row) on
the fly and multiply 8-bit × 8-bit:

* fp8: ``torch._scaled_mm`` with row-wise scales (token scales [M, 1] × channel scales
  [1, N]) into bf16; tensor-core fp8 needs sm89+ (Ada, Hopper, Blackwell);
* int8: ``torch._int_mm`` (int32 accumulate), scaled afterwards; int8 tensor cores from
  sm80 (Ampere).

Both ops also run on the CPU in current PyTorch, which is how the unit tests check them
against the bf16 product (a ``_scaled_mm`` that refuses row-wise scales, as the CPU one did up
to at least 2.10, gets unit scales and the row and column scales applied after). The per-token
activation quantization is one Triton kernel on CUDA (``quantize_activation``).

Where a kernel refuses a shape (CUDA wants dimensions that are
multiples of 16 for fp8, 8 for int8, and more than 16 tokens for int8), the product falls
back to the dequantized bf16 weight: same weights, no activation rounding.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import fused, switches

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
INT8_MAX = 127.0
KINDS = ("fp8", "int8")
_STORAGE = {"fp8": FP8, "int8": torch.int8}
_RANGE = {"fp8": FP8_MAX, "int8": INT8_MAX}
_TINY = 1e-12  # an all-zero row gets this scale instead of 0 (no division by zero)


def storage_dtype(kind: str) -> torch.dtype:
    """The dtype an 8-bit kind's weight bytes are stored in."""
    if kind not in _STORAGE:
        raise ValueError(f"8-bit weight kind {kind!r} is not one of {', '.join(KINDS)}")
    return _STORAGE[kind]


def kind_of_dtype(dtype: torch.dtype) -> str | None:
    """"fp8" or "int8" for an 8-bit weight dtype, else None."""
    return next((k for k, d in _STORAGE.items() if d == dtype), None)


def quantize_rows(matrix: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, scales): ``matrix`` [R, C] as 8-bit ``kind`` with one float32 scale per row,
    ``matrix ≈ values.float() * scales[:, None]`` (symmetric, absmax per row)."""
    storage_dtype(kind)  # an unknown kind fails here, by name
    limit = _RANGE[kind]
    m = matrix.float()
    scales = m.abs().amax(dim=1).clamp(min=_TINY) / limit
    scaled = m / scales[:, None]
    if kind == "int8":
        values = scaled.round_().clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    else:
        values = scaled.clamp_(-FP8_MAX, FP8_MAX).to(FP8)
    return values, scales


def quantize_activation_pytorch(x: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition of ``quantize_activation`` in PyTorch ops (what runs off CUDA)."""
    storage_dtype(kind)  # an unknown kind fails here, by name
    if x.dtype != torch.bfloat16:
        # float32 exactly as quantize_rows; fp16 too (its reciprocal scale limit / absmax
        # overflows fp16's 65504 for rows whose absmax is below ~0.007).
        return quantize_rows(x, kind)
    limit = _RANGE[kind]
    amax = x.abs().amax(dim=1).float().clamp_(min=_TINY)
    scaled = x * (limit / amax).to(x.dtype)[:, None]
    if kind == "int8":
        return scaled.round_().clamp_(-INT8_MAX, INT8_MAX).to(torch.int8), amax / limit
    return scaled.clamp_(-FP8_MAX, FP8_MAX).to(FP8), amax / limit


def _quantize_activation_cuda(kernels, x: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    storage_dtype(kind)
    return kernels.quantize_rows_8bit(x, kind, _RANGE[kind], _TINY)


fused.register_kernel(quantize_activation_pytorch, _quantize_activation_cuda)


def quantize_activation(x: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_rows`` for the activation of every product (one scale per token): a bf16
    ``x`` is scaled in bf16 (no float32 copy of the activation; the reciprocal scale rounded
    to bf16 costs < 2^-8 relative, far below the 8-bit step), other dtypes exactly as
    ``quantize_rows``. Scales are float32 [M].

    On CUDA one Triton kernel (``triton_kernels.quantize_rows_8bit``) reads each row twice
    (absmax, then scale and cast) and writes the 8-bit row and its scale, with the same
    arithmetic; elsewhere, or with LINGBOT_FUSED=0, the PyTorch ops of the definition."""
    return fused.run(quantize_activation_pytorch, x, kind)


def quantize_heads_pytorch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition of ``quantize_heads`` in PyTorch ops (what runs off CUDA)."""
    if x.dim() != 4:
        raise ValueError(f"quantize_heads expects [batch, tokens, heads, head_dim], got shape {tuple(x.shape)}")
    scales = heads_scale(x.abs().amax(dim=(1, 3)).float())  # [B, H]
    values = (x.float() / scales[:, None, :, None]).clamp_(-FP8_MAX, FP8_MAX).to(FP8)
    return values, scales


def head_absmax_pytorch(x: torch.Tensor) -> torch.Tensor:
    """The definition of ``head_absmax`` in PyTorch ops (what runs off CUDA)."""
    return x.abs().amax(dim=(1, 3)).float()


def _head_absmax_cuda(kernels, x: torch.Tensor) -> torch.Tensor:
    return kernels.head_amax(x)


fused.register_kernel(head_absmax_pytorch, _head_absmax_cuda)


def head_absmax(x: torch.Tensor) -> torch.Tensor:
    """float32 [B, H]: the absmax of each (sample, head) of x [B, L, H, D], the first half of
    ``quantize_heads`` (on CUDA ``triton_kernels.head_amax``; a maximum is exact, so the same
    values everywhere)."""
    return fused.run(head_absmax_pytorch, x)


def heads_scale(amax: torch.Tensor) -> torch.Tensor:
    """The fp8 scales of ``quantize_heads`` from each head's absmax (float32): the one rule,
    for whoever assembles a head's absmax from parts (a KV cache's frames)."""
    return amax.clamp(min=_TINY) / FP8_MAX


def _quantize_heads_cuda(kernels, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # a layout the kernels refuse (ValueError) runs the definition, which names the mistake
    scales = heads_scale(kernels.head_amax(x))  # the same values as abs().amax: a maximum is exact
    return kernels.scale_heads_fp8(x, scales, FP8_MAX), scales


fused.register_kernel(quantize_heads_pytorch, _quantize_heads_cuda)


def quantize_heads(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, scales): attention operands ``x`` [B, L, H, D] as fp8 e4m3 with one float32
    scale per sample and head (scales [B, H]; ``x ≈ values.float() * scales[:, None, :, None]``),
    the layout of FlashAttention 3's fp8 ``descale`` arguments. One scale for all of a head's
    tokens is what the kernel takes; a per-token scale would not fold into its softmax.

    On CUDA the absmax and the scaled cast are one Triton pass each (``triton_kernels.head_amax``,
    ``scale_heads_fp8``; bit for bit the definition); elsewhere, or with
    LINGBOT_FUSED=0, the PyTorch ops of ``quantize_heads_pytorch``."""
    return fused.run(quantize_heads_pytorch, x)


def requantize_heads_pytorch(x: torch.Tensor, values: torch.Tensor, scales: torch.Tensor, kept: torch.Tensor,
                             fresh_from: int) -> torch.Tensor:
    """The definition of ``requantize_heads`` in PyTorch ops (what runs off CUDA)."""
    cast = (x.float() / scales[None, :, None]).clamp_(-FP8_MAX, FP8_MAX).to(FP8)
    fresh = torch.arange(x.shape[0], device=x.device)[:, None, None] >= fresh_from
    redo = fresh | (kept != scales)[None, :, None]
    bytes_ = values.view(torch.uint8)  # torch.where has no fp8 kernels; the bytes are the values
    bytes_.copy_(torch.where(redo, cast.view(torch.uint8), bytes_))
    return values


def _requantize_heads_cuda(kernels, x, values, scales, kept, fresh_from):
    return kernels.requantize_heads_fp8(x, values, scales, kept, fresh_from, FP8_MAX)


fused.register_kernel(requantize_heads_pytorch, _requantize_heads_cuda)


def requantize_heads(x: torch.Tensor, values: torch.Tensor, scales: torch.Tensor, kept: torch.Tensor,
                     fresh_from: int) -> torch.Tensor:
    """Keep ``values`` [L, H, D] (fp8) equal to ``quantize_heads``' cast of x [L, H, D] with
    ``scales`` (float32 [H]) while casting only what changed: rows from ``fresh_from`` on
    always, earlier rows of a head only when its scale is not ``kept[h]``, the scale they
    were cast with (the caller's invariant: rows before ``fresh_from`` hold x's cast with
    ``kept``; set ``kept`` to ``scales`` afterwards). A KV cache's committed frames are cast
    once this way, not on every pass. On CUDA one Triton pass (``requantize_heads_fp8``;
    programs of unchanged heads return at once); elsewhere, or with LINGBOT_FUSED=0,
    ``requantize_heads_pytorch``."""
    return fused.run(requantize_heads_pytorch, x, values, scales, kept, fresh_from)


@dataclass(frozen=True)
class QuantizedRows:
    """An activation [M, K] quantized once for several products that read it (a block's q, k
    and v): ``fp8_linear`` / ``int8_linear`` take it in place of ``x`` and skip their own
    quantization (the same bytes, so the same products)."""

    x: torch.Tensor
    values: torch.Tensor
    scales: torch.Tensor
    kind: str

    @property
    def shape(self) -> torch.Size:
        return self.x.shape

    @property
    def is_cuda(self) -> bool:
        return self.x.is_cuda

    @property
    def device(self) -> torch.device:
        return self.x.device


def quantize_once(x: torch.Tensor, kind: str) -> QuantizedRows:
    """``x`` [M, K] with its per-token quantization for ``kind``, for several products."""
    return QuantizedRows(x, *quantize_activation(x, kind), kind)


def _quantized(x: "torch.Tensor | QuantizedRows", kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(x, QuantizedRows):
        if x.kind != kind:
            raise ValueError(f"an activation quantized for {x.kind} given to an {kind} product")
        return x.values, x.scales
    return quantize_activation(x, kind)


# Hopper's fp8 tensor cores can skip the periodic promotion of their partial sums to float32
# (``use_fast_accum``). Measured on an H200 at a Fast chunk's shapes (bench/fp8_gemm.py,
# bench/RESULTS.md): the 5120² linears and the FFN's up projection 5-10 % faster, the error
# against the float32 product of the same 8-bit operands 0.0017 -> 0.0022 (0.0033 for the
# FFN's down projection, K = 13,824), against the ~0.036 the fp8 rounding of the operands
# costs. ``LINGBOT_FP8_FAST_ACCUM=0`` keeps the promoted accumulation.


def _fast_accum(x: torch.Tensor) -> bool:
    return x.is_cuda and switches.FP8_FAST_ACCUM()


def dequantize_rows(values: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``values.float() * scales[:, None]`` in ``dtype``."""
    return (values.float() * scales.float()[:, None]).to(dtype)


def is_8bit(weight: torch.Tensor) -> bool:
    """Whether a linear weight is stored in one of the 8-bit kinds."""
    return kind_of_dtype(weight.dtype) is not None


def _fp8_kernel_fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    if not x.is_cuda:
        return True
    return x.shape[1] % 16 == 0 and weight.shape[0] % 16 == 0


def _int8_kernel_fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    if not x.is_cuda:
        return True
    return x.shape[0] > 16 and x.shape[1] % 8 == 0 and weight.shape[0] % 8 == 0


_BIAS_IN_KERNEL: dict[str, bool] = {}  # device type -> whether _scaled_mm took a bias there
_ROWWISE: dict[str, bool] = {}  # device type -> whether _scaled_mm took row-wise scales there


def _scaled_mm_rowwise(xq: torch.Tensor, weight: torch.Tensor, x_scale: torch.Tensor, weight_scale: torch.Tensor,
                       bias: torch.Tensor | None, out_dtype: torch.dtype, out: torch.Tensor | None) -> torch.Tensor:
    scales = {"scale_a": x_scale[:, None], "scale_b": weight_scale[None, :], "out_dtype": out_dtype}
    if _fast_accum(xq):
        scales["use_fast_accum"] = True
    if out is not None:
        scales["out"] = out
    if bias is None:
        return torch._scaled_mm(xq, weight.t(), **scales)
    if _BIAS_IN_KERNEL.get(xq.device.type, True):
        try:
            return torch._scaled_mm(xq, weight.t(), bias=bias, **scales)
        except torch.cuda.OutOfMemoryError:
            raise
        except RuntimeError:  # a build whose row-wise kernel takes no bias: add it after, from now on
            _BIAS_IN_KERNEL[xq.device.type] = False
    return torch._scaled_mm(xq, weight.t(), **scales).add_(bias)


def _scaled_mm_unit(xq: torch.Tensor, weight: torch.Tensor, x_scale: torch.Tensor, weight_scale: torch.Tensor,
                    bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """The row-wise product through a per-tensor ``_scaled_mm`` (unit scales, float32 out),
    scaled per token and channel afterwards: the same float32 sums, for builds whose kernel
    takes only per-tensor scales (PyTorch's CPU ``_scaled_mm`` up to at least 2.10)."""
    one = torch.ones((), dtype=torch.float32, device=xq.device)
    y = torch._scaled_mm(xq, weight.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
    y = y.mul_(x_scale[:, None]).mul_(weight_scale[None, :])
    if bias is not None:
        y += bias.float()
    return y.to(out_dtype)


def fp8_linear(x: "torch.Tensor | QuantizedRows", weight: torch.Tensor, weight_scale: torch.Tensor,
               bias: torch.Tensor | None, out_dtype: torch.dtype = torch.bfloat16,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (any float, or ``QuantizedRows``) times the fp8 weight [N, K]ᵀ with per-token
    × per-channel scales, plus bias, in ``out_dtype`` [M, N]. ``weight_scale`` float32 [N] (as
    ``Linear8bit`` holds it; other dtypes are converted per call). ``out``: a contiguous
    [M, N] tensor of ``out_dtype`` the kernel writes into (no copy); returned."""
    if out is not None and (not out.is_contiguous() or out.dtype != out_dtype
                            or tuple(out.shape) != (x.shape[0], weight.shape[0])):
        raise ValueError(f"fp8_linear: out must be a contiguous {out_dtype} [{x.shape[0]}, {weight.shape[0]}] "
                         f"tensor, got {tuple(out.shape)} {out.dtype}")
    if not _fp8_kernel_fits(x, weight):
        plain = x.x if isinstance(x, QuantizedRows) else x
        y = F.linear(plain.to(out_dtype), dequantize_rows(weight, weight_scale, out_dtype), bias)
        return y if out is None else out.copy_(y)
    xq, x_scale = _quantized(x, "fp8")
    weight_scale = weight_scale if weight_scale.dtype == torch.float32 else weight_scale.float()
    bias = None if bias is None else bias.to(out_dtype)
    device = x.device.type
    if _ROWWISE.get(device, True):
        try:
            return _scaled_mm_rowwise(xq, weight, x_scale, weight_scale, bias, out_dtype, out)
        except torch.cuda.OutOfMemoryError:
            raise
        except RuntimeError:  # row-wise scales refused on this device: per-tensor kernel from now on
            _ROWWISE[device] = False
    y = _scaled_mm_unit(xq, weight, x_scale, weight_scale, bias, out_dtype)
    return y if out is None else out.copy_(y)


def int8_linear(x: "torch.Tensor | QuantizedRows", weight: torch.Tensor, weight_scale: torch.Tensor,
                bias: torch.Tensor | None, out_dtype: torch.dtype = torch.bfloat16,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (or ``QuantizedRows``) times the int8 weight [N, K]ᵀ (int32 accumulation),
    scaled per token and per channel, plus bias, in ``out_dtype`` [M, N] (copied into ``out``
    when given; returned)."""
    if not _int8_kernel_fits(x, weight):
        plain = x.x if isinstance(x, QuantizedRows) else x
        y = F.linear(plain.to(out_dtype), dequantize_rows(weight, weight_scale, out_dtype), bias)
        return y if out is None else out.copy_(y)
    xq, x_scale = _quantized(x, "int8")
    acc = torch._int_mm(xq, weight.t())
    y = acc.float().mul_(x_scale[:, None]).mul_(weight_scale.float()[None, :])
    if bias is not None:
        y += bias.float()
    return y.to(out_dtype) if out is None else out.copy_(y)


class Linear8bit(nn.Linear):
    """An ``nn.Linear`` whose weight [out, in] is 8-bit (``kind`` fp8 or int8) with a float32
    ``weight_scale`` [out] buffer; the bias and the output are in ``compute_dtype``.

    Still an ``nn.Linear`` (by subclass), so block swap, LoRA attachment and the loaders
    find it as a linear layer; block swap moves only ``weight``, the scales stay put."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, kind: str = "fp8",
                 compute_dtype: torch.dtype = torch.bfloat16, device: torch.device | str | None = None) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.kind = kind
        self.compute_dtype = compute_dtype
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=storage_dtype(kind), device=device),
                                   requires_grad=False)
        self.register_buffer("weight_scale", torch.ones(out_features, dtype=torch.float32, device=device))
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features, dtype=compute_dtype, device=device), requires_grad=False)
        else:
            self.register_parameter("bias", None)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None, kind: str,
                    compute_dtype: torch.dtype = torch.bfloat16) -> "Linear8bit":
        """Quantize a float weight [out, in] (on its own device) per output channel."""
        values, scales = quantize_rows(weight.detach(), kind)
        return cls.from_quantized(values, scales, bias, kind, compute_dtype)

    @classmethod
    def from_quantized(cls, values: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, kind: str,
                       compute_dtype: torch.dtype = torch.bfloat16) -> "Linear8bit":
        """A layer around stored 8-bit values [out, in] and their float32 scales [out]."""
        if values.dtype != storage_dtype(kind) or values.dim() != 2 or tuple(scales.shape) != (values.shape[0],):
            raise ValueError(f"{kind} weight: values {tuple(values.shape)} {values.dtype} and scales "
                             f"{tuple(scales.shape)} do not make an [out, in] weight with one scale per row")
        out_features, in_features = values.shape
        layer = cls(in_features, out_features, bias=bias is not None, kind=kind, compute_dtype=compute_dtype,
                    device="meta")
        layer.weight = nn.Parameter(values, requires_grad=False)
        layer.weight_scale = scales.to(torch.float32)
        if bias is not None:
            layer.bias = nn.Parameter(bias.detach().to(compute_dtype), requires_grad=False)
        return layer

    def dequantized(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The weight as floats [out, in] (``compute_dtype`` unless given)."""
        scale = self.weight_scale.to(self.weight.device)
        return dequantize_rows(self.weight, scale, dtype or self.compute_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from .dense import GEMM_KINDS  # the kinds' table (it imports this module)

        lead = x.shape[:-1]
        scale = self.weight_scale.to(self.weight.device)
        y = GEMM_KINDS[self.kind].product(x.reshape(-1, x.shape[-1]), self.weight, scale, self.bias,
                                          self.compute_dtype)
        return y.reshape(*lead, -1)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, kind={self.kind}"
