"""The process group every rank joins, and its Ulysses x CFG sub-groups.

NCCL on CUDA, gloo on the CPU. ``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``,
``NVSHMEM_DISABLE_NVLS=1`` are set in every rank's environment (NVLink multicast stays off on
the lent machines). The CFG split's shape comes from ``pipeline/placement.split_degrees``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from ...wan.runtime.parallel import SequenceParallel
from ..placement import split_degrees

PARALLEL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
                # The watch aborts the group when a worker is lost (torch's note on _abort_process_group:
                # with the watchdog's error handling on, it may end the process itself: ComfyUI's).
                "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}
# Rendezvous and collective timeout. A collective never waits on a dead rank that long (the
# watch aborts the group first); an NCCL collective past it would end the process.
GROUP_TIMEOUT = timedelta(seconds=900)


def apply_env() -> None:
    for key, value in PARALLEL_ENV.items():
        os.environ.setdefault(key, value)


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    the same order everywhere); None where ``split_degrees`` keeps one group (below 4 ranks,
    or an odd count)."""
    degrees = split_degrees(world)
    if degrees.cfg == 1:
        return None
    half = degrees.ulysses
    rank = dist.get_rank()
    groups = [dist.new_group(list(range(half))), dist.new_group(list(range(half, world)))]
    pairs = [dist.new_group([i, i + half]) for i in range(half)]
    branch = rank // half
    return CfgGroups(branch, SequenceParallel(rank % half, half, groups[branch]), pairs[rank % half])


def join_group(rank: int, world: int, device: torch.device, init: str) -> tuple[SequenceParallel, CfgGroups | None]:
    """This process as ``rank`` of the group (rendezvous at ``init``): the Ulysses group of
    all ranks and, where the degrees have two, the CFG groups."""
    dist.init_process_group(backend_for(device), init_method=init, rank=rank, world_size=world,
                            timeout=GROUP_TIMEOUT, device_id=device if device.type == "cuda" else None)
    return SequenceParallel.from_group(), make_cfg_groups(world)


def split_forward(model: nn.Module, cfg: CfgGroups, x: torch.Tensor, t: torch.Tensor, context: list | None,
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


def all_to_all_loop(numel: int, dtype: torch.dtype, repeats: int, device: torch.device) -> None:
    """``repeats`` all-to-alls of ``numel`` elements over the group (the link measurement)."""
    send = torch.ones(numel, dtype=dtype, device=device)
    recv = torch.empty_like(send)
    for _ in range(repeats):
        dist.all_to_all_single(recv, send)


__all__ = ["CfgGroups", "GROUP_TIMEOUT", "PARALLEL_ENV", "all_to_all_loop", "apply_env", "backend_for", "join_group",
           "make_cfg_groups", "split_forward", "sync"]
