"""Noise for LingBot-World Fast: a chunk's initial noise and its re-noise draws.

Each chunk needs one initial noise [16, 3, h, w] and one fresh draw per re-noise (3 with
the official 4 steps). Two orders of drawing:

* ``OfficialOrderNoise`` follows the official ``generate_fast``: one generator; the whole
  video's initial noise [16, F_lat, h, w] first, then every re-noise in chunk and step
  order. Reproducing that order is what lets a run be compared with the official math
  (the fidelity test); the official code draws on a CUDA generator, this one on the CPU
  like the pack's other samplers, so equal seeds do not give the official pixels.
* ``ChunkNoise`` draws each chunk's noise from its own generator seeded by (seed, chunk
  index). The first N chunks of any run then do not depend on how long the run is: a
  clip of 81 frames is the start of the 961-frame stream with the same seed, and a Play
  session can be replayed through the clip workflow bit for bit. The nodes use this one.

Both return float32 tensors on the CPU; a source must be asked in order (chunk by chunk,
the initial noise before the re-noises, steps in order) and says so when it is not.
"""
from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np
import torch

from ...wan.geometry import CHUNK_FRAMES, LATENT_CHANNELS, check_seed


class NoiseSource(Protocol):
    def initial(self, chunk: int, shape: Sequence[int]) -> torch.Tensor:
        """The chunk's starting noise, float32 of ``shape`` ([16, frames, h, w])."""

    def renoise(self, chunk: int, step: int, shape: Sequence[int]) -> torch.Tensor:
        """The fresh noise that re-noises the chunk's x0 after step ``step`` (0-based)."""


class _Order:
    """Refuses draws out of the order a source was written for (a silent reorder would change
    every number after it). Steps: -1 is a chunk's initial noise, 0.. its re-noises."""

    def __init__(self, renoises: int) -> None:
        self.renoises = renoises
        self.expected: tuple[int, int] = (0, -1)

    @staticmethod
    def _name(step: int) -> str:
        return "initial noise" if step < 0 else f"re-noise {step}"

    def take(self, chunk: int, step: int) -> None:
        if (chunk, step) != self.expected:
            raise RuntimeError(f"noise asked for chunk {chunk} {self._name(step)}, but the next draw is chunk "
                               f"{self.expected[0]} {self._name(self.expected[1])}")
        last = step + 1 >= self.renoises
        self.expected = (chunk + 1, -1) if last else (chunk, step + 1)


class OfficialOrderNoise:
    """The official draw order: the whole video's initial noise, then every re-noise in
    order. ``latent_frames``, ``height``, ``width``: the latent video's size; ``renoises``:
    re-noise draws per chunk (steps − 1)."""

    def __init__(self, seed: int, latent_frames: int, height: int, width: int, renoises: int = 3,
                 chunk_frames: int = CHUNK_FRAMES) -> None:
        self.generator = torch.Generator(device="cpu").manual_seed(check_seed(seed))
        self.noise = torch.randn(LATENT_CHANNELS, latent_frames, height, width, generator=self.generator,
                                 dtype=torch.float32)
        self.chunk_frames = chunk_frames
        self._order = _Order(renoises)

    def initial(self, chunk: int, shape: Sequence[int]) -> torch.Tensor:
        start = chunk * self.chunk_frames
        out = self.noise[:, start:start + self.chunk_frames]
        if tuple(out.shape) != tuple(shape):
            raise ValueError(f"noise: chunk {chunk} is {tuple(out.shape)} of the video's noise, asked {tuple(shape)}")
        self._order.take(chunk, -1)
        return out.clone()

    def renoise(self, chunk: int, step: int, shape: Sequence[int]) -> torch.Tensor:
        self._order.take(chunk, step)
        return torch.randn(tuple(shape), generator=self.generator, dtype=torch.float32)


def chunk_seed(seed: int, chunk: int) -> int:
    """A 64-bit seed for one chunk, mixed from (seed, chunk) by NumPy's SeedSequence, so
    neighbouring seeds and chunks give unrelated streams."""
    return int(np.random.SeedSequence([check_seed(seed), int(chunk)]).generate_state(1, np.uint64)[0])


class ChunkNoise:
    """Each chunk's noise from a generator seeded by (seed, chunk): the initial noise first,
    then the re-noises. Independent of the run's length."""

    def __init__(self, seed: int, renoises: int = 3) -> None:
        self.seed = check_seed(seed)
        self.renoises = renoises
        self._generator: torch.Generator | None = None
        self._chunk = -1
        self._next_step = 0

    def initial(self, chunk: int, shape: Sequence[int]) -> torch.Tensor:
        self._generator = torch.Generator(device="cpu").manual_seed(chunk_seed(self.seed, chunk))
        self._chunk, self._next_step = chunk, 0
        return torch.randn(tuple(shape), generator=self._generator, dtype=torch.float32)

    def renoise(self, chunk: int, step: int, shape: Sequence[int]) -> torch.Tensor:
        if chunk != self._chunk or step != self._next_step:
            raise RuntimeError(f"noise asked for chunk {chunk} re-noise {step}, but chunk {self._chunk} is at "
                               f"re-noise {self._next_step} (draw each chunk's initial noise first, steps in order)")
        self._next_step += 1
        return torch.randn(tuple(shape), generator=self._generator, dtype=torch.float32)
