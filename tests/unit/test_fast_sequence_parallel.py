"""The Fast DiT Loader's devices=sequence_parallel / auto on the CPU (gloo, 2 ranks, the tiny
Fast transformer): the Fast Sampler's clip run through a ParallelModel on a worker process
equals the one-device clip; the worker's copy is a ComfyUI model, loaded and dropped with the
run, and dropped by Unload Models / ``POST /free``; auto picks by the measured link."""
from __future__ import annotations

import pytest
import torch

from comfy_host import comfy_state_reset, use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
import comfy.model_management as mm  # noqa: E402
import comfy.utils  # noqa: E402

from node_runs import (FAST, FAST_FRAMES, encode_prompt, encode_start, fast_not_resident, load_fast,  # noqa: E402
                       options, run_fast_sampler)
from comfyui_lingbot_world.nodes.fast_dit_loader import LingBotWorldFastDiTLoader  # noqa: E402
from comfyui_lingbot_world.nodes.host import workers  # noqa: E402
from comfyui_lingbot_world.nodes.host import gpus  # noqa: E402
from comfyui_lingbot_world.pipeline.parallel_pool import ParallelModel  # noqa: E402

clean_comfy_state = pytest.fixture(autouse=True)(comfy_state_reset)
CPUS = [torch.device("cpu"), torch.device("cpu")]


@pytest.fixture(scope="module", autouse=True)
def stop_workers():
    yield
    mm.unload_all_models()
    workers.shutdown()


def _held() -> dict[str, set[int]]:
    pool = workers.current_pool()
    return {} if pool is None else {key: set(ranks) for key, ranks in pool.loaded.items() if ranks}


def test_fast_sampler_on_two_ranks_equals_one_device_and_free_drops_the_worker_copy(fast_installed, monkeypatch):
    text, i2v = encode_prompt(), encode_start(FAST_FRAMES)
    single, _ = load_fast()
    want = run_fast_sampler(single, text, i2v)["samples"]
    monkeypatch.setattr(gpus, "usable_gpus", lambda: (CPUS, "two CPU ranks"))  # the tiny model: 2 heads
    fast, info = LingBotWorldFastDiTLoader.execute(FAST, "none", 0, devices="sequence_parallel").args
    assert fast.devices == tuple(CPUS) and info.endswith("; devices sequence_parallel on cpu, cpu")
    forwards = []
    real_forward = ParallelModel.forward
    monkeypatch.setattr(ParallelModel, "forward", lambda self, *a, **k: forwards.append(1) or real_forward(self, *a, **k))
    held = []
    comfy.utils.set_progress_bar_global_hook(lambda value, total, preview, node_id=None: held.append(_held()))
    got = run_fast_sampler(fast, text, i2v)["samples"]
    comfy.utils.set_progress_bar_global_hook(None)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    key = f"fast:{fast.folder}"
    assert len(forwards) == 2 * 5 - 1  # every forward on both ranks: two chunks of 4 steps + a commit pass
    assert held and all(h == {key: {1}} for h in held)  # the worker held its copy for every forward
    assert _held() == {} and fast_not_resident(fast)  # and dropped it with rank 0's at the run's end
    assert workers.current_pool().running  # the worker stays warm for the next prompt
    # A copy ComfyUI holds is ComfyUI's to unload: Unload Models / POST /free drop the worker's copy.
    copies = fast.worker_patchers()
    mm.load_models_gpu([fast.patcher, *copies], force_full_load=True)
    assert _held() == {key: {1}} and any(m.model is copies[0] for m in mm.current_loaded_models)
    mm.unload_all_models()
    assert _held() == {} and fast_not_resident(fast)


def test_the_devices_choice_and_what_auto_picks(fast_installed, monkeypatch):
    spec = LingBotWorldFastDiTLoader.INPUT_TYPES()["optional"]["devices"]
    assert options(spec) == ["single", "sequence_parallel", "decode_on_second_gpu", "auto"]
    assert spec[1]["default"] == "single"
    assert "auto: with 2 or more GPUs, times an all-to-all" in spec[1]["tooltip"]
    fast, info = LingBotWorldFastDiTLoader.execute(FAST, "none", 0)  # a saved workflow without the input
    assert fast.devices == () and "devices" not in info
    fast, info = LingBotWorldFastDiTLoader.execute(FAST, "none", 0, devices="auto")  # a CPU host
    assert fast.devices == () and info.endswith("; devices auto -> single (ComfyUI computes on cpu, "
                                                "torch.cuda.device_count() is 0)")
    with pytest.raises(ValueError, match="devices=sequence_parallel needs 2 or more CUDA GPUs"):
        LingBotWorldFastDiTLoader.execute(FAST, "none", 0, devices="sequence_parallel")
    with pytest.raises(ValueError, match="devices=decode_on_second_gpu needs 2 CUDA GPUs, but ComfyUI computes on cpu"):
        LingBotWorldFastDiTLoader.execute(FAST, "none", 0, devices="decode_on_second_gpu")
    with pytest.raises(ValueError, match="devices: 'cfg_split' is not one of single, sequence_parallel, "
                                         "decode_on_second_gpu, auto"):
        LingBotWorldFastDiTLoader.execute(FAST, "none", 0, devices="cfg_split")
    two = [torch.device("cuda", 0), torch.device("cuda", 1)]
    monkeypatch.setattr(mm, "get_torch_device", lambda: two[0])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for gbps, devices, decode, said in (
            (119.9, tuple(two), None, "auto -> sequence_parallel (all-to-all 119.9 GB/s"),
            (12.0, (), two[1], "auto -> decode_on_second_gpu (all-to-all 12.0 GB/s between cuda:0, cuda:1, under 40 "
                               "GB/s): the transformer on cuda:0, the VAE on cuda:1")):
        monkeypatch.setattr(gpus, "measured_link", lambda group, gbps=gbps: {"gbps": gbps})
        fast, info = LingBotWorldFastDiTLoader.execute(FAST, "none", 0, devices="auto")
        assert fast.devices == devices and fast.decode_device == decode and said in info
        assert fast.patcher.load_device == two[0]
    fast, info = LingBotWorldFastDiTLoader.execute(FAST, "none", 0, devices="decode_on_second_gpu")
    assert fast.devices == () and fast.decode_device == two[1] and fast.patcher.load_device == two[0]
    assert info.endswith("; devices decode_on_second_gpu: the transformer on cuda:0, the VAE on cuda:1")
