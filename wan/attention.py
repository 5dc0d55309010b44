"""Scaled dot-product attention with an optional fast kernel.

All inputs and outputs use the layout [batch, tokens, heads, head_dim]. The DiT needs no
masks: a sample has no padded tokens and cross-attention looks at every text position.

The backend is chosen once per device type. PyTorch SDPA is always available; on CUDA
flash-attn (3, then 2) or SageAttention is used when installed. The environment variable
LINGBOT_ATTENTION=sdpa|flash|sage forces one; forcing one that cannot run is an error.
"""
from __future__ import annotations

import functools
import os
from typing import Callable

import torch
import torch.nn.functional as F

ENV_VAR = "LINGBOT_ATTENTION"
BACKENDS = ("sdpa", "flash", "sage")

# Kernel signature after layout adaptation: (q, k, v) in [B, L, H, D] -> [B, L, H, D].
Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
_HALF = (torch.float16, torch.bfloat16)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return out.transpose(1, 2)


def _load_flash() -> Kernel | None:
    """flash-attn 3 (Hopper) first, then flash-attn 2; None when neither imports."""
    try:
        from flash_attn_interface import flash_attn_func as fa3
    except Exception:  # noqa: BLE001 - a broken install must not break the default path
        fa3 = None
    if fa3 is not None:
        def run3(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            out = fa3(q, k, v)
            # Some FA3 releases return (out, softmax_lse).
            return out[0] if isinstance(out, tuple) else out
        return run3
    try:
        from flash_attn import flash_attn_func as fa2
    except Exception:  # noqa: BLE001
        return None
    return lambda q, k, v: fa2(q, k, v)


def _load_sage() -> Kernel | None:
    try:
        from sageattention import sageattn
    except Exception:  # noqa: BLE001
        return None
    return lambda q, k, v: sageattn(q, k, v, tensor_layout="NHD", is_causal=False)


_LOADERS = {"flash": _load_flash, "sage": _load_sage}


def _half_precision(kernel: Kernel) -> Kernel:
    """flash / sage run in fp16 or bf16 only: cast float32 inputs to bf16 and back."""
    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out_dtype = q.dtype
        if q.dtype not in _HALF:
            q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
        return kernel(q, k, v).to(out_dtype)
    return run


@functools.lru_cache(maxsize=None)
def _select(device_type: str) -> tuple[str, Kernel]:
    forced = os.environ.get(ENV_VAR, "").strip().lower()
    if forced and forced not in BACKENDS:
        raise ValueError(f"{ENV_VAR}={forced!r} is not one of {', '.join(BACKENDS)}")
    if forced == "sdpa":
        return "sdpa", _sdpa
    if forced:
        if device_type != "cuda":
            raise RuntimeError(
                f"{ENV_VAR}={forced} needs CUDA tensors, but attention runs on {device_type!r}; "
                f"unset {ENV_VAR} or set it to sdpa"
            )
        kernel = _LOADERS[forced]()
        if kernel is None:
            package = "flash-attn (flash_attn_interface or flash_attn)" if forced == "flash" else "sageattention"
            raise RuntimeError(f"{ENV_VAR}={forced} but {package} cannot be imported; install it or unset {ENV_VAR}")
        return forced, _half_precision(kernel)
    if device_type == "cuda":
        for name in ("flash", "sage"):
            kernel = _LOADERS[name]()
            if kernel is not None:
                return name, _half_precision(kernel)
    return "sdpa", _sdpa


def backend_name(device: torch.device | str) -> str:
    """Name of the backend that attention() uses for tensors on `device`."""
    return _select(torch.device(device).type)[0]


def reset_backend_choice() -> None:
    """Forget the cached choice (after changing LINGBOT_ATTENTION, e.g. in tests)."""
    _select.cache_clear()


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Softmax attention over all keys; q [B, Lq, H, D], k and v [B, Lk, H, D] -> [B, Lq, H, D]."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"attention expects [B, L, heads, head_dim] tensors, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    return _select(q.device.type)[1](q, k, v)
