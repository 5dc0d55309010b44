"""wan/runtime/cuda_graphs.py and LingBotDiT's graphed path, on the CPU: the graphed path's
forward (the session's RoPE tables and camera terms at fixed addresses, refreshed in place
per chunk, the cache's bookkeeping outside the body) gives the eager forward's output bit for
bit; when graphs are not possible nothing changes. The capture and replay themselves need
CUDA: tests/gpu/test_cuda_graphs_cuda.py."""
from __future__ import annotations

import pytest
import torch

from comfyui_lingbot_world.pipeline.fast import FastParams, WholeI2V, sample_fast
from comfyui_lingbot_world.wan.runtime.cuda_graphs import ForwardGraphs, graphs_supported
from comfyui_lingbot_world.wan.runtime.kv_cache import CachePolicy

from fast_helpers import LAT_H, LAT_W, prompt, video_frames
from fast_helpers import one_thread, model  # noqa: F401  (module fixtures)

STEPS = (999.0, 978.0, 947.0, 825.0)


def _session(model, graphs: ForwardGraphs | None, keep: int | str, camera: bool, kv_dtype: str,
             chunks: int = 5) -> torch.Tensor:
    g = torch.Generator().manual_seed(11)
    cache = model.new_kv_cache(CachePolicy(window=9, sink=3, dtype=kv_dtype), LAT_H, LAT_W)
    cache.graphs = graphs
    text = [prompt()]
    outs = []
    with torch.inference_mode():
        for _ in range(chunks):
            x, y = torch.randn(1, 16, 3, LAT_H, LAT_W, generator=g), torch.randn(1, 20, 3, LAT_H, LAT_W, generator=g)
            tokens = model.prepare_camera(torch.randn(1, 384, 3, LAT_H, LAT_W, generator=g), keep_terms=model.config.num_layers if keep == "all" else keep) \
                if camera else None
            for t in STEPS:
                out = model(x, torch.tensor([t]), text if not outs else None, y=y, camera_tokens=tokens, kv_cache=cache)
                outs.append(out)
                x = x - 0.1 * out
            model(x, torch.tensor([0.0]), None, y=y, camera_tokens=tokens, kv_cache=cache, commit=True)
    if graphs is not None:
        assert cache.graphs is graphs
    cache.close()
    return torch.stack(outs)


def _eager_graphs() -> ForwardGraphs:
    """The graphed path on the CPU: never captures (the warm-up never ends), so every pass
    runs the graph body eagerly on the session's fixed tables and terms."""
    graphs = ForwardGraphs("cpu", warmup=10**9)
    graphs.disabled = None
    return graphs


@pytest.mark.parametrize("keep, camera, kv_dtype", [("all", True, "bf16"), (1, True, "int8"), (0, True, "bf16"),
                                                    (0, False, "int8")])
def test_graphed_path_equals_the_eager_forward(model, keep, camera, kv_dtype) -> None:
    graphs = _eager_graphs()
    want = _session(model, None, keep, camera, kv_dtype)
    got = _session(model, graphs, keep, camera, kv_dtype)
    assert torch.equal(got, want)
    assert graphs.state == {}  # closed with the cache


def _full_soon(model, seed: int):
    """A cache with eager-graphs that is full from chunk 1 (window 6, sink 3), a generator, x and y."""
    graphs = _eager_graphs()
    cache = model.new_kv_cache(CachePolicy(window=6, sink=3), LAT_H, LAT_W)
    cache.graphs = graphs
    g = torch.Generator().manual_seed(seed)
    return graphs, cache, g, torch.randn(1, 16, 3, LAT_H, LAT_W, generator=g), torch.randn(1, 20, 3, LAT_H, LAT_W,
                                                                                            generator=g)


def test_the_session_keeps_one_table_and_one_terms_object_refreshed_in_place(model) -> None:
    graphs, cache, g, x, y = _full_soon(model, 3)
    seen = []
    with torch.inference_mode():
        for chunk in range(3):
            tokens = model.prepare_camera(torch.randn(1, 384, 3, LAT_H, LAT_W, generator=g), keep_terms=model.config.num_layers)
            for t in (999.0, 500.0):
                model(x, torch.tensor([t]), [prompt()] if chunk == 0 else None, y=y, camera_tokens=tokens,
                      kv_cache=cache)
            model(x, torch.tensor([0.0]), None, y=y, camera_tokens=tokens, kv_cache=cache, commit=True)
            if chunk:
                kept = graphs.state["camera"]
                rope = graphs.state["rope"]
                seen.append((kept, kept.tokens.data_ptr(), rope[1][0].data_ptr(), rope[2]))
                assert torch.equal(kept.tokens, tokens.tokens)  # this chunk's camera copied in
                want = model.rope_tables((3, LAT_H // 2, LAT_W // 2), torch.device("cpu"), cache.frame_start - 3)
                assert torch.equal(rope[1][0], want[0]) and torch.equal(rope[1][1], want[1])
    (a, *ptrs_a), (b, *ptrs_b) = seen
    assert a is b and ptrs_a[:2] == ptrs_b[:2] and ptrs_a[2] != ptrs_b[2]  # same tensors, the next frame start
    cache.close()


def test_no_graphs_off_cuda() -> None:
    assert not graphs_supported("cpu")
    graphs = ForwardGraphs("cpu")
    assert graphs.disabled is not None
    assert graphs.run("key", {"x": torch.ones(2)}, lambda s: s["x"] * 2).tolist() == [2.0, 2.0]
    assert graphs.captures == graphs.replays == 0


def test_no_graphs_under_the_cuda_malloc_async_allocator(monkeypatch, caplog) -> None:
    """ComfyUI runs PyTorch's cudaMallocAsync allocator by default; there the captured passes
    replayed at half the eager speed (bench/RESULTS.md), so a session there runs eagerly and
    says why, in the graphs' reason and the log. Under the native allocator they are captured."""
    from comfyui_lingbot_world.wan.runtime import cuda_graphs

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_allocator_backend", lambda: "cudaMallocAsync")
    reason = cuda_graphs.graphs_off_reason("cuda:0")
    assert reason is not None and "cudaMallocAsync" in reason and "--disable-cuda-malloc" in reason
    assert not graphs_supported("cuda:0")
    monkeypatch.setattr(torch.cuda, "get_allocator_backend", lambda: "native")
    assert cuda_graphs.graphs_off_reason("cuda:0") is None and graphs_supported("cuda:0")
    monkeypatch.setenv("LINGBOT_CUDA_GRAPHS", "0")
    assert cuda_graphs.graphs_off_reason("cuda:0") == "LINGBOT_CUDA_GRAPHS=0"


def test_fast_params_cuda_graphs_on_the_cpu_change_nothing(model) -> None:
    """The setting on a CPU run: the cache makes no graphs, the clip is the same."""
    y = torch.randn(20, 9, LAT_H, LAT_W, generator=torch.Generator().manual_seed(2))
    runs = [sample_fast(model, prompt(), WholeI2V(y), None, FastParams(seed=4, cuda_graphs=on), video_frames(9))
            for on in (False, True)]
    assert torch.equal(runs[0], runs[1])


def test_a_camera_of_the_wrong_size_is_refused_on_the_graphed_path_too(model) -> None:
    _, cache, _, x, y = _full_soon(model, 5)
    with torch.inference_mode():
        model(x, torch.tensor([999.0]), [prompt()], y=y, kv_cache=cache)
        model(x, torch.tensor([0.0]), None, y=y, kv_cache=cache, commit=True)
        assert cache.full and cache.cross_ready
        wrong = torch.randn(1, 5, model.config.dim)
        with pytest.raises(ValueError, match="camera_tokens"):
            model(x, torch.tensor([999.0]), None, y=y, camera_tokens=wrong, kv_cache=cache)
    cache.close()
