"""Persistent rank processes for sequence-parallel runs: this process is rank 0, one spawned
worker per extra device, one ``torch.distributed`` group (NCCL on CUDA, gloo on the CPU).

The workers hold their own copy of the model (built by a picklable ``factory(device)``) and
run every forward in lock-step with rank 0: rank 0 sends the command (a queue per worker:
the operation and the inputs' shapes), the inputs themselves go by ``broadcast`` over the
group, every rank runs ``LingBotDiT.forward(..., parallel=sp)`` and all get the whole
prediction. Nothing here knows ComfyUI (nodes/host/workers.py adds the memory accounting).

- Cancel: before every block all ranks agree on a flag (one all-reduce of one number), so a
  cancel on rank 0 stops every rank at the same block boundary and the group stays usable.
- A worker that dies or fails: a watch thread in rank 0 sees it, aborts the group (a blocked
  collective then raises) and the forward fails with ``WorkerLost`` naming the device; the
  pool is torn down (workers stopped, group destroyed) and the next ``start`` begins afresh.
- No worker outlives rank 0: each waits on its parent's sentinel and exits when it goes.
- ``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, ``NVSHMEM_DISABLE_NVLS=1`` are
  set in every rank's environment (NVLink multicast stays off on the lent machines).
"""
from __future__ import annotations

import itertools
from datetime import timedelta
import os
import queue
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from ..wan.runtime.attention import attention_backend, run_choice as attention_run_choice
from ..wan.runtime.camera_terms import CameraTerms
from ..wan.runtime.kv_cache import CachePolicy, KVCache
from ..wan.runtime.parallel import SequenceParallel
from ..wan.runtime import switches

PARALLEL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
                # The watch aborts the group when a worker is lost (torch's note on _abort_process_group:
                # with the watchdog's error handling on, it may end the process itself: ComfyUI's).
                "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}
START_TIMEOUT_S = 600.0  # a worker's first model load (an A14B expert from disk) fits in it
WATCH_PERIOD_S = 0.2
# Rendezvous and collective timeout. A collective never waits on a dead rank that long (the
# watch aborts the group first); an NCCL collective past it would end the process.
GROUP_TIMEOUT = timedelta(seconds=900)


class WorkerLost(RuntimeError):
    """A worker process died or failed during a parallel run."""


class Cancelled(Exception):
    """Raised on the workers when rank 0 cancelled (they go back to waiting for commands)."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def apply_env() -> None:
    for key, value in PARALLEL_ENV.items():
        os.environ.setdefault(key, value)


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


# ----------------------------------------------------------------------------- tensors over the group

def _describe(tensors: dict[str, torch.Tensor]) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    return [(name, tuple(t.shape), t.dtype) for name, t in tensors.items()]


def _broadcast_out(tensors: dict[str, torch.Tensor], device: torch.device) -> None:
    for t in tensors.values():
        dist.broadcast(t.to(device).contiguous(), src=0)


def _broadcast_in(meta: list[tuple[str, tuple[int, ...], torch.dtype]],
                  device: torch.device) -> dict[str, torch.Tensor]:
    out = {}
    for name, shape, dtype in meta:
        t = torch.empty(shape, dtype=dtype, device=device)
        dist.broadcast(t, src=0)
        out[name] = t
    return out


def synced_cancel(device: torch.device, local: Callable[[], None] | None = None,
                  every: int | None = None) -> "_SyncedCancel":
    """A ``cancel`` hook that every rank calls before every block: rank 0's ``local`` check
    decides, and every ``every`` blocks (``LINGBOT_CANCEL_SYNC_BLOCKS``) one all-reduce of one number
    tells the others, so all stop together."""
    if every is None:
        every = switches.CANCEL_SYNC_BLOCKS()
    return _SyncedCancel(device, local, max(int(every), 1))


class _SyncedCancel:
    """See ``synced_cancel``. rank 0's ``local`` check runs before every block; the flag
    exchanged at check i (one of every ``every``) is read at the next exchange (and by
    ``finish`` after the last block, which exchanges once more), so the host waits for the
    exchange before last only and the GPU keeps ``every`` blocks of work ahead. A cancel
    therefore stops every rank within two exchanges of rank 0 seeing it, all at the same
    place. ``raised``: rank 0's error, once every rank acted on it."""

    def __init__(self, device: torch.device, local: Callable[[], None] | None, every: int = 1) -> None:
        self.flags = tuple(torch.zeros(1, dtype=torch.int32, device=device) for _ in range(2))
        self.local = local
        self.every = every
        self.count = 0
        self.exchanges = 0
        self.pending: torch.Tensor | None = None
        self.error: BaseException | None = None
        self.raised: BaseException | None = None

    def __call__(self) -> None:
        if self.local is not None and self.error is None:
            try:
                self.local()
            except BaseException as exc:  # noqa: BLE001 - raised once the other ranks know
                self.error = exc
        self.count += 1
        if (self.count - 1) % self.every == 0:
            self._exchange()

    def _exchange(self) -> None:
        flag = self.flags[self.exchanges % 2]
        self.exchanges += 1
        flag.fill_(0 if self.error is None else 1)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        previous, self.pending = self.pending, flag
        if previous is not None:
            self._act(previous)

    def finish(self) -> None:
        """After the forward (every rank calls it): one last exchange, then act on it."""
        if self.count:
            self._exchange()
        previous, self.pending = self.pending, None
        if previous is not None:
            self._act(previous)

    def _act(self, flag: torch.Tensor) -> None:
        if int(flag.item()):
            if self.error is not None:
                self.raised = self.error
                raise self.error
            raise Cancelled("rank 0 cancelled the run")


# ----------------------------------------------------------------------------- the link between the devices

# Effective all-to-all bandwidth (bytes each rank sends to the others per second,
# ``RankPool.measure_link``) above which the link counts as NVLink-class and sequence parallel
# pays. Measured (issue 26; docs/multi_gpu.md): on four H200s over NVLink the timed
# all-to-all gave 119.9 GB/s on 2 ranks and 81.6 GB/s on 4, and sequence parallel won there
# (Fast chunk 1.716 s -> 0.618 s on 4); with peer-to-peer off (NCCL_P2P_DISABLE=1, through
# host memory, as two PCIe cards without P2P) the same exchange is ~9-10x slower (a Fast
# forward's all-to-alls 163 ms against 18 ms, shared/GPU.md), i.e. ~10-13 GB/s, where the
# split costs more than it saves. 40 GB/s sits between the two with room on both sides
# (the earlier 100 GB/s sent the 4-rank NVLink group to cfg_split).
NVLINK_CLASS_GBPS = 40.0


def _all_to_all_loop(numel: int, dtype: torch.dtype, repeats: int, device: torch.device) -> None:
    send = torch.ones(numel, dtype=dtype, device=device)
    recv = torch.empty_like(send)
    for _ in range(repeats):
        dist.all_to_all_single(recv, send)


def pick_mode(gbps: float) -> str:
    """What ``devices=auto`` runs on a link of ``gbps`` (``RankPool.measure_link``): sequence
    parallel on NVLink-class links, else the CFG split (the VAE on the second GPU)."""
    return "sequence_parallel" if gbps >= NVLINK_CLASS_GBPS else "cfg_split"


# ----------------------------------------------------------------------------- Ulysses x CFG split

@dataclass(frozen=True)
class CfgGroups:
    """Four or more ranks as two Ulysses groups (the first half runs the prompt branch, the
    second the negative one, each over its half of the GPUs) and the pairs that exchange the
    two predictions (rank i with rank i + half)."""

    branch: int  # 0: the prompt branch (rank 0's), 1: the negative one
    sp: SequenceParallel  # this rank's Ulysses group
    pair: object  # this rank and its counterpart in the other group


def make_cfg_groups(world: int) -> CfgGroups | None:
    """Every rank calls it right after ``init_process_group`` (``new_group`` is collective, in
    the same order everywhere); None below 4 ranks or for an odd count."""
    if world < 4 or world % 2:
        return None
    half = world // 2
    rank = dist.get_rank()
    groups = [dist.new_group(list(range(half))), dist.new_group(list(range(half, world)))]
    pairs = [dist.new_group([i, i + half]) for i in range(half)]
    branch = rank // half
    return CfgGroups(branch, SequenceParallel(rank % half, half, groups[branch]), pairs[rank % half])


def _split_forward(model: nn.Module, cfg: CfgGroups, x: torch.Tensor, t: torch.Tensor, context: list | None,
                   y: torch.Tensor | None, camera: torch.Tensor | None, cancel: Callable[[], None]) -> torch.Tensor:
    """A batch of two (prompt, negative) as one sample per Ulysses group; every rank ends with both."""
    i = cfg.branch
    part = slice(i, i + 1)
    if camera is not None and camera.shape[0] == 2:
        camera = camera[part]
    out = model(x[part], t.reshape(-1).expand(2)[part], None if context is None else [context[i]],
                y=None if y is None else y[part], camera_tokens=camera, parallel=cfg.sp, cancel=cancel).contiguous()
    both = [torch.empty_like(out) for _ in range(2)]
    dist.all_gather(both, out, group=cfg.pair)
    return torch.cat(both, 0)


# ----------------------------------------------------------------------------- the worker process

def _watch_parent() -> None:
    parent = mp.parent_process()
    if parent is not None:
        parent.join()  # returns when the parent is gone
        os._exit(0)


def _worker(rank: int, world: int, devices: list[str], init: str, commands: Any, reports: Any) -> None:
    apply_env()
    threading.Thread(target=_watch_parent, name="lingbot-parent-watch", daemon=True).start()
    device = torch.device(devices[rank])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, torch.get_num_threads() // world))
    try:
        dist.init_process_group(backend_for(device), init_method=init, rank=rank, world_size=world,
                                timeout=GROUP_TIMEOUT, device_id=device if device.type == "cuda" else None)
        sp = SequenceParallel.from_group()
        cfg = make_cfg_groups(world)
    except BaseException:  # noqa: BLE001
        reports.put(("error", rank, traceback.format_exc()))
        return
    reports.put(("ready", rank, None))
    models: dict[str, nn.Module] = {}
    caches: dict[int, KVCache] = {}
    cameras: dict[int, torch.Tensor] = {}
    while True:
        op, payload = commands.get()
        try:
            if op == "stop":
                break
            if op == "load":
                key, factory = payload
                models.pop(key, None)
                models[key] = factory(device)
                reports.put(("loaded", rank, key))
            elif op == "link":
                _all_to_all_loop(*payload, device)
            elif op == "free":
                models.pop(payload, None)
                caches.clear(), cameras.clear()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                reports.put(("freed", rank, payload))
            elif op == "camera":
                key, ident, meta, keep_terms = payload
                plucker = _broadcast_in(meta, device)["plucker"]
                with torch.inference_mode():
                    cameras[ident] = models[key].prepare_camera(plucker, keep_terms=keep_terms)
            elif op == "drop_camera":
                cameras.pop(payload, None)
            elif op == "new_cache":
                key, ident, policy, height, width, frames, graphs = payload
                caches[ident] = models[key].new_kv_cache(policy, height, width, frames, device=device, parallel=sp,
                                                         graphs=graphs)
            elif op == "close_cache":
                cache = caches.pop(payload, None)
                if cache is not None:
                    cache.close()
            elif op == "forward":
                key, plain, meta = payload
                tensors = _broadcast_in(meta, device)
                context = [tensors[f"context{i}"] for i in range(plain["contexts"])] if plain["contexts"] else None
                camera = cameras[plain["camera"]] if plain["camera"] is not None else tensors.get("camera_tokens")
                cache = caches.get(plain["cache"])
                if cache is not None:  # rank 0 may have skipped a chunk (KVCache.skip_chunk) since
                    cache.frame_start = plain["frame_start"]
                hook = synced_cancel(device)
                try:
                    with torch.inference_mode(), attention_backend(plain["attention"]):
                        if plain["split"]:
                            _split_forward(models[key], cfg, tensors["x"], tensors["t"], context, tensors.get("y"),
                                           camera, hook)
                        else:
                            models[key](tensors["x"], tensors["t"], context, y=tensors.get("y"), camera_tokens=camera,
                                        kv_cache=cache, commit=plain["commit"], parallel=sp, cancel=hook)
                    hook.finish()
                except Cancelled:
                    pass
            else:
                raise ValueError(f"unknown command {op!r}")
        except BaseException:  # noqa: BLE001 - reported; rank 0's watch aborts the group
            reports.put(("error", rank, traceback.format_exc()))
            break
    models.clear(), caches.clear(), cameras.clear()
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass


# ----------------------------------------------------------------------------- starting a worker

# The pack is imported under its folder's name inside ComfyUI (``comfyui_lingbot_world`` in
# tests and tools), which a spawned interpreter cannot import by itself. The worker's entry
# is therefore ``exec`` of this bootstrap: it registers the pack's folder under the same
# package name (without running its __init__, so ComfyUI's nodes are not imported) and
# calls ``_worker``; factories pickled by rank 0 then resolve to the same module names.
_PACKAGE = __name__.rsplit(".pipeline.", 1)[0]
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_BOOTSTRAP = """
import sys, types, importlib
if PACKAGE not in sys.modules:
    package = types.ModuleType(PACKAGE)
    package.__path__ = [ROOT]
    package.__package__ = PACKAGE
    sys.modules[PACKAGE] = package
importlib.import_module(PACKAGE + ".pipeline.parallel_pool")._worker(*ARGS)
"""


class _main_not_reimported:
    """``spawn`` re-imports the parent's main script in the child (``__mp_main__``); for
    ComfyUI that is main.py, whose top level parses arguments and sets up the server. The
    worker needs nothing from it, so the script's path is hidden while the child starts."""

    def __enter__(self) -> None:
        import sys

        self.main = sys.modules.get("__main__")
        self.file = getattr(self.main, "__file__", None)
        if self.file is not None and getattr(self.main, "__spec__", None) is None:
            del self.main.__file__
        else:
            self.file = None

    def __exit__(self, *exc: object) -> None:
        if self.file is not None:
            self.main.__file__ = self.file


# ----------------------------------------------------------------------------- rank 0

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
        self._replies: "queue.Queue[tuple[str, int, Any]]" = queue.Queue()
        self._init_dir: str | None = None
        self.sp: SequenceParallel | None = None
        self.cfg: CfgGroups | None = None  # Ulysses x CFG split (4+ ranks, an even count)
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
        self._init_dir = tempfile.mkdtemp(prefix="lingbot-group-")
        init = f"file://{os.path.join(self._init_dir, 'store')}"
        self._reports = ctx.Queue()
        self._dead = None
        names = [str(d) for d in self.devices]
        for rank in range(1, self.world):
            commands = ctx.Queue()
            proc = ctx.Process(target=exec, args=(_BOOTSTRAP, {"PACKAGE": _PACKAGE, "ROOT": _ROOT, "ARGS": (
                rank, self.world, names, init, commands, self._reports)}), name=f"lingbot-rank{rank}", daemon=True)
            with _main_not_reimported():
                proc.start()
            self._procs.append(proc)
            self._commands.append(commands)
        self._stop_watch.clear()
        self._watch = threading.Thread(target=self._watch_workers, name="lingbot-rank-watch", daemon=True)
        self._watch.start()
        try:
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            dist.init_process_group(backend_for(self.device), init_method=init, rank=0, world_size=self.world,
                                    timeout=GROUP_TIMEOUT,
                                    device_id=self.device if self.device.type == "cuda" else None)
            self.sp = SequenceParallel.from_group()
            self.cfg = make_cfg_groups(self.world)
            self._await("ready", START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop the workers (politely, then by force), destroy the group; idempotent."""
        for commands in self._commands:
            try:
                commands.put(("stop", None))
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
        self._procs, self._commands, self.sp, self.cfg, self.loaded = [], [], None, None, {}
        self._replies = queue.Queue()

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    # -------------------------------------------------------------- failure watch
    def _watch_workers(self) -> None:
        while not self._stop_watch.wait(WATCH_PERIOD_S):
            try:
                while True:
                    kind, rank, detail = self._reports.get_nowait()
                    if kind == "error":
                        self._lost(rank, f"failed:\n{detail}")
                    else:
                        self._replies.put((kind, rank, detail))
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

    def _await(self, kind: str, timeout: float, count: int | None = None) -> None:
        need = self.world - 1 if count is None else count
        deadline = time.monotonic() + timeout
        while need:
            if self._dead is not None:
                self._check()
            try:
                got, _, _ = self._replies.get(timeout=0.1)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the sequence-parallel workers did not answer {kind!r} within {timeout:.0f} s")
                continue
            if got == kind:
                need -= 1

    def _send(self, op: str, payload: Any, ranks: Sequence[int] | None = None) -> None:
        self._check()
        for rank, commands in enumerate(self._commands, start=1):
            if ranks is None or rank in ranks:
                commands.put((op, payload))

    def _guard(self, run: Callable[[], Any], synced: Callable[[BaseException], bool] = lambda exc: False) -> Any:
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
        self._send("load", (key, factory), ranks)
        self._await("loaded", START_TIMEOUT_S, len(ranks))
        self.loaded.setdefault(key, set()).update(ranks)

    def measure_link(self, megabytes: float = 64.0, repeats: int = 5) -> dict:
        """Time an all-to-all of ``megabytes`` per rank (bf16 on CUDA, float32 on the CPU) after
        one warm-up: seconds per exchange and the effective GB/s each rank sends."""
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        numel = int(megabytes * 2**20 / torch.empty((), dtype=dtype).element_size()) // self.world * self.world
        for count in (1, repeats):
            self._send("link", (numel, dtype, count))
            started = time.perf_counter()
            self._guard(lambda: (_all_to_all_loop(numel, dtype, count, self.device), _sync(self.device)))
            seconds = (time.perf_counter() - started) / count
        sent = numel * torch.empty((), dtype=dtype).element_size() * (self.world - 1) / self.world
        gbps = sent / seconds / 1e9
        return {"all_to_all_mb": megabytes, "all_to_all_s": seconds, "gbps": gbps, "ranks": self.world,
                "auto_picks": pick_mode(gbps)}

    def free(self, key: str, ranks: Sequence[int] | None = None) -> None:
        """The workers ``ranks`` (default all) drop their copy of ``key`` (and their caches
        and camera tokens)."""
        if not self.running:
            return
        held = self.loaded.get(key, set())
        ranks = [r for r in (range(1, self.world) if ranks is None else ranks) if r in held]
        self._send("free", key, ranks)
        self._await("freed", 60.0, len(ranks))
        held.difference_update(ranks)

    def require(self, key: str) -> None:
        """Refuse a forward unless every worker holds ``key`` (lock-step needs all ranks)."""
        missing = [str(self.devices[r]) for r in range(1, self.world) if r not in self.loaded.get(key, set())]
        if missing:
            raise RuntimeError(f"the sequence-parallel copy of {key} is not loaded on {', '.join(missing)} "
                               "(unloaded by the memory manager during the run?); run the prompt again")


_ids = itertools.count(1)


@dataclass(frozen=True)
class LoadExpert:
    """Model factory for the workers: an expert folder loaded as ``pipeline.experts.load_expert`` does."""

    folder: str
    quantize: str | None = None
    blocks_on_gpu: int | None = None

    def __call__(self, device: torch.device) -> nn.Module:
        from .experts import load_expert

        return load_expert(self.folder, device, self.quantize, blocks_on_gpu=self.blocks_on_gpu).eval()


class ParallelModel(nn.Module):
    """Rank 0's copy of the model, driving the workers' copies: called like ``LingBotDiT``
    (``forward``, ``prepare_camera``, ``new_kv_cache``), every call runs on all ranks."""

    def __init__(self, pool: RankPool, key: str, model: nn.Module, cfg_split: bool = True) -> None:
        super().__init__()
        self.pool, self.key, self.inner = pool, key, model
        # A batch of two (batched CFG) on 4+ ranks: one sample per half of the GPUs (Ulysses x
        # CFG split); otherwise every forward over all ranks.
        self.cfg_split = cfg_split
        self.config = model.config
        self._cameras: dict[int, int] = {}  # id(rank 0's camera tokens) -> worker-side id
        self._caches: dict[int, tuple[KVCache, int]] = {}

    def __getattr__(self, name: str) -> Any:
        """Everything else (``config``, ``patch_embedding``, ...) is rank 0's model's."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["inner"], name)

    def prepare_camera(self, plucker: torch.Tensor, keep_terms: int = 0) -> torch.Tensor | CameraTerms:
        """``keep_terms``: every rank keeps its shard's camera terms of that many blocks (``CameraTerms``)."""
        pool = self.pool
        ident = next(_ids)
        tensors = {"plucker": plucker.to(pool.device)}
        pool._send("camera", (self.key, ident, _describe(tensors), keep_terms))
        pool._guard(lambda: _broadcast_out(tensors, pool.device))
        tokens = self.inner.prepare_camera(tensors["plucker"], keep_terms=keep_terms)
        for old in list(self._cameras):  # one camera per expert activation: older ones go
            pool._send("drop_camera", self._cameras.pop(old))
        self._cameras[id(tokens)] = ident
        return tokens

    def new_kv_cache(self, policy: CachePolicy, latent_height: int, latent_width: int,
                     latent_frames: int | None = None, device: torch.device | str | None = None,
                     graphs: bool = False) -> KVCache:
        """``graphs``: every rank captures and replays the same passes (NCCL inside the graphs)."""
        self._collect_caches()
        ident = next(_ids)
        self.pool._send("new_cache", (self.key, ident, policy, latent_height, latent_width, latent_frames, graphs))
        cache = self.inner.new_kv_cache(policy, latent_height, latent_width, latent_frames, device=self.pool.device,
                                        parallel=self.pool.sp, graphs=graphs)
        self._caches[id(cache)] = (cache, ident)
        return cache

    def _collect_caches(self) -> None:
        for key, (cache, ident) in list(self._caches.items()):
            if cache.closed:
                self.pool._send("close_cache", ident)
                del self._caches[key]

    def forward(self, x: torch.Tensor, t: torch.Tensor, context: Any = None, y: torch.Tensor | None = None,
                camera_tokens: torch.Tensor | None = None, camera: torch.Tensor | None = None,
                cancel: Callable[[], None] | None = None, kv_cache: KVCache | None = None,
                commit: bool = False) -> torch.Tensor | None:
        pool = self.pool
        pool.require(self.key)
        if camera is not None:
            camera_tokens = self.prepare_camera(camera)
        tensors: dict[str, torch.Tensor] = {"x": x, "t": torch.as_tensor(t, device=pool.device)}
        if y is not None:
            tensors["y"] = y
        contexts = 0
        if context is not None:
            items = list(context)  # a padded [B, L, D] tensor or a list: one [L, D] entry per sample
            for i, item in enumerate(items):
                tensors[f"context{i}"] = item
            contexts = len(items)
        camera_id = None if camera_tokens is None else self._cameras.get(id(camera_tokens))
        if camera_tokens is not None and camera_id is None:  # not made here: the workers get the tokens
            tensors["camera_tokens"] = camera_tokens.tokens if isinstance(camera_tokens, CameraTerms) else camera_tokens
        cache_id = None
        if kv_cache is not None:
            cache_id = self._caches[id(kv_cache)][1]
        tensors = {k: v.to(pool.device) for k, v in tensors.items()}
        split = bool(self.cfg_split and pool.cfg is not None and x.shape[0] == 2 and kv_cache is None)
        plain = {"contexts": contexts, "camera": camera_id, "cache": cache_id, "commit": commit, "split": split,
                 "frame_start": None if kv_cache is None else kv_cache.frame_start,
                 "attention": attention_run_choice()}  # every rank attends with this run's kernel
        pool._send("forward", (self.key, plain, _describe(tensors)))
        hook = synced_cancel(pool.device, cancel)

        def run() -> torch.Tensor | None:
            _broadcast_out(tensors, pool.device)
            context_arg = [tensors[f"context{i}"] for i in range(contexts)] if contexts else None
            if split:
                out = _split_forward(self.inner, pool.cfg, tensors["x"], tensors["t"], context_arg, tensors.get("y"),
                                     camera_tokens, hook)
                hook.finish()
                return out
            out = self.inner(tensors["x"], tensors["t"], context_arg, y=tensors.get("y"),
                             camera_tokens=camera_tokens, kv_cache=kv_cache, commit=commit, parallel=pool.sp,
                             cancel=hook)
            hook.finish()
            return out
        return pool._guard(run, synced=lambda exc: exc is hook.raised)

    def close(self) -> None:
        """Free the workers' copy (rank 0's is dropped with this object)."""
        self.pool.free(self.key)
        self._cameras.clear(), self._caches.clear()


__all__ = ["CfgGroups", "Cancelled", "LoadExpert", "NVLINK_CLASS_GBPS", "PARALLEL_ENV", "ParallelModel", "RankPool",
           "WorkerLost", "apply_env", "make_cfg_groups",
           "pick_mode", "synced_cancel"]
