"""The whole run outside ComfyUI (pipeline/generate.py) as one video tensor, for tests."""
from __future__ import annotations

import torch

from comfyui_lingbot_world.pipeline.generate import generate


def generate_video(package, image, prompt: str, negative_prompt: str, frames: int, height: int, width: int,
                   camera=None, params=None, **options) -> torch.Tensor:
    """``generate`` with every window's new frames collected: [3, frames, height, width] in [-1, 1]."""
    pieces: list[torch.Tensor] = []
    if params is not None:
        options["params"] = params
    generate(package, image, prompt, negative_prompt, frames, height, width, pieces.append, camera, **options)
    return torch.cat(pieces, dim=1)
