"""Sequence parallel on 2 (and 4, where there are) real GPUs with NCCL: the tiny float32 model
(4 heads) in lock-step over rank 0 (this process) and spawned workers, against the same
model on GPU 0 alone; a cancel mid-forward; a worker killed mid-forward (NCCL does not
notice a dead peer by itself: the watch must abort the group) and the next start; the link
measured. CPU twins with gloo: tests/unit/test_parallel_pool*.py, test_sequence_parallel.py."""
from __future__ import annotations

import os
import signal

import pytest
import torch

import parallel_ranks
from parallel_ranks import CONFIG, FRAMES, LAT_H, LAT_W
from comfyui_lingbot_world.pipeline.parallel_pool import ParallelModel, RankPool, WorkerLost
from comfyui_lingbot_world.wan.runtime.kv_cache import CachePolicy

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")]

TOLERANCE = 1e-4  # float32; the attention kernel runs on H/P heads per call


def _inputs(device):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 16, FRAMES, LAT_H, LAT_W, generator=g)
    y = torch.randn(2, 20, FRAMES, LAT_H, LAT_W, generator=g)
    context = [torch.randn(n, CONFIG.text_dim, generator=g).to(device) for n in (7, 12)]
    plucker = torch.randn(1, 384, FRAMES, LAT_H, LAT_W, generator=g)
    return x.to(device), torch.tensor([937.0, 412.0], device=device), context, y.to(device), plucker.to(device)


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("world", [2, 4])
def test_lock_step_forwards_and_fast_cache_match_one_gpu(world):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA GPUs")
    devices = [torch.device("cuda", i) for i in range(world)]
    reference = parallel_ranks.build(devices[0])
    pool = RankPool(devices).start()
    try:
        link = pool.measure_link(16.0, 3)
        assert link["gbps"] > 0  # what auto makes of it: pipeline.placement.decide_devices (test_placement.py)
        parallel = ParallelModel(pool, "tiny", pool.load("tiny", parallel_ranks.build, local=reference))
        x, t, context, y, plucker = _inputs(devices[0])
        with torch.no_grad():
            assert _rel(parallel(x, t, context, y=y, camera=plucker), reference(x, t, context, y, camera=plucker)) \
                < TOLERANCE
            policy = CachePolicy(window=9, sink=3)
            whole = reference.new_kv_cache(policy, LAT_H, LAT_W)
            shard = parallel.new_kv_cache(policy, LAT_H, LAT_W)
            for chunk in range(4):
                xc, yc = x[:1] * (chunk + 1) * 0.3, y[:1]
                want = reference(xc, t[:1], context[:1] if chunk == 0 else None, yc, kv_cache=whole)
                got = parallel(xc, t[:1], context[:1] if chunk == 0 else None, y=yc, kv_cache=shard)
                assert _rel(got, want) < TOLERANCE, chunk
                reference(want, t[:1] * 0, None, yc, kv_cache=whole, commit=True)
                parallel(want, t[:1] * 0, None, y=yc, kv_cache=shard, commit=True)
            assert shard.slot_frames == whole.slot_frames
            calls = []

            def cancel():
                calls.append(1)
                if len(calls) == 1:
                    raise InterruptedError("cancelled")

            with pytest.raises(InterruptedError):
                parallel(x, t, context, y=y, camera=plucker, cancel=cancel)
            assert pool.running  # every rank stopped at the same block: the next forward runs
            assert _rel(parallel(x, t, context, y=y, camera=plucker), reference(x, t, context, y, camera=plucker)) \
                < TOLERANCE
        parallel.close()
        assert pool.loaded["tiny"] == set()
    finally:
        pool.close()


def test_a_worker_killed_mid_forward_fails_naming_its_gpu_and_the_next_start_works():
    devices = [torch.device("cuda", 0), torch.device("cuda", 1)]
    pool = RankPool(devices).start()
    try:
        reference = parallel_ranks.build(devices[0])
        parallel = ParallelModel(pool, "tiny", pool.load("tiny", parallel_ranks.build, local=reference))
        x, t, context, y, plucker = _inputs(devices[0])
        pid, calls = pool.pids()[0], []

        def kill_worker():
            calls.append(1)
            if len(calls) == 1:
                os.kill(pid, signal.SIGKILL)

        with torch.no_grad(), pytest.raises(WorkerLost, match=r"worker on cuda:1 \(rank 1\)"):
            parallel(x, t, context, y=y, camera=plucker, cancel=kill_worker)
        assert not pool.running
        pool.start()
        again = ParallelModel(pool, "tiny", pool.load("tiny", parallel_ranks.build, local=reference))
        with torch.no_grad():
            assert _rel(again(x, t, context, y=y, camera=plucker), reference(x, t, context, y, camera=plucker)) \
                < TOLERANCE
    finally:
        pool.close()
