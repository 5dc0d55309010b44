"""On CUDA: chunk n decoded on a second CUDA stream (pipeline/fast/worker.py) while chunk
n+1 generates writes bit for bit the frames of the sequential stream, for Fast Long Video's
stream and for a Play session; the VAE on the CPU beside a transformer on the GPU too."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from comfyui_lingbot_world.pipeline.fast import FastParams, stream_fast_video
from comfyui_lingbot_world.pipeline.fast.worker import worker_thread_alive
from comfyui_lingbot_world.pipeline.play import PlaySession, PlaySettings
from comfyui_lingbot_world.pipeline.play.registry import SessionRegistry
from comfyui_lingbot_world.wan.runtime import switches
from comfyui_lingbot_world.wan.runtime.kv_cache import CachePolicy
from fast_helpers import HEIGHT, WIDTH, image, prompt, tiny_fast_model, tiny_vae

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda_model():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return tiny_fast_model().cuda()


def start_image() -> np.ndarray:
    return np.random.default_rng(3).integers(0, 255, (HEIGHT + 8, WIDTH + 12, 3), dtype=np.uint8)


@pytest.mark.parametrize("vae_device", ["cuda", "cpu"])
def test_the_overlapped_stream_writes_the_sequential_frames_on_cuda(cuda_model, vae_device):
    weights = tiny_vae(seed=1).state_dict()
    made = {}
    for overlap in (False, True):
        pieces = []
        stream_fast_video(cuda_model, prompt(), weights, start_image(), 45, HEIGHT, WIDTH, None,
                          FastParams(seed=5, policy=CachePolicy(window=6, sink=3)), pieces.append,
                          device=vae_device, overlap=overlap)
        made[overlap] = pieces
    assert [p.shape[1] for p in made[True]] == [9, 12, 12, 12]
    assert all(torch.equal(a, b) for a, b in zip(made[False], made[True]))
    assert not worker_thread_alive()


class Writer:
    def __init__(self) -> None:
        self.pieces: list[torch.Tensor] = []

    def write(self, video: torch.Tensor) -> None:
        self.pieces.append(video.clone())

    def close(self) -> None:
        pass


def test_a_play_session_overlapped_on_cuda_makes_the_sequential_frames(cuda_model):
    vae = tiny_vae(seed=1).cuda()
    made = {}
    for overlap in (False, True):
        writer = Writer()
        settings = PlaySettings(width=WIDTH, height=HEIGHT, seed=11, chunk_budget=4, mode="continuous",
                                poll_s=0.005, policy=CachePolicy(window=6, sink=3, dtype="int8"))
        result = PlaySession(cuda_model, prompt(), vae, image(), settings, writer=writer,
                             registry=SessionRegistry(), overlap=overlap).run()
        made[overlap] = (result.latent, writer.pieces)
    assert torch.equal(made[False][0], made[True][0])
    # one piece per latent frame (each chunk sent in parts), bit for bit the sequential ones
    assert len(made[True][1]) == 12 and all(torch.equal(a, b) for a, b in zip(made[False][1], made[True][1]))
    with torch.inference_mode():
        whole = vae.decode(made[True][0][None].cuda())[0].float().cpu()
    assert torch.equal(torch.cat(made[True][1], dim=1), whole)


two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")


@two_gpus
def test_the_vae_on_the_second_gpu_makes_the_one_gpu_frames(cuda_model):
    """devices=decode_on_second_gpu: the transformer on cuda:0, the VAE (encode and every chunk's
    decode, overlapped) on cuda:1; the latents and frames are the one-GPU session's bit for bit."""
    made = {}
    for vae_device in ("cuda:0", "cuda:1"):
        vae = tiny_vae(seed=1).to(vae_device)
        writer = Writer()
        settings = PlaySettings(width=WIDTH, height=HEIGHT, seed=11, chunk_budget=4, mode="continuous",
                                poll_s=0.005, policy=CachePolicy(window=6, sink=3))
        result = PlaySession(cuda_model, prompt(), vae, image(), settings, writer=writer,
                             registry=SessionRegistry(), overlap=True).run()
        made[vae_device] = (result.latent, writer.pieces)
        pieces = []
        stream_fast_video(cuda_model, prompt(), tiny_vae(seed=1).state_dict(), start_image(), 45, HEIGHT, WIDTH, None,
                          FastParams(seed=5, policy=CachePolicy(window=6, sink=3)), pieces.append,
                          device=vae_device, overlap=True)
        made[vae_device + " stream"] = pieces
    assert torch.equal(made["cuda:0"][0], made["cuda:1"][0])
    assert len(made["cuda:1"][1]) == 12
    assert all(torch.equal(a, b) for a, b in zip(made["cuda:0"][1], made["cuda:1"][1]))
    assert all(torch.equal(a, b) for a, b in zip(made["cuda:0 stream"], made["cuda:1 stream"]))
    assert not worker_thread_alive()


def test_the_generation_runs_on_a_highest_priority_stream_and_hands_back_in_order(monkeypatch):
    from comfyui_lingbot_world.pipeline.fast.worker import generation_first

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    device = torch.device("cuda")
    before = torch.cuda.current_stream(device)
    highest = torch.cuda.Stream.priority_range()[1] if hasattr(torch.cuda.Stream, "priority_range") else None
    x = torch.ones(1 << 20, device=device)
    with generation_first(device):
        inside = torch.cuda.current_stream(device)
        assert inside != before and inside.priority < 0 and (highest is None or inside.priority == highest)
        y = x * 2  # ordered after what was queued on the caller's stream
    assert torch.cuda.current_stream(device) == before
    assert torch.equal(y + 0, torch.full_like(x, 2.0))  # the caller's stream reads it after the block's work
    with generation_first(device, overlap=False):
        assert torch.cuda.current_stream(device) == before  # nothing beside it: nothing to prioritise
    monkeypatch.setenv(switches.STREAM_PRIORITY.name, "0")
    with generation_first(device):
        assert torch.cuda.current_stream(device) == before
