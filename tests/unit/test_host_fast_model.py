"""nodes/host/fast_model.py: the Fast transformer under ComfyUI's memory manager (CPU host):
loaded by ComfyUI with room for the run's KV cache, unloaded on every exit, its weights
dropped rather than offloaded."""
from __future__ import annotations

import gc
import weakref

import pytest

from comfy_host import comfy_state_reset, use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
import comfy.model_management as mm  # noqa: E402

from node_runs import FAST, load_fast  # noqa: E402
from comfyui_lingbot_world.nodes.host.fast_model import (PreparedRun, decode_gpu_with_room,  # noqa: E402
                                                          loaded_fast_model, run_memory)
from comfyui_lingbot_world.wan.runtime.kv_cache import CachePolicy  # noqa: E402

clean_comfy_state = pytest.fixture(autouse=True)(comfy_state_reset)


def test_comfyui_loads_and_drops_the_transformer_like_an_expert(fast_installed):
    fast, _ = load_fast(FAST, "nf4")
    window, full = (run_memory(fast, CachePolicy(window=w, sink=3 if w else 0), 4, 6, 240) for w in (9, None))
    assert 0 < window < full  # the full cache of 240 latent frames is larger than a 9-frame window
    assert run_memory(fast, CachePolicy(window=9, sink=3, dtype="int8"), 4, 6, 240) < window
    with loaded_fast_model(fast, window) as model:
        assert fast.patcher.expert is model and any(m is fast.patcher for m in mm.loaded_models())
        probe = weakref.ref(model.blocks[0].self_attn.q.weight)
    assert fast.patcher.expert is None and not any(m is fast.patcher for m in mm.loaded_models())
    with pytest.raises(RuntimeError, match="boom"), loaded_fast_model(fast, window):
        raise RuntimeError("boom")  # an error in the run unloads it too
    assert fast.patcher.expert is None
    del model
    gc.collect()
    assert probe() is None  # the weights are gone, not offloaded to RAM


def test_the_memory_plan_follows_the_cards_size(fast_installed, monkeypatch):
    """nodes/host/fast_model.memory_plan: plan_fast_memory with this transformer's size and
    run memory on the load device's size (the choices themselves: test_memory_plan.py);
    PreparedRun puts the VAE and the overlap where the plan says."""
    import torch

    from comfyui_lingbot_world.nodes.host.fast_model import PreparedRun, memory_plan
    from comfyui_lingbot_world.pipeline.memory import ALLOCATOR_SLACK, AUTO_FIT_SHARE, FastMemoryPlan

    fast, _ = load_fast(FAST, "nf4")
    policy = CachePolicy(window=9, sink=3)
    weights, reserve = fast.patcher.model_size(), mm.minimum_inference_memory()
    run = {d: run_memory(fast, CachePolicy(window=9, sink=3, dtype=d), 4, 6, None) for d in ("bf16", "int8")}
    vae = 10 * weights

    def card(total: float):
        monkeypatch.setattr(mm, "get_total_memory", lambda *a, **k: int(total))
        return memory_plan(fast, policy, True, 4, 6, None, vae=vae)

    roomy = card((2 * (weights + run["bf16"] + vae + reserve) + ALLOCATOR_SLACK) / AUTO_FIT_SHARE)
    assert (roomy.kv_dtype, roomy.blocks_on_gpu, roomy.vae_on_gpu, roomy.overlap) == ("bf16", None, True, True)
    assert roomy.camera_terms == fast.config.num_layers  # room for every block's kept camera terms
    # Room for the transformer and the int8 cache, not for the VAE beside them: the tiny
    # transformer's 2 blocks are all in flight under block swap, so the VAE goes to the CPU.
    tight = card((weights + run["int8"] + reserve + ALLOCATOR_SLACK) / AUTO_FIT_SHARE + 1024)
    assert tight.fits and tight.kv_dtype == "int8" and not tight.vae_on_gpu and tight.overlap
    assert memory_plan(fast, policy, False, 4, 6, None, vae=vae).kv_dtype == "bf16"  # the user's dtype kept

    cpu_vae = FastMemoryPlan("int8", 2, False, True, 0, True)
    prepared = PreparedRun(None, policy, cpu_vae, torch.device("cpu"))
    assert prepared.vae_device == torch.device("cpu") and not prepared.overlap  # no overlap on a CPU host
    assert PreparedRun(None, policy, cpu_vae, torch.device("cuda", 0)).overlap
    on_gpu = PreparedRun(None, policy, FastMemoryPlan("bf16", None, True, False, 0, True), torch.device("cuda", 0))
    assert on_gpu.vae_device == torch.device("cuda", 0) and not on_gpu.overlap


def test_the_vae_goes_to_the_second_gpu_only_where_it_has_room(monkeypatch, caplog):
    import torch

    second = torch.device("cuda", 1)
    free = {"bytes": 8 * 2**30}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free["bytes"], 80 * 2**30))
    assert decode_gpu_with_room(None, 2**30) is None
    assert decode_gpu_with_room(second, 2 * 2**30) == second
    free["bytes"] = 2 * 2**30  # the VAE streams and ComfyUI's inference reserve do not fit: beside the transformer
    with caplog.at_level("WARNING"):
        assert decode_gpu_with_room(second, 2 * 2**30) is None
    assert "the decode stays beside the transformer" in caplog.text
    plan = type("Plan", (), {"vae_on_gpu": False})()
    run = PreparedRun(None, None, plan, torch.device("cuda", 0), second)
    assert run.vae_device == second  # Play and Fast Long Video open their VAE there
    assert PreparedRun(None, None, plan, torch.device("cuda", 0)).vae_device == torch.device("cpu")


def test_camera_terms_under_block_swap_follow_whose_block_count_the_run_uses():
    """The plan keeps camera terms under block swap (it swaps more blocks to make room for
    them); where the Fast DiT Loader's own block_swap wins over the plan's block count, the
    plan's terms are dropped: they were counted against the plan's blocks, not the loader's."""
    from comfyui_lingbot_world.nodes.host.fast_model import plan_terms
    from comfyui_lingbot_world.pipeline.memory import FastMemoryPlan

    swapping = FastMemoryPlan("int8", 20, True, True, 0, True, camera_terms=40)
    assert plan_terms(swapping, None) == 40  # the loader keeps all blocks: the plan's swap applies
    assert plan_terms(swapping, 30) == 0  # the loader's 30 blocks win: no room was counted for terms
    whole = FastMemoryPlan("bf16", None, True, True, 0, True, camera_terms=12)
    assert plan_terms(whole, None) == plan_terms(whole, 30) == 12  # the plan fits the loaded model as it is


def test_a_run_that_ended_well_may_keep_the_transformer_loaded_for_the_next(fast_installed):
    """``keep_loaded`` (Play): after a run that ended well the transformer stays in ComfyUI's
    list, the same weights for the next run (captures, where it made any, read them at their
    addresses; under ComfyUI's default allocator it makes none, frees its KV cache and still
    skips the load);
    Unload Models unloads it and what it keeps; a failed run never keeps it, nor a run
    without ``keep_loaded``."""
    fast, _ = load_fast(FAST, "nf4")
    window = run_memory(fast, CachePolicy(window=9, sink=3), 4, 6, None)
    with loaded_fast_model(fast, window):
        pass
    assert fast.patcher.expert is None
    with loaded_fast_model(fast, window, keep_loaded=True) as model:
        weight = model.blocks[0].self_attn.q.weight
    assert fast.patcher.expert is model and any(m is fast.patcher for m in mm.loaded_models())
    with loaded_fast_model(fast, window, keep_loaded=True) as again:
        assert again is model and again.blocks[0].self_attn.q.weight is weight  # nothing reloaded
    released = []
    model.release_state = lambda: released.append(True)  # what the kept KV cache and graphs hang on
    with loaded_fast_model(fast, window, keep_loaded=True):
        pass
    assert released == [True]  # no captures: the kept KV cache goes, the weights stay
    model.keeps_captures = lambda: True
    with loaded_fast_model(fast, window, keep_loaded=True):
        pass
    assert released == [True]  # captures read the kept cache at its addresses: it stays with them
    mm.unload_all_models()  # Unload Models, POST /free
    assert fast.patcher.expert is None and released
    with pytest.raises(RuntimeError, match="boom"), loaded_fast_model(fast, window, keep_loaded=True):
        raise RuntimeError("boom")
    assert fast.patcher.expert is None and not any(m is fast.patcher for m in mm.loaded_models())
