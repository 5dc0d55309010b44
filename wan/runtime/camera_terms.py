"""Each block's camera scale and shift, kept for the forwards that share one camera.

A LingBot-World block turns the model-level camera tokens c into
``h = layer2(silu(layer1(c))) + c`` and applies ``x * (1 + scale(h)) + shift(h)`` after its
self-attention: four dim x dim linears over every token, and none of it depends on x or on
the timestep. A Fast chunk runs five forwards (four steps and the commit) on one camera,
so those linears can run once per chunk: ``CameraTerms`` wraps the camera tokens and keeps
each block's (scale, shift) per token span from the block's first forward on. The later
forwards read them back; the values are the very tensors the first forward used, so the
output is bit for bit the same (``tests/unit/test_camera_terms.py``).

What it costs: two [tokens, dim] tensors per block in the camera layers' compute dtype
(``estimate_bytes``: 3.8 GB for a 480x832 Fast chunk of 4,680 tokens in bf16 over 40
blocks), which is why a Fast run keeps them only for as many blocks as its memory plan has
room for (``max_blocks``; ``pipeline.memory.plan_fast_memory``). The exact path's 40 steps would need 27 GB at
480x832x81: it keeps computing them per forward.

Sequence parallel: each rank keeps the terms of its own token shard (``shard``).

CUDA graphs (``runtime/cuda_graphs.py``): a captured forward reads the terms at fixed
addresses, so the graphed Fast path keeps one ``CameraTerms`` for the whole session and,
when a chunk's camera arrives, copies its tokens in (``refresh``) and computes the kept
blocks' terms ahead of the forward into the same tensors (``keep``).
"""
from __future__ import annotations

from typing import Callable

import torch

ScaleShift = tuple[torch.Tensor, torch.Tensor]


class CameraTerms:
    """Camera tokens [B or 1, L, dim] plus the per-block camera terms computed from them."""

    def __init__(self, tokens: torch.Tensor, max_blocks: int | None = None) -> None:
        """``max_blocks``: keep the terms of this many blocks (the first ones to run), compute
        the others' per forward as without ``CameraTerms`` (None: every block)."""
        if tokens.dim() != 3:
            raise ValueError(f"camera terms: expected camera tokens [B, L, dim], got shape {tuple(tokens.shape)}")
        if max_blocks is not None and max_blocks < 0:
            raise ValueError(f"camera terms: max_blocks must be >= 0 or None, got {max_blocks}")
        self.tokens = tokens
        self.max_blocks = max_blocks
        self._terms: dict[tuple[int, int, int], ScaleShift] = {}
        self._blocks: set[int] = set()
        self._shards: dict[tuple[int, int], CameraTerms] = {}

    # What the model reads like the plain tokens (shape checks, moves).
    @property
    def shape(self) -> torch.Size:
        return self.tokens.shape

    def dim(self) -> int:
        return self.tokens.dim()

    def scale_shift(self, block: object, start: int, stop: int, compute: Callable[[torch.Tensor], ScaleShift]) -> ScaleShift:
        """``block``'s (scale, shift) of tokens [start, stop): ``compute(tokens[:, start:stop])``
        the first time, the kept tensors after."""
        key = (id(block), start, stop)
        found = self._terms.get(key)
        if found is None:
            found = compute(self.tokens[:, start:stop])
            if id(block) in self._blocks or self.max_blocks is None or len(self._blocks) < self.max_blocks:
                self._blocks.add(id(block))
                self._terms[key] = found
        return found

    def keep(self, block: object, start: int, stop: int, terms: ScaleShift) -> None:
        """Store ``block``'s (scale, shift) of tokens [start, stop), computed ahead of the
        forward; terms kept before are overwritten in place (their addresses do not change)."""
        key = (id(block), start, stop)
        found = self._terms.get(key)
        if found is None:
            self._blocks.add(id(block))
            self._terms[key] = terms
            return
        for kept, new in zip(found, terms):
            kept.copy_(new)

    def refresh(self, tokens: torch.Tensor) -> None:
        """New camera tokens of the same shape, copied into the kept tokens tensor (the kept
        terms are stale until ``keep`` rewrites them)."""
        if tokens.shape != self.tokens.shape:
            raise ValueError(f"camera terms: new tokens {tuple(tokens.shape)} for kept ones {tuple(self.tokens.shape)}")
        self.tokens.copy_(tokens)

    def shard(self, parallel, cut: Callable[[torch.Tensor], torch.Tensor]) -> "CameraTerms":
        """This rank's token shard (``cut``: the model's shard plan applied to the tokens), with
        its own kept terms; one per rank and group size."""
        key = (parallel.rank, parallel.size)
        if key not in self._shards:
            self._shards[key] = CameraTerms(cut(self.tokens), self.max_blocks)
        return self._shards[key]

    @property
    def nbytes(self) -> int:
        """Bytes of the kept terms (the tokens not counted)."""
        own = sum(s.numel() * s.element_size() + h.numel() * h.element_size() for s, h in self._terms.values())
        return own + sum(child.nbytes for child in self._shards.values())

    def clear(self) -> None:
        self._terms.clear()
        self._blocks.clear()
        self._shards.clear()

    @staticmethod
    def estimate_bytes(tokens: int, dim: int, layers: int, dtype_bytes: int = 2) -> int:
        """What the terms of ``layers`` blocks over ``tokens`` tokens take (scale and shift)."""
        return 2 * int(layers) * int(tokens) * int(dim) * int(dtype_bytes)


__all__ = ["CameraTerms"]
