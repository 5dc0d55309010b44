"""The persistent rank processes (pipeline/parallel_pool/) on the CPU with gloo: a worker
process holding the tiny model runs each forward in lock-step with this process (rank 0),
and a cancel on rank 0 stops every rank at the same block and leaves the group usable. A
worker killed mid-run: tests/unit/test_parallel_pool_failure.py (one pool per process)."""
from __future__ import annotations

import pytest
import torch

import parallel_ranks
from parallel_ranks import CONFIG, FRAMES, LAT_H, LAT_W
from comfyui_lingbot_world.pipeline.parallel_pool import ParallelModel, RankPool
from comfyui_lingbot_world.wan.runtime.kv_cache import CachePolicy

FLOAT32 = 1e-5


def _inputs(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 16, FRAMES, LAT_H, LAT_W, generator=g)
    y = torch.randn(2, 20, FRAMES, LAT_H, LAT_W, generator=g)
    context = [torch.randn(n, CONFIG.text_dim, generator=g) for n in (7, 12)]
    plucker = torch.randn(1, 384, FRAMES, LAT_H, LAT_W, generator=g)
    return x, torch.tensor([937.0, 412.0]), context, y, plucker


def _rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module")
def pool():
    pool = RankPool(["cpu", "cpu"]).start()
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def parallel(pool):
    return ParallelModel(pool, "tiny", pool.load("tiny", parallel_ranks.build))


def test_forward_in_lock_step_equals_one_process(parallel):
    reference = parallel_ranks.model()
    x, t, context, y, plucker = _inputs()
    want = reference(x, t, context, y, camera=plucker)
    tokens = parallel.prepare_camera(plucker)  # as the sampler does: once per expert activation
    assert _rel(parallel(x, t, context, y=y, camera_tokens=tokens), want) < FLOAT32
    assert _rel(parallel(x, t, context, y=y, camera=plucker), want) < FLOAT32


def test_fast_session_with_the_workers_cache_shard_equals_one_process(parallel):
    reference = parallel_ranks.model()
    policy = CachePolicy(window=9, sink=3)
    whole = reference.new_kv_cache(policy, LAT_H, LAT_W)
    shard = parallel.new_kv_cache(policy, LAT_H, LAT_W)
    assert shard.heads == CONFIG.num_heads // 2
    g = torch.Generator().manual_seed(2)
    text = [torch.randn(9, CONFIG.text_dim, generator=g)]
    for chunk in range(4):
        y = torch.randn(1, 20, FRAMES, LAT_H, LAT_W, generator=g)
        x = torch.randn(1, 16, FRAMES, LAT_H, LAT_W, generator=g)
        context = text if chunk == 0 else None
        if chunk == 2:  # a chunk skipped on rank 0 only (as the generator's last chunk): the workers follow
            whole.skip_chunk(), shard.skip_chunk()
            continue
        want = reference(x, torch.tensor([999.0]), context, y, kv_cache=whole)
        got = parallel(x, torch.tensor([999.0]), context, y=y, kv_cache=shard)
        assert _rel(got, want) < FLOAT32, chunk
        reference(want, torch.tensor([0.0]), None, y, kv_cache=whole, commit=True)
        assert parallel(want, torch.tensor([0.0]), None, y=y, kv_cache=shard, commit=True) is None
    assert shard.slot_frames == whole.slot_frames and shard.frame_start == whole.frame_start
    shard.close()


def test_cancel_stops_every_rank_and_the_group_stays_usable(parallel, pool):
    reference = parallel_ranks.model()
    x, t, context, y, plucker = _inputs()
    calls = []

    def cancel():  # before every block: stop before the second one
        calls.append(1)
        if len(calls) == 2:
            raise InterruptedError("cancelled by the user")

    with pytest.raises(InterruptedError, match="cancelled by the user"):
        parallel(x, t, context, y=y, camera=plucker, cancel=cancel)
    assert pool.running and all(p.is_alive() for p in pool._procs)
    assert _rel(parallel(x, t, context, y=y, camera=plucker), reference(x, t, context, y, camera=plucker)) < FLOAT32


def test_the_fast_generator_runs_a_clip_on_the_ranks(parallel):
    """pipeline/fast's sample_fast drives ParallelModel as it drives the model (its cache
    made through it, the workers' shards following): the same clip as one process."""
    from comfyui_lingbot_world.pipeline.fast import FastParams, sample_fast
    from comfyui_lingbot_world.pipeline.image import I2VCondition

    g = torch.Generator().manual_seed(4)
    frames = 33  # 9 latent frames: 3 chunks, the last without its commit pass
    condition = I2VCondition(y=torch.randn(20, 9, LAT_H, LAT_W, generator=g), frames=frames,
                             height=8 * LAT_H, width=8 * LAT_W)
    text = torch.randn(9, CONFIG.text_dim, generator=g)
    params = FastParams(seed=5)
    want = sample_fast(parallel_ranks.model(), text, condition, None, params, frames)
    got = sample_fast(parallel, text, condition, None, params, frames)
    assert got.shape == want.shape == (16, 9, LAT_H, LAT_W)
    assert _rel(got, want) < FLOAT32
