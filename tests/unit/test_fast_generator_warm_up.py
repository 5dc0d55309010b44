"""``FastGenerator.warm_up`` (pipeline/fast/generator.py) on the tiny Fast model, CPU:

- a warm-started session's chunks equal a cold session's bit for bit (bf16 and int8 caches,
  camera terms kept or not, with and without a camera, the cache kept by the model or not),
  and the cache it starts on holds what a new cache holds;
- with graphs (``CpuGraphs``: CUDA graph capture stood in on the CPU) the warm-up captures
  every graph the session replays, so the session captures nothing and runs nothing eagerly
  once its cache is full; a second session on the same model gets the kept cache and its
  graphs back and captures nothing; other shapes capture anew;
- through a ``ParallelModel`` (a gloo worker) the warm-up and its reset reach the worker;
- a warm-up after the first chunk is refused; a cancel inside it ends the session.
The same on CUDA, graphs captured for real: tests/gpu/test_cuda_graphs_cuda.py.
"""
from __future__ import annotations

import pytest
import torch

import parallel_ranks
from comfyui_lingbot_world.pipeline.fast import FastGenerator, FastParams, WholeI2V
from comfyui_lingbot_world.wan.runtime.kv_cache import CachePolicy, KVCache
from fast_helpers import CpuGraphs, LAT_H, LAT_W, cpu_graphs, prompt
from fast_helpers import one_thread, model  # noqa: F401  (module fixtures)

CHUNKS = 5


class Interrupted(Exception):
    pass


def session(model, params: FastParams, warm: bool, camera: bool = True, chunks: int = CHUNKS,
            shape: tuple[int, int] = (LAT_H, LAT_W), text: torch.Tensor | None = None) -> dict:
    """An open-ended session of ``chunks`` chunks (a new camera each), warmed up or not:
    its chunks, the warm-up's record, the cache it ran on and its graphs' counts."""
    h, w = shape
    g = torch.Generator().manual_seed(9)
    y = torch.randn(20, 3 * chunks, h, w, generator=g)
    cameras = [torch.randn(1, 384, 3, h, w, generator=g) if camera else None for _ in range(chunks)]
    text = prompt(cfg=model.config) if text is None else text
    generator = FastGenerator(model, text, WholeI2V(y), params)
    record = generator.warm_up(camera=camera) if warm else None
    cache = generator.cache
    fresh = fresh_state(cache)
    graphs = cache.graphs
    before = None if graphs is None else (graphs.captures, graphs.eager, graphs.replays)
    out = torch.stack([generator.next_chunk(cam) for cam in cameras])
    after = None if graphs is None else (graphs.captures, graphs.eager, graphs.replays)
    generator.close()
    return {"chunks": out, "record": record, "cache": cache, "fresh": fresh, "graphs": graphs,
            "counts": None if graphs is None else tuple(a - b for a, b in zip(after, before)),
            "forwards": generator.forwards}


def fresh_state(cache: KVCache) -> dict:
    """What a cache holds for the chunk it starts with (all a new cache holds, beside buffers
    whose contents no pass reads before writing them)."""
    return {"slot_frames": list(cache.slot_frames), "frame_start": cache.frame_start, "committed": cache.committed,
            "cross_ready": cache.cross_ready, "closed": cache.closed, "broken": cache._broken,
            "committing": cache.committing,
            "int8_scales": None if not cache.int8 else bool((cache._k_scale == 0).all() and (cache._v_scale == 0).all())}


NEW_CACHE = {"slot_frames": [], "frame_start": 0, "committed": 0, "cross_ready": False, "closed": False,
             "broken": None, "committing": False}


@pytest.mark.parametrize("kv_dtype, terms, camera, graphs", [
    ("bf16", 0, True, False),
    ("int8", 1, True, False),
    ("bf16", 2, True, True),   # the cache the model keeps: the warm-up's, reset
    ("int8", 0, False, True),
])
def test_a_warm_session_equals_a_cold_one_bit_for_bit(model, kv_dtype, terms, camera, graphs):
    params = FastParams(seed=3, policy=CachePolicy(window=9, sink=3, dtype=kv_dtype), camera_terms=terms,
                        cuda_graphs=graphs)
    cold = session(model, params, warm=False, camera=camera)
    warm = session(model, params, warm=True, camera=camera)
    assert torch.equal(warm["chunks"], cold["chunks"])
    assert warm["fresh"] == cold["fresh"] == {**NEW_CACHE, "int8_scales": True if kv_dtype == "int8" else None}
    record = warm["record"]
    # No graphs on the CPU: the cache filled (chunks 0 and 1), then one chunk with it full.
    assert (record.chunks, record.forwards, record.captures) == (3, 6, 0) and record.seconds > 0
    assert warm["forwards"] == cold["forwards"] == 5 * CHUNKS  # the session's own forwards only
    if graphs:  # the model kept the cache: the session ran on the warm-up's, and the cold one's again
        assert warm["cache"] is cold["cache"] is model._kept_cache.cache
    else:
        assert warm["cache"] is not cold["cache"] and warm["cache"].closed and warm["cache"]._k is None
    model.release_state()


def test_the_warm_up_captures_every_graph_the_session_replays_and_the_next_session_reuses_them(model, monkeypatch):
    cpu_graphs(monkeypatch)
    params = FastParams(seed=5, camera_terms=1, cuda_graphs=True)
    try:
        eager = session(model, FastParams(seed=5, camera_terms=1), warm=False)
        cold = session(model, params, warm=False)
        model.release_state()  # the warm session starts from nothing kept
        assert not model.keeps_captures()
        first = session(model, params, warm=True)
        assert model.keeps_captures()  # what lets the Play node keep the model loaded for the next session
        second = session(model, params, warm=True)
        for run in (cold, first, second):
            assert torch.equal(run["chunks"], eager["chunks"])
        # Window 9, sink 3: chunks 0 and 1 fill the cache; in chunk 2 the denoising pass warms up
        # its key and the next captures it, the commit warms up; chunk 3 captures the commit;
        # chunk 4 replays everything and ends the warm-up.
        assert isinstance(first["graphs"], CpuGraphs)
        record = first["record"]
        assert (record.chunks, record.forwards, record.captures) == (5, 2 + 2 + 3 + 2 + 2, 2)
        # The session: chunks 2..4 replay all their 15 passes, nothing warms up or captures.
        assert first["counts"] == (0, 0, 15)
        assert cold["counts"] == (2, 2, 13)  # a cold session captures during its chunks
        # The next session: the same cache and graphs; its warm-up finds them captured.
        assert second["cache"] is first["cache"] and second["graphs"] is first["graphs"]
        record = second["record"]
        assert (record.chunks, record.forwards, record.captures) == (3, 6, 0)
        assert second["counts"] == (0, 0, 15)
        # Other shapes: the kept cache is freed, a new one captures its own graphs.
        other = session(model, params, warm=True, shape=(LAT_H, LAT_W + 2))
        assert other["cache"] is not first["cache"] and first["cache"]._k is None and first["graphs"].state == {}
        assert other["record"].captures == 2 and other["counts"] == (0, 0, 15)
    finally:
        model.release_state()


def test_commits_whose_slot_moves_cycle_are_all_captured(model, monkeypatch):
    """Window 12, sink 0: the cache fills in 3 chunks, then the commits move frames into slots
    0-2, 3-5, 6-8 in turn (three commit graphs): the warm-up sees each twice, so the session
    replays every pass once its cache is full."""
    cpu_graphs(monkeypatch)
    params = FastParams(seed=6, policy=CachePolicy(window=12, sink=0), cuda_graphs=True)
    try:
        eager = session(model, FastParams(seed=6, policy=CachePolicy(window=12, sink=0)), warm=False, chunks=9)
        warm = session(model, params, warm=True, chunks=9)
        assert (warm["record"].chunks, warm["record"].captures) == (10, 4)
        assert warm["counts"] == (0, 0, 5 * 6)
        assert torch.equal(warm["chunks"], eager["chunks"])
    finally:
        model.release_state()


def test_a_new_prompt_in_the_next_session_is_the_one_attended(model, monkeypatch):
    """The kept cache's text keys are computed again for the next session's prompt (into the
    tensors its graphs read)."""
    cpu_graphs(monkeypatch)
    params = FastParams(seed=2, cuda_graphs=True)
    other_text = prompt(seed=8, cfg=model.config)
    try:
        want = session(model, FastParams(seed=2), warm=False, text=other_text)["chunks"]
        session(model, params, warm=True)
        got = session(model, params, warm=True, text=other_text)
        assert torch.equal(got["chunks"], want)
    finally:
        model.release_state()


def test_warm_up_runs_before_the_first_chunk_only(model):
    y = torch.randn(20, 6, LAT_H, LAT_W, generator=torch.Generator().manual_seed(1))
    with FastGenerator(model, prompt(), WholeI2V(y), FastParams(seed=1)) as generator:
        generator.next_chunk()
        with pytest.raises(RuntimeError, match="before the session's first chunk"):
            generator.warm_up()


def test_a_cancel_during_the_warm_up_ends_the_session(model):
    y = torch.randn(20, 6, LAT_H, LAT_W, generator=torch.Generator().manual_seed(1))
    calls = []

    def check() -> None:
        calls.append(1)
        if len(calls) == 4:
            raise Interrupted

    generator = FastGenerator(model, prompt(), WholeI2V(y), FastParams(seed=1), check_interrupt=check)
    cache = generator.cache
    with pytest.raises(Interrupted):
        generator.warm_up()
    assert generator.cache is None and cache.closed and cache._k is None
    with pytest.raises(RuntimeError, match="was closed"):
        generator.next_chunk()


def test_the_warm_up_reaches_the_sequence_parallel_workers():
    """Every warm-up forward runs on the worker too, and the worker's cache comes back reset
    with rank 0's (closed, then taken again): a warm session on two ranks makes the cold
    one's chunks bit for bit. cuda_graphs=True: both ranks keep their caches."""
    from comfyui_lingbot_world.pipeline.parallel_pool import ParallelModel, RankPool

    pool = RankPool(["cpu", "cpu"]).start()
    try:
        parallel = ParallelModel(pool, "tiny", pool.load("tiny", parallel_ranks.build), cfg_split=False)
        params = FastParams(seed=4, camera_terms=1, cuda_graphs=True)
        text = prompt(cfg=parallel.config)
        shape = (parallel_ranks.LAT_H, parallel_ranks.LAT_W)
        cold = session(parallel, params, warm=False, chunks=4, shape=shape, text=text)
        warm = session(parallel, params, warm=True, chunks=4, shape=shape, text=text)
        assert warm["record"].chunks == 3 and warm["cache"] is cold["cache"]
        assert torch.equal(warm["chunks"], cold["chunks"])
    finally:
        pool.close()
