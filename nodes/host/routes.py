"""``GET /lingbot/status``: what is in memory right now, for users and for tests.

ComfyUI's model manager only knows the models it loaded (our DiT experts). T5 and the VAE
are loaded and freed by the pipeline itself, so the route also looks for live instances of
those classes (and of the DiT) that still hold real weights: a non-zero count after a run
means something kept a reference to a model the pack meant to free.

    {
      "device": "cuda:0", "free_memory_bytes": ...,
      "loaded_models": [{"class": "ExpertPatcher", "model_patcher": true, "model": "ExpertSlot",
                         "device": "cuda:0", "size_bytes": ..., "loaded_bytes": ..., "expert": "high"}],
      "experts_resident": [{"expert": "high", "folder": "lingbot/<package>/high_noise_model", "device": "cuda:0"}],
      "dit_models_alive": 1, "text_encoders_alive": 0, "vaes_alive": 0,
      "workers": {"running": true, "devices": ["cuda:0", "cuda:1"], "pids": [4242], "loaded": {}}
    }

``workers``: the sequence-parallel worker processes of ``devices=sequence_parallel`` (null until
a run first started them; ``pids`` of the live ones, ``loaded``: model key -> ranks holding it).

The route is added to ``server.PromptServer.instance.routes``, which ComfyUI turns into
HTTP routes (also under ``/api``) after it has imported the custom nodes; old and current
ComfyUI both work this way. Outside a running ComfyUI nothing is registered.

The route never stalls ComfyUI's event loop: the live models come from weak references the
loaders keep (no scan of every Python object, which stalls a busy server), and the rest
runs in one worker thread whose result concurrent requests share.
Folders are shown relative to their ComfyUI model folder (``<kind>/<path>``), never as
absolute paths.
"""
from __future__ import annotations

import asyncio
import logging
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from torch import nn

import comfy.model_management as mm
from comfy.model_patcher import ModelPatcher

from ...loaders.live import live_modules
from ...wan.model import LingBotDiT
from ...wan.t5 import UMT5Encoder
from ...wan.vae import WanVAE
from .expert_patcher import ExpertPatcher, ExpertSlot
from .model_files import EXPERT_KINDS, kind_roots
from .workers import pool_status

log = logging.getLogger(__name__)

STATUS_ROUTE = "/lingbot/status"


def holds_weights(module: nn.Module) -> bool:
    """True while any parameter or buffer of ``module`` is a real (non-meta) tensor.

    ``pipeline.memory.release_module`` sets them all to None, so a released module that
    something still references counts as freed.
    """
    for tensor in module.parameters():
        if tensor is not None and tensor.device.type != "meta":
            return True
    for tensor in module.buffers():
        if tensor is not None and tensor.device.type != "meta":
            return True
    return False


def _loaded_model_entry(patcher: ModelPatcher) -> dict[str, Any]:
    model = patcher.model
    return {
        "class": type(patcher).__name__,
        "model_patcher": isinstance(patcher, ModelPatcher),
        "model": type(model).__name__,
        "device": str(patcher.current_loaded_device()),
        "size_bytes": int(patcher.model_size()),
        "loaded_bytes": int(patcher.loaded_size()),
        "expert": model.name if isinstance(patcher, ExpertPatcher) else None,
    }


def loaded_models() -> list[dict[str, Any]]:
    """One entry per model in ComfyUI's ``current_loaded_models`` (copied: the worker
    thread may change the list while we read it)."""
    entries = []
    for loaded in list(mm.current_loaded_models):
        patcher = loaded.model  # a weak reference on current hosts: None once collected
        if patcher is not None:
            entries.append(_loaded_model_entry(patcher))
    return entries


def live_models() -> dict[str, Any]:
    """Counts of live pack models that hold weights, and the experts ComfyUI has resident.

    Every model the pack's loaders build is tracked by a weak reference
    (``loaders.live``), so this looks at a handful of entries, not at every Python object:
    the call costs microseconds however busy the server is. A model that something kept
    after the pack freed it still counts (that is what the counts are for); a model built
    outside the loaders is not seen.
    """
    counts = {UMT5Encoder: 0, WanVAE: 0, LingBotDiT: 0}
    for module in live_modules():
        kind = type(module)
        if kind in counts:
            try:
                counts[kind] += holds_weights(module)
            except RuntimeError:  # the worker thread is building it right now: it is alive
                counts[kind] += 1
    experts = []
    for loaded in list(mm.current_loaded_models):
        patcher = loaded.model  # a weak reference on current hosts: None once collected
        slot = getattr(patcher, "model", None) if patcher is not None else None
        if isinstance(slot, ExpertSlot) and slot.expert is not None:
            experts.append({"expert": slot.name, "folder": display_name(slot.folder),
                            "device": str(getattr(slot, "device", "unknown"))})
    return {
        "experts_resident": sorted(experts, key=lambda e: e["expert"]),
        "dit_models_alive": counts[LingBotDiT],
        "text_encoders_alive": counts[UMT5Encoder],
        "vaes_alive": counts[WanVAE],
    }


def display_name(folder: Path | str, kinds: tuple[str, ...] = EXPERT_KINDS) -> str:
    """``<kind>/<path inside that ComfyUI model folder>`` as the node combos show it; only
    the last part of the path for a folder outside every model folder (no absolute path)."""
    folder = Path(folder)
    for kind in kinds:
        for root in kind_roots(kind):
            for inside, base in ((folder, root), (folder.resolve(), root.resolve())):
                if inside.is_relative_to(base):
                    return f"{kind}/{inside.relative_to(base).as_posix()}"
    return folder.name


def status() -> dict[str, Any]:
    device = mm.get_torch_device()
    return {
        "device": str(device),
        "free_memory_bytes": int(mm.get_free_memory(device)),
        "loaded_models": loaded_models(),
        **live_models(),
        "workers": pool_status(),
    }


_EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lingbot-status")
_in_flight: asyncio.Future | None = None


async def status_off_loop() -> dict[str, Any]:
    """``status()`` computed in the worker thread; concurrent callers share one scan."""
    global _in_flight
    if _in_flight is None or _in_flight.done():
        _in_flight = asyncio.get_running_loop().run_in_executor(_EXECUTOR, status)
    return await asyncio.shield(_in_flight)


async def _status_handler(request):
    from aiohttp import web

    return web.json_response(await status_off_loop())


def register_status_route() -> bool:
    """Add ``GET /lingbot/status`` to the running ComfyUI server; False outside one.

    Only a ComfyUI that is starting has imported ``server`` before its custom nodes;
    importing it ourselves (tests, tools) would drag in the whole server for nothing.
    """
    server = sys.modules.get("server")
    instance = getattr(getattr(server, "PromptServer", None), "instance", None)
    routes = getattr(instance, "routes", None)
    if routes is None:
        return False
    if any(getattr(route, "path", None) == STATUS_ROUTE for route in routes):
        return True  # the pack was imported twice; aiohttp refuses duplicate routes
    routes.get(STATUS_ROUTE)(_status_handler)
    log.debug("LingBot: registered GET %s", STATUS_ROUTE)
    return True
