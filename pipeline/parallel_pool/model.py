"""``ParallelModel``: rank 0's copy of the model, driving the workers' copies in lock-step
(called like ``LingBotDiT``), and ``LoadExpert``, the factory the workers build an expert with."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from ...wan.runtime.attention import run_choice as attention_run_choice
from ...wan.runtime.camera_terms import CameraTerms
from ...wan.runtime.kv_cache import CachePolicy, KVCache
from .cancel import synced_cancel
from .messages import CloseCache, DropCamera, Forward, NewCache, PrepareCamera, describe, send_tensors
from .rank_pool import RankPool

_ids = itertools.count(1)


@dataclass(frozen=True)
class LoadExpert:
    """Model factory for the workers: an expert folder loaded as ``pipeline.experts.load_expert`` does."""

    folder: str
    quantize: str | None = None
    blocks_on_gpu: int | None = None

    def __call__(self, device: torch.device) -> nn.Module:
        from ..experts import load_expert

        return load_expert(self.folder, device, self.quantize, blocks_on_gpu=self.blocks_on_gpu).eval()


class ParallelModel(nn.Module):
    """Rank 0's copy of the model, driving the workers' copies: called like ``LingBotDiT``
    (``forward``, ``prepare_camera``, ``new_kv_cache``), every call runs on all ranks."""

    def __init__(self, pool: RankPool, key: str, model: nn.Module, cfg_split: bool = True) -> None:
        super().__init__()
        self.pool, self.key, self.inner = pool, key, model
        # A batch of two (batched CFG) on 4+ ranks: one sample per half of the GPUs (Ulysses x
        # CFG split); otherwise every forward over all ranks.
        self.cfg_split = cfg_split
        self.config = model.config
        self._cameras: dict[int, int] = {}  # id(rank 0's camera tokens) -> worker-side id
        self._caches: dict[int, tuple[KVCache, int]] = {}

    def __getattr__(self, name: str) -> Any:
        """Everything else (``config``, ``patch_embedding``, ...) is rank 0's model's."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["inner"], name)

    def prepare_camera(self, plucker: torch.Tensor, keep_terms: int = 0) -> torch.Tensor | CameraTerms:
        """``keep_terms``: every rank keeps its shard's camera terms of that many blocks (``CameraTerms``)."""
        pool = self.pool
        ident = next(_ids)
        tensors = {"plucker": plucker.to(pool.device)}
        pool.send(PrepareCamera(self.key, ident, describe(tensors), keep_terms))
        pool.guard(lambda: send_tensors(tensors, pool.device))
        tokens = self.inner.prepare_camera(tensors["plucker"], keep_terms=keep_terms)
        for old in list(self._cameras):  # one camera per expert activation: older ones go
            pool.send(DropCamera(self._cameras.pop(old)))
        self._cameras[id(tokens)] = ident
        return tokens

    def new_kv_cache(self, policy: CachePolicy, latent_height: int, latent_width: int,
                     latent_frames: int | None = None, device: torch.device | str | None = None,
                     graphs: bool = False) -> KVCache:
        """``graphs``: every rank captures and replays the same passes (NCCL inside the graphs)."""
        self._collect_caches()
        ident = next(_ids)
        self.pool.send(NewCache(self.key, ident, policy, latent_height, latent_width, latent_frames, graphs))
        cache = self.inner.new_kv_cache(policy, latent_height, latent_width, latent_frames, device=self.pool.device,
                                        parallel=self.pool.sp, graphs=graphs)
        self._caches[id(cache)] = (cache, ident)
        return cache

    def _collect_caches(self) -> None:
        for key, (cache, ident) in list(self._caches.items()):
            if cache.closed:
                self.pool.send(CloseCache(ident))
                del self._caches[key]

    def forward(self, x: torch.Tensor, t: torch.Tensor, context: Any = None, y: torch.Tensor | None = None,
                camera_tokens: torch.Tensor | None = None, camera: torch.Tensor | None = None,
                cancel: Callable[[], None] | None = None, kv_cache: KVCache | None = None,
                commit: bool = False) -> torch.Tensor | None:
        pool = self.pool
        pool.require(self.key)
        if camera is not None:
            camera_tokens = self.prepare_camera(camera)
        tensors: dict[str, torch.Tensor] = {"x": x, "t": torch.as_tensor(t, device=pool.device)}
        if y is not None:
            tensors["y"] = y
        contexts = 0
        if context is not None:
            items = list(context)  # a padded [B, L, D] tensor or a list: one [L, D] entry per sample
            for i, item in enumerate(items):
                tensors[f"context{i}"] = item
            contexts = len(items)
        camera_id = None if camera_tokens is None else self._cameras.get(id(camera_tokens))
        if camera_tokens is not None and camera_id is None:  # not made here: the workers get the tokens
            tensors["camera_tokens"] = camera_tokens.tokens if isinstance(camera_tokens, CameraTerms) else camera_tokens
        tensors = {k: v.to(pool.device) for k, v in tensors.items()}
        message = Forward(
            key=self.key, tensors=describe(tensors), contexts=contexts, camera_tokens=camera_id,
            kv_cache=None if kv_cache is None else self._caches[id(kv_cache)][1],
            frame_start=None if kv_cache is None else kv_cache.frame_start, commit=commit,
            split=bool(self.cfg_split and pool.cfg is not None and x.shape[0] == 2 and kv_cache is None),
            attention=attention_run_choice())  # every rank attends with this run's kernel
        pool.send(message)
        hook = synced_cancel(pool.device, cancel)

        def run() -> torch.Tensor | None:
            send_tensors(tensors, pool.device)
            out = message.call(self.inner, tensors, camera_tokens, kv_cache, pool.sp, pool.cfg, hook)
            hook.finish()
            return out
        return pool.guard(run, synced=lambda exc: exc is hook.raised)

    def close(self) -> None:
        """Free the workers' copy (rank 0's is dropped with this object)."""
        self.pool.free(self.key)
        self._cameras.clear(), self._caches.clear()


__all__ = ["LoadExpert", "ParallelModel"]
