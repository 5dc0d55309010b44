"""nodes/host/gpus.py: both loaders' ``devices`` through the one rule of pipeline/placement.py.

On simulated hosts (ComfyUI on the CPU; one, two, four GPUs; an NVLink-class and a slow link)
the DiT Loader and the Fast DiT Loader run what ``decide_devices`` says for their model: both
``single`` below two GPUs, both ``sequence_parallel`` on a fast link, each its own slow-link row
otherwise. With two CPU ranks and a real measurement (gloo): a pool started only to measure the
link stops unless the pick runs on it, and one kept warm for the run stops on ``POST /free``
although no ComfyUI model stands for it yet."""
from __future__ import annotations

import gc

import psutil
import pytest
import torch

from comfy_host import comfy_state_reset, use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
import comfy.model_management as mm  # noqa: E402

from node_runs import FAST, HIGH, LOW  # noqa: E402
from comfyui_lingbot_world.nodes.dit_loader import LingBotWorldDiTLoader  # noqa: E402
from comfyui_lingbot_world.nodes.fast_dit_loader import LingBotWorldFastDiTLoader  # noqa: E402
from comfyui_lingbot_world.nodes.host import gpus, workers  # noqa: E402
from comfyui_lingbot_world.pipeline import placement  # noqa: E402
from comfyui_lingbot_world.pipeline.placement import BASE, FAST as FAST_MODEL, decide_devices  # noqa: E402

clean_comfy_state = pytest.fixture(autouse=True)(comfy_state_reset)
CPUS = [torch.device("cpu"), torch.device("cpu")]


@pytest.fixture(autouse=True)
def stop_workers(monkeypatch):
    monkeypatch.setattr(workers, "_LINKS", {})  # every test measures afresh
    yield
    monkeypatch.undo()  # the simulated GPUs first: ComfyUI reads their memory when it unloads
    mm.unload_all_models()
    workers.shutdown()


def _host(monkeypatch, count: int) -> list[torch.device]:
    """ComfyUI computing on cuda:0 of ``count`` GPUs (on the CPU when ``count`` is 0)."""
    monkeypatch.setattr(mm, "get_torch_device", lambda: torch.device("cuda", 0) if count else torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    return [torch.device("cuda", i) for i in range(count)]


def _base_ran(dit) -> tuple[str, tuple]:
    if dit.parallel is not None:
        return "sequence_parallel", tuple(dit.parallel.devices)
    if dit.placement is not None:
        return dit.placement.mode, dit.placement.devices
    return "single", ()


def _fast_ran(fast) -> tuple[str, tuple]:
    if fast.devices:
        return "sequence_parallel", tuple(fast.devices)
    if fast.decode_device is not None:
        return "decode_on_second_gpu", (fast.patcher.load_device, fast.decode_device)
    return "single", ()


@pytest.mark.parametrize("count", [0, 1, 2, 4])
@pytest.mark.parametrize("gbps", [119.9, 12.0])
def test_both_loaders_run_what_the_one_rule_decides(fast_installed, monkeypatch, count, gbps):
    host_gpus = _host(monkeypatch, count)
    monkeypatch.setattr(gpus, "measured_link", lambda group: {"gbps": gbps})
    heads = LingBotWorldDiTLoader.execute(HIGH, LOW, "none", 0)[0].config.num_heads
    base = _base_ran(LingBotWorldDiTLoader.execute(HIGH, LOW, "none", 0, "auto")[0])
    fast = _fast_ran(LingBotWorldFastDiTLoader.execute(FAST, "none", 0, devices="auto")[0])
    want = {model: decide_devices("auto", model, host_gpus, heads, "", lambda group: gbps)
            for model in (BASE, FAST_MODEL)}
    assert base[0] == want[BASE].mode.name and fast[0] == want[FAST_MODEL].mode.name
    if base[0] != "single":
        assert base[1] == want[BASE].devices
    if fast[0] != "single":
        assert fast[1] == want[FAST_MODEL].devices
    if count < 2:  # no second GPU: both run on one, neither refuses
        assert base[0] == fast[0] == "single"
    elif gbps >= placement.NVLINK_CLASS_GBPS:
        assert base[0] == fast[0] == "sequence_parallel"
    else:
        assert (base[0], fast[0]) == ("cfg_split", "decode_on_second_gpu")


def test_a_pool_started_to_measure_stops_unless_the_pick_runs_on_it_and_free_stops_it(fast_installed, monkeypatch):
    monkeypatch.setattr(gpus, "usable_gpus", lambda: (CPUS, "two CPU ranks"))
    fast, info = LingBotWorldFastDiTLoader.execute(FAST, "none", 0, devices="auto")  # gloo: a slow link
    assert "devices auto -> decode_on_second_gpu (all-to-all" in info and fast.devices == ()
    assert workers.current_pool() is None  # started for the measurement alone, and stopped
    monkeypatch.setattr(workers, "_LINKS", {})
    monkeypatch.setattr(placement, "NVLINK_CLASS_GBPS", 0.0)  # this link counts as NVLink-class now
    fast, info = LingBotWorldFastDiTLoader.execute(FAST, "none", 0, devices="auto")
    assert "devices auto -> sequence_parallel (all-to-all" in info and fast.devices == tuple(CPUS)
    pool = workers.current_pool()
    pids = pool.pids()
    assert pool.running and pids  # warm for the run that follows; ComfyUI holds no model of it yet
    assert not any(isinstance(m.model, workers.WorkerGroupPatcher) for m in mm.current_loaded_models)
    mm.unload_all_models()  # POST /free, Unload Models: the prompt never ran a sampler
    gc.collect()
    assert workers.current_pool() is None and not any(psutil.pid_exists(pid) for pid in pids)
