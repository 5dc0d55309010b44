"""Rank 0's side of the worker processes: start them, send them commands, wait for their
reports, watch them, stop them.

- A worker that dies or fails: a watch thread sees it, aborts the group (a blocked
  collective then raises) and the step fails with ``WorkerLost`` naming the device; the
  pool is torn down (workers stopped, group destroyed, its rendezvous folder removed) and the
  next ``start`` begins afresh.
- One group per process: a process that already has a default group refuses to start a pool.
"""
from __future__ import annotations

import os
import queue
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from ...wan.runtime.parallel import SequenceParallel
from .groups import CfgGroups, all_to_all_loop, apply_env, join_group, sync
from .messages import Failed, Free, Freed, Load, Loaded, MeasureLink, Ready, Report, Stop
from .worker import spawn_worker

START_TIMEOUT_S = 600.0  # a worker's first model load (an A14B expert from disk) fits in it
WATCH_PERIOD_S = 0.2
RENDEZVOUS_PREFIX = "lingbot-group-"  # the temporary folder of the group's file store: PREFIX<pid>-<random>


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def remove_stale_rendezvous(folder: str | None = None) -> list[str]:
    """Remove the rendezvous folders that processes killed before their ``close`` left in the
    temporary folder (their pid is in the name and no longer runs); the names removed."""
    root = folder or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        pid = name[len(RENDEZVOUS_PREFIX):].partition("-")[0]
        if name.startswith(RENDEZVOUS_PREFIX) and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            removed.append(name)
    return removed


class WorkerLost(RuntimeError):
    """A worker process died or failed during a parallel run."""


@dataclass
class _Dead:
    rank: int
    device: str
    detail: str


class RankPool:
    """Rank 0 of a group over ``devices`` (``devices[0]`` is this process's device); the
    workers are started by ``start`` and stay until ``close``."""

    def __init__(self, devices: Sequence[torch.device | str]) -> None:
        self.devices = [torch.device(d) for d in devices]
        if len(self.devices) < 2:
            raise ValueError(f"a parallel run needs at least 2 devices, got {len(self.devices)}")
        if len({d.type for d in self.devices}) != 1:
            raise ValueError(f"devices must all be CUDA or all CPU, got {[str(d) for d in self.devices]}")
        self.world = len(self.devices)
        self.device = self.devices[0]
        self._procs: list[Any] = []
        self._commands: list[Any] = []
        self._reports: Any = None
        self._dead: _Dead | None = None
        self._watch: threading.Thread | None = None
        self._stop_watch = threading.Event()
        self._replies: "queue.Queue[Report]" = queue.Queue()
        self._init_dir: str | None = None
        self.sp: SequenceParallel | None = None
        self.cfg: CfgGroups | None = None  # Ulysses x CFG split (pipeline/placement.split_degrees)
        self.loaded: dict[str, set[int]] = {}  # model key -> workers holding it

    # -------------------------------------------------------------- lifecycle
    @property
    def running(self) -> bool:
        return self.sp is not None

    def start(self) -> "RankPool":
        if self.running:
            return self
        if dist.is_initialized():
            raise RuntimeError("torch.distributed is already initialized in this process (another pack or run "
                               "holds the default group); restart ComfyUI to use the sequence-parallel modes")
        apply_env()
        ctx = mp.get_context("spawn")
        remove_stale_rendezvous()
        self._init_dir = tempfile.mkdtemp(prefix=f"{RENDEZVOUS_PREFIX}{os.getpid()}-")
        try:
            init = f"file://{self._init_dir}/store"
            self._reports = ctx.Queue()
            self._dead = None
            names = [str(d) for d in self.devices]
            for rank in range(1, self.world):
                commands = ctx.Queue()
                self._procs.append(spawn_worker(ctx, rank, self.world, names, init, commands, self._reports))
                self._commands.append(commands)
            self._stop_watch.clear()
            self._watch = threading.Thread(target=self._watch_workers, name="lingbot-rank-watch", daemon=True)
            self._watch.start()
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            self.sp, self.cfg = join_group(0, self.world, self.device, init)
            self._await(Ready, START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop the workers (politely, then by force), destroy the group, remove its
        rendezvous folder; idempotent."""
        for commands in self._commands:
            try:
                commands.put(Stop())
            except Exception:  # noqa: BLE001
                pass
        deadline = time.monotonic() + 10.0
        for proc in self._procs:
            proc.join(max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)
        self._stop_watch.set()
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass
        if self._init_dir is not None:
            shutil.rmtree(self._init_dir, ignore_errors=True)
            self._init_dir = None
        self._procs, self._commands, self.sp, self.cfg, self.loaded = [], [], None, None, {}
        self._replies = queue.Queue()

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    # -------------------------------------------------------------- failure watch
    def _watch_workers(self) -> None:
        while not self._stop_watch.wait(WATCH_PERIOD_S):
            try:
                while True:
                    report = self._reports.get_nowait()
                    if isinstance(report, Failed):
                        self._lost(report.rank, f"failed:\n{report.detail}")
                    else:
                        self._replies.put(report)
            except queue.Empty:
                pass
            except (OSError, ValueError, EOFError):
                return
            for rank, proc in enumerate(self._procs, start=1):
                if proc.exitcode is not None and not self._stop_watch.is_set():
                    self._lost(rank, f"exited with code {proc.exitcode}")

    def _lost(self, rank: int, detail: str) -> None:
        if self._dead is not None:
            return
        self._dead = _Dead(rank, str(self.devices[rank]), detail)
        if dist.is_initialized():  # a collective blocked on the lost rank raises now
            try:
                dist.distributed_c10d._abort_process_group()
            except Exception:  # noqa: BLE001 - gloo raises on a closed peer by itself
                pass

    def lost_message(self) -> str:
        dead = self._dead
        assert dead is not None
        return (f"the sequence-parallel worker on {dead.device} (rank {dead.rank}) {dead.detail.strip()}; "
                "the workers were stopped and the next run starts them again")

    def _check(self) -> None:
        if self._dead is not None:
            message = self.lost_message()
            self.close()
            raise WorkerLost(message)
        if not self.running:
            raise RuntimeError("the rank pool is not started")

    def _await(self, kind: type, timeout: float, count: int | None = None) -> None:
        """Wait for ``count`` (default: every worker) reports of type ``kind``."""
        need = self.world - 1 if count is None else count
        deadline = time.monotonic() + timeout
        while need:
            if self._dead is not None:
                self._check()
            try:
                got = self._replies.get(timeout=0.1)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the sequence-parallel workers did not answer {kind.__name__} within "
                                       f"{timeout:.0f} s")
                continue
            if isinstance(got, kind):
                need -= 1

    def send(self, command: object, ranks: Sequence[int] | None = None) -> None:
        """Put ``command`` (a ``messages`` dataclass) on the queue of the workers ``ranks`` (default all)."""
        self._check()
        for rank, commands in enumerate(self._commands, start=1):
            if ranks is None or rank in ranks:
                commands.put(command)

    def guard(self, run: Callable[[], Any], synced: Callable[[BaseException], bool] = lambda exc: False) -> Any:
        """Run a collective step; a lost worker (or a failure on rank 0 that leaves the
        workers inside a collective) tears the pool down. ``synced(exc)``: the error is a
        cancel every rank acted on at the same block, after which the group is still in step."""
        try:
            return run()
        except BaseException as exc:
            if self._dead is None:
                self._poll_dead(1.0)  # a collective may notice a dead peer before the watch thread
            if self._dead is not None:
                message = self.lost_message()
                self.close()
                raise WorkerLost(message) from exc
            if synced(exc):
                raise
            self.close()
            raise

    def _poll_dead(self, wait: float) -> None:
        deadline = time.monotonic() + wait
        for rank, proc in enumerate(self._procs, start=1):
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.exitcode is not None:
                self._lost(rank, f"exited with code {proc.exitcode}")
                return

    # -------------------------------------------------------------- commands
    def load(self, key: str, factory: Callable[[torch.device], nn.Module], local: nn.Module | None = None) -> nn.Module:
        """Build ``factory(device)`` on every rank (the workers in parallel); rank 0's copy is
        returned (``local``: rank 0's copy exists already, only the workers build theirs)."""
        self.load_on(key, factory, range(1, self.world))
        return factory(self.device) if local is None else local

    def load_on(self, key: str, factory: Callable[[torch.device], nn.Module], ranks: Sequence[int]) -> None:
        """Build ``factory(device)`` on the workers ``ranks`` (in parallel), waiting for them."""
        ranks = [r for r in ranks if r not in self.loaded.get(key, set())]
        self.send(Load(key, factory), ranks)
        self._await(Loaded, START_TIMEOUT_S, len(ranks))
        self.loaded.setdefault(key, set()).update(ranks)

    def measure_link(self, megabytes: float = 64.0, repeats: int = 5) -> dict:
        """Time an all-to-all of ``megabytes`` per rank (bf16 on CUDA, float32 on the CPU) after
        one warm-up: seconds per exchange and the effective GB/s each rank sends
        (``pipeline/placement.decide_devices`` reads the GB/s)."""
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        numel = int(megabytes * 2**20 / torch.empty((), dtype=dtype).element_size()) // self.world * self.world
        for count in (1, repeats):
            self.send(MeasureLink(numel, dtype, count))
            started = time.perf_counter()
            self.guard(lambda: (all_to_all_loop(numel, dtype, count, self.device), sync(self.device)))
            seconds = (time.perf_counter() - started) / count
        sent = numel * torch.empty((), dtype=dtype).element_size() * (self.world - 1) / self.world
        return {"all_to_all_mb": megabytes, "all_to_all_s": seconds, "gbps": sent / seconds / 1e9,
                "ranks": self.world}

    def free(self, key: str, ranks: Sequence[int] | None = None) -> None:
        """The workers ``ranks`` (default all) drop their copy of ``key`` (and their caches
        and camera tokens)."""
        if not self.running:
            return
        held = self.loaded.get(key, set())
        ranks = [r for r in (range(1, self.world) if ranks is None else ranks) if r in held]
        self.send(Free(key), ranks)
        self._await(Freed, 60.0, len(ranks))
        held.difference_update(ranks)

    def require(self, key: str) -> None:
        """Refuse a forward unless every worker holds ``key`` (lock-step needs all ranks)."""
        missing = [str(self.devices[r]) for r in range(1, self.world) if r not in self.loaded.get(key, set())]
        if missing:
            raise RuntimeError(f"the sequence-parallel copy of {key} is not loaded on {', '.join(missing)} "
                               "(unloaded by the memory manager during the run?); run the prompt again")


__all__ = ["RENDEZVOUS_PREFIX", "RankPool", "START_TIMEOUT_S", "WorkerLost"]
