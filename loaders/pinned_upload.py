"""Copy checkpoint tensors to a CUDA device through two pinned staging buffers.

Handing safetensors a CUDA device makes it copy each tensor from pageable (memory-mapped)
memory, which the driver stages through its own small buffers and waits on (an NF4 expert
loads faster this way: bench/RESULTS.md). Here the host copies
a tensor from the memory map into one page-locked buffer (PyTorch's CPU copy runs on all
cores) while the GPU's DMA engine drains the other buffer asynchronously, so reading the
page cache and the PCIe transfer overlap. Every transfer is queued on the current stream,
so kernels queued after a read see the finished tensor; a buffer is reused only once the
event recorded after its last transfer has fired.

The buffers are freed with the uploader (``close``); PyTorch's host allocator keeps them
cached for the next load until ``pipeline.memory`` empties that cache. A host that forbids
page-locked memory (ComfyUI's ``--disable-pinned-memory``) turns staging off with
``allow_pinned_staging(False)``; loads then take safetensors' own, slower path.
"""
from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)

# Two buffers of this size: larger than any single NF4 A14B tensor (the FFN's packed
# weight is 35 MB), small enough that the pinned allocation itself takes a few ms.
DEFAULT_CHUNK_BYTES = 64 << 20

_allowed = True


def allow_pinned_staging(allowed: bool) -> None:
    """Whether loads may allocate their two page-locked staging buffers (default: yes)."""
    global _allowed
    _allowed = bool(allowed)


class PinnedUploader:
    """``upload(cpu_tensor)`` returns a copy on ``device``, queued on the current stream."""

    def __init__(self, device: torch.device | str, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"PinnedUploader copies to a CUDA device, not {self.device}")
        self.chunk_bytes = int(chunk_bytes)
        self._buffers = [torch.empty(self.chunk_bytes, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
        self._done: list[torch.cuda.Event | None] = [None, None]
        self._next = 0

    def upload(self, tensor: torch.Tensor) -> torch.Tensor:
        if self._buffers is None:
            raise RuntimeError("PinnedUploader used after close()")
        src = tensor.detach()
        if not src.is_contiguous():
            src = src.contiguous()
        out = torch.empty(src.shape, dtype=src.dtype, device=self.device)
        nbytes = src.numel() * src.element_size()
        if nbytes == 0:
            return out
        src_bytes = src.reshape(-1).view(torch.uint8)
        out_bytes = out.reshape(-1).view(torch.uint8)
        stream = torch.cuda.current_stream(self.device)
        for start in range(0, nbytes, self.chunk_bytes):
            end = min(start + self.chunk_bytes, nbytes)
            index = self._next
            self._next ^= 1
            done = self._done[index]
            if done is not None:
                done.synchronize()  # the DMA that last read this buffer has finished
            staged = self._buffers[index][: end - start]
            staged.copy_(src_bytes[start:end])
            out_bytes[start:end].copy_(staged, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
            self._done[index] = event
        return out

    def close(self) -> None:
        """Wait for the queued transfers (they read the buffers), then drop the buffers."""
        for event in self._done:
            if event is not None:
                event.synchronize()
        self._done = [None, None]
        self._buffers = None


def make_uploader(device: torch.device | str) -> PinnedUploader | None:
    """An uploader for a CUDA ``device``; None for other devices, when staging is turned off,
    or where page-locked memory cannot be had (then the caller copies the plain way, only
    slower)."""
    device = torch.device(device)
    if not _allowed or device.type != "cuda" or not torch.cuda.is_available():
        return None
    try:
        with torch.cuda.device(device):
            return PinnedUploader(device)
    except RuntimeError as exc:  # e.g. a locked-memory limit (ulimit -l, some containers and WSL)
        log.warning("LingBot-World: no pinned staging memory (%s); weights are copied to %s the slower way",
                    exc, device)
        return None
