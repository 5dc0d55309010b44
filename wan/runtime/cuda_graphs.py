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
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Hashable, Mapping

import torch

from . import switches

log = logging.getLogger(__name__)

Body = Callable[[Mapping[str, torch.Tensor]], "torch.Tensor | None"]


@dataclass
class _Captured:
    graph: "torch.cuda.CUDAGraph"
    inputs: dict[str, torch.Tensor]
    output: torch.Tensor | None


def graphs_supported(device: torch.device | str) -> bool:
    """CUDA graphs run on CUDA devices only (the CPU and other backends run eagerly), unless
    ``LINGBOT_CUDA_GRAPHS=0``."""
    if not switches.CUDA_GRAPHS():
        return False
    return torch.device(device).type == "cuda" and torch.cuda.is_available()


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
        self.disabled: str | None = None if graphs_supported(self.device) else f"no CUDA graphs on {self.device}"
        self.replays = 0
        self.captures = 0

    @property
    def keys(self) -> list[Hashable]:
        return list(self._graphs)

    def run(self, key: Hashable, inputs: Mapping[str, torch.Tensor], body: Body) -> torch.Tensor | None:
        """``body(inputs)``, replayed from the graph of ``key`` when there is one."""
        entry = self._graphs.get(key)
        if entry is None:
            if self.disabled is not None:
                return body(inputs)
            self._seen[key] += 1
            if self._seen[key] <= self.warmup:
                return body(inputs)
            entry = self._capture(key, inputs, body)
            if entry is None:
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


__all__ = ["ForwardGraphs", "graphs_supported"]
