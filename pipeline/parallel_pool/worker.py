"""A worker process: rank 1, 2, ... of the group, holding its own copies of the models and
answering rank 0's commands (``messages.py``) through one handler per command type
(``HANDLERS``), until ``Stop``, a failure (reported as ``Failed``) or its parent's end.

No worker outlives rank 0: each waits on its parent's sentinel and exits when it goes.
"""
from __future__ import annotations

import os
import sys
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from ...wan.runtime.attention import attention_backend
from ...wan.runtime.camera_terms import CameraTerms
from ...wan.runtime.kv_cache import KVCache
from ...wan.runtime.parallel import SequenceParallel
from .cancel import Cancelled, synced_cancel
from .groups import CfgGroups, all_to_all_loop, apply_env, join_group
from .messages import (CloseCache, DropCamera, Failed, Forward, Free, Freed, Load, Loaded, MeasureLink, NewCache,
                       PrepareCamera, Ready, Report, Stop, receive_tensors)


@dataclass
class WorkerState:
    """What one worker holds: its place in the group and its models, caches and camera tokens
    (keyed by the ids rank 0 gave them)."""

    rank: int
    device: torch.device
    sp: SequenceParallel
    cfg: CfgGroups | None
    models: dict[str, nn.Module] = field(default_factory=dict)
    caches: dict[int, KVCache] = field(default_factory=dict)
    cameras: dict[int, torch.Tensor | CameraTerms] = field(default_factory=dict)

    def clear(self) -> None:
        self.models.clear(), self.caches.clear(), self.cameras.clear()


def _load(state: WorkerState, msg: Load) -> Report:
    state.models.pop(msg.key, None)  # the old copy goes before the new one is built
    state.models[msg.key] = msg.factory(state.device)
    return Loaded(state.rank, msg.key)


def _free(state: WorkerState, msg: Free) -> Report:
    state.models.pop(msg.key, None)
    state.caches.clear(), state.cameras.clear()
    if state.device.type == "cuda":
        torch.cuda.empty_cache()
    return Freed(state.rank, msg.key)


def _measure_link(state: WorkerState, msg: MeasureLink) -> None:
    all_to_all_loop(msg.numel, msg.dtype, msg.repeats, state.device)


def _prepare_camera(state: WorkerState, msg: PrepareCamera) -> None:
    plucker = receive_tensors(msg.tensors, state.device)["plucker"]
    with torch.inference_mode():
        state.cameras[msg.ident] = state.models[msg.key].prepare_camera(plucker, keep_terms=msg.keep_terms)


def _drop_camera(state: WorkerState, msg: DropCamera) -> None:
    state.cameras.pop(msg.ident, None)


def _new_cache(state: WorkerState, msg: NewCache) -> None:
    state.caches[msg.ident] = state.models[msg.key].new_kv_cache(
        msg.policy, msg.latent_height, msg.latent_width, msg.latent_frames, device=state.device, parallel=state.sp,
        graphs=msg.graphs)


def _close_cache(state: WorkerState, msg: CloseCache) -> None:
    cache = state.caches.pop(msg.ident, None)
    if cache is not None:
        cache.close()


def _forward(state: WorkerState, msg: Forward) -> None:
    inputs = receive_tensors(msg.tensors, state.device)
    camera = state.cameras[msg.camera_tokens] if msg.camera_tokens is not None else inputs.get("camera_tokens")
    cache = state.caches.get(msg.kv_cache)
    if cache is not None:  # rank 0 may have skipped a chunk (KVCache.skip_chunk) since
        cache.frame_start = msg.frame_start
    hook = synced_cancel(state.device)
    try:
        with torch.inference_mode(), attention_backend(msg.attention):
            msg.call(state.models[msg.key], inputs, camera, cache, state.sp, state.cfg, hook)
        hook.finish()
    except Cancelled:
        pass


# One handler per command (Stop ends the loop); a report it returns goes to rank 0.
HANDLERS: dict[type, Callable[[WorkerState, Any], Report | None]] = {
    Load: _load, Free: _free, MeasureLink: _measure_link, PrepareCamera: _prepare_camera, DropCamera: _drop_camera,
    NewCache: _new_cache, CloseCache: _close_cache, Forward: _forward,
}


def _watch_parent() -> None:
    parent = mp.parent_process()
    if parent is not None:
        parent.join()  # returns when the parent is gone
        os._exit(0)


def worker_main(rank: int, world: int, devices: list[str], init: str, commands: Any, reports: Any) -> None:
    """The worker process's life: join the group, then serve commands until ``Stop``."""
    apply_env()
    threading.Thread(target=_watch_parent, name="lingbot-parent-watch", daemon=True).start()
    device = torch.device(devices[rank])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, torch.get_num_threads() // world))
    try:
        sp, cfg = join_group(rank, world, device, init)
    except BaseException:  # noqa: BLE001
        reports.put(Failed(rank, traceback.format_exc()))
        return
    reports.put(Ready(rank))
    state = WorkerState(rank, device, sp, cfg)
    while True:
        msg = commands.get()
        if isinstance(msg, Stop):
            break
        try:
            handler = HANDLERS.get(type(msg))
            if handler is None:
                raise TypeError(f"unknown command {type(msg).__name__}; expected one of "
                                f"{', '.join(t.__name__ for t in HANDLERS)} or Stop")
            report = handler(state, msg)
            if report is not None:
                reports.put(report)
        except BaseException:  # noqa: BLE001 - reported; rank 0's watch aborts the group
            reports.put(Failed(rank, traceback.format_exc()))
            break
    state.clear()
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass


# ----------------------------------------------------------------------------- starting a worker

# The pack is imported under its folder's name inside ComfyUI (``comfyui_lingbot_world`` in
# tests and tools), which a spawned interpreter cannot import by itself. The worker's entry
# is therefore ``exec`` of this bootstrap: it registers the pack's folder under the same
# package name (without running its __init__, so ComfyUI's nodes are not imported) and
# calls ``worker_main``; factories pickled by rank 0 then resolve to the same module names.
_PACKAGE = __name__.rsplit(".pipeline.", 1)[0]
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_BOOTSTRAP = """
import sys, types, importlib
if PACKAGE not in sys.modules:
    package = types.ModuleType(PACKAGE)
    package.__path__ = [ROOT]
    package.__package__ = PACKAGE
    sys.modules[PACKAGE] = package
importlib.import_module(PACKAGE + ".pipeline.parallel_pool.worker").worker_main(*ARGS)
"""


class _main_not_reimported:
    """``spawn`` re-imports the parent's main script in the child (``__mp_main__``); for
    ComfyUI that is main.py, whose top level parses arguments and sets up the server. The
    worker needs nothing from it, so the script's path is hidden while the child starts."""

    def __enter__(self) -> None:
        self.main = sys.modules.get("__main__")
        self.file = getattr(self.main, "__file__", None)
        if self.file is not None and getattr(self.main, "__spec__", None) is None:
            del self.main.__file__
        else:
            self.file = None

    def __exit__(self, *exc: object) -> None:
        if self.file is not None:
            self.main.__file__ = self.file


def spawn_worker(ctx: Any, rank: int, world: int, devices: list[str], init: str, commands: Any,
                 reports: Any) -> Any:
    """Start rank ``rank``'s process (``ctx``: the ``spawn`` multiprocessing context)."""
    proc = ctx.Process(target=exec, args=(_BOOTSTRAP, {"PACKAGE": _PACKAGE, "ROOT": _ROOT, "ARGS": (
        rank, world, devices, init, commands, reports)}), name=f"lingbot-rank{rank}", daemon=True)
    with _main_not_reimported():
        proc.start()
    return proc


__all__ = ["HANDLERS", "WorkerState", "spawn_worker", "worker_main"]
