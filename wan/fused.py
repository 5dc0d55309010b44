"""Per-token elementwise chains of a DiT block, fused into one kernel each on CUDA.

Each function here is a short chain (norm -> modulate -> cast, RMS norm -> RoPE -> cast)
that eager PyTorch runs as 4-10 separate passes over a [tokens, 5120] float32 tensor. On a
GPU those passes cost more than a third of a block's matmul time at 480p; compiled by
torch.compile (Inductor) each chain becomes one read and one write. The eager versions
are the definition: the compiled ones compute the same function.

Compilation is used only for CUDA tensors and can be switched off with LINGBOT_COMPILE=0
(for example where no Triton is installed); the first call pays a one-off compile.
"""
from __future__ import annotations

import functools
import logging
import os
from typing import Callable

import torch
import torch.nn.functional as F

ENV_VAR = "LINGBOT_COMPILE"
log = logging.getLogger(__name__)


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


def rms_rope(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float,
             heads: int) -> torch.Tensor:
    """RMSNorm(x) * weight, split into heads, channel pairs rotated by RoPE; x's dtype.
    x [B, l, D]; cos, sin [l, 1, D / heads / 2] float32 -> [B, l, heads, D / heads]."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    pairs = h.unflatten(-1, (heads, -1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2).to(x.dtype)


def rms_heads(x: torch.Tensor, weight: torch.Tensor, eps: float, heads: int) -> torch.Tensor:
    """RMSNorm(x) * weight split into heads, in x's dtype (cross-attention q and k)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return h.unflatten(-1, (heads, -1)).to(x.dtype)


def camera_affine_(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """x = (1 + scale) * x + shift, in place on the float32 stream."""
    return x.mul_(1 + scale).add_(shift)


def _compile_enabled() -> bool:
    return os.environ.get(ENV_VAR, "1") != "0" and hasattr(torch, "compile")


@functools.lru_cache(maxsize=None)
def _compiled(fn: Callable) -> Callable | None:
    try:
        return torch.compile(fn, dynamic=True)
    except Exception as exc:  # noqa: BLE001 - no compiler: the eager path is exact
        log.warning("torch.compile unavailable (%s); running %s eagerly", exc, fn.__name__)
        return None


_broken: set[str] = set()


def run(fn: Callable, *args, **kwargs):
    """``fn(*args)``, through its compiled twin when the first tensor is on CUDA."""
    first = args[0]
    if first.is_cuda and _compile_enabled() and fn.__name__ not in _broken:
        compiled = _compiled(fn)
        if compiled is not None:
            try:
                return compiled(*args, **kwargs)
            except torch.cuda.OutOfMemoryError:
                raise
            except Exception as exc:  # noqa: BLE001 - e.g. no Triton for this GPU
                _broken.add(fn.__name__)
                log.warning("compiled %s failed (%s); using the eager version from now on", fn.__name__, exc)
    return fn(*args, **kwargs)
