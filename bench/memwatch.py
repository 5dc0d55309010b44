"""Sample this process's memory while a benchmark runs, overall and per named phase."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator

import torch

GB = 1024**3


def read_status() -> dict[str, int]:
    """RssAnon / RssFile / VmHWM of this process in bytes (Linux /proc)."""
    out: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile", "VmHWM", "VmRSS"):
                out[key] = int(value.split()[0]) * 1024
    return out


class MemoryWatch:
    """A background thread reading /proc/self/status every ``interval`` seconds.

    Anonymous RSS is what the OOM killer counts; file-backed pages of memory maps are
    page cache the kernel can drop, so both are recorded separately.
    """

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.peak_anon = 0
        self.peak_file = 0
        self._phase_anon = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.phases: dict[str, dict[str, float]] = {}

    def _sample(self) -> None:
        status = read_status()
        anon, file_ = status.get("RssAnon", 0), status.get("RssFile", 0)
        self.peak_anon = max(self.peak_anon, anon)
        self.peak_file = max(self.peak_file, file_)
        self._phase_anon = max(self._phase_anon, anon)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            time.sleep(self.interval)

    def __enter__(self) -> "MemoryWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    @contextmanager
    def phase(self, name: str) -> Iterator[dict[str, float]]:
        """Time a phase and record its peak RssAnon and peak VRAM."""
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self._sample()
        self._phase_anon = read_status().get("RssAnon", 0)
        record: dict[str, float] = {}
        started = time.perf_counter()
        try:
            yield record
        finally:
            if cuda:
                torch.cuda.synchronize()
            self._sample()
            record["seconds"] = time.perf_counter() - started
            record["peak_rss_anon_gb"] = self._phase_anon / GB
            if cuda:
                record["peak_vram_allocated_gb"] = torch.cuda.max_memory_allocated() / GB
                record["peak_vram_reserved_gb"] = torch.cuda.max_memory_reserved() / GB
            self.phases[name] = record
