"""Hand-written Triton kernels for the per-token elementwise chains of a DiT block.

Between its matmuls a block makes several passes over the float32 residual stream
([tokens, 5120] per sample, 0.67 GB at 480x832x81). Eager PyTorch spends 4-10 kernels per
chain; Inductor fuses them but, compiled for dynamic shapes, reached only a half to a tenth
of the memory bandwidth (measured in bench/block_profile.py). Each kernel here gives one
program one row: the row is read once, reduced in registers and written once.

The eager functions in ``fused.py`` are the definitions; these match them to float32
rounding (bf16 intermediates are rounded where the definition rounds them). Only imported
where Triton is available; ``fused`` falls back to the eager versions otherwise.

``quantize_rows_8bit`` is the per-token activation quantization of the 8-bit products
(``weights8.quantize_activation``, registered with ``fused``): it equals its definition bit
for bit on CUDA. ``scale_heads_fp8`` is the cast of ``weights8.quantize_heads`` (fp8
attention operands, one scale per head), bit for bit its definition on CUDA too.
"""
from __future__ import annotations

import functools
import struct

import torch
import triton
import triton.language as tl


def _warps(block: int) -> int:
    return 16 if block >= 8192 else 8 if block >= 2048 else 4


def _check_rows(name: str, t: torch.Tensor) -> None:
    if t.dim() != 2 or t.stride(-1) != 1:
        raise ValueError(f"{name}: expected a [rows, dim] tensor with contiguous rows, got shape "
                         f"{tuple(t.shape)} strides {t.stride()}")


# ----------------------------------------------------------------- RMS norm + RoPE (q, k)

@triton.jit
def _rms_rope_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, row_stride, token_start, eps,
                     DIM: tl.constexpr, HALF_HEAD: tl.constexpr, PAIRS: tl.constexpr,
                     NORM: tl.constexpr, ROPE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, 2 * PAIRS)
    mask = offs < DIM
    ptr = x_ptr + row * row_stride + offs
    x = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
    if NORM:
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / DIM + eps)
        x = x * rstd * tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if ROPE:
        even, odd = tl.split(tl.reshape(x, (PAIRS, 2)))
        pair = tl.arange(0, PAIRS)
        table = (token_start + row) * HALF_HEAD + pair % HALF_HEAD
        c = tl.load(cos_ptr + table, mask=pair < DIM // 2, other=0.0)
        s = tl.load(sin_ptr + table, mask=pair < DIM // 2, other=0.0)
        x = tl.reshape(tl.join(even * c - odd * s, even * s + odd * c), (2 * PAIRS,))
    tl.store(ptr, x.to(x_ptr.dtype.element_ty), mask=mask)


def rms_rope_(x: torch.Tensor, weight: torch.Tensor | None, cos: torch.Tensor | None, sin: torch.Tensor | None,
              token_start: int, eps: float, head_dim: int) -> torch.Tensor:
    """In place on x [rows, dim] (tokens token_start.. of one sample): RMS norm with
    ``weight`` (None: skipped), then RoPE with the full cos/sin tables [tokens, 1, head_dim/2]
    float32 (None: skipped)."""
    _check_rows("rms_rope_", x)
    rows, dim = x.shape
    norm, rope = weight is not None, cos is not None
    if rope and (cos.dtype != torch.float32 or not cos.is_contiguous() or not sin.is_contiguous()):
        raise ValueError("rms_rope_: cos/sin must be contiguous float32 tables")
    pairs = triton.next_power_of_2(dim) // 2
    _rms_rope_kernel[(rows,)](
        x, weight if norm else x, cos if rope else x, sin if rope else x, x.stride(0), token_start, eps,
        DIM=dim, HALF_HEAD=head_dim // 2, PAIRS=pairs, NORM=norm, ROPE=rope, num_warps=_warps(2 * pairs),
    )
    return x


# ------------------------------------------------- LayerNorm (+ residual add) + modulation

@triton.jit
def _layer_norm_kernel(x_ptr, y_ptr, out_ptr, a_ptr, b_ptr, x_stride, y_stride, out_stride, eps,
                       DIM: tl.constexpr, BLOCK: tl.constexpr, ADD_Y: tl.constexpr, MODULATE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.arange(0, BLOCK)
    mask = col < DIM
    x = tl.load(x_ptr + row * x_stride + col, mask=mask, other=0.0).to(tl.float32)
    if ADD_Y:
        x = x + tl.load(y_ptr + row * y_stride + col, mask=mask, other=0.0).to(tl.float32)
        tl.store(x_ptr + row * x_stride + col, x, mask=mask)
    mean = tl.sum(x, axis=0) / DIM
    centred = tl.where(mask, x - mean, 0.0)
    h = centred * tl.rsqrt(tl.sum(centred * centred, axis=0) / DIM + eps)
    a = tl.load(a_ptr + col, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + col, mask=mask, other=0.0).to(tl.float32)
    if MODULATE:
        h = h * (1.0 + a) + b
    else:
        h = h * a + b
    tl.store(out_ptr + row * out_stride + col, h.to(out_ptr.dtype.element_ty), mask=mask)


def layer_norm(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, eps: float, dtype: torch.dtype,
               modulate: bool, residual: torch.Tensor | None = None) -> torch.Tensor:
    """LayerNorm of the rows of float32 x [rows, dim], returned in ``dtype``.

    ``modulate``: h * (1 + a) + b (a = scale, b = shift); else h * a + b (weight, bias).
    ``residual`` [rows, dim]: x += residual first, written back into x."""
    _check_rows("layer_norm", x)
    if x.dtype != torch.float32:
        raise ValueError("layer_norm: the residual stream must be float32")
    rows, dim = x.shape
    if residual is not None:
        residual = residual if residual.stride(-1) == 1 else residual.contiguous()
        _check_rows("layer_norm residual", residual)
    a, b = a.reshape(-1).contiguous(), b.reshape(-1).contiguous()
    if a.numel() != dim or b.numel() != dim:
        raise ValueError(f"layer_norm: expected {dim} values per parameter, got {a.numel()} and {b.numel()}")
    out = torch.empty(rows, dim, dtype=dtype, device=x.device)
    block = triton.next_power_of_2(dim)
    _layer_norm_kernel[(rows,)](
        x, residual if residual is not None else x, out, a, b, x.stride(0),
        residual.stride(0) if residual is not None else 0, out.stride(0), eps,
        DIM=dim, BLOCK=block, ADD_Y=residual is not None, MODULATE=modulate, num_warps=_warps(block),
    )
    return out


# ------------------------------------------------- gated residual + camera affine (in place)

@triton.jit
def _gate_camera_kernel(x_ptr, y_ptr, gate_ptr, scale_ptr, shift_ptr, x_batch_stride, y_batch_stride,
                        gate_batch_stride, cam_batch_stride, DIM: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    sample = tl.program_id(1).to(tl.int64)
    col = tl.arange(0, BLOCK)
    mask = col < DIM
    x_at = x_ptr + sample * x_batch_stride + row * DIM + col
    cam = sample * cam_batch_stride + row * DIM + col
    x = tl.load(x_at, mask=mask, other=0.0)
    y = tl.load(y_ptr + sample * y_batch_stride + row * DIM + col, mask=mask, other=0.0).to(tl.float32)
    gate = tl.load(gate_ptr + sample * gate_batch_stride + col, mask=mask, other=0.0)
    scale = tl.load(scale_ptr + cam, mask=mask, other=0.0)
    shift = tl.load(shift_ptr + cam, mask=mask, other=0.0).to(tl.float32)
    # 1 + scale is rounded to the camera layers' dtype, as the definition computes it there.
    one_plus = (scale.to(tl.float32) + 1.0).to(scale_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
    one_plus = one_plus.to(tl.float32)
    tl.store(x_at, (x + y * gate) * one_plus + shift, mask=mask)


def gate_camera_(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, scale: torch.Tensor,
                 shift: torch.Tensor) -> torch.Tensor:
    """x = (x + y * gate) * (1 + scale) + shift in place. x [B, n, D] float32 with contiguous
    rows; y [B, n, D]; scale, shift [B or 1, n, D]; gate [B, D] float32."""
    batch, rows, dim = x.shape
    if x.dtype != torch.float32 or x.stride(2) != 1 or x.stride(1) != dim:
        raise ValueError("gate_camera_: x must be a float32 [B, n, D] view with contiguous rows")
    y, scale, shift = y.contiguous(), scale.contiguous(), shift.contiguous()
    for name, t in (("y", y), ("scale", scale), ("shift", shift)):
        if t.shape[1:] != x.shape[1:] or t.shape[0] not in (1, batch):
            raise ValueError(f"gate_camera_: {name} must be [B or 1, {rows}, {dim}], got {tuple(t.shape)}")
    if scale.shape[0] != shift.shape[0] or scale.dtype != shift.dtype or y.shape[0] != batch:
        raise ValueError("gate_camera_: scale and shift must match, y must have x's batch")
    gate = gate.float().contiguous()
    block = triton.next_power_of_2(dim)
    _gate_camera_kernel[(rows, batch)](
        x, y, gate, scale, shift, x.stride(0), y.stride(0), gate.stride(0),
        0 if scale.shape[0] == 1 else scale.stride(0), DIM=dim, BLOCK=block, num_warps=_warps(block),
    )
    return x


# ------------------------------------------- per-token 8-bit activation quantization (fp8 / int8)

@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, s_ptr, x_stride, q_stride, limit, inv_limit, tiny,
                          DIM: tl.constexpr, BLOCK: tl.constexpr, HALF: tl.constexpr, INT8: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_stride
    q_row = q_ptr + row * q_stride
    col = tl.arange(0, BLOCK)
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, DIM, BLOCK):  # pass 1: the row's absmax
        x = tl.load(x_row + start + col, mask=start + col < DIM, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    amax = tl.maximum(tl.max(amax, axis=0), tiny)
    # As PyTorch on CUDA computes them: ``amax / limit`` is amax times the float32 reciprocal
    # of the scalar; ``limit / amax`` is ``amax.reciprocal() * limit`` (Tensor.__rtruediv__).
    scale = amax * inv_limit
    tl.store(s_ptr + row, scale)
    if HALF:  # bf16: the reciprocal scale rounded to bf16, as quantize_activation does
        inv = (tl.math.div_rn(1.0, amax) * limit).to(x_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
        inv = inv.to(tl.float32)
    for start in range(0, DIM, BLOCK):  # pass 2 (the row again, from L2): scale, round, store
        mask = start + col < DIM
        x = tl.load(x_row + start + col, mask=mask, other=0.0)
        if HALF:  # the product of two half values is exact in float32, then rounded to their dtype
            v = (x.to(tl.float32) * inv).to(x_ptr.dtype.element_ty, fp_downcast_rounding="rtne").to(tl.float32)
        else:
            v = tl.math.div_rn(x.to(tl.float32), scale)
        if INT8:
            # Half to even, as torch.round (v + 0.5 is exact for |v| < 2**22; a tie that
            # floor rounded up to an odd integer goes back down).
            r = tl.floor(v + 0.5)
            r = tl.where(((r - v) == 0.5) & ((r - 2.0 * tl.floor(r * 0.5)) != 0.0), r - 1.0, r)
            v = tl.minimum(tl.maximum(r, -127.0), 127.0)
            tl.store(q_row + start + col, v.to(tl.int8), mask=mask)
        else:
            v = tl.minimum(tl.maximum(v, -limit), limit)
            tl.store(q_row + start + col, v.to(tl.float8e4nv, fp_downcast_rounding="rtne"), mask=mask)


@functools.lru_cache(maxsize=None)
def _float32_reciprocal(value: float) -> float:
    """1 / value rounded to float32, as PyTorch's CUDA division by a Python scalar takes it."""
    return struct.unpack("f", struct.pack("f", 1.0 / value))[0]


def quantize_rows_8bit(x: torch.Tensor, kind: str, limit: float, tiny: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, scales) of x [rows, dim] (bf16, fp16 or float32) quantized per row to fp8 e4m3
    (``kind`` "fp8") or int8, in one kernel: each row's absmax, then the row scaled, rounded
    and cast. The same arithmetic as ``weights8.quantize_activation`` (the definition) as
    PyTorch runs it on CUDA, bit for bit: a bf16 row is multiplied by its reciprocal scale
    rounded to bf16, other rows divided by the float32 scale; ``div_rn`` where PyTorch
    divides, the scalar division as a multiplication by the reciprocal (PyTorch's CUDA
    kernel does that; its CPU one divides, so CPU scales may differ by one float32 ulp);
    casts round half to even; fp8 is clamped to ±448 first. (Triton's CPU interpreter casts
    to bf16 and fp8 by truncation: only the GPU matches bit for bit.)"""
    _check_rows("quantize_rows_8bit", x)
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"quantize_rows_8bit: x must be bf16, fp16 or float32, got {x.dtype}")
    if kind not in ("fp8", "int8"):
        raise ValueError(f"quantize_rows_8bit: kind {kind!r} is not fp8 or int8")
    rows, dim = x.shape
    values = torch.empty(rows, dim, dtype=torch.float8_e4m3fn if kind == "fp8" else torch.int8, device=x.device)
    scales = torch.empty(rows, dtype=torch.float32, device=x.device)
    if rows == 0:
        return values, scales
    # Blocks that tile the row without a masked tail where a power of two divides it
    # (5120 = 5 x 1024, 13824 = 27 x 512); the second pass re-reads the row from L2.
    block = 2048
    while block > 256 and dim % block:
        block //= 2
    block = min(block, triton.next_power_of_2(dim))
    inv_limit = _float32_reciprocal(limit)
    _quantize_rows_kernel[(rows,)](
        x, values, scales, x.stride(0), values.stride(0), limit, inv_limit, tiny, DIM=dim, BLOCK=block,
        HALF=x.dtype == torch.bfloat16, INT8=kind == "int8", num_warps=_warps(block),
    )
    return values, scales


# ------------------------------------------- fp8 attention operands, one scale per (sample, head)

@triton.jit
def _scale_heads_kernel(x_ptr, s_ptr, q_ptr, tokens, heads, x_stride_b, x_stride_l, limit,
                        HEAD_DIM: tl.constexpr, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # one token of one sample: its heads x head_dim values
    b = row // tokens
    x_row = x_ptr + b * x_stride_b + (row % tokens) * x_stride_l
    q_row = q_ptr + row * WIDTH
    col = tl.arange(0, BLOCK)
    for start in range(0, WIDTH, BLOCK):
        c = start + col
        mask = c < WIDTH
        x = tl.load(x_row + c, mask=mask, other=0.0).to(tl.float32)
        s = tl.load(s_ptr + b * heads + c // HEAD_DIM, mask=mask, other=1.0)
        v = tl.minimum(tl.maximum(tl.math.div_rn(x, s), -limit), limit)
        tl.store(q_row + c, v.to(tl.float8e4nv, fp_downcast_rounding="rtne"), mask=mask)


@triton.jit
def _head_amax_kernel(x_ptr, out_ptr, tokens, x_stride_b, x_stride_l, blocks,
                      HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, DIM_BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    head = tl.program_id(2)
    heads = tl.num_programs(2)
    rows = block * ROWS + tl.arange(0, ROWS)
    d = tl.arange(0, DIM_BLOCK)
    ptr = x_ptr + b * x_stride_b + rows[:, None].to(tl.int64) * x_stride_l + head * HEAD_DIM + d[None, :]
    x = tl.load(ptr, mask=(rows[:, None] < tokens) & (d[None, :] < HEAD_DIM), other=0.0).to(tl.float32)
    tl.store(out_ptr + (b * blocks + block) * heads + head, tl.max(tl.max(tl.abs(x), axis=1), axis=0))


def head_amax(x: torch.Tensor) -> torch.Tensor:
    """The absmax of each (sample, head) of x [B, L, H, D] (each token's heads contiguous) as
    float32 [B, H]: ``x.abs().amax(dim=(1, 3)).float()`` (a maximum is exact) without an |x|
    copy or a strided reduction: one program per (sample, 64 tokens, head), then the
    per-block maxima reduced by PyTorch."""
    if x.dim() != 4 or x.stride(3) != 1 or x.stride(2) != x.shape[3]:
        raise ValueError(f"head_amax: expected [B, L, H, D] with each token's heads contiguous, got shape "
                         f"{tuple(x.shape)} strides {x.stride()}")
    batch, tokens, heads, head_dim = x.shape
    rows = 64
    blocks = triton.cdiv(max(tokens, 1), rows)
    partial = torch.zeros(batch, blocks, heads, dtype=torch.float32, device=x.device)
    if x.numel():
        _head_amax_kernel[(batch, blocks, heads)](x, partial, tokens, x.stride(0), x.stride(1), blocks,
                                                  HEAD_DIM=head_dim, ROWS=rows,
                                                  DIM_BLOCK=triton.next_power_of_2(head_dim), num_warps=4)
    return partial.amax(dim=1)


def scale_heads_fp8(x: torch.Tensor, scales: torch.Tensor, limit: float) -> torch.Tensor:
    """x [B, L, H, D] (bf16, fp16 or float32; each token's H x D values contiguous) divided
    by its head's float32 scale (scales [B, H]), clamped to ±limit and cast to fp8 e4m3
    (round half to even), contiguous [B, L, H, D]: ``(x.float() / scales).clamp(...).to(fp8)``
    in one pass (x read once, one byte written)."""
    if x.dim() != 4 or x.stride(3) != 1 or x.stride(2) != x.shape[3]:
        raise ValueError(f"scale_heads_fp8: expected [B, L, H, D] with each token's heads contiguous, got shape "
                         f"{tuple(x.shape)} strides {x.stride()}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"scale_heads_fp8: x must be bf16, fp16 or float32, got {x.dtype}")
    batch, tokens, heads, head_dim = x.shape
    if tuple(scales.shape) != (batch, heads) or scales.dtype != torch.float32 or not scales.is_contiguous():
        raise ValueError(f"scale_heads_fp8: scales must be contiguous float32 [{batch}, {heads}], got "
                         f"{tuple(scales.shape)} {scales.dtype}")
    values = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    if values.numel() == 0:
        return values
    width = heads * head_dim
    block = min(2048, triton.next_power_of_2(width))
    _scale_heads_kernel[(batch * tokens,)](
        x, scales, values, tokens, heads, x.stride(0), x.stride(1), limit,
        HEAD_DIM=head_dim, WIDTH=width, BLOCK=block, num_warps=_warps(block),
    )
    return values


@triton.jit
def _requantize_heads_kernel(x_ptr, q_ptr, s_ptr, kept_ptr, rows, fresh_from, limit,
                             WIDTH: tl.constexpr, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr,
                             DIM_BLOCK: tl.constexpr):
    block = tl.program_id(0)
    head = tl.program_id(1)
    start = block * ROWS
    s = tl.load(s_ptr + head)
    # Rows before fresh_from hold values already cast with the head's kept scale: only a
    # changed scale makes them stale. A block reaching past fresh_from always runs (its kept
    # rows, cast again with an unchanged scale, get the same bytes).
    if (start + ROWS > fresh_from) | (tl.load(kept_ptr + head) != s):
        r = start + tl.arange(0, ROWS)
        d = tl.arange(0, DIM_BLOCK)
        offs = r[:, None].to(tl.int64) * WIDTH + head * HEAD_DIM + d[None, :]
        mask = (r[:, None] < rows) & (d[None, :] < HEAD_DIM)
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        v = tl.minimum(tl.maximum(tl.math.div_rn(x, s), -limit), limit)
        tl.store(q_ptr + offs, v.to(tl.float8e4nv, fp_downcast_rounding="rtne"), mask=mask)


def requantize_heads_fp8(x: torch.Tensor, values: torch.Tensor, scales: torch.Tensor, kept: torch.Tensor,
                         fresh_from: int, limit: float) -> torch.Tensor:
    """``values`` [L, H, D] (fp8 e4m3) <- x [L, H, D] (bf16, fp16 or float32) cast per head
    as ``scale_heads_fp8`` casts it, only where the bytes may differ: rows from
    ``fresh_from`` on always, earlier rows of a head only when its scale (float32 [H]) is
    not the one they were cast with (``kept`` [H]). ``kept`` is not updated here. Every
    tensor contiguous; a program over kept rows of a head whose scale did not move returns
    at once, so the committed frames cost a load of two scales."""
    if x.dim() != 3 or values.shape != x.shape or values.dtype != torch.float8_e4m3fn or not (
            x.is_contiguous() and values.is_contiguous()):
        raise ValueError(f"requantize_heads_fp8: expected contiguous x and fp8 values [tokens, heads, head_dim], got "
                         f"{tuple(x.shape)} {x.dtype}, {tuple(values.shape)} {values.dtype}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"requantize_heads_fp8: x must be bf16, fp16 or float32, got {x.dtype}")
    rows, heads, head_dim = x.shape
    for name, t in (("scales", scales), ("kept", kept)):
        if tuple(t.shape) != (heads,) or t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"requantize_heads_fp8: {name} must be contiguous float32 [{heads}], got "
                             f"{tuple(t.shape)} {t.dtype}")
    if rows:
        block = 64
        _requantize_heads_kernel[(triton.cdiv(rows, block), heads)](
            x, values, scales, kept, rows, fresh_from, limit, WIDTH=heads * head_dim, HEAD_DIM=head_dim,
            ROWS=block, DIM_BLOCK=triton.next_power_of_2(head_dim), num_warps=4)
    return values


# ------------------------------------------- the int8 KV cache's committed frames, dequantized

@triton.jit
def _dequantize_int8_kernel(q_ptr, s_ptr, out_ptr, n, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    q = tl.load(q_ptr + offs, mask=mask, other=0).to(tl.float32)
    s = tl.load(s_ptr + offs // HEAD_DIM, mask=mask, other=0.0)
    tl.store(out_ptr + offs, (q * s).to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out`` [tokens, heads, head_dim] (bf16 or fp16) <- q (int8, same shape) times its
    (token, head) float32 scale, rounded half to even: what ``out.copy_(q).mul_(scale)``
    computes (the product in float32, one rounding), in one pass (int8 and scales read once,
    ``out`` written once) instead of four. Every tensor contiguous."""
    if q.dtype != torch.int8 or out.dtype not in (torch.bfloat16, torch.float16) or scale.dtype != torch.float32:
        raise ValueError(f"dequantize_int8: expected int8 values, float32 scales and a bf16/fp16 out, got "
                         f"{q.dtype}, {scale.dtype}, {out.dtype}")
    if q.dim() != 3 or q.shape != out.shape or tuple(scale.shape) != tuple(q.shape[:2]) or not (
            q.is_contiguous() and scale.is_contiguous() and out.is_contiguous()):
        raise ValueError(f"dequantize_int8: expected contiguous q, out [tokens, heads, head_dim] and scales "
                         f"[tokens, heads], got {tuple(q.shape)}, {tuple(scale.shape)}, {tuple(out.shape)}")
    n = q.numel()
    if n:
        block = 4096
        _dequantize_int8_kernel[(triton.cdiv(n, block),)](q, scale, out, n, HEAD_DIM=q.shape[2], BLOCK=block,
                                                          num_warps=8)
    return out
