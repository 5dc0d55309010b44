"""A DiT of any config with seeded random weights, built on the device it runs on: the model
factory the sequence-parallel benchmark gives every rank (picklable: the spawned workers
import this module by name, bench/ being on their sys.path). ``weights``: the kind every
linear layer is held in (``loaders.weight_kind.convert_linear``, the loaders' own
conversion; bf16 keeps the float weights)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

import _pack  # noqa: F401  (registers the checkout as comfyui_lingbot_world)
from comfyui_lingbot_world.loaders.dit_weights import linear_layers  # noqa: E402
from comfyui_lingbot_world.loaders.weight_kind import check_kind, convert_linear  # noqa: E402
from comfyui_lingbot_world.wan.config import DiTConfig  # noqa: E402
from comfyui_lingbot_world.wan.model import LingBotDiT  # noqa: E402


@dataclass(frozen=True)
class SyntheticDiT:
    """``SyntheticDiT(config, dtype)(device)``: the same weights on every rank (same seed)."""

    config: DiTConfig
    dtype: torch.dtype = torch.bfloat16
    seed: int = 0
    weights: str = "bf16"  # a wan/runtime/dense.py GEMM_KINDS row: bf16, fp8, int8, nf4

    def __call__(self, device: torch.device | str) -> LingBotDiT:
        device = torch.device(device)
        with torch.device("meta"):
            model = LingBotDiT(self.config).to(self.dtype)
        model = model.to_empty(device=device)
        generator = torch.Generator(device=device).manual_seed(self.seed)
        model.init_weights(generator=generator)
        check_kind(self.weights, "--weights")
        if self.weights != "bf16":  # one layer at a time, as the loaders convert on load
            for name, linear in linear_layers(model).items():
                model.set_submodule(name, convert_linear(linear, self.weights, self.dtype))
                linear.weight = None  # type: ignore[assignment]
        return model.eval().requires_grad_(False)
