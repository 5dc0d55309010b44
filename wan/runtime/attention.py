"""Scaled dot-product attention with an optional fast kernel.

All inputs and outputs use the layout [batch, tokens, heads, head_dim]. The DiT needs no
masks: a sample has no padded tokens and cross-attention looks at every text position.

The backends are rows of ``ATTENTION_BACKENDS`` with their constraints (devices, dtypes,
head sizes, compute capability, the optional kernels that serve them) and whether they serve
a sequence-parallel run. PyTorch SDPA is always available; on CUDA FlashAttention (3, then
2) or SageAttention when installed.

A run chooses its backend with ``attention_backend(name)`` (a context manager over a context
variable, so the choice ends with the run and does not leak into other runs or threads);
``decide`` turns the choice into the backend on each device: ``auto`` is
``LINGBOT_ATTENTION`` when set (wan/runtime/switches.py), else ``auto_backend``'s rule by
GPU and installed kernels; a backend that cannot run there is refused in one line.
``flash_fp8`` (FlashAttention 3 on fp8 operands quantized per head, Hopper only) is never
picked by ``auto``: it rounds q, k and v to 3 mantissa bits, and what that does to pictures
of the real weights is not measured.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
from dataclasses import dataclass
from typing import Callable, Collection, Iterator

import torch
import torch.nn.functional as F

from . import switches

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


def _fa2() -> Callable | None:
    """flash-attn 2's ``flash_attn_func``; None when it does not import."""
    try:
        return importlib.import_module("flash_attn").flash_attn_func
    except Exception:  # noqa: BLE001 - a broken install must not break the default path
        return None


def _sageattn() -> Callable | None:
    """SageAttention's ``sageattn``; None when it does not import."""
    try:
        return importlib.import_module("sageattention").sageattn
    except Exception:  # noqa: BLE001
        return None


def _load_flash() -> Kernel | None:
    """flash-attn 3 (Hopper) first, then flash-attn 2; None when neither imports."""
    fa3 = _fa3()
    if fa3 is not None:
        return lambda q, k, v: _first(fa3(q, k, v))
    fa2 = _fa2()
    if fa2 is None:
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
    sageattn = _sageattn()
    if sageattn is None:
        return None

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if q.shape[-1] not in SAGE_HEAD_DIMS:  # e.g. the tiny test geometry: SDPA instead of an error
            return _sdpa(q, k, v)
        return sageattn(q, k, v, tensor_layout="NHD", is_causal=False)
    return run


_LOADERS = {"flash": _load_flash, "flash_fp8": _load_flash_fp8, "flash_fp8_kept": _load_flash_fp8_kept,
            "sage": _load_sage}
# The optional kernels a backend may need, each probed by importing it.
KERNELS: dict[str, Callable[[], Callable | None]] = {"fa3": _fa3, "fa2": _fa2, "sage": _sageattn}


@functools.lru_cache(maxsize=None)
def installed_kernels() -> frozenset[str]:
    """The optional kernels (``KERNELS``) that import in this process (probed once)."""
    return frozenset(name for name, probe in KERNELS.items() if probe() is not None)


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
    # The optional kernels (``KERNELS``) that serve it, any one of them; empty: built into PyTorch.
    kernels: tuple[str, ...] = ()
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

    def installed(self, kernels: Collection[str]) -> bool:
        """Whether one of the kernels it needs is among ``kernels`` (``installed_kernels()``)."""
        return not self.kernels or any(k in kernels for k in self.kernels)


_FLOATS = (torch.float32,) + _HALF
ATTENTION_BACKENDS: dict[str, AttentionBackend] = {
    "sdpa": AttentionBackend("sdpa", lambda: _sdpa, "PyTorch", ("cpu", "cuda"), _FLOATS, None, None, True),
    "flash": AttentionBackend("flash", lambda: _LOADERS["flash"](),
                              "flash-attn (FlashAttention 3: flash_attn_interface or the fa3-fwd wheel; or flash_attn 2)",
                              ("cuda",), _HALF, tuple(range(8, 257, 8)), (8, 0), True, kernels=("fa3", "fa2")),
    # Hopper only: FlashAttention 3's fp8 kernels are built for sm90.
    "flash_fp8": AttentionBackend("flash_fp8", lambda: _LOADERS["flash_fp8"](),
                                  "FlashAttention 3 (the fa3-fwd wheel, or flash_attn_interface)", ("cuda",), _HALF,
                                  FA3_FP8_HEAD_DIMS, (9, 0), True, max_capability=(9, 0), kernels=("fa3",),
                                  kept=lambda: _LOADERS["flash_fp8_kept"]()),
    "sage": AttentionBackend("sage", lambda: _LOADERS["sage"](), "sageattention", ("cuda",), _HALF,
                             SAGE_HEAD_DIMS, (8, 0), True, kernels=("sage",)),
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


def auto_backend(capability: tuple[int, int] | None, installed: Collection[str] = (),
                 sequence_parallel: bool = False) -> str:
    """``auto``'s pick by GPU and installed kernels (``installed_kernels()``; ``capability``:
    the CUDA device's, None off CUDA), when ``LINGBOT_ATTENTION`` does not say:

    1. Hopper (sm90) with FlashAttention 3: ``flash`` in bf16 (faster than cuDNN SDPA there,
       with the same error against float32; bench/RESULTS.md);
    2. RTX 30 / RTX 40 (sm86, sm89) with SageAttention: ``sage``, where its 8-bit kernel is
       published as faster than FlashAttention 2 (on Hopper it measured slower than SDPA);
    3. Ampere and Ada (sm80 to sm89) with flash-attn 2: ``flash``;
    4. else PyTorch ``sdpa`` (the CPU, Blackwell, and wherever no kernel is known faster).

    ``flash_fp8`` is never picked: it rounds q, k and v to 8 bits, and what that does to the
    real model's pictures is not measured. ``sequence_parallel``: only backends that serve a
    sequence-parallel run."""
    def able(name: str, kernel: str) -> bool:
        backend = ATTENTION_BACKENDS[name]
        return (kernel in installed and backend.runs_on("cuda", capability)
                and (backend.supports_sequence_parallel or not sequence_parallel))

    if capability is None:
        return "sdpa"
    capability = tuple(capability)
    if able("flash", "fa3") and ATTENTION_BACKENDS["flash_fp8"].runs_on("cuda", capability):  # FA3's architecture
        return "flash"
    if able("sage", "sage") and capability in SAGE_FASTER_CAPABILITIES:
        return "sage"
    if able("flash", "fa2") and capability < (9, 0):
        return "flash"
    return "sdpa"


def _capability(device: torch.device) -> tuple[int, int] | None:
    return tuple(torch.cuda.get_device_capability(device)) if device.type == "cuda" else None


def runnable(device: torch.device | str, sequence_parallel: bool = False) -> list[str]:
    """The backends that can run on ``device`` here: its type and compute capability, the
    kernels installed, and a sequence-parallel run's need."""
    device = torch.device(device)
    capability, installed = _capability(device), installed_kernels()
    return [b.name for b in ATTENTION_BACKENDS.values()
            if b.runs_on(device.type, capability) and b.installed(installed)
            and (b.supports_sequence_parallel or not sequence_parallel)]


def _why_not(backend: AttentionBackend, device: torch.device, sequence_parallel: bool) -> str | None:
    """Why ``backend`` cannot run on ``device`` here (None: it can)."""
    if device.type not in backend.devices:
        return f"{backend.name} needs a CUDA GPU, and attention runs on {device.type}"
    capability = _capability(device)
    if not backend.runs_on(device.type, capability):
        low, high = backend.min_capability, backend.max_capability
        wanted = (f"{low[0]}.{low[1]}" if low == high else f"{low[0]}.{low[1]} or newer" if high is None
                  else f"{low[0]}.{low[1]} to {high[0]}.{high[1]}")
        return (f"{backend.name} needs a GPU of compute capability {wanted} (Hopper: H100 / H200 for 9.0) and "
                f"{device} is {capability[0]}.{capability[1]}")
    if not backend.installed(installed_kernels()):
        return f"{backend.package} cannot be imported"
    if sequence_parallel and not backend.supports_sequence_parallel:
        return f"{backend.name} cannot run a sequence-parallel model"
    return None


def decide(choice: str | None, device: torch.device | str, sequence_parallel: bool = False) -> str:
    """The backend a run's ``choice`` attends with on ``device``: the one decider of ``auto``
    for every node, the command line and the bench.

    ``auto`` (or None): ``LINGBOT_ATTENTION`` when it is set (``wan/runtime/switches.py``),
    else ``auto_backend`` for the device's compute capability and the kernels installed here.
    Any other choice is itself. A backend that cannot run here (device type, compute
    capability, not installed, ``sequence_parallel`` need) is refused with a ValueError of one
    line naming the choice (or the variable and its value) and what can run here."""
    choice = choice or "auto"
    if choice not in CHOICES:
        raise ValueError(f"attention backend must be one of {', '.join(CHOICES)}, got {choice!r}")
    device = torch.device(device)
    forced = switches.ATTENTION() if choice == "auto" else None
    if choice == "auto" and forced is None:
        return auto_backend(_capability(device), installed_kernels(), sequence_parallel)
    name = forced or choice
    why = _why_not(ATTENTION_BACKENDS[name], device, sequence_parallel)
    if why is not None:
        able = runnable(device, sequence_parallel)
        them = able[0] if len(able) == 1 else f"one of {', '.join(able)}"
        what, fix = ((f"{switches.ATTENTION.name}={name}", f"unset {switches.ATTENTION.name} or set it to {them}")
                     if forced else (f"attention {name!r}", f"choose {them} or auto"))
        raise ValueError(f"{what} cannot run here: {why}; what runs here: {', '.join(able)}; {fix}")
    return name


@functools.lru_cache(maxsize=None)
def _kernel(choice: str | None, device: torch.device, forced: str) -> tuple[str, Kernel]:
    """The decided backend's kernel (``forced``: the raw ``LINGBOT_ATTENTION``, part of the key)."""
    name = decide(choice, device)
    if name == "sdpa":
        return "sdpa", _sdpa
    kernel = ATTENTION_BACKENDS[name].load()
    if kernel is None:  # imported when probed, not now: a broken install
        raise ValueError(f"attention {name!r}: {ATTENTION_BACKENDS[name].package} cannot be imported")
    return name, _half_precision(kernel)


@contextlib.contextmanager
def attention_backend(name: str | None) -> Iterator[None]:
    """Use backend ``name`` (auto|sdpa|sage|flash|flash_fp8; None: auto) for attention calls
    inside the block, decided on each device by ``decide``."""
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
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return _kernel(_RUN_CHOICE.get(), device, switches.ATTENTION.raw())


def backend_name(device: torch.device | str) -> str:
    """Name of the backend that attention() uses for tensors on `device` (in this context)."""
    return _kernel_for(torch.device(device))[0]


def reset_backend_choice() -> None:
    """Forget the probed kernels and the cached choices (after installing one, e.g. in tests)."""
    installed_kernels.cache_clear()
    _kernel.cache_clear()
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
