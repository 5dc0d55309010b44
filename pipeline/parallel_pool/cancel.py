"""Cancel agreed by every rank: before every block all ranks learn rank 0's decision (one
all-reduce of one number every few blocks), so a cancel on rank 0 stops every rank at the
same block boundary and the group stays usable."""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from ...wan.runtime import switches


class Cancelled(Exception):
    """Raised on the workers when rank 0 cancelled (they go back to waiting for commands)."""


def synced_cancel(device: torch.device, local: Callable[[], None] | None = None,
                  every: int | None = None) -> "SyncedCancel":
    """A ``cancel`` hook that every rank calls before every block: rank 0's ``local`` check
    decides, and every ``every`` blocks (``LINGBOT_CANCEL_SYNC_BLOCKS``) one all-reduce of one number
    tells the others, so all stop together."""
    if every is None:
        every = switches.CANCEL_SYNC_BLOCKS()
    return SyncedCancel(device, local, max(int(every), 1))


class SyncedCancel:
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


__all__ = ["Cancelled", "SyncedCancel", "synced_cancel"]
