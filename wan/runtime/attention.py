"""Scaled dot-product attention with an optional fast kernel.

All inputs and outputs use the layout [batch, tokens, heads, head_dim]. The DiT needs no
masks: a sample has no padded tokens and cross-attention looks at every text position.

The backends are rows of ``ATTENTION_BACKENDS`` with their constraints (devices, dtypes,
head sizes, compute capability) and whether they serve a sequence-parallel run.
The backend is chosen once per device type. PyTorch SDPA is always available; on CUDA
flash-attn (3, then 2) or SageAttention is used when installed. ``flash_fp8`` (FlashAttention
3 on fp8 operands quantized per head, Hopper only) is never picked by itself: it rounds q, k
and v to 3 mantissa bits, and what that does to pictures of the real weights is not measured.
The environment variable LINGBOT_ATTENTION=sdpa|flash|flash_fp8|sage forces one; forcing one
that cannot run is an error.

A run can choose its own backend with ``attention_backend(name)`` (a context manager over
a context variable, so the choice ends with the run and does not leak into other runs or
threads). ``auto`` picks by GPU (``auto_backend``): FlashAttention 3 in bf16 on Hopper when
installed (measured faster than cuDNN SDPA on an H100, 2026-11-28), else PyTorch SDPA on
Hopper and newer (sageattention 1.0.6 ran at 0.75-0.80x of cuDNN SDPA on an H100) and
wherever the 8-bit kernel is not known to be faster; SageAttention when installed on
Ampere/Ada consumer cards (sm86/sm89), where its authors report about 2x over FlashAttention 2.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import os
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

ENV_VAR = "LINGBOT_ATTENTION"
# Compute capabilities where the 8-bit SageAttention kernel is published as faster than
# FlashAttention 2 / SDPA: RTX 30 (sm86) and RTX 40 / L4 / L40 (sm89).
SAGE_FASTER_CAPABILITIES = ((8, 6), (8, 9))

_RUN_CHOICE: contextvars.ContextVar[str | None] = contextvars.ContextVar("lingbot_attention", default=None)

# Kernel signature after layout adaptation: (q, k, v) in [B, L, H, D] -> [B, L, H, D].
Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
_HALF = (torch.float16, torch.bfloat16)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return out.transpose(1, 2)


def _fa3() -> Callable | None:
    """FlashAttention 3's ``flash_attn_func`` (Hopper): from a flash-attn build of its
    ``hopper/`` folder (``flash_attn_interface``) or the forward-only ``fa3-fwd`` wheel on
    PyPI (``fa3_fwd_interface``); None when neither imports."""
    for module in ("flash_attn_interface", "fa3_fwd_interface"):
        try:
            return importlib.import_module(module).flash_attn_func
        except Exception:  # noqa: BLE001 - a broken install must not break the default path
            continue
    return None


def _first(out):
    # Some FA3 releases return (out, softmax_lse).
    return out[0] if isinstance(out, tuple) else out


def _load_flash() -> Kernel | None:
    """flash-attn 3 (Hopper) first, then flash-attn 2; None when neither imports."""
    fa3 = _fa3()
    if fa3 is not None:
        return lambda q, k, v: _first(fa3(q, k, v))
    try:
        from flash_attn import flash_attn_func as fa2
    except Exception:  # noqa: BLE001
        return None
    return lambda q, k, v: fa2(q, k, v)


FA3_FP8_HEAD_DIMS = (64, 96, 128, 192, 256)  # FlashAttention 3's fp8 forward kernels


# A kernel on keys and values its caller keeps quantized (a KV cache's, ``LayerKV.attended_fp8``):
# (q [B, Lq, H, D] bf16/fp16, k, v [B, Lk, H, D] fp8 e4m3, k_scales, v_scales [B, H] float32)
# -> [B, Lq, H, D] in q's dtype; q is quantized inside (it changes on every call).
KeptKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _load_flash_fp8_kept() -> KeptKernel | None:
    """FlashAttention 3 on fp8 e4m3 operands quantized per (sample, head)
    (``weights8.quantize_heads``: q here, k and v by the caller), the scales passed as the
    kernel's descale factors, the output in q's dtype."""
    fa3 = _fa3()
    if fa3 is None:
        return None
    from .weights8 import quantize_heads

    def run(q: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, k_scales: torch.Tensor,
            v_scales: torch.Tensor) -> torch.Tensor:
        q8, q_scales = quantize_heads(q)
        return _first(fa3(q8, k8, v8, q_descale=q_scales, k_descale=k_scales, v_descale=v_scales)).to(q.dtype)
    return run


def _load_flash_fp8() -> Kernel | None:
    """FlashAttention 3 on fp8 e4m3 operands: q, k and v quantized per head on the fly
    (``weights8.quantize_heads``), their scales passed as the kernel's descale factors, the
    output in bf16. Hopper's fp8 tensor cores run it at about twice the bf16 rate; the
    rounding of q, k and v to 3 mantissa bits is what it costs (bench/attention_backends.py)."""
    kept = _LOADERS["flash_fp8_kept"]()
    if kept is None:
        return None
    from .weights8 import quantize_heads

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if q.shape[-1] not in FA3_FP8_HEAD_DIMS:  # e.g. the tiny test geometry: SDPA instead of an error
            return _sdpa(q, k, v)
        (k8, ks), (v8, vs) = quantize_heads(k), quantize_heads(v)
        return kept(q, k8, v8, ks, vs)
    return run


SAGE_HEAD_DIMS = (64, 96, 128)  # what sageattn's kernels take; the A14B experts use 128


def _load_sage() -> Kernel | None:
    try:
        from sageattention import sageattn
    except Exception:  # noqa: BLE001
        return None

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if q.shape[-1] not in SAGE_HEAD_DIMS:  # e.g. the tiny test geometry: SDPA instead of an error
            return _sdpa(q, k, v)
        return sageattn(q, k, v, tensor_layout="NHD", is_causal=False)
    return run


_LOADERS = {"flash": _load_flash, "flash_fp8": _load_flash_fp8, "flash_fp8_kept": _load_flash_fp8_kept,
            "sage": _load_sage}


@dataclass(frozen=True)
class AttentionBackend:
    """One attention kernel and what it needs (the place to add one: a row of ``ATTENTION_BACKENDS``).

    ``supports_sequence_parallel``: the kernel attends whole heads of one device's queries
    to keys and values it is given, so a sequence-parallel run (heads split across GPUs
    after an all-to-all, Ulysses style) can call it per rank; whoever builds a parallel run
    must refuse a backend without it."""

    name: str
    load: Callable[[], Kernel | None]  # the kernel in [B, L, H, D] layout; None when not installed
    package: str  # what to install for it (messages)
    devices: tuple[str, ...]  # device types it runs on
    dtypes: tuple[torch.dtype, ...]  # inputs it takes as they are (others are cast to bf16 and back)
    head_dims: tuple[int, ...] | None  # head sizes its kernels take (None: any); others fall back to SDPA
    min_capability: tuple[int, int] | None  # least CUDA compute capability (None: any)
    supports_sequence_parallel: bool
    max_capability: tuple[int, int] | None = None  # greatest one (None: any): kernels built for one architecture
    # The same kernel on fp8 keys and values the caller keeps quantized per (sample, head),
    # ``weights8.quantize_heads``' layout (a KV cache casts its committed frames once, not
    # on every pass); None: the backend attends to the keys and values as they are.
    kept: Callable[[], KeptKernel | None] | None = None

    def runs_on(self, device_type: str, capability: tuple[int, int] | None = None) -> bool:
        """Whether the backend can run on this device (capability of a CUDA device, if known)."""
        if device_type not in self.devices:
            return False
        if capability is None:
            return True
        capability = tuple(capability)
        return ((self.min_capability is None or capability >= self.min_capability)
                and (self.max_capability is None or capability <= self.max_capability))


_FLOATS = (torch.float32,) + _HALF
ATTENTION_BACKENDS: dict[str, AttentionBackend] = {
    "sdpa": AttentionBackend("sdpa", lambda: _sdpa, "PyTorch", ("cpu", "cuda"), _FLOATS, None, None, True),
    "flash": AttentionBackend("flash", lambda: _LOADERS["flash"](),
                              "flash-attn (FlashAttention 3: flash_attn_interface or the fa3-fwd wheel; or flash_attn 2)",
                              ("cuda",), _HALF, tuple(range(8, 257, 8)), (8, 0), True),
    # Hopper only: FlashAttention 3's fp8 kernels are built for sm90.
    "flash_fp8": AttentionBackend("flash_fp8", lambda: _LOADERS["flash_fp8"](),
                                  "FlashAttention 3 (the fa3-fwd wheel, or flash_attn_interface)", ("cuda",), _HALF,
                                  FA3_FP8_HEAD_DIMS, (9, 0), True, max_capability=(9, 0),
                                  kept=lambda: _LOADERS["flash_fp8_kept"]()),
    "sage": AttentionBackend("sage", lambda: _LOADERS["sage"](), "sageattention", ("cuda",), _HALF,
                             SAGE_HEAD_DIMS, (8, 0), True),
}
BACKENDS = tuple(ATTENTION_BACKENDS)
CHOICES = ("auto",) + BACKENDS


def require_sequence_parallel(name: str) -> AttentionBackend:
    """The backend ``name``, after checking that a sequence-parallel run may use it (what a
    parallel run's builder calls); ValueError naming the backend and the ones that can."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    backend = ATTENTION_BACKENDS[name]
    if not backend.supports_sequence_parallel:
        able = [b.name for b in ATTENTION_BACKENDS.values() if b.supports_sequence_parallel]
        raise ValueError(f"attention backend {name!r} cannot run a sequence-parallel model; choose one of "
                         f"{', '.join(able)}")
    return backend


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
        _check_capability(forced, torch.cuda.get_device_capability(), ENV_VAR + "=" + forced)
        kernel = ATTENTION_BACKENDS[forced].load()
        if kernel is None:
            package = ATTENTION_BACKENDS[forced].package
            raise RuntimeError(f"{ENV_VAR}={forced} but {package} cannot be imported; install it or unset {ENV_VAR}")
        return forced, _half_precision(kernel)
    if device_type == "cuda":
        capability = torch.cuda.get_device_capability()
        picked = auto_backend(capability, _LOADERS["sage"]() is not None, _fa3() is not None)
        if picked != "sdpa":
            return picked, _half_precision(ATTENTION_BACKENDS[picked].load())
        flash = _LOADERS["flash"]()
        if flash is not None and tuple(capability) < (9, 0):  # flash-attn 2 where it is the flash kernel there is
            return "flash", _half_precision(flash)
    return "sdpa", _sdpa


def _check_capability(name: str, capability: tuple[int, int], what: str) -> None:
    """RuntimeError naming the GPU generation a backend's kernels were built for."""
    backend = ATTENTION_BACKENDS[name]
    if not backend.runs_on("cuda", capability):
        low, high = backend.min_capability, backend.max_capability
        wanted = (f"compute capability {low[0]}.{low[1]}" if low == high else
                  f"compute capability {low[0]}.{low[1]} or newer" if high is None else
                  f"compute capability {low[0]}.{low[1]} to {high[0]}.{high[1]}")
        raise RuntimeError(f"{what} needs a GPU of {wanted} (Hopper: H100 / H200 for 9.0), this one is "
                           f"{capability[0]}.{capability[1]}; choose sdpa or auto")


def auto_backend(capability: tuple[int, int] | None, sage_installed: bool, fa3_installed: bool = False) -> str:
    """``auto``'s pick for a CUDA device of this compute capability (None: not CUDA).

    Hopper with FlashAttention 3: ``flash`` (bf16), measured on an H100 on 2026-11-28 at
    1.16x cuDNN SDPA on a Fast chunk's shapes and 1.12x on the exact path's 480p, with the
    same error against float32 (bench/RESULTS.md). An installed SageAttention only where it
    is known to be faster: on the H100 it ran at 0.75-0.8x of SDPA, on RTX 30/40 cards ~2x."""
    if capability is None:
        return "sdpa"
    if fa3_installed and ATTENTION_BACKENDS["flash_fp8"].runs_on("cuda", capability):  # FA3's architecture
        return "flash"
    if sage_installed and tuple(capability) in SAGE_FASTER_CAPABILITIES:
        return "sage"
    return "sdpa"


@functools.lru_cache(maxsize=None)
def _chosen(name: str, device: torch.device) -> tuple[str, Kernel]:
    """The kernel for a per-run choice on ``device`` (errors name the choice and the fix)."""
    if name == "auto":
        capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
        name = auto_backend(capability, capability is not None and _LOADERS["sage"]() is not None,
                            capability is not None and _fa3() is not None)
    if name == "sdpa":
        return "sdpa", _sdpa
    backend = ATTENTION_BACKENDS[name]
    if not backend.runs_on(device.type):
        raise RuntimeError(f"attention backend {name!r} needs CUDA tensors, but attention runs on "
                           f"{device.type!r}; choose sdpa or auto")
    _check_capability(name, torch.cuda.get_device_capability(device), f"attention backend {name!r}")
    kernel = backend.load()
    if kernel is None:
        package = backend.package
        raise RuntimeError(f"attention backend {name!r} chosen but {package} cannot be imported; "
                           f"install it or choose sdpa or auto")
    return name, _half_precision(kernel)


@contextlib.contextmanager
def attention_backend(name: str | None) -> Iterator[None]:
    """Use backend ``name`` (auto|sdpa|sage|flash|flash_fp8) for attention calls inside the block;
    None keeps the process default (LINGBOT_ATTENTION, else the first installed kernel)."""
    if name is not None and name not in CHOICES:
        raise ValueError(f"attention backend must be one of {', '.join(CHOICES)}, got {name!r}")
    token = _RUN_CHOICE.set(name)
    try:
        yield
    finally:
        _RUN_CHOICE.reset(token)


def run_choice() -> str | None:
    """This run's choice (``attention_backend``), None outside one: what a parallel run sends
    its workers so that every rank attends with the same kernel."""
    return _RUN_CHOICE.get()


def _kernel_for(device: torch.device) -> tuple[str, Kernel]:
    choice = _RUN_CHOICE.get()
    if choice is None:
        return _select(device.type)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return _chosen(choice, device)


def backend_name(device: torch.device | str) -> str:
    """Name of the backend that attention() uses for tensors on `device` (in this context)."""
    return _kernel_for(torch.device(device))[0]


def reset_backend_choice() -> None:
    """Forget the cached choice (after changing LINGBOT_ATTENTION, e.g. in tests)."""
    _select.cache_clear()
    _chosen.cache_clear()
    _kept_kernel.cache_clear()


@functools.lru_cache(maxsize=None)
def _kept_kernel(name: str) -> KeptKernel | None:
    return ATTENTION_BACKENDS[name].kept()


def attends_kept_operands(choice: str | None) -> bool:
    """Whether a run choosing backend ``choice`` attends with a kernel on kept fp8 operands
    (so a bf16 KV cache keeps them beside itself: memory plans count them). ``auto`` never
    picks such a kernel."""
    backend = ATTENTION_BACKENDS.get(choice or "")
    return backend is not None and backend.kept is not None


def kept_operands_kernel(q: torch.Tensor) -> KeptKernel | None:
    """The kernel of this context's backend on keys and values kept quantized by the caller
    (``AttentionBackend.kept``), for queries like ``q`` [B, L, H, D]; None when the backend
    attends to unquantized operands (all but ``flash_fp8``) or does not take q's dtype or
    head size. A Fast KV cache then gives ``LayerKV.attended_fp8()`` in place of its keys
    and values: the same operands the kernel would make, cast once per chunk."""
    name, _ = _kernel_for(q.device)
    backend = ATTENTION_BACKENDS.get(name)
    if backend is None or backend.kept is None or q.dtype not in backend.dtypes:
        return None
    if backend.head_dims is not None and q.shape[-1] not in backend.head_dims:
        return None
    return _kept_kernel(name)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Softmax attention over all keys; q [B, Lq, H, D], k and v [B, Lk, H, D] -> [B, Lq, H, D]."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"attention expects [B, L, heads, head_dim] tensors, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    return _kernel_for(q.device)[1](q, k, v)
