"""Kept camera terms (wan/runtime/camera_terms.py): a Fast chunk's five forwards compute each
block's camera scale and shift once, the video is bit for bit the one computed per forward,
a limit keeps only that many blocks' terms, and the memory plan keeps as many as fit."""
from __future__ import annotations

import pytest
import torch

from comfyui_lingbot_world.pipeline import memory
from comfyui_lingbot_world.pipeline.fast import FastParams, KeyframeCamera, WholeI2V, sample_fast
from comfyui_lingbot_world.pipeline.memory import GIB, plan_fast_memory
from comfyui_lingbot_world.wan.config import A14B
from comfyui_lingbot_world.wan.model import DiTBlock
from comfyui_lingbot_world.wan.runtime.camera_terms import CameraTerms
from comfyui_lingbot_world.wan.runtime.kv_cache import CachePolicy
from fast_helpers import HEIGHT, LAT_H, LAT_W, WIDTH, camera_path, prompt, video_frames
from fast_helpers import one_thread, model  # noqa: F401  (module fixtures)

LATENT_FRAMES = 9  # three chunks


def clip(model, terms: int, monkeypatch) -> tuple[torch.Tensor, int]:
    """The tiny Fast clip with ``terms`` kept blocks; and how often a block computed its terms."""
    calls = []
    original = DiTBlock._camera_scale_shift
    monkeypatch.setattr(DiTBlock, "_camera_scale_shift", staticmethod(lambda cam, c: calls.append(1) or original(cam, c)))
    frames = video_frames(LATENT_FRAMES)
    y = torch.randn(20, LATENT_FRAMES, LAT_H, LAT_W, generator=torch.Generator().manual_seed(2))
    camera = KeyframeCamera(*camera_path(frames), frames, HEIGHT, WIDTH)
    latent = sample_fast(model, prompt(), WholeI2V(y), camera, FastParams(seed=5, camera_terms=terms), frames)
    monkeypatch.undo()
    return latent, len(calls)


def test_kept_terms_give_the_same_video_bit_for_bit_with_one_computation_a_chunk(model, monkeypatch):
    blocks = len(model.blocks)
    plain, per_forward = clip(model, 0, monkeypatch)
    kept, once = clip(model, blocks, monkeypatch)
    assert torch.equal(kept, plain)
    # 3 chunks: 5 + 5 + 4 forwards (the clip's last chunk skips its commit, and a commit's
    # last block stops after storing its keys: no camera there)
    assert per_forward == blocks * 14 - 2
    assert once == blocks * 3


def test_a_limit_keeps_the_first_blocks_terms_and_computes_the_rest(model, monkeypatch):
    blocks = len(model.blocks)
    plain, per_forward = clip(model, 0, monkeypatch)
    partial, calls = clip(model, 1, monkeypatch)
    assert torch.equal(partial, plain)
    assert blocks > 1
    # the first block: once a chunk; the others every forward (the last one not in a commit)
    assert calls == 3 + (blocks - 1) * 14 - 2


def test_terms_hold_what_they_were_given_and_say_their_size():
    tokens = torch.randn(1, 10, 4)
    terms = CameraTerms(tokens, max_blocks=1)
    block_a, block_b = object(), object()
    made = []

    def compute(c):
        made.append(c.shape[1])
        return c * 2, c + 1

    first = terms.scale_shift(block_a, 0, 10, compute)
    assert terms.scale_shift(block_a, 0, 10, compute) is first and made == [10]
    terms.scale_shift(block_b, 0, 10, compute)
    terms.scale_shift(block_b, 0, 10, compute)
    assert made == [10, 10, 10]  # block_b is past the limit: computed every time
    assert terms.nbytes == 2 * 10 * 4 * 4
    assert CameraTerms.estimate_bytes(4680, 5120, 40) == 2 * 40 * 4680 * 5120 * 2
    with pytest.raises(ValueError, match="camera tokens"):
        CameraTerms(torch.zeros(10, 4))
    with pytest.raises(ValueError, match="camera_terms"):
        FastParams(camera_terms=-1)


RUN = {d: memory.fast_run_bytes(A14B, CachePolicy(window=9, sink=3, dtype=d), 60, 104, None) for d in ("bf16", "int8")}
TERMS = memory.camera_terms_bytes(A14B, 60, 104, 3)


def plan(card_gib: float, vae: int = 0):
    return plan_fast_memory(int(card_gib * GIB), int(8.9 * GIB), 40, RUN, vae, memory.decode_chunk_bytes(480, 832),
                            GIB, terms_bytes=TERMS)


def test_the_plan_keeps_the_terms_of_as_many_blocks_as_fit():
    assert TERMS == 2 * 4680 * 5120 * 2  # one block's scale and shift for a 480x832 chunk, bf16
    assert memory.camera_terms_bytes(A14B, 60, 104, 3, ranks=2) == TERMS // 2
    big = plan(80)
    assert big.camera_terms == 40
    tight = plan(24, memory.vae_stream_budget(int(0.24 * GIB), 480, 832, "bf16"))
    assert 0 < tight.camera_terms < 40
    assert tight.need + memory.ALLOCATOR_SLACK <= memory.AUTO_FIT_SHARE * 24 * GIB
    assert tight.need + TERMS + memory.ALLOCATOR_SLACK > memory.AUTO_FIT_SHARE * 24 * GIB  # one more would not fit
    # Under block swap, more blocks are swapped (up to half) while that keeps more terms: the
    # same card with terms offered swaps more than the plan without them, and no further.
    swapped, least = plan(16), plan_fast_memory(16 * GIB, int(8.9 * GIB), 40, RUN, 0,
                                                memory.decode_chunk_bytes(480, 832), GIB)
    assert least.blocks_on_gpu is not None and swapped.camera_terms > 0
    assert swapped.blocks_on_gpu == max(40 - int(memory.SWAP_HIDDEN_SHARE * 40), 1) < least.blocks_on_gpu
    assert swapped.need + memory.ALLOCATOR_SLACK <= memory.AUTO_FIT_SHARE * 16 * GIB
    assert "camera terms of 40 blocks" in big.describe()
