"""LingBot-World Fast's one transformer under ComfyUI's memory manager (the LINGBOT_FAST_DIT value).

The transformer comes into memory exactly as a Base expert does: an ``ExpertPatcher``
(expert_patcher.py) streams it from its folder when ComfyUI loads it and drops it when
ComfyUI unloads it, never keeping a copy in RAM. ``loaded_fast_model`` has ComfyUI load it
with room left for the run (the KV cache and a chunk's activations, plus what the caller
adds, e.g. the VAE of a stream) and unloads it on every way out of the run: finished,
cancelled or failed.

With ``devices`` (the Fast DiT Loader's ``sequence_parallel``, or ``auto`` on an
NVLink-class link) every chunk runs on all those GPUs in lock-step: ComfyUI's process is
rank 0 (its copy is the same patcher), each worker GPU's copy is a ``WorkerPatcher``
(workers.py) loaded and unloaded with it, so ``POST /free`` and the end of the run drop the
worker copies too; the model the run gets is a ``ParallelModel`` whose KV cache is sharded
by head on every rank.

The Fast nodes' kv_dtype "auto" is the memory plan's (``pipeline.memory.plan_fast_memory``,
the one rule, which the bench applies too): the bf16 cache where the run fits the device with
it, int8 where it does not.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Iterator, Sequence, TypeVar

import torch
from torch import nn

import comfy.model_management as mm

from ...loaders.model_kind import ModelIdentity
from ...pipeline.memory import FastMemoryPlan, camera_terms_bytes, fast_run_bytes, graph_pool_bytes, plan_fast_memory
from ...wan.config import DiTConfig
from ...wan.runtime.cuda_graphs import graphs_supported
from ...wan.runtime.kv_cache import CachePolicy
from ...pipeline.parallel_pool import ParallelModel
from .expert_patcher import ExpertLoadOptions, ExpertPatcher, unload_patcher
from .workers import WorkerPatcher, begin_run, end_run, group_patcher, shared_pool
from ...wan.runtime.kv_cache import KV_DTYPES

PATCHER_NAME = "fast"  # what ComfyUI's list of loaded models and GET /lingbot/status show
R = TypeVar("R")

log = logging.getLogger(__name__)


@dataclass
class FastDiT:
    """The LINGBOT_FAST_DIT value: the Fast transformer's patcher, its geometry (config.json)
    and what its files say it is (``loaders.model_kind``)."""

    patcher: ExpertPatcher
    config: DiTConfig
    identity: ModelIdentity
    # Sequence parallel over these devices (the first is the patcher's); empty: one device.
    devices: tuple[torch.device, ...] = ()
    # Where Play and Fast Long Video run the VAE (the chunks' decode) when it is another GPU
    # than the transformer's (devices=decode_on_second_gpu); None: beside the transformer.
    decode_device: torch.device | None = None
    # The attention kernel of every run of this transformer (wan/runtime/attention.py CHOICES).
    attention: str = "auto"

    @classmethod
    def for_folder(cls, folder: str | Path, options: ExpertLoadOptions, config: DiTConfig,
                   identity: ModelIdentity, devices: Sequence[torch.device | str] = (),
                   decode_device: torch.device | str | None = None, attention: str = "auto") -> "FastDiT":
        """Reads file headers only; nothing loads until a run asks ComfyUI for it. ``devices``
        (two or more): every chunk on all of them (sequence parallel); ``decode_device``: the
        VAE's GPU, when not the transformer's; ``attention``: the runs' attention kernel."""
        devices = tuple(torch.device(d) for d in devices)
        if len(devices) == 1:
            raise ValueError(f"FastDiT devices: sequence parallel needs 2 or more devices, got {devices[0]}")
        patcher = ExpertPatcher.for_folder(PATCHER_NAME, folder, options, load_device=devices[0] if devices else None)
        return cls(patcher, config, identity, devices, None if decode_device is None else torch.device(decode_device),
                   attention)

    def worker_patchers(self) -> list[WorkerPatcher]:
        """One ``WorkerPatcher`` per worker GPU for this transformer, with the weight kind
        and block swap rank 0's patcher resolved (none without ``devices``)."""
        options = self.patcher.model.options
        return [WorkerPatcher.for_expert(PATCHER_NAME, self.folder, options, rank, self.devices)
                for rank in range(1, len(self.devices))]

    @property
    def folder(self) -> Path:
        return self.patcher.model.folder

    def get_ram_usage(self) -> int:
        # Newer ComfyUI hosts weigh cached node outputs by this when RAM runs short.
        return self.patcher.get_ram_usage()


def run_memory(fast: FastDiT, policy: CachePolicy, latent_height: int, latent_width: int,
               latent_frames: int | None, extra: int = 0) -> int:
    """Working memory to keep free beside the transformer for a run (``fast_run_bytes``)."""
    return fast_run_bytes(fast.config, policy, latent_height, latent_width, latent_frames, extra, fast.attention)


@dataclass
class PreparedRun(Generic[R]):
    """What ``prepared_fast_run`` yields: the loaded transformer, the run with its cache
    fitted, and where the memory plan puts the rest (``pipeline.memory.plan_fast_memory``)."""

    model: nn.Module
    run: R
    plan: FastMemoryPlan
    device: torch.device  # the transformer's
    decode_device: torch.device | None = None  # the VAE's GPU when it is another one

    @property
    def vae_device(self) -> torch.device:
        """Where the run's VAE streams go: a second GPU (devices=decode_on_second_gpu), the
        transformer's device, or the CPU when the card has no room for them."""
        if self.decode_device is not None:
            return self.decode_device
        return self.device if self.plan.vae_on_gpu else torch.device("cpu")

    @property
    def overlap(self) -> bool:
        """Decode chunk n beside chunk n+1 (on a GPU only: on the CPU both would share the cores)."""
        return self.plan.overlap and self.device.type == "cuda"


def memory_plan(fast: FastDiT, policy: CachePolicy, auto_dtype: bool, latent_height: int, latent_width: int,
                latent_frames: int | None, vae: int = 0, decode: int = 0) -> FastMemoryPlan:
    """The run's memory settings for the load device's size (``plan_fast_memory``)."""
    run = {d: run_memory(fast, dataclasses.replace(policy, dtype=d), latent_height, latent_width, latent_frames)
           for d in KV_DTYPES}
    return plan_fast_memory(mm.get_total_memory(fast.patcher.load_device), fast.patcher.model_size(),
                            fast.config.num_layers, run, vae, decode, mm.minimum_inference_memory(),
                            kv_dtype=None if auto_dtype else policy.dtype,
                            terms_bytes=terms_memory(fast, policy, latent_height, latent_width),
                            graph_bytes=graph_memory(fast, policy, latent_height, latent_width))


def terms_memory(fast: FastDiT, policy: CachePolicy, latent_height: int, latent_width: int) -> int:
    """One block's kept camera terms on each GPU of the run (``camera_terms_bytes``)."""
    return camera_terms_bytes(fast.config, latent_height, latent_width, policy.chunk, max(len(fast.devices or ()), 1))


def graph_memory(fast: FastDiT, policy: CachePolicy, latent_height: int, latent_width: int) -> int:
    """The CUDA graphs' pool on each GPU of the run (0: no graphs on its device)."""
    if not graphs_supported(fast.patcher.load_device):
        return 0
    return graph_pool_bytes(fast.config, latent_height, latent_width, policy.chunk, max(len(fast.devices or ()), 1))


@contextlib.contextmanager
def prepared_fast_run(fast: FastDiT, run: R, auto_dtype: bool, latent_height: int, latent_width: int,
                      latent_frames: int | None, vae: int = 0, decode: int = 0,
                      keep_warm: bool = False) -> Iterator[PreparedRun[R]]:
    """The three Fast nodes' one preparation: the memory plan for the card (``vae``: the VAE
    streams' budget on the device, ``decode``: a chunk's decode beside the next chunk), whose
    kv_dtype ``run`` (``FastParams`` or ``PlaySettings``: anything with a cache ``policy``)
    takes when ``auto_dtype`` and whose block swap applies where the loader keeps every block
    on the GPU (its "0"); the run's memory asked of ComfyUI and the transformer loaded,
    unloaded however the block ends (``keep_warm``, Play: kept loaded after a run that ended
    well on a GPU with every block there, so the next session skips the load and starts on the
    same captures where it made any; ``loaded_fast_model``)."""
    device = torch.device(fast.patcher.load_device)
    decode_device = decode_gpu_with_room(fast.decode_device, vae + decode) if device.type == "cuda" else None
    if decode_device is not None:  # the VAE streams are the other GPU's: the transformer's GPU keeps their room
        vae = decode = 0
    plan = memory_plan(fast, run.policy, auto_dtype, latent_height, latent_width, latent_frames, vae, decode)
    if auto_dtype:
        run = dataclasses.replace(run, policy=dataclasses.replace(run.policy, dtype=plan.kv_dtype))
        log.info("LingBot Fast: kv_dtype auto -> %s (%.0f GiB on %s: %s)", plan.kv_dtype,
                 mm.get_total_memory(device) / 2**30, device, plan.describe())
    load = fast
    options = fast.patcher.model.options
    if plan.blocks_on_gpu is not None and options.blocks_on_gpu is None and device.type == "cuda":
        log.info("LingBot Fast: %.0f GiB on %s: %s", mm.get_total_memory(device) / 2**30, device, plan.describe())
        load = FastDiT.for_folder(fast.folder, dataclasses.replace(options, blocks_on_gpu=plan.blocks_on_gpu),
                                  fast.config, fast.identity, fast.devices, fast.decode_device, fast.attention)
    if vae and not plan.vae_on_gpu and device.type == "cuda":
        # Measured on an H100 under a 12 GiB cap: the float32 VAE on the CPU took 278 s to encode
        # the start frame's condition before the first chunk (bench/RESULTS.md).
        log.warning("LingBot Fast: no room for the VAE beside the transformer on %s (%s): it runs on the CPU, "
                    "so the start frame's encode takes minutes and every chunk's decode is slow. precision bf16 "
                    "halves the VAE's memory and may keep it on the GPU.", device, plan.describe())
    graphs = plan.cuda_graphs and device.type == "cuda"
    terms = plan_terms(plan, options.blocks_on_gpu)
    run = dataclasses.replace(run, camera_terms=terms, cuda_graphs=graphs, attention=fast.attention)
    memory = run_memory(fast, run.policy, latent_height, latent_width, latent_frames,
                        (vae if plan.vae_on_gpu else 0)
                        + terms * terms_memory(fast, run.policy, latent_height, latent_width)
                        + (graph_memory(fast, run.policy, latent_height, latent_width) if graphs else 0))
    # On a GPU only (what a warm start is for), and only the loaded patcher itself (a plan's block
    # swap makes a patcher per run); captures, where there are any, read its weights at their addresses.
    keep = keep_warm and load is fast and device.type == "cuda"
    with loaded_fast_model(load, memory, keep_loaded=keep) as model:
        yield PreparedRun(model, run, plan, model.patch_embedding.weight.device, decode_device)


def plan_terms(plan: FastMemoryPlan, loader_blocks_on_gpu: int | None) -> int:
    """The blocks whose camera terms the run keeps: the plan's, except where the plan swaps
    blocks and the Fast DiT Loader's own ``block_swap`` wins (the plan's terms counted the
    memory of its own block count, not the loader's)."""
    if plan.blocks_on_gpu is not None and loader_blocks_on_gpu is not None:
        return 0
    return plan.camera_terms


def decode_gpu_with_room(decode_device: torch.device | None, need: int) -> torch.device | None:
    """``decode_device`` when it has ``need`` bytes free now (ComfyUI does not manage that GPU:
    what is free there is what the run may use), else None with a word in the log: the VAE then
    goes where the memory plan puts it on the transformer's GPU."""
    if decode_device is None:
        return None
    free, _ = torch.cuda.mem_get_info(decode_device)
    if free < need + mm.minimum_inference_memory():
        log.warning("LingBot Fast: %.1f GiB free on %s, the VAE streams need %.1f GiB: the decode stays beside the "
                    "transformer", free / 2**30, decode_device, need / 2**30)
        return None
    log.info("LingBot Fast: the VAE (start frame encode, every chunk's decode) on %s", decode_device)
    return decode_device


@contextlib.contextmanager
def loaded_fast_model(fast: FastDiT, memory: int, keep_loaded: bool = False) -> Iterator[nn.Module]:
    """The transformer, loaded by ComfyUI with ``memory`` bytes left free (other models are
    evicted as needed); unloaded when the block ends, however it ends, except with
    ``keep_loaded`` after a run that ended well on one GPU: then it stays in ComfyUI's list of
    loaded models for the next run (its weights; where it captured CUDA graphs, also the KV
    cache they read and the graphs, which ComfyUI's model size does not count), until ComfyUI
    needs the memory or Unload Models / ``POST /free`` (either unload frees the kept state
    too: ``release_module``). With
    ``fast.devices`` its copies on the worker GPUs load and unload with it, and the module is
    a ``ParallelModel`` running every forward on all of them."""
    workers = fast.worker_patchers()
    ended_well = False
    group = [group_patcher(fast.devices)] if workers else []  # ComfyUI holds the workers between prompts
    if workers:
        begin_run()
    try:
        pool = shared_pool(fast.devices) if workers else None  # started before ComfyUI loads on the workers
        mm.load_models_gpu([fast.patcher, *workers, *group], memory_required=int(memory), force_full_load=True)
        module = fast.patcher.expert
        if module is None:  # load_models_gpu returned without loading: a host we do not know
            raise RuntimeError(f"ComfyUI did not load the Fast transformer from {fast.folder} to "
                               f"{fast.patcher.load_device}")
        if pool is not None:
            log.info("LingBot Fast: sequence parallel on %s", ", ".join(str(d) for d in fast.devices))
            module = ParallelModel(pool, workers[0].model.key, module, cfg_split=False)
        yield module
        ended_well = True
    finally:
        try:
            for worker in workers:
                unload_patcher(worker)
            kept = fast.patcher.expert
            if ended_well and keep_loaded and not workers and kept is not None:
                captured = kept.keeps_captures()
                if not captured:
                    # Without captures the kept KV cache saves only an allocation; freed, what
                    # stays is the weights, which ComfyUI counts in the model's size.
                    kept.release_state()
                log.info("LingBot Fast: the transformer stays loaded on %s%s for the next session (ComfyUI unloads "
                         "it when it needs the memory; Unload Models frees it)", fast.patcher.load_device,
                         " with its captured passes and their KV cache" if captured else "")
            else:
                unload_patcher(fast.patcher)
        finally:
            if workers:
                end_run()


__all__ = ["FastDiT", "PreparedRun", "decode_gpu_with_room", "loaded_fast_model", "memory_plan",
           "plan_terms", "prepared_fast_run", "run_memory"]
