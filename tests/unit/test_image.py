"""pipeline/image.py: the image stage takes a start frame in any image mode."""
from __future__ import annotations

import pytest
import torch
from PIL import Image

from comfyui_lingbot_world.loaders.package import find_package
from comfyui_lingbot_world.pipeline import image as image_stage

H, W = 32, 48


@pytest.mark.parametrize("mode", ["L", "LA", "P", "RGBA", "I;16", "CMYK"])
def test_image_stage_accepts_every_mode(packages, mode):
    files = find_package(packages["nf4"])
    picture = Image.new("RGB", (64, 40), (200, 120, 30)).convert(mode) if mode != "I;16" else Image.new("I;16", (64, 40), 40000)
    cond = image_stage.encode_image(files.vae, picture, 5, H, W, "cpu")
    assert cond.y.shape == (20, 2, H // 8, W // 8)
    assert torch.isfinite(cond.y).all()
