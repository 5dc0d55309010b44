"""A DiT of any config with seeded random weights, built on the device it runs on: the model
factory the sequence-parallel benchmark gives every rank (picklable: the spawned workers
import this module by name, bench/ being on their sys.path)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

import _pack  # noqa: F401  (registers the checkout as comfyui_lingbot_world)
from comfyui_lingbot_world.wan.config import DiTConfig  # noqa: E402
from comfyui_lingbot_world.wan.model import LingBotDiT  # noqa: E402


@dataclass(frozen=True)
class SyntheticDiT:
    """``SyntheticDiT(config, dtype)(device)``: the same weights on every rank (same seed)."""

    config: DiTConfig
    dtype: torch.dtype = torch.bfloat16
    seed: int = 0

    def __call__(self, device: torch.device | str) -> LingBotDiT:
        device = torch.device(device)
        with torch.device("meta"):
            model = LingBotDiT(self.config).to(self.dtype)
        model = model.to_empty(device=device)
        generator = torch.Generator(device=device).manual_seed(self.seed)
        model.init_weights(generator=generator)
        return model.eval().requires_grad_(False)
