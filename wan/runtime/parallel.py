"""The model side of multi-process runs: Ulysses sequence parallel on ``torch.distributed``.

One process per GPU (NCCL; ``gloo`` on the CPU for tests), each holding the whole model. A
``SequenceParallel`` names the process group that splits one forward's tokens; it is passed
to ``LingBotDiT.forward(..., parallel=sp)``. Where the forward is cut and put back together
is declared once, beside the model, as a ``ShardPlan`` (``LingBotDiT.sharding``), and the
executor (``runtime/executor.py``) applies it to every pass (exact, causal, graphed):

* after the patch embedding every rank keeps its slice of the token sequence: the sequence
  is padded to a multiple of the group's size P and cut into P equal, contiguous slices
  (``shard``); the camera tokens and the RoPE tables are cut the same way, so per-token
  work (norms, projections, RoPE, camera injection, FFN) runs on 1/P of the tokens;
* self-attention (Ulysses, DeepSpeed-Ulysses / USP): each rank projects q, k, v for its
  tokens, one ``all_to_all_single`` turns [tokens/P, all heads] into [all tokens, heads/P]
  (``seq_to_heads``), the padding is dropped, attention runs over the whole sequence with
  H/P heads, and a second all-to-all turns the output back (``heads_to_seq``). Attention
  is per head, so this is the same math as one process;
* cross-attention needs nothing: each rank's queries attend to the whole text;
* after the head the slices are gathered on every rank (``gather``) and unpadded, so every
  rank holds the whole prediction and can step the sampler itself, in lock-step.

Causal (Fast / Play): the KV cache is sharded by head (``LingBotDiT.new_kv_cache(...,
parallel=sp)``: H/P heads of every token on each rank, resident there), so a forward
exchanges only the new chunk's q, k and v; the chunk's keys and values land in the rank's
cache after the all-to-all and its queries attend to the rank's heads of the cache. There
the three exchanges overlap the projections (``start_seq_to_heads``: the keys travel while
the values are projected, the values while the queries are), and the keys and values are
received straight into the cache's slots. ``LINGBOT_SP_OVERLAP=0`` waits for each exchange
as it starts (the same numbers; for measuring what the overlap gives; every rank must agree).

The group size must divide the heads (40 for A14B: 2, 4, 5, 8). The ways a run uses several
GPUs, this one among them (``sequence_parallel``, strategy "ulysses"), are the rows of
``pipeline/placement.DEVICES_MODES``.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import switches

_ACTIVE: contextvars.ContextVar["ShardedRun | None"] = contextvars.ContextVar("lingbot_sequence_parallel",
                                                                                     default=None)


class Exchange:
    """An all-to-all in flight (``async_op``): the GPU goes on with other work until ``wait()``
    makes the current stream wait for it. Holds the sent tensor until then."""

    def __init__(self, work: object, received: torch.Tensor, sent: torch.Tensor) -> None:
        self._work, self._received, self._sent = work, received, sent

    def wait(self) -> torch.Tensor:
        """The received tensor, once the exchange is done (on the current stream)."""
        if self._work is not None:
            self._work.wait()
            self._work = self._sent = None
        return self._received


def overlap_exchanges() -> bool:
    """Whether ``start_seq_to_heads`` callers let an exchange run beside the next projection."""
    return switches.SP_OVERLAP()


@dataclass(frozen=True)
class SequenceParallel:
    """A Ulysses group: ``size`` processes (this one is ``rank`` in it) sharing one forward.

    ``group``: the ``torch.distributed`` process group (None: the default group)."""

    rank: int
    size: int
    group: object | None = None

    @classmethod
    def from_group(cls, group: object | None = None) -> "SequenceParallel":
        """The group ``group`` (None: the default one, after ``init_process_group``)."""
        if not dist.is_initialized():
            raise RuntimeError("sequence parallel needs torch.distributed.init_process_group first "
                               "(one process per GPU: nodes/host/workers.py starts them)")
        return cls(dist.get_rank(group), dist.get_world_size(group), group)

    # ------------------------------------------------------------------ geometry
    def padded(self, length: int) -> int:
        """``length`` rounded up to a multiple of the group size."""
        return -(-length // self.size) * self.size

    def local_length(self, length: int) -> int:
        return self.padded(length) // self.size

    def span(self, length: int) -> tuple[int, int]:
        """This rank's token range [start, stop) in the padded sequence."""
        n = self.local_length(length)
        return self.rank * n, (self.rank + 1) * n

    def check_heads(self, heads: int) -> None:
        if heads % self.size:
            raise ValueError(f"sequence parallel over {self.size} GPUs needs a head count divisible by "
                             f"{self.size}; the model has {heads} heads (A14B's 40 split over 2, 4, 5 or 8)")

    # ------------------------------------------------------------------ tokens
    def shard(self, x: torch.Tensor, dim: int = 1, fill: float = 0.0) -> torch.Tensor:
        """This rank's slice of ``x`` along ``dim`` (padded with ``fill`` to a multiple of the
        group size first), contiguous."""
        length = x.shape[dim]
        pad = self.padded(length) - length
        if pad:
            widths = [0, 0] * (x.dim() - 1 - dim) + [0, pad]
            x = F.pad(x, widths, value=fill)
        start, stop = self.span(length)
        return x.narrow(dim, start, stop - start).contiguous()

    def gather(self, x: torch.Tensor, length: int, dim: int = 1) -> torch.Tensor:
        """Every rank's slice along ``dim`` put back in token order, padding dropped: the whole
        sequence of ``length`` tokens on every rank."""
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x, group=self.group)
        return torch.cat(parts, dim=dim).narrow(dim, 0, length)

    # ------------------------------------------------------------------ Ulysses exchange
    def seq_to_heads(self, x: torch.Tensor) -> torch.Tensor:
        """[l, G, H, D] (this rank's l tokens, all H heads, G tensors such as q, k, v) ->
        [P*l, G, H/P, D] (every token, this rank's heads), one all-to-all."""
        l, g, h, d = x.shape
        p = self.size
        send = x.reshape(l, g, p, h // p, d).permute(2, 0, 1, 3, 4).contiguous()  # chunk j goes to rank j
        recv = torch.empty_like(send)  # chunk i: rank i's tokens, my heads
        dist.all_to_all_single(recv, send, group=self.group)
        return recv.reshape(p * l, g, h // p, d)

    def start_seq_to_heads(self, x: torch.Tensor, out: torch.Tensor | None = None) -> Exchange:
        """Start sending ``x`` [l, H*D] (this rank's l tokens, all heads) as [P*l, H*D/P]
        (every token, this rank's heads): one all-to-all, left running. ``out``: a contiguous
        [P*l, H*D/P] tensor to receive into (e.g. the KV cache's slots for the chunk)."""
        l, width = x.shape
        p = self.size
        send = x.view(l, p, width // p).transpose(0, 1).contiguous()  # chunk j goes to rank j
        recv = torch.empty_like(send) if out is None else out.view(p, l, width // p)
        work = dist.all_to_all_single(recv, send, group=self.group, async_op=True)
        exchange = Exchange(work, recv.view(p * l, width // p), send)
        if not overlap_exchanges():
            exchange.wait()
        return exchange

    def heads_to_seq(self, x: torch.Tensor) -> torch.Tensor:
        """[P*l, H/P, D] (every token, this rank's heads) -> [l, H, D] (this rank's tokens, all heads)."""
        n, hp, d = x.shape
        p = self.size
        send = x.reshape(p, n // p, hp, d).contiguous()  # chunk j: rank j's tokens
        recv = torch.empty_like(send)  # chunk i: my tokens, rank i's heads
        dist.all_to_all_single(recv, send, group=self.group)
        return recv.permute(1, 0, 2, 3).reshape(n // p, p * hp, d)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, length: int,
               kernel: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Self-attention of the whole sequence (``length`` real tokens) from this rank's
        slices q, k, v [l, H*D]: output [l, H*D] for this rank's tokens. ``kernel`` is the
        attention function ([B, L, h, D] layout)."""
        l = q.shape[0]
        qkv = self.seq_to_heads(torch.stack([q, k, v], 1).unflatten(-1, (heads, -1)))[:length]
        out = kernel(qkv[None, :, 0], qkv[None, :, 1], qkv[None, :, 2])[0]  # [length, H/P, D]
        del qkv
        return self.heads_to_seq(F.pad(out, (0, 0, 0, 0, 0, self.size * l - length))).flatten(1)


@dataclass(frozen=True)
class Split:
    """A tensor cut like the token sequence: along ``dim``, padded with ``fill`` to a multiple
    of the group size, this rank's slice kept (``SequenceParallel.shard``)."""

    dim: int
    fill: float = 0.0

    def apply(self, sp: SequenceParallel, x: torch.Tensor) -> torch.Tensor:
        return sp.shard(x, self.dim, self.fill)


@dataclass(frozen=True)
class Gather:
    """Every rank's slice along ``dim`` put back in token order, the padding dropped
    (``SequenceParallel.gather``)."""

    dim: int

    def apply(self, sp: SequenceParallel, x: torch.Tensor, length: int) -> torch.Tensor:
        return sp.gather(x, length, self.dim)


@dataclass(frozen=True)
class ShardPlan:
    """Where a model's forward is split over a sequence-parallel group and gathered again,
    as data (after diffusers' ``_cp_plan``): ``splits`` names the points of the forward whose
    tensors each rank keeps a slice of (a tuple of ``Split`` for a tuple of tensors),
    ``gathers`` the points whose slices every rank gets back whole; ``cache_heads``: the
    causal KV cache holds this rank's heads of every token (heads / group size).
    Everything the plan does not name runs whole on every rank (the timestep, the text).
    Self-attention's exchange between token and head shards is the blocks' own
    (``current().attend``)."""

    splits: dict[str, Split | tuple[Split, ...]]
    gathers: dict[str, Gather]
    cache_heads: bool = True

    def split(self, point: str, sp: SequenceParallel | None, value):
        """``value`` at ``point`` as this rank keeps it (unchanged without a group)."""
        if sp is None:
            return value
        spec = self.splits[point]
        if isinstance(spec, tuple):
            return tuple(part.apply(sp, item) for part, item in zip(spec, value))
        return spec.apply(sp, value)

    def gather(self, point: str, sp: SequenceParallel | None, x: torch.Tensor, length: int) -> torch.Tensor:
        """``x`` at ``point`` whole again (``length`` real tokens; unchanged without a group)."""
        return x if sp is None else self.gathers[point].apply(sp, x, length)

    def local_heads(self, sp: SequenceParallel | None, heads: int) -> int:
        """The heads this rank's KV cache holds (all of them without a group)."""
        if sp is None:
            return heads
        sp.check_heads(heads)
        return heads // sp.size if self.cache_heads else heads


@dataclass(frozen=True)
class ShardedRun:
    """The forward in progress: its group ``sp`` and the real (unpadded) token count ``length``."""

    sp: SequenceParallel
    length: int

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int,
               kernel: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        return self.sp.attend(q, k, v, heads, self.length, kernel)


@contextlib.contextmanager
def active(sp: SequenceParallel | None, length: int) -> Iterator[None]:
    """Make ``sp`` the sequence-parallel group of the forward of ``length`` tokens running in
    this context (None: a one-process forward; nothing changes)."""
    token = _ACTIVE.set(None if sp is None else ShardedRun(sp, length))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def current() -> ShardedRun | None:
    """The sharded forward in progress (None: one process holds the whole sequence)."""
    return _ACTIVE.get()


__all__ = ["Exchange", "Gather", "SequenceParallel", "ShardPlan", "ShardedRun", "Split", "active",
           "current", "overlap_exchanges"]
