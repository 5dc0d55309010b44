"""LingBot-World Fast's one transformer under ComfyUI's memory manager (the LINGBOT_FAST_DIT value).

The transformer comes into memory exactly as a Base expert does: an ``ExpertPatcher``
(expert_patcher.py) streams it from its folder when ComfyUI loads it and drops it when
ComfyUI unloads it, never keeping a copy in RAM. ``loaded_fast_model`` has ComfyUI load it
with room left for the run (the KV cache and a chunk's activations, plus what the caller
adds, e.g. the VAE of a stream) and unloads it on every way out of the run: finished,
cancelled or failed.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from torch import nn

import comfy.model_management as mm

from ...loaders.model_kind import ModelIdentity
from ...wan.config import DiTConfig
from ...wan.runtime.kv_cache import CachePolicy, KVCache
from .expert_patcher import ExpertLoadOptions, ExpertPatcher, unload_patcher

PATCHER_NAME = "fast"  # what ComfyUI's list of loaded models and GET /lingbot/status show
KV_DTYPE_BYTES = 2  # the cache's compute dtype (bf16) per value; int8 entries are counted by the policy


@dataclass
class FastDiT:
    """The LINGBOT_FAST_DIT value: the Fast transformer's patcher, its geometry (config.json)
    and what its files say it is (``loaders.model_kind``)."""

    patcher: ExpertPatcher
    config: DiTConfig
    identity: ModelIdentity

    @classmethod
    def for_folder(cls, folder: str | Path, options: ExpertLoadOptions, config: DiTConfig,
                   identity: ModelIdentity) -> "FastDiT":
        """Reads file headers only; nothing loads until a run asks ComfyUI for it."""
        return cls(ExpertPatcher.for_folder(PATCHER_NAME, folder, options), config, identity)

    @property
    def folder(self) -> Path:
        return self.patcher.model.folder

    def get_ram_usage(self) -> int:
        # Newer ComfyUI hosts weigh cached node outputs by this when RAM runs short.
        return self.patcher.get_ram_usage()


def run_memory(fast: FastDiT, policy: CachePolicy, latent_height: int, latent_width: int,
               latent_frames: int | None, extra: int = 0) -> int:
    """Working memory to keep free beside the transformer for a run: the policy's KV cache
    (text keys and values included) and one chunk's activations, plus ``extra`` bytes."""
    config = fast.config
    _, ph, pw = config.patch_size
    frame_tokens = (latent_height // ph) * (latent_width // pw)
    cache = KVCache.estimate_bytes(policy, layers=config.num_layers, heads=config.num_heads,
                                   head_dim=config.head_dim, frame_tokens=frame_tokens, dtype_bytes=KV_DTYPE_BYTES,
                                   latent_frames=latent_frames, text_tokens=config.text_len)
    return cache + fast.patcher.inference_memory(policy.chunk * frame_tokens, config.dim) + int(extra)


@contextlib.contextmanager
def loaded_fast_model(fast: FastDiT, memory: int) -> Iterator[nn.Module]:
    """The transformer, loaded by ComfyUI with ``memory`` bytes left free (other models are
    evicted as needed); unloaded when the block ends, however it ends."""
    try:
        mm.load_models_gpu([fast.patcher], memory_required=int(memory), force_full_load=True)
        module = fast.patcher.expert
        if module is None:  # load_models_gpu returned without loading: a host we do not know
            raise RuntimeError(f"ComfyUI did not load the Fast transformer from {fast.folder} to "
                               f"{fast.patcher.load_device}")
        yield module
    finally:
        unload_patcher(fast.patcher)


__all__ = ["FastDiT", "loaded_fast_model", "run_memory"]
