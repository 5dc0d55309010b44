"""A worker process killed in the middle of a sequence-parallel forward (pipeline/parallel_pool.py,
CPU, gloo): the forward fails with a message naming the worker's device, the pool is torn
down (no process left, the group destroyed), and the next start runs again; close leaves no
worker process. (A module of its own: one group per process, and test_parallel_pool.py keeps
its pool for the whole module.)"""
from __future__ import annotations

import os
import signal

import pytest
import torch

import parallel_ranks
from comfyui_lingbot_world.pipeline.parallel_pool import PARALLEL_ENV, ParallelModel, RankPool, WorkerLost
from test_parallel_pool import FLOAT32, _inputs, _rel


def test_a_worker_killed_mid_run_fails_with_its_device_and_the_next_start_works():
    pool = RankPool(["cpu", "cpu"]).start()
    try:
        parallel = ParallelModel(pool, "tiny", pool.load("tiny", parallel_ranks.build))
        x, t, context, y, plucker = _inputs()
        pid = pool.pids()[0]
        calls = []

        def kill_worker():  # rank 0's check before the second block kills rank 1
            calls.append(1)
            if len(calls) == 2:
                os.kill(pid, signal.SIGKILL)

        with pytest.raises(WorkerLost, match=r"worker on cpu \(rank 1\) exited with code -9"):
            parallel(x, t, context, y=y, camera=plucker, cancel=kill_worker)
        assert not pool.running and pool.pids() == []
        # the next run starts the workers again
        pool.start()
        again = ParallelModel(pool, "tiny", pool.load("tiny", parallel_ranks.build))
        want = parallel_ranks.model()(x, t, context, y, camera=plucker)
        assert _rel(again(x, t, context, y=y, camera=plucker), want) < FLOAT32
        procs = list(pool._procs)
    finally:
        pool.close()
    assert all(not p.is_alive() for p in procs) and not torch.distributed.is_initialized()
    assert all(os.environ[k] == v for k, v in PARALLEL_ENV.items())


PARENT = """
import sys, time
sys.path[:0] = [{root!r}, {tests!r}]
from _standalone import import_pack
import_pack()
from comfyui_lingbot_world.pipeline.parallel_pool import RankPool
if __name__ == "__main__":
    pool = RankPool(["cpu", "cpu"]).start()
    print(pool.pids()[0], flush=True)
    time.sleep(600)
"""


def test_no_worker_outlives_its_parent(tmp_path):
    """rank 0 killed (ComfyUI gone without closing the pool): the worker exits by itself."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    tests = Path(__file__).resolve().parents[1]
    script = tmp_path / "parent.py"
    script.write_text(PARENT.format(root=str(tests.parent), tests=str(tests)))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(parent.stdout.readline())
        os.kill(worker, 0)  # alive while its parent is
        parent.kill()
        parent.wait(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(worker, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            os.kill(worker, signal.SIGKILL)
            pytest.fail(f"worker {worker} still running 30 s after its parent was killed")
    finally:
        if parent.poll() is None:
            parent.kill()


def test_ulysses_times_cfg_split_on_four_ranks_equals_one_process():
    """4 ranks = 2 x 2: a batch of two (prompt, negative) runs one sample per Ulysses group of
    two, the pairs exchange the predictions; a batch of one runs over all four."""
    pool = RankPool(["cpu"] * 4).start()
    try:
        assert pool.cfg is not None and pool.cfg.branch == 0 and pool.cfg.sp.size == 2
        reference = parallel_ranks.model()
        parallel = ParallelModel(pool, "tiny", pool.load("tiny", parallel_ranks.build, local=reference))
        x, t, context, y, plucker = _inputs()
        want = reference(x, t, context, y, camera=plucker)
        assert _rel(parallel(x, t, context, y=y, camera=plucker), want) < FLOAT32  # 2 x 2
        parallel.cfg_split = False
        assert _rel(parallel(x, t, context, y=y, camera=plucker), want) < FLOAT32  # Ulysses over 4
        one = reference(x[:1], t[:1], context[:1], y[:1], camera=plucker)
        assert _rel(parallel(x[:1], t[:1], context[:1], y=y[:1], camera=plucker), one) < FLOAT32
    finally:
        pool.close()
