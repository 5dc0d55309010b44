"""A worker process killed in the middle of a sequence-parallel forward (pipeline/parallel_pool/,
CPU, gloo): the forward fails with a message naming the worker's device, the pool is torn
down (no process left, the group destroyed), and the next start runs again; close leaves no
worker process and no rendezvous folder, also when the start fails; a command the worker has
no handler for fails it naming the command. (A module of its own: one group per process, and
test_parallel_pool.py keeps its pool for the whole module.)"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

import pytest
import torch

import parallel_ranks
from comfyui_lingbot_world.pipeline.parallel_pool import PARALLEL_ENV, ParallelModel, RankPool, WorkerLost
from comfyui_lingbot_world.pipeline.parallel_pool import messages, rank_pool, worker
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


def _rendezvous(folder) -> list[str]:
    return sorted(p.name for p in folder.glob(f"{rank_pool.RENDEZVOUS_PREFIX}*"))


def test_close_and_a_failed_start_remove_the_rendezvous_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mkdtemp puts the group's file store
    pool = RankPool(["cpu", "cpu"]).start()
    try:
        assert len(_rendezvous(tmp_path)) == 1  # the group's file store, while the pool runs
    finally:
        pool.close()
    assert _rendezvous(tmp_path) == []

    def spawn_fails(*args, **kwargs):
        raise OSError("cannot start a process")

    monkeypatch.setattr(rank_pool, "spawn_worker", spawn_fails)
    with pytest.raises(OSError, match="cannot start a process"):
        RankPool(["cpu", "cpu"]).start()
    assert _rendezvous(tmp_path) == [] and not torch.distributed.is_initialized()


def test_a_start_removes_what_killed_processes_left(tmp_path, monkeypatch):
    """A process killed before its close (a server stopped with SIGKILL) leaves its rendezvous
    folder; the next start removes those whose process is gone, never a running one's."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid no longer runs
    for pid in (dead.pid, os.getppid()):
        (tmp_path / f"{rank_pool.RENDEZVOUS_PREFIX}{pid}-abc").mkdir()
    (tmp_path / f"{rank_pool.RENDEZVOUS_PREFIX}oldname").mkdir()  # not a name this code makes: left alone
    pool = RankPool(["cpu", "cpu"]).start()
    try:
        assert f"{rank_pool.RENDEZVOUS_PREFIX}{dead.pid}-abc" not in _rendezvous(tmp_path)
        assert {f"{rank_pool.RENDEZVOUS_PREFIX}{os.getppid()}-abc", f"{rank_pool.RENDEZVOUS_PREFIX}oldname"} <= set(
            _rendezvous(tmp_path))
        assert any(n.startswith(f"{rank_pool.RENDEZVOUS_PREFIX}{os.getpid()}-") for n in _rendezvous(tmp_path))
    finally:
        pool.close()


def test_every_command_has_one_handler_and_an_unknown_one_fails_the_worker_naming_it():
    assert set(worker.HANDLERS) | {messages.Stop} == set(messages.COMMANDS)
    pool = RankPool(["cpu", "cpu"]).start()
    try:
        procs = list(pool._procs)
        pool.send(("load", ("tiny", parallel_ranks.build)))  # an untyped command: no handler takes it
        with pytest.raises(WorkerLost, match=r"(?s)worker on cpu \(rank 1\) failed:.*unknown command tuple"):
            pool.load("tiny", parallel_ranks.build)
        assert not pool.running
    finally:
        pool.close()
    assert all(not p.is_alive() for p in procs)


def test_a_cancel_stops_within_two_exchanges_of_rank_0_seeing_it(monkeypatch):
    """The agreed cancel (``cancel.synced_cancel``): rank 0's check fails before block 3; with an
    exchange every 2 blocks the flag sent at block 3 is read at the exchange after it (block 5),
    where every rank raises, rank 0 its own error."""
    from comfyui_lingbot_world.pipeline.parallel_pool import cancel

    monkeypatch.setattr(cancel.dist, "all_reduce", lambda flag, op=None: flag)  # one rank: the MAX is its own
    seen = {"blocks": 0}

    def local() -> None:
        seen["blocks"] += 1
        if seen["blocks"] == 3:
            raise KeyboardInterrupt("stop")

    hook = cancel.synced_cancel(torch.device("cpu"), local, every=2)
    hook(), hook(), hook(), hook()  # blocks 1-4: the error is kept, not raised yet
    assert hook.error is not None and hook.raised is None
    with pytest.raises(KeyboardInterrupt, match="stop"):
        hook()  # block 5: the exchange after the one that carried the flag
    assert hook.raised is hook.error and hook.exchanges == 3
