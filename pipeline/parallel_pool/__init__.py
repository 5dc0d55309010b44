"""Persistent rank processes for sequence-parallel runs: this process is rank 0, one spawned
worker per extra device, one ``torch.distributed`` group (NCCL on CUDA, gloo on the CPU).

The workers hold their own copy of the model (built by a picklable ``factory(device)``) and
run every forward in lock-step with rank 0: rank 0 sends a typed command (``messages.py``)
on a queue per worker, the inputs themselves go by ``broadcast`` over the group, every rank
runs ``LingBotDiT.forward(..., parallel=sp)`` (``messages.Forward.call``) and all get the
whole prediction. Nothing here knows ComfyUI (nodes/host/workers.py adds the memory
accounting). By concern:

- ``groups.py``: the group every rank joins, its environment, the Ulysses x CFG sub-groups;
- ``messages.py``: the commands and reports, and the tensors that follow a command;
- ``cancel.py``: a cancel on rank 0 agreed by every rank at the same block;
- ``worker.py``: a worker process: one handler per command, no life beyond its parent's;
- ``rank_pool.py``: ``RankPool``, rank 0's end: start, commands, the failure watch, close;
- ``model.py``: ``ParallelModel`` (rank 0's model driving the workers' copies) and ``LoadExpert``.
"""
from .cancel import Cancelled, synced_cancel
from .groups import PARALLEL_ENV, CfgGroups, apply_env, make_cfg_groups
from .model import LoadExpert, ParallelModel
from .rank_pool import RankPool, WorkerLost

__all__ = ["CfgGroups", "Cancelled", "LoadExpert", "PARALLEL_ENV", "ParallelModel", "RankPool", "WorkerLost",
           "apply_env", "make_cfg_groups", "synced_cancel"]
