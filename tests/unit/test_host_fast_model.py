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
from comfyui_lingbot_world.nodes.host.fast_model import loaded_fast_model, run_memory  # noqa: E402
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
