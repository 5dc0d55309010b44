"""CUDA graphs of a forward whose shapes repeat: captured once, replayed with new inputs.

A LingBot-World Fast chunk at 480x832 runs ~1,200 kernels per forward. On one H100 the host
spends about as long launching them as the GPU spends running them, and with the sequence
split over two or four GPUs each rank's kernels shrink while the launches do not (the
profile in bench/RESULTS.md: the GPU idle ~25 % of a chunk on two ranks). A captured graph
launches the whole forward at once.

``ForwardGraphs`` holds the graphs of one session (a Fast KV cache: every tensor a forward
reads besides its inputs lives as long as the cache, at a fixed address). The caller names
each forward by a key (everything the forward's kernels depend on apart from the contents of
its input tensors) and gives the forward as ``body(inputs)``. Per key: the first call runs
eagerly (the warm-up: Triton compiles, cuDNN and cuBLAS pick their plans, lazy buffers get
made), the second captures the body into a graph on fresh copies of the inputs (the
*static* inputs) and replays it, later calls copy their inputs into the static ones and
replay. The kernels are the eager ones, so a replay gives the eager result bit for bit
(``tests/gpu/test_cuda_graphs_cuda.py``).

What the caller must keep true: every tensor the body reads that is not one of ``inputs``
keeps its address and is refreshed in place before a replay (the cache's buffers, the RoPE
tables, the camera terms), and nothing of the body's Python side changes state (a replay
runs no Python). The output of a replay is the graph's own tensor: the next replay of any
graph of the session overwrites it, so ``run`` returns a copy.

All graphs of a session share one memory pool (they never run at the same time). A capture
that fails (an operation the device cannot capture) turns the session's graphs off with the
reason in ``disabled``; that forward and all later ones run eagerly.

The graphed pass (``graphed_pass``, one of the executor's passes, ``runtime/executor.py``):
a causal pass of LingBot-World Fast runs through its cache's graphs once its shapes repeat
(``replays_graphs``: the cache full, the text's keys cached, no block swap). Its key is
everything its kernels depend on besides the contents of x, t and y: their shapes and
dtypes, whether it commits, the cache's committed frames and the commit's slot moves, the
camera's presence, the rank and group size, the attention kernel. What it reads besides
them sits at addresses the graphs keep: the cache's buffers, the RoPE tables and the camera
terms (``state``), refreshed in place before each pass. A cache the model keeps between
sessions keeps its graphs with it (``kv_cache.KeptCache``), so a later session with the same
shapes replays what an earlier one (or a warm-up) captured.
"""
from __future__ import annotations

import logging
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Hashable, Mapping, Sequence

import torch

from . import switches
from .attention import backend_name
from .camera_terms import CameraTerms

if TYPE_CHECKING:  # kv_cache imports this module
    from .kv_cache import KVCache

log = logging.getLogger(__name__)

Body = Callable[[Mapping[str, torch.Tensor]], "torch.Tensor | None"]


@dataclass
class _Captured:
    graph: "torch.cuda.CUDAGraph"
    inputs: dict[str, torch.Tensor]
    output: torch.Tensor | None


# PyTorch's allocator backend under which captured passes lose: ComfyUI turns it on by default
# (its cuda_malloc.py; --disable-cuda-malloc turns it off). Measured on an H100 (bench/RESULTS.md,
# 2026-12-06): a Fast chunk of graph replays took 2.30 s under it against 1.10 s eager under it
# and 1.09 s of replays under PyTorch's own caching allocator.
SLOW_ALLOCATOR = "cudaMallocAsync"


def allocator_backend() -> str:
    """PyTorch's CUDA allocator backend ("native" or "cudaMallocAsync")."""
    try:
        return str(torch.cuda.get_allocator_backend())
    except (AttributeError, RuntimeError):  # a build without CUDA
        return "native"


def graphs_off_reason(device: torch.device | str) -> str | None:
    """Why a session on ``device`` runs its passes eagerly, or None where it captures them:
    the one rule of CUDA graphs. Off the CPU and other non-CUDA backends, with
    ``LINGBOT_CUDA_GRAPHS=0``, and under the ``cudaMallocAsync`` allocator (``SLOW_ALLOCATOR``:
    there the replays run at half the eager speed)."""
    if not switches.CUDA_GRAPHS():
        return "LINGBOT_CUDA_GRAPHS=0"
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return f"no CUDA graphs on {device}"
    if allocator_backend() == SLOW_ALLOCATOR:
        return (f"PyTorch's {SLOW_ALLOCATOR} allocator (ComfyUI's default) replays captured passes at half the "
                "eager speed; start ComfyUI with --disable-cuda-malloc to use CUDA graphs")
    return None


def graphs_supported(device: torch.device | str) -> bool:
    """Whether a session on ``device`` captures its passes (``graphs_off_reason``)."""
    return graphs_off_reason(device) is None


class ForwardGraphs:
    """The captured forwards of one session on ``device`` (see the module's docstring).

    ``warmup``: eager runs of a key before it is captured (at least 1)."""

    def __init__(self, device: torch.device | str, warmup: int = 1) -> None:
        self.device = torch.device(device)
        self.warmup = max(int(warmup), 1)
        self._graphs: dict[Hashable, _Captured] = {}
        self._seen: Counter = Counter()
        self._pool = None
        # What the caller keeps at fixed addresses for the graphs (tables, terms, ...): it
        # outlives ``reset`` (new captures read it again) and goes with ``close``.
        self.state: dict[str, object] = {}
        self.disabled: str | None = graphs_off_reason(self.device)
        self.replays = 0
        self.captures = 0
        self.eager = 0  # calls that ran the body eagerly (a key's warm-up, or graphs off)

    @property
    def keys(self) -> list[Hashable]:
        return list(self._graphs)

    def run(self, key: Hashable, inputs: Mapping[str, torch.Tensor], body: Body) -> torch.Tensor | None:
        """``body(inputs)``, replayed from the graph of ``key`` when there is one."""
        entry = self._graphs.get(key)
        if entry is None:
            if self.disabled is None:
                self._seen[key] += 1
                if self._seen[key] > self.warmup:
                    entry = self._capture(key, inputs, body)
            if entry is None:
                self.eager += 1
                return body(inputs)
        for name, value in inputs.items():
            entry.inputs[name].copy_(value)
        entry.graph.replay()
        self.replays += 1
        return None if entry.output is None else entry.output.clone()

    def _capture(self, key: Hashable, inputs: Mapping[str, torch.Tensor], body: Body) -> _Captured | None:
        # The static inputs hold this call's values: the replay right after the capture runs on them.
        static = {name: value.detach().clone() for name, value in inputs.items()}
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: Play's decode thread keeps using the GPU while this thread captures.
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                output = body(static)
        except Exception as exc:  # noqa: BLE001 - the session goes on eagerly, the reason kept
            self.disabled = f"capture failed: {type(exc).__name__}: {exc}"
            log.warning("LingBot: CUDA graph capture failed (%s); this session runs eagerly", self.disabled)
            self.reset()
            torch.cuda.synchronize(self.device)
            return None
        if self._pool is None:
            self._pool = graph.pool()
        entry = _Captured(graph, static, output)
        self._graphs[key] = entry
        self.captures += 1
        return entry

    def reset(self) -> None:
        """Drop every graph (their memory pool goes back to PyTorch's allocator); the next
        calls of each key warm up and capture again."""
        self._graphs.clear()
        self._seen.clear()
        self._pool = None

    def close(self) -> None:
        """``reset`` and drop the caller's ``state``: the session is over."""
        self.reset()
        self.state.clear()


# --------------------------------------------------------------------------- the graphed pass

Rope = tuple[torch.Tensor, torch.Tensor]


def replays_graphs(model: Any, kv_cache: "KVCache") -> bool:
    """Does this causal pass run through the cache's CUDA graphs? Only where its shapes repeat
    (the cache full, the text's keys cached) and the weights stay put (no block swap: a
    swapped block's weights arrive at new addresses every forward)."""
    graphs = kv_cache.graphs
    if graphs is None or graphs.disabled is not None or not kv_cache.full or not kv_cache.cross_ready:
        return False
    if "run_blocks" in vars(model):  # block swap (or another wrapper) owns the loop
        return False
    # Weights moved since the capture (unloaded and loaded again): capture anew.
    where = tuple(next(block.parameters()).data_ptr() for block in model.blocks)
    if graphs.state.get("weights") != where:
        graphs.reset()
        graphs.state["weights"] = where
    return True


def graphed_pass(model: Any, forward: Any, run_model: Callable[..., "torch.Tensor | None"]) -> torch.Tensor | None:
    """A causal pass replayed from (or captured into) the cache's ``ForwardGraphs``.
    ``forward``: the executor's checked inputs; ``run_model(model, forward, x, y, t, rope,
    text, camera, head)``: the forward's embed → blocks → head, the body the graph holds. The
    RoPE tables and camera terms it reads are the graphs' kept ones (``_kept_rope``,
    ``_kept_camera``), refreshed in place here. Cancel is checked once before the pass (a
    graph cannot stop part way)."""
    cache = forward.kv_cache
    graphs, device, commit, sp = cache.graphs, forward.x.device, forward.commit, forward.parallel
    rope = _kept_rope(model, graphs, forward.grid, device, cache.frame_start)
    camera = _kept_camera(model, graphs, forward.camera, sp)
    t = torch.as_tensor(forward.t, device=device).reshape(-1)
    if forward.cancel is not None:
        forward.cancel()
    x, y = forward.x, forward.y
    inputs = {"x": x, "t": t} if y is None else {"x": x, "t": t, "y": y}
    with cache.in_pass(commit):
        key = (tuple(x.shape), x.dtype, None if y is None else (tuple(y.shape), y.dtype), (tuple(t.shape), t.dtype),
               commit, cache.committed, cache.commit_slots, camera is None,
               None if sp is None else (sp.rank, sp.size), backend_name(device))
        return graphs.run(key, inputs, lambda static: run_model(model, forward, static["x"], static.get("y"),
                                                                static["t"], rope, None, camera, not commit))


def _kept_rope(model: Any, graphs: ForwardGraphs, grid: Sequence[int], device: torch.device,
               frame_start: int) -> Rope:
    """The graphs' RoPE tables (one pair, kept at fixed addresses), holding ``frame_start``'s."""
    kept = graphs.state.get("rope")
    if kept is None or kept[0] != tuple(grid):
        graphs.reset()  # graphs read the old tables
        with torch.inference_mode(False):
            tables = tuple(torch.empty_like(table, memory_format=torch.contiguous_format)
                           for table in model.rope_tables(grid, device, frame_start))
        kept = graphs.state["rope"] = (tuple(grid), tables, None)
    if kept[2] != frame_start:
        for table, new in zip(kept[1], model.rope_tables(grid, device, frame_start)):
            table.copy_(new)
        graphs.state["rope"] = kept = (kept[0], kept[1], frame_start)
    return kept[1]


def _kept_camera(model: Any, graphs: ForwardGraphs, camera_tokens: "torch.Tensor | CameraTerms | None",
                 sp: Any) -> CameraTerms | None:
    """The graphs' camera terms (one ``CameraTerms`` at fixed addresses): when a new chunk's
    camera arrives, its tokens (this rank's shard, by the model's shard plan) are copied in
    and the kept blocks' terms computed ahead of the forward."""
    if camera_tokens is None:
        return None
    kept: CameraTerms | None = graphs.state.get("camera")
    source_ref = graphs.state.get("camera_source")
    if kept is not None and source_ref is not None and source_ref() is camera_tokens:
        return kept  # the chunk's camera, already in
    source = camera_tokens.tokens if isinstance(camera_tokens, CameraTerms) else camera_tokens
    blocks = model.blocks
    keep = camera_tokens.max_blocks if isinstance(camera_tokens, CameraTerms) else 0
    keep = len(blocks) if keep is None else min(int(keep), len(blocks))
    source = model.sharding.split("camera", sp, source)
    if kept is None or kept.tokens.shape != source.shape or kept.tokens.dtype != source.dtype \
            or kept.max_blocks != keep:
        graphs.reset()  # graphs read the old terms
        with torch.inference_mode(False):
            kept = CameraTerms(torch.empty_like(source, memory_format=torch.contiguous_format), keep)
        graphs.state["camera"] = kept
    kept.refresh(source)
    for block in blocks[:keep]:
        block.keep_camera_terms(kept, kept.tokens.shape[1])
    # A weak reference: a session's last camera is not kept alive by the graphs it leaves behind.
    graphs.state["camera_source"] = weakref.ref(camera_tokens)
    return kept


__all__ = ["ForwardGraphs", "SLOW_ALLOCATOR", "allocator_backend", "graphed_pass", "graphs_off_reason", "graphs_supported",
           "replays_graphs"]
