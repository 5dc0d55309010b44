"""``POST /free`` and Unload Models on every GPU the pack uses.

Both end in ComfyUI's ``comfy.model_management.unload_all_models``, which unloads the models
of the GPU ComfyUI computes on; hosts before 0.28 look at that GPU only. The pack's models on
the other GPUs (the low-noise expert of ``expert_per_gpu``, ``cfg_split``'s second copies, the
workers' copies of ``sequence_parallel``) and the worker processes themselves (each holds a
CUDA context and NCCL buffers on its GPU, also when a ``devices=auto`` measurement or a failed
load left them running without a ComfyUI model standing for them) would stay.

``install_unload_hook`` wraps the host's function once, at the pack's import: after the host's
own unload, every model of the pack still in ComfyUI's list is unloaded through ComfyUI's
bookkeeping, on whatever device, the worker processes stop (during a run that uses them: when
it ends) and the allocator's cache is emptied on every GPU. Other packs' models are left to
the host's own rule.
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Callable

import comfy.model_management as mm

from .expert_patcher import ExpertPatcher, unload_patcher
from .workers import WorkerGroupPatcher, WorkerPatcher, current_pool, stop_workers

log = logging.getLogger(__name__)

PACK_PATCHERS = (ExpertPatcher, WorkerPatcher, WorkerGroupPatcher)
_MARK = "_lingbot_unloads_every_gpu"


def unload_pack_models() -> int:
    """Unload every model of the pack that ComfyUI holds, on any device, and stop the worker
    processes; how many models were unloaded."""
    ours = [loaded.model for loaded in list(mm.current_loaded_models) if isinstance(loaded.model, PACK_PATCHERS)]
    for patcher in ours:
        unload_patcher(patcher)
    pool = current_pool()
    if pool is not None and pool.running:
        stop_workers()
    # The allocator's cached blocks on every GPU (the host empties its cache only when it unloaded
    # something there): what a run outside ComfyUI's manager left, the VAE of decode_on_second_gpu.
    mm.soft_empty_cache()
    if ours:
        log.info("LingBot: unloaded %d model(s) of the pack on %s", len(ours),
                 ", ".join(sorted({str(p.load_device) for p in ours})))
    return len(ours)


def install_unload_hook() -> None:
    """Make ``unload_all_models`` (``POST /free``, Unload Models) also run ``unload_pack_models``;
    once per process, whatever imports the pack again."""
    original: Callable[..., Any] = mm.unload_all_models
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def unload_all_models(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        unload_pack_models()
        return result

    setattr(unload_all_models, _MARK, True)
    mm.unload_all_models = unload_all_models


__all__ = ["PACK_PATCHERS", "install_unload_hook", "unload_pack_models"]
