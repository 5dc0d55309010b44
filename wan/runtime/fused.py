"""Per-token elementwise chains of a DiT block: eager definitions and their fused CUDA kernels.

Each function here is a short chain (norm -> modulate -> cast, RMS norm -> RoPE, gated
residual -> camera affine) that eager PyTorch runs as 4-10 separate passes over a
[tokens, 5120] float32 tensor; on a GPU those passes cost a third of a block's matmul
time at 480p. ``run(fn, ...)`` calls the hand-written Triton kernel for ``fn``
(triton_kernels.py) when the tensors are on CUDA, and the eager definition otherwise.
The eager versions are the definition: the kernels compute the same function.

Other ``wan/runtime`` modules add their own rows with ``register_kernel`` (``weights8``: the
per-token 8-bit activation quantization).

LINGBOT_FUSED=0 turns the kernels off (the eager path is exact, only slower). A kernel
that fails once (e.g. no Triton backend for the GPU) is not tried again in the process; one
that refuses a call's layout (ValueError, checked before launch) leaves only that call eager.
"""
from __future__ import annotations

import functools
import logging
from typing import Callable

import torch
import torch.nn.functional as F

from . import switches

log = logging.getLogger(__name__)


def _rms(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS norm over the last dimension of float32 ``h``, times ``weight``."""
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def _rotate_pairs(h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> torch.Tensor:
    """h [B, l, D] float32 -> [B, l, heads, D / heads] with consecutive channel pairs rotated."""
    pairs = h.unflatten(-1, (heads, -1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def ln_modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float,
                dtype: torch.dtype) -> torch.Tensor:
    """LayerNorm(x) * (1 + scale) + shift in float32, returned in ``dtype``.
    x [B, l, D]; shift, scale [B, D] float32."""
    h = F.layer_norm(x.float(), (x.shape[-1],), eps=eps)
    return (h * (1 + scale[:, None]) + shift[:, None]).to(dtype)


def ln_affine(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
              dtype: torch.dtype) -> torch.Tensor:
    """LayerNorm with a learned gain and bias in float32, returned in ``dtype``."""
    return F.layer_norm(x.float(), (x.shape[-1],), weight.float(), bias.float(), eps).to(dtype)


def gate_camera_(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, scale: torch.Tensor,
                 shift: torch.Tensor) -> torch.Tensor:
    """x = (x + y * gate) * (1 + scale) + shift, in place on the float32 stream.

    The self-attention's gated residual followed by the camera injection: one pass over x
    instead of three. x [B, l, D] float32; y [B, l, D]; gate [B, D] float32; scale, shift
    [B or 1, l, D] in the camera layers' dtype. ``1 + scale`` stays in that dtype, as in the
    reference under bf16 autocast."""
    return x.add_(y * gate[:, None]).mul_(1 + scale).add_(shift)


def add_ln_modulate_(x: torch.Tensor, y: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float,
                     dtype: torch.dtype) -> torch.Tensor:
    """x += y (in place), then LayerNorm(x) * (1 + scale) + shift in ``dtype``: the
    cross-attention residual fused with the FFN's input. x [B, l, D] float32; y [B, l, D]."""
    x.add_(y)
    return ln_modulate(x, shift, scale, eps, dtype)


def rms_rope_(x: torch.Tensor, weight: torch.Tensor | None, cos: torch.Tensor | None, sin: torch.Tensor | None,
              token_start: int, eps: float, head_dim: int) -> torch.Tensor:
    """In place on x [rows, D] (tokens token_start.. of one sample): RMS norm with ``weight``
    (None: none), then RoPE with the rows' slice of the full cos/sin tables (None: none).

    On CUDA, ``run`` calls the Triton kernel instead."""
    heads = x.shape[-1] // head_dim
    h = x[None].float()
    if weight is not None:
        h = _rms(h, weight, eps)
    if cos is None:
        h = h.unflatten(-1, (heads, -1))
    else:
        rows = slice(token_start, token_start + x.shape[0])
        h = _rotate_pairs(h, cos[rows], sin[rows], heads)
    x.copy_(h[0].flatten(-2))
    return x


@functools.lru_cache(maxsize=None)
def _kernels():
    try:
        from . import triton_kernels
    except Exception as exc:  # noqa: BLE001 - no Triton: the eager path is exact
        log.warning("LingBot: Triton unavailable (%s); the fused elementwise chains run eagerly", exc)
        return None
    return triton_kernels


def _per_sample(x: torch.Tensor, one: Callable[[int], torch.Tensor]) -> torch.Tensor:
    """Stack one([b]) for each sample b of x [B, n, D] (the kernels work on [n, D] rows)."""
    if x.shape[0] == 1:
        return one(0)[None]
    return torch.stack([one(b) for b in range(x.shape[0])])


def _ln_modulate_cuda(k, x, shift, scale, eps, dtype):
    return _per_sample(x, lambda b: k.layer_norm(x[b], scale[b], shift[b], eps, dtype, modulate=True))


def _ln_affine_cuda(k, x, weight, bias, eps, dtype):
    return _per_sample(x, lambda b: k.layer_norm(x[b], weight, bias, eps, dtype, modulate=False))


def _add_ln_modulate_cuda(k, x, y, shift, scale, eps, dtype):
    return _per_sample(x, lambda b: k.layer_norm(x[b], scale[b], shift[b], eps, dtype, modulate=True,
                                                 residual=y[b]))


def _gate_camera_cuda(k, x, y, gate, scale, shift):
    return k.gate_camera_(x, y, gate, scale, shift)


def _rms_rope_cuda(k, x, weight, cos, sin, token_start, eps, head_dim):
    return k.rms_rope_(x, weight, cos, sin, token_start, eps, head_dim)


# eager definition -> its CUDA implementation (called with the kernels module first)
_CUDA = {
    ln_modulate: _ln_modulate_cuda,
    ln_affine: _ln_affine_cuda,
    add_ln_modulate_: _add_ln_modulate_cuda,
    gate_camera_: _gate_camera_cuda,
    rms_rope_: _rms_rope_cuda,
}
_broken: set[str] = set()


def register_kernel(fn: Callable, cuda: Callable) -> None:
    """Add a row to the table: ``run(fn, ...)`` calls ``cuda(kernels_module, ...)`` on CUDA
    (for definitions living in other ``wan/runtime`` modules, e.g. ``weights8``)."""
    _CUDA[fn] = cuda


def run(fn: Callable, *args, **kwargs):
    """``fn(*args)``, through its Triton kernel when the first tensor is on CUDA."""
    cuda = _CUDA.get(fn)
    if cuda is not None and args[0].is_cuda and switches.FUSED() and fn.__name__ not in _broken:
        kernels = _kernels()
        if kernels is not None:
            try:
                return cuda(kernels, *args, **kwargs)
            except torch.cuda.OutOfMemoryError:
                raise
            except ValueError as exc:  # a layout this kernel does not take: eager for this call only
                log.debug("LingBot: %s runs eagerly for this call (%s)", fn.__name__, exc)
                return fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - e.g. no Triton backend for this GPU
                _broken.add(fn.__name__)
                log.warning("LingBot: fused kernel for %s failed (%s); using the eager version from now on",
                            fn.__name__, exc)
    return fn(*args, **kwargs)
