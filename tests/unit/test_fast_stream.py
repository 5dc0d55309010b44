"""pipeline/fast/stream.py: a long Fast video in one causal pass on a tiny float32 transformer
and VAE (CPU): the frames written chunk by chunk equal the clip sampler's latent decoded
whole (lazy image condition, per-chunk camera and stream decoder included); the frame
rounding of long requests; an error or out-of-memory leaves the chunks written and frees
the cache and the VAE."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from comfyui_lingbot_world.pipeline.fast import (FastParams, KeyframeCamera, sample_fast, stream_fast_video,
                                                 stream_frames)
from comfyui_lingbot_world.pipeline.fast import stream as stream_module
from comfyui_lingbot_world.pipeline.camera import CameraCondition
from comfyui_lingbot_world.pipeline.image import encode_image
from comfyui_lingbot_world.wan.model import LingBotDiT
from comfyui_lingbot_world.wan.runtime.kv_cache import CachePolicy, KVCache
from fast_helpers import HEIGHT, WIDTH, camera_path, prompt, tiny_vae, whole_camera
from fast_helpers import one_thread, model  # noqa: F401  (module fixtures)


@pytest.fixture(scope="module")
def vae_weights():
    return tiny_vae(seed=1).state_dict()


def start_image() -> np.ndarray:
    return np.random.default_rng(3).integers(0, 255, (HEIGHT + 8, WIDTH + 12, 3), dtype=np.uint8)


@pytest.mark.parametrize("policy", [CachePolicy(window=6, sink=3), CachePolicy(window=None, sink=0)],
                         ids=["window", "full"])
def test_the_stream_writes_the_clip_decoded_whole(model, vae_weights, policy):
    frames = 33  # 3 chunks
    params = FastParams(seed=5, policy=policy)
    poses, intrinsics = camera_path(frames)
    pieces = []
    result = stream_fast_video(model, prompt(), vae_weights, start_image(), frames, HEIGHT, WIDTH,
                               KeyframeCamera(poses, intrinsics, frames, HEIGHT, WIDTH), params, pieces.append,
                               device="cpu")
    assert [p.shape[1] for p in pieces] == [9, 12, 12]
    assert (result.frames, result.chunks, result.chunks_done, result.frames_written) == (33, 3, 3, 33)

    # The clip path: the whole image condition, the whole camera tensor, sample, decode once.
    i2v = encode_image(vae_weights, start_image(), frames, HEIGHT, WIDTH, "cpu")
    camera = CameraCondition(whole_camera(frames), frames, HEIGHT, WIDTH, poses[:frames])
    latent = sample_fast(model, prompt(), i2v, camera, params, frames)
    vae = tiny_vae(seed=1)
    with torch.inference_mode():
        whole = vae.decode(latent[None])[0]
    assert torch.equal(torch.cat(pieces, dim=1), whole)


def test_long_requests_round_down_to_whole_chunks():
    assert [stream_frames(f) for f in (961, 957, 81, 85, 93, 9, 13)] == [957, 957, 81, 81, 93, 9, 9]
    with pytest.raises(ValueError, match="frames=5 is shorter than one chunk of 12 frames; use at least 9"):
        stream_frames(5)
    with pytest.raises(ValueError, match=r"frame count must be 4n\+1 .* got 8"):
        stream_frames(8)


def test_an_out_of_memory_keeps_the_chunks_written_and_frees_the_cache_and_the_vae(model, vae_weights, monkeypatch):
    closed, released = [], []
    original_free, original_forward = KVCache.free, LingBotDiT.forward
    monkeypatch.setattr(KVCache, "free", lambda self: closed.append(self) or original_free(self))
    real_release = stream_module.release_module
    monkeypatch.setattr(stream_module, "release_module", lambda m: released.append(type(m).__name__) or real_release(m))
    forwards = iter(range(100))

    def failing(self, *args, **kwargs):
        if next(forwards) == 7:  # chunk 2, step 3
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return original_forward(self, *args, **kwargs)

    monkeypatch.setattr(LingBotDiT, "forward", failing)
    pieces = []
    params = FastParams(seed=1, policy=CachePolicy(window=6, sink=3, dtype="int8"))
    with pytest.raises(torch.cuda.OutOfMemoryError) as err:
        stream_fast_video(model, prompt(), vae_weights, start_image(), 33, HEIGHT, WIDTH, None, params,
                          pieces.append, device="cpu")
    message = str(err.value)
    assert f"33 frames at {WIDTH}x{HEIGHT}" in message and "window 6 sink 3, int8" in message
    assert "chunk 2" in message and "Tried to allocate 2.00 GiB" in message
    assert [p.shape[1] for p in pieces] == [9]  # chunk 1 was written before
    assert closed and all(c._k is None for c in closed)
    assert released == ["WanVAE"]


def test_a_cancel_stops_between_chunks_with_the_finished_ones_written(model, vae_weights):
    class Cancelled(Exception):
        pass

    pieces = []

    def write(video):
        pieces.append(video)

    calls = iter(range(10_000))
    stop_after = []

    def cancel():
        next(calls)
        if len(pieces) == 2 and not stop_after:
            stop_after.append(True)
            raise Cancelled

    with pytest.raises(Cancelled):
        stream_fast_video(model, prompt(), vae_weights, start_image(), 45, HEIGHT, WIDTH, None,
                          FastParams(seed=1, policy=CachePolicy(window=6, sink=3)), write, device="cpu",
                          check_interrupt=cancel)
    assert [p.shape[1] for p in pieces] == [9, 12]
