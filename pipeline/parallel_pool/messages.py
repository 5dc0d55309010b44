"""What rank 0 and its workers say to each other: one frozen dataclass per message.

Commands go to a worker through its queue (pickled); the tensors a command needs do not: they
follow by ``broadcast`` over the group in the order of the command's ``TensorSpec``s
(``send_tensors`` on rank 0, ``receive_tensors`` on a worker). The worker answers some
commands with a report on the shared report queue. The worker's handler table
(``worker.HANDLERS``) has one entry per command type; ``Forward.call`` is the one model call
both sides make for a forward, so a new forward argument is a field of ``Forward`` and a line
of ``call``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from ...wan.runtime.camera_terms import CameraTerms
from ...wan.runtime.kv_cache import CachePolicy, KVCache
from ...wan.runtime.parallel import SequenceParallel
from .groups import CfgGroups, split_forward


@dataclass(frozen=True)
class TensorSpec:
    """One tensor that follows a command by broadcast: its name, shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype


def describe(tensors: dict[str, torch.Tensor]) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(name, tuple(t.shape), t.dtype) for name, t in tensors.items())


def send_tensors(tensors: dict[str, torch.Tensor], device: torch.device) -> None:
    """rank 0: broadcast ``tensors`` in order (the order ``describe`` gave the command)."""
    for t in tensors.values():
        dist.broadcast(t.to(device).contiguous(), src=0)


def receive_tensors(specs: tuple[TensorSpec, ...], device: torch.device) -> dict[str, torch.Tensor]:
    """A worker: the tensors ``specs`` announced, received from rank 0's broadcast."""
    out = {}
    for spec in specs:
        t = torch.empty(spec.shape, dtype=spec.dtype, device=device)
        dist.broadcast(t, src=0)
        out[spec.name] = t
    return out


# ----------------------------------------------------------------------------- commands (rank 0 -> a worker)

@dataclass(frozen=True)
class Load:
    """Build ``factory(device)`` as the model ``key`` (replacing one of that key); answered by ``Loaded``."""

    key: str
    factory: Callable[[torch.device], nn.Module]


@dataclass(frozen=True)
class Free:
    """Drop the model ``key``, every KV cache and camera tokens; answered by ``Freed``."""

    key: str


@dataclass(frozen=True)
class MeasureLink:
    """Join rank 0's ``repeats`` all-to-alls of ``numel`` elements of ``dtype`` (the link's speed)."""

    numel: int
    dtype: torch.dtype
    repeats: int


@dataclass(frozen=True)
class PrepareCamera:
    """``model.prepare_camera`` on the Plücker tensor that follows (``tensors``), kept as ``ident``."""

    key: str
    ident: int
    tensors: tuple[TensorSpec, ...]
    keep_terms: int


@dataclass(frozen=True)
class DropCamera:
    ident: int


@dataclass(frozen=True)
class NewCache:
    """``model.new_kv_cache`` with these arguments and the worker's head shard, kept as ``ident``."""

    key: str
    ident: int
    policy: CachePolicy
    latent_height: int
    latent_width: int
    latent_frames: int | None
    graphs: bool


@dataclass(frozen=True)
class CloseCache:
    ident: int


@dataclass(frozen=True)
class Forward:
    """One ``LingBotDiT.forward`` on every rank, as rank 0 called it. ``tensors`` follow by
    broadcast (x, t, y, context0..., and camera_tokens when rank 0 got them from elsewhere);
    the other arguments keep forward's names."""

    key: str
    tensors: tuple[TensorSpec, ...]
    contexts: int  # context entries among the tensors (one per sample); 0: context None
    camera_tokens: int | None  # the tokens a PrepareCamera kept (None: among the tensors, or none)
    kv_cache: int | None  # the cache a NewCache made (None: an exact forward)
    frame_start: int | None  # rank 0's cache position (it may have skipped a chunk since)
    commit: bool
    split: bool  # a batch of two (prompt, negative) as one sample per CFG group (groups.split_forward)
    attention: str | None  # the run's attention kernel: every rank attends with it

    def call(self, model: nn.Module, inputs: dict[str, torch.Tensor],
             camera_tokens: torch.Tensor | CameraTerms | None, kv_cache: KVCache | None,
             sp: SequenceParallel, cfg: CfgGroups | None, cancel: Callable[[], None]) -> torch.Tensor | None:
        """The model call of this forward on one rank (rank 0 with its own model, tokens and
        cache; a worker with its copies)."""
        context = [inputs[f"context{i}"] for i in range(self.contexts)] if self.contexts else None
        if self.split:
            return split_forward(model, cfg, inputs["x"], inputs["t"], context, inputs.get("y"), camera_tokens,
                                 cancel)
        return model(inputs["x"], inputs["t"], context, y=inputs.get("y"), camera_tokens=camera_tokens,
                     kv_cache=kv_cache, commit=self.commit, parallel=sp, cancel=cancel)


@dataclass(frozen=True)
class Stop:
    """Leave the group and exit."""


COMMANDS = (Load, Free, MeasureLink, PrepareCamera, DropCamera, NewCache, CloseCache, Forward, Stop)


# ----------------------------------------------------------------------------- reports (a worker -> rank 0)

@dataclass(frozen=True)
class Ready:
    """The worker joined the group."""

    rank: int


@dataclass(frozen=True)
class Loaded:
    rank: int
    key: str


@dataclass(frozen=True)
class Freed:
    rank: int
    key: str


@dataclass(frozen=True)
class Failed:
    """The worker failed (its traceback); it leaves its loop, and rank 0 aborts the group."""

    rank: int
    detail: str


Report = Ready | Loaded | Freed | Failed

__all__ = ["COMMANDS", "CloseCache", "DropCamera", "Failed", "Forward", "Free", "Freed", "Load", "Loaded",
           "MeasureLink", "NewCache", "PrepareCamera", "Ready", "Report", "Stop", "TensorSpec", "describe",
           "receive_tensors", "send_tensors"]
