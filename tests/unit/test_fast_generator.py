"""The LingBot-World Fast chunk engine (pipeline/fast): 5 forwards a chunk with only the
commit writing committed frames, cancel and out-of-memory freeing the cache, memory that
does not grow from 81 to 957 frames, length-independent noise, and the causal model
against its ordinary forward."""
from __future__ import annotations

import dataclasses
import gc

import pytest
import torch

from comfyui_lingbot_world.pipeline.fast import (ChunkNoise, FastGenerator, FastParams, KeyframeCamera,
                                                 OfficialOrderNoise, StreamedI2V, WholeI2V, sample_fast)
from comfyui_lingbot_world.pipeline.fast.noise import chunk_seed
from comfyui_lingbot_world.wan.model import LingBotDiT, build_rope
from comfyui_lingbot_world.wan.runtime.block_swap import BlockSwapper, SyncTransfer
from comfyui_lingbot_world.wan.runtime.kv_cache import CachePolicy, KVCache
from fast_helpers import (HEIGHT, LAT_H, LAT_W, WIDTH, camera_path, image, prompt, tiny_vae,
                          video_frames, whole_camera)
from fast_helpers import one_thread, model  # noqa: F401  (module fixtures)

FRAME_TOKENS = (LAT_H // 2) * (LAT_W // 2)


def random_y(latent_frames: int, seed: int = 2) -> torch.Tensor:
    return torch.randn(20, latent_frames, LAT_H, LAT_W, generator=torch.Generator().manual_seed(seed))


class Interrupted(Exception):
    pass


# --------------------------------------------------------------------------- forwards

def test_five_forwards_a_chunk_and_only_the_commit_writes_committed_frames(model, monkeypatch):
    latent_frames = 9
    passes = []
    original = LingBotDiT.forward

    def counting(self, *args, **kwargs):
        cache: KVCache = kwargs["kv_cache"]
        committed = cache.committed * FRAME_TOKENS
        before = (cache.committed, cache.frame_start, cache._k[:, :committed].clone(), cache._v[:, :committed].clone())
        out = original(self, *args, **kwargs)
        unchanged = (torch.equal(cache._k[:, :committed], before[2]) and torch.equal(cache._v[:, :committed], before[3])
                     and (cache.committed, cache.frame_start) == before[:2])
        passes.append((kwargs["commit"], float(args[1][0]), unchanged, out is None))
        return out

    monkeypatch.setattr(LingBotDiT, "forward", counting)
    params = FastParams(seed=1, policy=CachePolicy(window=6, sink=3))
    with FastGenerator(model, prompt(), WholeI2V(random_y(latent_frames)), params, latent_frames=latent_frames) as run:
        for c in range(3):
            run.next_chunk()
            assert run.forwards == 5 * (c + 1)
    assert len(passes) == 15
    for c in range(3):
        chunk = passes[5 * c:5 * c + 5]
        assert [p[1] for p in chunk] == [999.0, 978.0, 947.0, 825.0, 0.0]
        assert [p[0] for p in chunk] == [False] * 4 + [True]
        assert all(p[2] for p in chunk[:4]), "a denoising pass changed the committed frames"
        assert not chunk[4][2] and chunk[4][3]  # the commit stores the chunk and returns nothing


def test_a_clip_skips_the_last_commit(model, monkeypatch):
    calls = []
    original = LingBotDiT.forward
    monkeypatch.setattr(LingBotDiT, "forward", lambda self, *a, **k: calls.append(k["commit"]) or original(self, *a, **k))
    steps = []
    latent = sample_fast(model, prompt(), WholeI2V(random_y(9)), None, FastParams(seed=1), video_frames(9),
                         on_step=lambda done, total: steps.append((done, total)))
    assert latent.shape == (16, 9, LAT_H, LAT_W) and latent.device.type == "cpu"
    assert calls == ([False] * 4 + [True]) * 2 + [False] * 4  # nothing attends to the last chunk
    assert steps == [(i, 12) for i in range(1, 13)]


# --------------------------------------------------------------------------- cancel, OOM

@pytest.mark.parametrize("cancel_at", [1, 8, 14, 15, 40])
def test_cancel_between_forwards_or_blocks_raises_and_frees_the_cache(model, cancel_at):
    calls = 0

    def check():
        nonlocal calls
        calls += 1
        if calls == cancel_at:
            raise Interrupted

    run = FastGenerator(model, prompt(), WholeI2V(random_y(9)), FastParams(seed=1), latent_frames=9,
                        check_interrupt=check)
    cache = run.cache
    with pytest.raises(Interrupted):
        for _ in range(3):
            run.next_chunk()
    assert run.cache is None and cache.closed and cache._k is None and cache._v is None
    with pytest.raises(RuntimeError, match="closed"):
        run.next_chunk()
    # the model is left as it was: a new session runs and equals an uncancelled one
    fresh = sample_fast(model, prompt(), WholeI2V(random_y(9)), None, FastParams(seed=1), video_frames(9))
    again = sample_fast(model, prompt(), WholeI2V(random_y(9)), None, FastParams(seed=1), video_frames(9))
    assert torch.equal(fresh, again)


def test_cancel_inside_sample_fast_frees_the_cache(model, monkeypatch):
    closed = []
    original = KVCache.close
    monkeypatch.setattr(KVCache, "close", lambda self: closed.append(self) or original(self))
    calls = iter(range(100))

    def check():
        if next(calls) == 20:
            raise Interrupted

    with pytest.raises(Interrupted):
        sample_fast(model, prompt(), WholeI2V(random_y(9)), None, FastParams(seed=1), video_frames(9),
                    check_interrupt=check)
    assert len(closed) >= 1 and all(c._k is None for c in closed)


def test_out_of_memory_names_the_size_and_the_cache_and_frees_it(model, monkeypatch):
    closed = []
    original_free, original_forward = KVCache.free, LingBotDiT.forward
    monkeypatch.setattr(KVCache, "free", lambda self: closed.append(self) or original_free(self))
    forwards = iter(range(100))

    def failing(self, *args, **kwargs):
        if next(forwards) == 7:  # chunk 2, step 3
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return original_forward(self, *args, **kwargs)

    monkeypatch.setattr(LingBotDiT, "forward", failing)
    params = FastParams(seed=1, policy=CachePolicy(window=6, sink=3, dtype="int8"))
    with pytest.raises(torch.cuda.OutOfMemoryError) as err:
        sample_fast(model, prompt(), WholeI2V(random_y(9)), None, params, video_frames(9))
    message = str(err.value)
    assert f"33 frames at {WIDTH}x{HEIGHT}" in message and "window 6 sink 3, int8" in message
    assert "chunk 2" in message and "kv_window" in message and "Tried to allocate 2.00 GiB" in message
    assert closed and all(c._k is None for c in closed)
    # A cache the model keeps between sessions (made for CUDA graphs) is freed too, not kept.
    forwards = iter(range(100))
    with pytest.raises(torch.cuda.OutOfMemoryError):
        sample_fast(model, prompt(), WholeI2V(random_y(9)), None, dataclasses.replace(params, cuda_graphs=True),
                    video_frames(9))
    assert closed[-1]._k is None and model._kept_cache.cache is None


# --------------------------------------------------------------------------- memory

def live_tensor_bytes() -> int:
    """Bytes of every tensor storage reachable from Python (weights, cache, buffers...)."""
    gc.collect()
    seen, total = set(), 0
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor) and obj.device.type == "cpu":
            storage = obj.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
    return total


def rss_anon() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def test_cache_memory_is_constant_from_81_to_957_frames(model):
    """961 frames do not fill whole chunks (241 latent frames); 957 is the nearest count.
    The stream takes its y from the VAE's causal stream and its camera chunk by chunk."""
    sizes = {}
    for frames in (81, 957):
        latent_frames = (frames - 1) // 4 + 1
        streamed = StreamedI2V(tiny_vae(), image(), latent_frames=None)
        camera = KeyframeCamera(*camera_path(frames), frames, HEIGHT, WIDTH)
        live, rss = [], []
        with FastGenerator(model, prompt(), streamed, FastParams(seed=3, policy=CachePolicy(window=9, sink=3)),
                           latent_frames=None) as run:
            cache = run.cache
            for c in range(latent_frames // 3):
                run.next_chunk(camera.chunk(3 * c, 3))
                if frames == 957 and c in (12, 40, 79):
                    live.append(live_tensor_bytes())
                    rss.append(rss_anon())
            sizes[frames] = cache.nbytes()
        if frames == 957:
            assert streamed.constant_from is not None and streamed.encoded < 40  # the VAE was released early
            print(f"live tensor bytes after chunks 13/41/80: {live}; RssAnon {[r >> 20 for r in rss]} MiB")
            assert live[0] == live[1] == live[2], live
            assert rss[2] - rss[0] < 16 << 20, f"RssAnon grew by {(rss[2] - rss[0]) / 2**20:.1f} MiB"
    assert sizes[81] == sizes[957] > 0


# --------------------------------------------------------------------------- noise

def test_chunk_noise_makes_the_start_of_a_run_independent_of_its_length(model):
    y = random_y(15)
    short = sample_fast(model, prompt(), WholeI2V(y[:, :9]), None, FastParams(seed=11), video_frames(9))
    long = sample_fast(model, prompt(), WholeI2V(y), None, FastParams(seed=11), video_frames(15))
    # the short clip's last chunk skipped its commit; the chunks before are the same either way
    assert torch.equal(short, long[:, :9])
    assert not torch.equal(long[:, 9:12], long[:, 6:9])
    assert chunk_seed(11, 0) != chunk_seed(11, 1) != chunk_seed(12, 0)


def test_official_order_noise_follows_the_official_draws_and_refuses_another_order():
    g = torch.Generator().manual_seed(9)
    whole = torch.randn(16, 6, 2, 3, generator=g)
    draws = [torch.randn(16, 3, 2, 3, generator=g) for _ in range(6)]
    noise = OfficialOrderNoise(9, 6, 2, 3)
    assert torch.equal(noise.initial(0, (16, 3, 2, 3)), whole[:, :3])
    assert torch.equal(noise.renoise(0, 0, (16, 3, 2, 3)), draws[0])
    with pytest.raises(RuntimeError, match="next draw is chunk 0 re-noise 1"):
        noise.renoise(0, 2, (16, 3, 2, 3))
    noise.renoise(0, 1, (16, 3, 2, 3))
    noise.renoise(0, 2, (16, 3, 2, 3))
    assert torch.equal(noise.initial(1, (16, 3, 2, 3)), whole[:, 3:])
    assert torch.equal(noise.renoise(1, 0, (16, 3, 2, 3)), draws[3])
    chunked = ChunkNoise(9)
    with pytest.raises(RuntimeError, match="initial noise first"):
        chunked.renoise(0, 0, (16, 3, 2, 3))


# --------------------------------------------------------------------------- the causal model

def test_the_first_chunk_with_an_empty_cache_is_the_ordinary_forward(model):
    """Bidirectional inside the chunk, nothing before it: the causal path is the ordinary
    forward of those 3 frames (same operations, through the cache's buffers)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(1, 16, 3, LAT_H, LAT_W, generator=g), torch.randn(1, 20, 3, LAT_H, LAT_W, generator=g)
    camera = whole_camera(video_frames(3))
    t = torch.tensor([978.0])
    plain = model(x, t, [prompt()], y=y, camera=camera)
    for dtype in ("bf16", "int8"):
        cache = model.new_kv_cache(CachePolicy(window=6, sink=0, dtype=dtype), LAT_H, LAT_W)
        causal = model(x, t, [prompt()], y=y, camera=camera, kv_cache=cache)
        assert torch.equal(causal, plain)
        assert model(x, t, None, y=y, camera=camera, kv_cache=cache).equal(plain)  # text K/V from the cache


def test_rope_continues_across_chunks():
    whole = build_rope((9, 2, 3), 32, torch.device("cpu"))
    chunk = build_rope((3, 2, 3), 32, torch.device("cpu"), frame_start=6)
    assert all(torch.equal(a[6 * 6:], b) for a, b in zip(whole, chunk))


def test_block_swap_passes_the_cache_on(model):
    import copy

    swapped = copy.deepcopy(model)
    BlockSwapper(swapped, 1, transfer=SyncTransfer("cpu"))
    a = sample_fast(model, prompt(), WholeI2V(random_y(6)), None, FastParams(seed=2), video_frames(6))
    b = sample_fast(swapped, prompt(), WholeI2V(random_y(6)), None, FastParams(seed=2), video_frames(6))
    assert torch.equal(a, b)


def test_cache_refuses_what_it_was_not_made_for(model):
    cache = model.new_kv_cache(CachePolicy(window=6, sink=0), LAT_H, LAT_W)
    x, y = torch.zeros(1, 16, 3, LAT_H, LAT_W), torch.zeros(1, 20, 3, LAT_H, LAT_W)
    with pytest.raises(ValueError, match="4 latent frames per pass"):
        model(torch.zeros(1, 16, 4, LAT_H, LAT_W), torch.tensor([1.0]), [prompt()],
              y=torch.zeros(1, 20, 4, LAT_H, LAT_W), kv_cache=cache)
    with pytest.raises(ValueError, match="tokens per latent frame"):
        model(torch.zeros(1, 16, 3, 2, 2), torch.tensor([1.0]), [prompt()], y=torch.zeros(1, 20, 3, 2, 2),
              kv_cache=cache)
    with pytest.raises(ValueError, match="no CFG"):
        model(x.expand(2, -1, -1, -1, -1), torch.tensor([1.0, 1.0]), [prompt(), prompt()],
              y=y.expand(2, -1, -1, -1, -1), kv_cache=cache)
    with pytest.raises(ValueError, match="context"):
        model(x, torch.tensor([1.0]), None, y=y, kv_cache=cache)
    with pytest.raises(ValueError, match="commit=True needs a kv_cache"):
        model(x, torch.tensor([1.0]), [prompt()], y=y, commit=True)
    with pytest.raises(ValueError, match="camera chunk"):
        FastGenerator(model, prompt(), WholeI2V(random_y(6)), FastParams(), latent_frames=6).next_chunk(
            torch.zeros(1, 384, 6, LAT_H, LAT_W))
