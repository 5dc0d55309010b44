"""The sequence-parallel workers as ComfyUI models: their VRAM accounted, unloaded by ComfyUI.

ComfyUI's process is rank 0 of the group (pipeline/parallel_pool/): its own copy of the
running expert is the ordinary ``ExpertPatcher`` on its GPU; each worker GPU gets a
``WorkerPatcher``, a ``ModelPatcher`` whose load device is that GPU and whose size is the
expert's. ComfyUI plans memory with them like any model (its free-memory reading of a
worker's GPU already sees the worker process's allocations), and unloading one (eviction,
``POST /free``, Unload Models, a model switch) tells that worker to drop its copy: nothing
stays behind on a worker GPU that ComfyUI does not know of. The worker processes themselves
are started once and kept warm between prompts (one pool per ComfyUI process, closed at
exit); the pool itself is one more ComfyUI model, a ``WorkerGroupPatcher`` on ComfyUI's GPU
(rank 0's end of the group), so ComfyUI unloading the models of its GPU stops the workers
too; ``POST /free`` and Unload Models stop them in any case (``unload_all.py``, also a pool no
ComfyUI model stands for): each worker's CUDA context and NCCL buffers go with its process and
every worker GPU is back to its idle level (the next sequence-parallel run starts them again,
a few seconds).

``SequenceParallelSource`` is the ``ExpertSource`` the sampler uses: ``acquire`` has ComfyUI
load the expert on rank 0 and on every worker (the other expert goes first, as with one
GPU) and returns a ``ParallelModel``, so the sampler runs every forward on all GPUs.
"""
from __future__ import annotations

import atexit
import logging
import threading
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
_GROUP: "WorkerGroupPatcher | None" = None
# Runs using the pool now, and whether ComfyUI unloaded the group meanwhile (it is stopped when
# the last of them ends: a run's collectives must not lose their peers half-way).
_RUNS = 0
_STOP_AFTER_RUNS = False
_LOCK = threading.RLock()


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
    global _POOL, _STOP_AFTER_RUNS
    with _LOCK:
        _STOP_AFTER_RUNS = False
        if _POOL is not None:
            log.info("LingBot: stopping the sequence-parallel workers on %s",
                     ", ".join(str(d) for d in _POOL.devices[1:]))
            _POOL.close()
            _POOL = None


def begin_run() -> None:
    """A run starts using the pool: an unload of the group meanwhile waits for ``end_run``."""
    global _RUNS
    with _LOCK:
        _RUNS += 1


def end_run() -> None:
    """The run has ended (its copies unloaded); the workers stop now if ComfyUI unloaded the
    group during it."""
    global _RUNS
    with _LOCK:
        _RUNS = max(0, _RUNS - 1)
        stop = _RUNS == 0 and _STOP_AFTER_RUNS
    if stop:
        shutdown()


def group_patcher(devices: Sequence[torch.device | str]) -> "WorkerGroupPatcher":
    """The ComfyUI model standing for the worker processes of the pool over ``devices``; a run
    loads it with its copies (``load_models_gpu([..., group_patcher(devices)])``), so that
    ComfyUI keeps it loaded between prompts and stops the workers when it unloads it."""
    global _GROUP
    devices = [torch.device(d) for d in devices]
    if _GROUP is None or _GROUP.model.devices != devices:
        _GROUP = WorkerGroupPatcher(devices)
    return _GROUP


def _group_unloaded(group: "WorkerGroupPatcher") -> None:
    """ComfyUI unloaded the group (``POST /free``, Unload Models, memory wanted on its GPU):
    stop the workers (a group of an earlier device list, replaced since, stands for no pool any more)."""
    if group is _GROUP:
        stop_workers()


def stop_workers() -> None:
    """Stop the worker processes, at once or, when runs are using them, as the last one ends
    (a run's collectives must not lose their peers half-way)."""
    global _STOP_AFTER_RUNS
    with _LOCK:
        if _RUNS:
            _STOP_AFTER_RUNS = True
            log.info("LingBot: the sequence-parallel workers were unloaded during a run: they stop when it ends")
            return
    shutdown()


def pool_status() -> dict | None:
    """What ``GET /lingbot/status`` shows of the workers (None: never started in this process)."""
    pool = _POOL
    if pool is None:
        return None
    return {"running": pool.running, "devices": [str(d) for d in pool.devices], "pids": pool.pids(),
            "loaded": {key: sorted(ranks) for key, ranks in list(pool.loaded.items()) if ranks}}


class GroupSlot(nn.Module):
    """What a ``WorkerGroupPatcher`` calls its model: the worker processes (no weights here)."""

    def __init__(self, devices: Sequence[torch.device]) -> None:
        super().__init__()
        self.devices = list(devices)

    def extra_repr(self) -> str:
        return f"workers on {', '.join(str(d) for d in self.devices[1:])}"


class WorkerGroupPatcher(ModelPatcher):
    """The sequence-parallel worker processes as one ComfyUI model on ComfyUI's GPU (where
    ComfyUI frees memory for its own loads). Loading it does nothing (the pool is started by
    the run); unloading it stops the workers."""

    model: GroupSlot

    def __init__(self, devices: Sequence[torch.device]) -> None:
        devices = [torch.device(d) for d in devices]
        super().__init__(GroupSlot(devices), devices[0], torch.device("cpu"), size=0)

    def get_ram_usage(self) -> int:
        return 0

    def load(self, device_to=None, lowvram_model_memory=0, force_patch_weights=False, full_load=False):
        self.model.device = self.load_device
        self.model.model_loaded_weight_memory = 0
        self.model.model_lowvram = False
        self.model.lowvram_patch_counter = 0

    def partially_load(self, device_to, extra_memory=0, force_patch_weights=False):
        self.load(device_to, full_load=True)
        return 0

    def partially_unload(self, device_to, memory_to_free=0, force_patch_weights=False):
        return 0

    def unpatch_model(self, device_to=None, unpatch_weights=True):
        if unpatch_weights:
            _group_unloaded(self)
        return super().unpatch_model(device_to, unpatch_weights)


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
        self._running = False  # between the first acquire and close/abort: the pool is in use

    def acquire(self, name: str) -> nn.Module:
        if not self._running:
            self._running = True
            begin_run()
        other = "low" if name == "high" else "high"
        for patcher in self.experts.patchers(other):
            if patcher.is_resident():
                unload_patcher(patcher)
        pool = shared_pool(self.experts.devices)  # started before ComfyUI loads anything on the workers
        patchers = self.experts.patchers(name)
        mm.load_models_gpu([*patchers, group_patcher(self.experts.devices)], memory_required=self.inference_memory,
                           force_full_load=True)
        rank0 = self.experts.rank0[name]
        if rank0.expert is None:
            raise RuntimeError(f"ComfyUI did not load the {name}-noise expert to {rank0.load_device}")
        return ParallelModel(pool, self.experts.workers[name][0].model.key, rank0.expert)

    def release(self, name: str) -> None:
        for patcher in self.experts.patchers(name):
            unload_patcher(patcher)

    def abort(self) -> None:
        try:
            for patcher in self.experts.all_patchers():
                unload_patcher(patcher)
        finally:
            if self._running:
                self._running = False
                end_run()

    def close(self) -> None:
        self.abort()


_LINKS: dict[tuple[str, ...], dict] = {}
_STARTED_FOR_LINK = False  # the pool was started by measured_link alone (settle_link_pool decides)


def measured_link(devices: Sequence[torch.device | str]) -> dict:
    """The link between ``devices``, measured once per process (``RankPool.measure_link``:
    GB/s of a timed all-to-all)."""
    global _STARTED_FOR_LINK
    key = tuple(str(torch.device(d)) for d in devices)
    if key not in _LINKS:
        started_here = (_POOL is None or not _POOL.running) and not _RUNS
        _LINKS[key] = shared_pool(devices).measure_link()
        _STARTED_FOR_LINK = _STARTED_FOR_LINK or started_here
        log.info("LingBot: link between %s: %.1f GB/s all-to-all", ", ".join(key), _LINKS[key]["gbps"])
    return _LINKS[key]


def settle_link_pool(keep: bool) -> None:
    """After ``devices=auto`` decided: a pool started only to measure the link stays (warm for
    the run) when ``keep`` (the decided mode runs on it), else it stops, so that no worker
    process holds a CUDA context and NCCL buffers on the other GPUs for nothing."""
    global _STARTED_FOR_LINK
    started, _STARTED_FOR_LINK = _STARTED_FOR_LINK, False
    if started and not keep and not _RUNS:
        shutdown()


__all__ = ["GroupSlot", "SequenceParallelExperts", "SequenceParallelSource", "WorkerGroupPatcher", "WorkerPatcher",
           "begin_run", "current_pool", "end_run", "group_patcher", "measured_link", "pool_status",
           "settle_link_pool", "shared_pool", "shutdown", "stop_workers"]
