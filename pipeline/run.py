"""The whole image-to-video run outside ComfyUI, stage by stage, each stage freeing its model."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..loaders.package import find_package
from .camera import CameraCondition, camera_from_files, camera_from_preset
from .decode import decode
from .experts import DiskExperts
from .image import ImageLike, encode_image
from .lora import LoraExperts, LoraSpec
from .memory import resolve_device
from .sampling import SamplingParams, sample
from .text import encode_text


@dataclass(frozen=True)
class CameraRequest:
    """Either a folder with poses.npy + intrinsics.npy, or a preset name and speed."""

    folder: Path | None = None
    preset: str | None = None
    speed: float = 1.0

    def build(self, frames: int, height: int, width: int) -> CameraCondition:
        if self.folder is not None:
            return camera_from_files(self.folder / "poses.npy", self.folder / "intrinsics.npy", frames, height, width)
        if self.preset is None:
            raise ValueError("CameraRequest needs a folder or a preset")
        return camera_from_preset(self.preset, self.speed, frames, height, width)


def generate(
    package: str | Path,
    image: ImageLike,
    prompt: str,
    negative_prompt: str,
    frames: int,
    height: int,
    width: int,
    camera: CameraRequest | None = None,
    params: SamplingParams = SamplingParams(),
    device: torch.device | str | None = None,
    cache_dir: str | Path | None = None,
    quantize: str | None = None,
    decode_tile: int | None = None,
    on_step: Callable[[int, int], None] | None = None,
    loras: list[LoraSpec] | None = None,
) -> torch.Tensor:
    """Return the video [3, frames, height, width] in [-1, 1] (float32, CPU).

    ``loras``: adapters applied to the experts while they sample (unmerged)."""
    files = find_package(package)
    device = resolve_device(device)
    camera_condition = camera.build(frames, height, width) if camera else None  # cheap; fail early
    text = encode_text(files.t5, files.tokenizer, prompt, negative_prompt, device, cache_dir)
    condition = encode_image(files.vae, image, frames, height, width, device)
    experts = DiskExperts(files.high, files.low, device, quantize)
    source = LoraExperts(experts, loras) if loras else experts
    try:
        latent = sample(source, text, condition, camera_condition, params, on_step=on_step)
    finally:
        experts.close()
    return decode(files.vae, latent, device, tile=decode_tile)
