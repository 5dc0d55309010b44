"""Chunk n's decode (and its writing) beside chunk n+1's generation.

``ChunkWorker.submit(index, x0)`` hands a finished chunk to ``work(index, x0)`` — the VAE's
stream decode, the .mp4 and the page — and returns at once, so the caller's next chunk
generates meanwhile. ``work`` runs on one worker thread, one chunk at a time and in
order (the stream decoder carries state from chunk to chunk), on a second CUDA stream
when ``x0`` is on a GPU (it waits for the event recorded on the caller's stream when
``x0`` was handed over, so it reads the finished chunk). At most one chunk is in flight:
``submit`` first waits for the one before, so memory holds one decode beside one
generation. ``overlap=False`` runs ``work`` in the caller, the sequential order every
caller had before (the fallback, and what the tests compare against).

A failure in the worker is not lost: ``check()`` (put it in the caller's interrupt check,
which runs before every forward and block) raises it in the caller, and ``submit``,
``wait`` and ``close`` raise it too. When the caller fails, ``close(failed=True)`` lets the
chunk in flight finish (so every finished chunk is written) and drops what it raises
after that, keeping the caller's error. ``close`` joins the thread: nothing of the worker
outlives the run.

``generation_first(device)`` runs the caller's generation on a high-priority CUDA stream
while a worker decodes beside it (the worker's stream has the default, lowest priority): the
GPU's block scheduler gives the generation's kernels the SMs first and the decode takes what
they leave idle, so the decode slows the next chunk as little as it can (same kernels, same
results). ``LINGBOT_STREAM_PRIORITY=0`` turns it off.
"""
from __future__ import annotations

import contextlib
import threading
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterator

import torch

from ...wan.runtime import switches

HIGHEST_PRIORITY = -100  # torch maps it to the device's highest stream priority


class ChunkWorker:
    def __init__(self, work: Callable[[int, torch.Tensor], None], overlap: bool = True,
                 device: torch.device | str | None = None) -> None:
        self._work = work
        self.overlap = bool(overlap)
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future | None = None
        self._stream = None
        self._closed = False
        if self.overlap:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lingbot-decode")
            device = torch.device(device) if device is not None else torch.device("cpu")
            if device.type == "cuda" and torch.cuda.is_available():
                self._stream = torch.cuda.Stream(device=device)

    # ---------------------------------------------------------------- the caller's side
    def submit(self, index: int, x0: torch.Tensor) -> None:
        """Hand over chunk ``index`` (raises the previous chunk's failure, if any)."""
        if self._closed:
            raise RuntimeError("this chunk worker was closed; start a new run")
        if not self.overlap:
            with torch.inference_mode():
                self._work(index, x0)
            return
        self.wait()
        ready = None
        if self._stream is not None and x0.is_cuda:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(x0.device))
        self._pending = self._pool.submit(self._run, index, x0, ready)

    def check(self) -> None:
        """Raise the worker's failure now, if it has failed (cheap: no waiting)."""
        pending = self._pending
        if pending is not None and pending.done() and pending.exception() is not None:
            self.wait()

    def wait(self) -> None:
        """Wait for the chunk in flight; raise what it raised."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        error = pending.exception()
        if error is not None:
            if error.__traceback__ is not None:  # the decode's frames would keep its activations
                traceback.clear_frames(error.__traceback__)
            raise error

    def close(self, failed: bool = False) -> None:
        """Finish the chunk in flight and stop the thread. ``failed``: the caller is raising
        its own error; a failure of the worker is then dropped, not raised over it."""
        if self._closed:
            return
        self._closed = True
        try:
            self.wait()
        except BaseException:
            if not failed:
                raise
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            self._pool = self._stream = None

    # ---------------------------------------------------------------- the worker's side
    def _run(self, index: int, x0: torch.Tensor, ready) -> None:
        if self._stream is None:
            with torch.inference_mode():
                self._work(index, x0)
            return
        with torch.cuda.stream(self._stream), torch.inference_mode():
            self._stream.wait_event(ready)
            self._work(index, x0)
            # x0 came from the caller's stream: keep it until this stream is done with it.
            self._stream.synchronize()


@contextlib.contextmanager
def generation_first(device: torch.device, overlap: bool = True) -> Iterator[None]:
    """The block's CUDA work on a fresh highest-priority stream of ``device`` (see the module's
    docstring); it starts after, and the caller's stream continues after, everything queued on
    the caller's stream. A no-op off CUDA, without ``overlap`` (nothing runs beside it) or
    with ``LINGBOT_STREAM_PRIORITY=0``."""
    device = torch.device(device)
    if device.type != "cuda" or not overlap or not switches.STREAM_PRIORITY():
        yield
        return
    before = torch.cuda.current_stream(device)
    stream = torch.cuda.Stream(device=device, priority=HIGHEST_PRIORITY)
    stream.wait_stream(before)
    try:
        with torch.cuda.stream(stream):
            yield
    finally:
        before.wait_stream(stream)  # what the caller does next (frees included) comes after the block's work


def worker_thread_alive() -> bool:
    """Whether a decode worker thread is still running (for tests: none after a run)."""
    return any(t.name.startswith("lingbot-decode") and t.is_alive() for t in threading.enumerate())


__all__ = ["ChunkWorker", "generation_first", "worker_thread_alive"]
