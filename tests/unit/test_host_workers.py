"""nodes/host/workers.py under the real ComfyUI model manager (CPU, gloo): the sampler runs
each expert on rank 0 (this process) and a worker process in lock-step and gets the
one-device latent; each worker's copy is a ComfyUI model whose unload (Unload Models /
``POST /free``, a switch of expert) makes the worker drop it; an interrupt unloads every
copy and leaves the workers running for the next prompt; the workers themselves are one more
ComfyUI model on ComfyUI's device, which Unload Models / ``POST /free`` unload: they stop
(after the run that uses them, when that happens during one)."""
from __future__ import annotations

import dataclasses
import gc
from pathlib import Path

import psutil
import pytest
import torch

from comfy_host import use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
import comfy.model_management as mm  # noqa: E402

from comfyui_lingbot_world.nodes.host import workers  # noqa: E402
from comfyui_lingbot_world.nodes.host.expert_patcher import ExpertLoadOptions  # noqa: E402
from comfyui_lingbot_world.pipeline.experts import DiskExperts  # noqa: E402
from comfyui_lingbot_world.pipeline.image import I2VCondition  # noqa: E402
from comfyui_lingbot_world.pipeline.sampling import SamplingParams, expert_for, sample  # noqa: E402
from comfyui_lingbot_world.pipeline.text import TextEmbeddings  # noqa: E402
from comfyui_lingbot_world.wan.scheduler import make_sampler  # noqa: E402

DEVICES = [torch.device("cpu"), torch.device("cpu")]
PARAMS = SamplingParams(steps=4, shift=5.0, seed=3)  # both experts


@pytest.fixture(scope="module", autouse=True)
def stop_workers():
    yield
    mm.unload_all_models()
    workers.shutdown()


@pytest.fixture
def folders(package) -> dict[str, Path]:
    return {"high": package / "high_noise_model_bnb_nf4", "low": package / "low_noise_model_bnb_nf4"}


def _inputs():
    g = torch.Generator().manual_seed(5)
    text = TextEmbeddings(positive=torch.randn(6, 32, generator=g), negative=torch.randn(5, 32, generator=g),
                          from_cache=False)
    return text, I2VCondition(y=torch.randn(20, 3, 4, 6, generator=g), frames=9, height=32, width=48)


def _held() -> dict[str, set[int]]:
    pool = workers.current_pool()
    return {} if pool is None else {key: set(ranks) for key, ranks in pool.loaded.items() if ranks}


def _group_loaded() -> bool:
    return any(isinstance(m.model, workers.WorkerGroupPatcher) for m in mm.current_loaded_models)


def test_sequence_parallel_sampling_equals_one_device_and_free_drops_the_workers_copies(folders):
    text, condition = _inputs()
    want = sample(DiskExperts(folders["high"], folders["low"], "cpu"), text, condition, None, PARAMS)
    experts = workers.SequenceParallelExperts(folders, ExpertLoadOptions(), DEVICES)
    source = workers.SequenceParallelSource(experts)
    held_during: list[dict] = []
    got = sample(source, text, condition, None, PARAMS, on_step=lambda d, n: held_during.append(_held()))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # one expert at a time on the worker too: the high-noise copy went before the low-noise one loaded
    names = [expert_for(t, PARAMS.boundary) for t in make_sampler("unipc", PARAMS.steps, PARAMS.shift).timesteps]
    assert set(names) == {"high", "low"}
    assert held_during == [{f"{name}:{folders[name]}": {1}} for name in names]
    source.close()  # the run ends: every copy unloaded through ComfyUI
    assert _held() == {} and not any(p.is_resident() for p in experts.all_patchers())
    # a copy kept loaded is ComfyUI's to unload: Unload Models / POST /free drop the worker's copy
    mm.load_models_gpu(experts.patchers("low"), force_full_load=True)
    assert _held() == {f"low:{folders['low']}": {1}}
    assert any(m.model is experts.workers["low"][0] for m in mm.current_loaded_models)
    assert _group_loaded()  # the workers are ComfyUI's too, kept warm between prompts
    pids = workers.current_pool().pids()
    mm.unload_all_models()
    gc.collect()
    # unload_all_models frees ComfyUI's device alone; the group lives there, so the workers stop
    assert _held() == {} and workers.current_pool() is None and workers.pool_status() is None
    assert pids and not any(psutil.pid_exists(pid) for pid in pids) and not _group_loaded()


def test_interrupt_unloads_every_copy_and_the_next_run_works(folders):
    text, condition = _inputs()
    experts = workers.SequenceParallelExperts(folders, ExpertLoadOptions(), DEVICES)
    steps = []

    def interrupt():  # checked between steps and before every block
        if len(steps) == 3:
            raise mm.InterruptProcessingException()

    with pytest.raises(mm.InterruptProcessingException):
        sample(workers.SequenceParallelSource(experts), text, condition, None, PARAMS,
               on_step=lambda d, n: steps.append(d), check_interrupt=interrupt)
    assert _held() == {} and not any(p.is_resident() for p in experts.all_patchers())
    pool = workers.current_pool()
    assert pool.running and all(p.is_alive() for p in pool._procs)
    want = sample(DiskExperts(folders["high"], folders["low"], "cpu"), text, condition, None, PARAMS)
    source = workers.SequenceParallelSource(experts)
    torch.testing.assert_close(sample(source, text, condition, None, PARAMS), want, rtol=1e-5, atol=1e-6)
    source.close()


def test_the_group_unloaded_during_a_run_stops_the_workers_when_the_run_ends(folders):
    from comfyui_lingbot_world.nodes.host.expert_patcher import unload_patcher

    experts = workers.SequenceParallelExperts(folders, ExpertLoadOptions(), DEVICES)
    source = workers.SequenceParallelSource(experts)
    source.acquire("high")
    pool = workers.current_pool()
    assert _group_loaded() and _held() == {f"high:{folders['high']}": {1}}
    unload_patcher(workers.group_patcher(DEVICES))  # ComfyUI wants the memory in the middle of the run
    assert pool.running and workers.current_pool() is pool and not _group_loaded()
    source.close()  # the run ends: its copies unloaded, then the workers stop
    assert workers.current_pool() is None and not any(p.is_alive() for p in pool._procs)
    assert not any(p.is_resident() for p in experts.all_patchers())


def test_the_loaders_dit_runs_sequence_parallel_through_run_experts(folders, package):
    from comfyui_lingbot_world.loaders.expert_config import read_expert_pair
    from comfyui_lingbot_world.nodes.host.expert_patcher import DiTExperts, ExpertPatcher, run_experts
    from comfyui_lingbot_world.pipeline.lora import LoraSpec

    options = ExpertLoadOptions()
    high, low = (ExpertPatcher.for_folder(n, folders[n], options, load_device=DEVICES[0]) for n in ("high", "low"))
    parallel = workers.SequenceParallelExperts(folders, options, DEVICES, rank0={"high": high, "low": low})
    dit = DiTExperts(high=high, low=low, config=read_expert_pair(folders["high"], folders["low"]), parallel=parallel)
    comfy, source = run_experts(dit, tokens=18)
    assert isinstance(source, workers.SequenceParallelSource) and source is comfy
    assert source.experts.rank0["high"] is high  # ComfyUI accounts rank 0's copy with the loader's patcher
    text, condition = _inputs()
    want = sample(DiskExperts(folders["high"], folders["low"], "cpu"), text, condition, None, PARAMS)
    try:
        torch.testing.assert_close(sample(source, text, condition, None, PARAMS), want, rtol=1e-5, atol=1e-6)
    finally:
        comfy.close()
    assert _held() == {}
    lora = dataclasses.replace(dit, loras=(LoraSpec(path=package / "missing.safetensors"),))
    with pytest.raises(ValueError, match="devices=sequence_parallel does not apply LoRAs yet"):
        run_experts(lora, tokens=18)
