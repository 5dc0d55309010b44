"""The sequence-parallel workers as ComfyUI models: their VRAM accounted, unloaded by ComfyUI.

ComfyUI's process is rank 0 of the group (pipeline/parallel_pool.py): its own copy of the
running expert is the ordinary ``ExpertPatcher`` on its GPU; each worker GPU gets a
``WorkerPatcher``, a ``ModelPatcher`` whose load device is that GPU and whose size is the
expert's. ComfyUI plans memory with them like any model (its free-memory reading of a
worker's GPU already sees the worker process's allocations), and unloading one (eviction,
``POST /free``, Unload Models, a model switch) tells that worker to drop its copy: nothing
stays behind on a worker GPU that ComfyUI does not know of. The worker processes themselves
are started once and kept warm (one pool per ComfyUI process, closed at exit).

``SequenceParallelSource`` is the ``ExpertSource`` the sampler uses: ``acquire`` has ComfyUI
load the expert on rank 0 and on every worker (the other expert goes first, as with one
GPU) and returns a ``ParallelModel``, so the sampler runs every forward on all GPUs.
"""
from __future__ import annotations

import atexit
import logging
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

import comfy.model_management as mm
from comfy.model_patcher import ModelPatcher

from ...loaders.expert_size import expert_memory
from ...pipeline.parallel_pool import LoadExpert, ParallelModel, RankPool
from .expert_patcher import ExpertLoadOptions, ExpertPatcher, unload_patcher

log = logging.getLogger(__name__)

_POOL: RankPool | None = None


def shared_pool(devices: Sequence[torch.device | str]) -> RankPool:
    """The process's one pool over ``devices`` (started, or started again after a failure;
    a different device list closes the old pool first)."""
    global _POOL
    devices = [torch.device(d) for d in devices]
    if _POOL is not None and _POOL.devices != devices:
        _POOL.close()
        _POOL = None
    if _POOL is None:
        _POOL = RankPool(devices)
    return _POOL.start()


def current_pool() -> RankPool | None:
    return _POOL


@atexit.register
def shutdown() -> None:
    """Stop the workers (also at ComfyUI's exit; a worker left behind exits by itself when
    ComfyUI's process is gone)."""
    global _POOL
    if _POOL is not None:
        _POOL.close()
        _POOL = None


class WorkerSlot(nn.Module):
    """What a ``WorkerPatcher`` calls its model: which expert, on which worker (no weights:
    they live in the worker process)."""

    def __init__(self, key: str, factory: LoadExpert, rank: int, devices: Sequence[torch.device]) -> None:
        super().__init__()
        self.key, self.factory, self.rank, self.devices = key, factory, rank, list(devices)

    def extra_repr(self) -> str:
        return f"key={self.key!r}, rank={self.rank}, device={self.devices[self.rank]}"


class WorkerPatcher(ModelPatcher):
    """One worker GPU's copy of one expert, for ComfyUI's memory manager."""

    model: WorkerSlot

    @classmethod
    def for_expert(cls, name: str, folder: str | Path, options: ExpertLoadOptions, rank: int,
                   devices: Sequence[torch.device]) -> "WorkerPatcher":
        folder = Path(folder)
        device = torch.device(devices[rank])
        swap = options.blocks_on_gpu if device.type == "cuda" else None
        on_device, _ = expert_memory(folder, options.quantize, swap)
        factory = LoadExpert(str(folder), options.quantize, swap)
        slot = WorkerSlot(f"{name}:{folder}", factory, rank, devices)
        return cls(slot, device, torch.device("cpu"), size=on_device)

    def is_resident(self) -> bool:
        pool = current_pool()
        return pool is not None and pool.running and self.model.rank in pool.loaded.get(self.model.key, set())

    def get_ram_usage(self) -> int:
        return 0  # the copy lives in the worker process, on its GPU

    def load(self, device_to=None, lowvram_model_memory=0, force_patch_weights=False, full_load=False):
        slot = self.model
        if not self.is_resident():
            log.info("LingBot: loading %s on %s (sequence-parallel worker %d)", slot.key, self.load_device, slot.rank)
            shared_pool(slot.devices).load_on(slot.key, slot.factory, [slot.rank])
        self.model.device = self.load_device
        self.model.model_loaded_weight_memory = self.model_size()
        self.model.model_lowvram = False
        self.model.lowvram_patch_counter = 0

    def partially_load(self, device_to, extra_memory=0, force_patch_weights=False):
        self.load(device_to, full_load=True)
        return self.model_size()

    def partially_unload(self, device_to, memory_to_free=0, force_patch_weights=False):
        return 0  # all or nothing: ComfyUI goes on to detach(), which drops the copy

    def unpatch_model(self, device_to=None, unpatch_weights=True):
        if unpatch_weights:
            self._drop()
        return super().unpatch_model(device_to, unpatch_weights)

    def _drop(self) -> None:
        pool = current_pool()
        self.model.model_loaded_weight_memory = 0
        if pool is not None and pool.running and self.is_resident():
            log.info("LingBot: worker %d drops %s", self.model.rank, self.model.key)
            pool.free(self.model.key, [self.model.rank])


class SequenceParallelExperts:
    """Both experts on every GPU of ``devices`` (``devices[0]``: ComfyUI's): rank 0's
    ``ExpertPatcher`` (``rank0``, default new ones) and a ``WorkerPatcher`` per worker GPU,
    per expert."""

    def __init__(self, folders: dict[str, Path], options: ExpertLoadOptions, devices: Sequence[torch.device],
                 rank0: dict[str, ExpertPatcher] | None = None) -> None:
        self.devices = [torch.device(d) for d in devices]
        if len(self.devices) < 2:
            raise ValueError(f"sequence parallel needs at least 2 GPUs, got {len(self.devices)}")
        self.rank0 = rank0 or {name: ExpertPatcher.for_folder(name, folders[name], options,
                                                              load_device=self.devices[0])
                               for name in ("high", "low")}
        self.workers = {name: [WorkerPatcher.for_expert(name, folders[name], options, rank, self.devices)
                               for rank in range(1, len(self.devices))] for name in ("high", "low")}

    def patchers(self, name: str) -> list[ModelPatcher]:
        return [self.rank0[name], *self.workers[name]]

    def all_patchers(self) -> list[ModelPatcher]:
        return self.patchers("high") + self.patchers("low")


class SequenceParallelSource:
    """``pipeline.sampling.ExpertSource`` running each expert on every GPU in lock-step."""

    cfg_split = False

    def __init__(self, experts: SequenceParallelExperts, inference_memory: int = 0) -> None:
        self.experts = experts
        self.inference_memory = int(inference_memory)

    def acquire(self, name: str) -> nn.Module:
        other = "low" if name == "high" else "high"
        for patcher in self.experts.patchers(other):
            if patcher.is_resident():
                unload_patcher(patcher)
        pool = shared_pool(self.experts.devices)  # started before ComfyUI loads anything on the workers
        patchers = self.experts.patchers(name)
        mm.load_models_gpu(patchers, memory_required=self.inference_memory, force_full_load=True)
        rank0 = self.experts.rank0[name]
        if rank0.expert is None:
            raise RuntimeError(f"ComfyUI did not load the {name}-noise expert to {rank0.load_device}")
        return ParallelModel(pool, self.experts.workers[name][0].model.key, rank0.expert)

    def release(self, name: str) -> None:
        for patcher in self.experts.patchers(name):
            unload_patcher(patcher)

    def abort(self) -> None:
        for patcher in self.experts.all_patchers():
            unload_patcher(patcher)

    def close(self) -> None:
        self.abort()


_LINKS: dict[tuple[str, ...], dict] = {}


def measured_link(devices: Sequence[torch.device | str]) -> dict:
    """The link between ``devices``, measured once per process (``RankPool.measure_link``:
    GB/s of a timed all-to-all and what ``devices=auto`` picks on it)."""
    key = tuple(str(torch.device(d)) for d in devices)
    if key not in _LINKS:
        _LINKS[key] = shared_pool(devices).measure_link()
        link = _LINKS[key]
        log.info("LingBot: link between %s: %.1f GB/s all-to-all; auto picks %s", ", ".join(key), link["gbps"],
                 link["auto_picks"])
    return _LINKS[key]


def group_size(heads: int, count: int) -> int:
    """The most GPUs (of ``count``) a sequence-parallel group can use: a divisor of the heads."""
    size = max((p for p in range(2, count + 1) if heads % p == 0), default=0)
    if not size:
        raise ValueError(f"sequence parallel needs at least 2 GPUs whose count divides the model's {heads} heads; "
                         f"torch.cuda.device_count() is {count}")
    return size


def parallel_gpus(heads: int) -> list[torch.device]:
    """The GPUs of a sequence-parallel group: ComfyUI's first, then the next visible ones, as
    many as divide the model's ``heads``."""
    comfy_device = mm.get_torch_device()
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if comfy_device.type != "cuda" or count < 2:
        raise ValueError(f"devices=sequence_parallel needs 2 or more CUDA GPUs, but ComfyUI computes on "
                         f"{comfy_device.type} (torch.cuda.device_count() is {count}); choose devices=single")
    first = comfy_device.index or 0
    return [torch.device("cuda", (first + i) % count) for i in range(group_size(heads, count))]


__all__ = ["SequenceParallelExperts", "SequenceParallelSource", "WorkerPatcher", "current_pool", "group_size",
           "measured_link", "parallel_gpus", "shared_pool",
           "shutdown"]
