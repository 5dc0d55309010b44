"""pipeline/generate.py: the whole run outside ComfyUI on the tiny synthetic packages (CPU),
both layouts, with and without a camera."""
from __future__ import annotations

import weakref

import numpy as np
import pytest
import torch
from PIL import Image

from whole_run import generate_video as generate
from comfyui_lingbot_world.pipeline import experts as experts_mod
from comfyui_lingbot_world.pipeline.camera import path_from_preset
from comfyui_lingbot_world.pipeline.sampling import SamplingParams

H, W = 32, 48
PARAMS = SamplingParams(steps=4, shift=5.0, seed=7)


@pytest.fixture
def image() -> Image.Image:
    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 255, (40, 60, 3), dtype=np.uint8))


@pytest.mark.parametrize("layout", ["nf4", "bf16"])
@pytest.mark.parametrize("frames", [5, 9])
@pytest.mark.parametrize("with_camera", [False, True])
def test_generate_returns_video(packages, image, layout, frames, with_camera):
    camera = path_from_preset("dolly_in", 1.0, frames) if with_camera else None
    video = generate(packages[layout], image, "a castle in the clouds", "", frames, H, W, camera, PARAMS,
                     device="cpu", quantize="nf4" if layout == "bf16" else None)
    assert video.shape == (3, frames, H, W)
    assert video.dtype == torch.float32
    assert torch.isfinite(video).all()
    assert video.abs().max() <= 1.0


def test_camera_changes_the_result(packages, image):
    args = (packages["nf4"], image, "a road through a forest", "", 5, H, W)
    plain = generate(*args, None, PARAMS, device="cpu")
    moving = generate(*args, path_from_preset("pan_left", 2.0, 5), PARAMS, device="cpu")
    assert not torch.allclose(plain, moving)


def test_same_seed_same_video(packages, image):
    args = (packages["nf4"], image, "a quiet lake", "", 5, H, W, None, PARAMS)
    assert torch.equal(generate(*args, device="cpu"), generate(*args, device="cpu"))


def test_one_expert_resident_at_a_time(packages, image, monkeypatch):
    resident: list[str] = []
    peak = 0
    real_load = experts_mod.load_expert

    def tracking_load(folder, device, quantize=None, blocks_on_gpu=None):
        nonlocal peak
        module = real_load(folder, device, quantize, blocks_on_gpu)
        resident.append(str(folder))
        alive = [r for r in refs if r() is not None and any(p is not None for p in r().parameters())]
        peak = max(peak, len(alive) + 1)
        refs.append(weakref.ref(module))
        return module

    refs: list[weakref.ref] = []
    monkeypatch.setattr(experts_mod, "load_expert", tracking_load)
    # shift 5 over 4 steps puts the switch inside the run: both experts must be used.
    generate(packages["nf4"], image, "mountains", "", 5, H, W, None, PARAMS, device="cpu")
    assert len(resident) == 2 and "high" in resident[0] and "low" in resident[1]
    assert peak == 1


def test_batched_cfg_equals_two_passes(packages, image):
    args = (packages["nf4"], image, "a harbour at dusk", "fog", 5, H, W, path_from_preset("orbit_left", 1.0, 5))
    batched = generate(*args, SamplingParams(steps=3, shift=5.0, seed=3, batch_cfg=True), device="cpu")
    separate = generate(*args, SamplingParams(steps=3, shift=5.0, seed=3, batch_cfg=False), device="cpu")
    torch.testing.assert_close(batched, separate, rtol=1e-4, atol=1e-4)
