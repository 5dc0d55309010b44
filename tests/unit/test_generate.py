"""The whole pipeline (pipeline/generate.py) on tiny synthetic packages, on the CPU, stage by stage."""
from __future__ import annotations

import weakref

import numpy as np
import pytest
import torch
from PIL import Image

from whole_run import generate_video as generate
from comfyui_lingbot_world.loaders.package import find_package
from comfyui_lingbot_world.pipeline import experts as experts_mod
from comfyui_lingbot_world.pipeline import image as image_stage
from comfyui_lingbot_world.pipeline import text as text_stage
from comfyui_lingbot_world.pipeline.camera import path_from_preset
from comfyui_lingbot_world.pipeline.sampling import SamplingParams, expert_for
from comfyui_lingbot_world.wan.negative_prompt import DEFAULT_NEGATIVE_PROMPT

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


def test_expert_choice_follows_boundary():
    assert expert_for(950.0, 0.947) == "high"
    assert expert_for(947.0, 0.947) == "high"
    assert expert_for(946.9, 0.947) == "low"


def test_text_stage_frees_encoder_and_caches(packages, tmp_path, monkeypatch):
    files = find_package(packages["nf4"])
    loaded: list[weakref.ref] = []
    real_load = text_stage.load_t5

    def tracking(path, device, dtype):
        module = real_load(path, device, dtype)
        loaded.append(weakref.ref(module))
        return module

    monkeypatch.setattr(text_stage, "load_t5", tracking)
    first = text_stage.encode_text(files.t5, files.tokenizer, "a red fox", "blurry", "cpu", cache_dir=tmp_path)
    assert not first.from_cache and len(loaded) == 1
    module = loaded[0]()
    assert module is None or all(p is None for p in module._parameters.values())

    def refuse(*a, **k):
        raise AssertionError("the encoder must not load for a cached prompt")

    monkeypatch.setattr(text_stage, "load_t5", refuse)
    again = text_stage.encode_text(files.t5, files.tokenizer, "a red fox", "blurry", "cpu", cache_dir=tmp_path)
    assert again.from_cache
    assert torch.equal(again.positive, first.positive) and torch.equal(again.negative, first.negative)


def test_empty_prompt_is_encoded_and_empty_negative_is_the_default(packages):
    """The reference encodes an empty prompt like any other (just </s>) and replaces an
    empty negative prompt by the config's default one (SPEC §10)."""
    files = find_package(packages["nf4"])
    empty = text_stage.encode_text(files.t5, files.tokenizer, "", "", "cpu")
    default = text_stage.encode_text(files.t5, files.tokenizer, "", DEFAULT_NEGATIVE_PROMPT, "cpu")
    assert empty.positive.shape[0] == 1  # the end-of-sequence token alone
    torch.testing.assert_close(empty.negative, default.negative)
    assert empty.negative.shape[0] > 50  # the long default prompt, not an empty one
    with pytest.raises(ValueError, match="negative_prompt: character 1 is a lone surrogate"):
        text_stage.encode_text(files.t5, files.tokenizer, "x", "a\udfff", "cpu")


@pytest.mark.parametrize("mode", ["L", "LA", "P", "RGBA", "I;16", "CMYK"])
def test_image_stage_accepts_every_mode(packages, mode):
    files = find_package(packages["nf4"])
    picture = Image.new("RGB", (64, 40), (200, 120, 30)).convert(mode) if mode != "I;16" else Image.new("I;16", (64, 40), 40000)
    cond = image_stage.encode_image(files.vae, picture, 5, H, W, "cpu")
    assert cond.y.shape == (20, 2, H // 8, W // 8)
    assert torch.isfinite(cond.y).all()


def test_batched_cfg_equals_two_passes(packages, image):
    args = (packages["nf4"], image, "a harbour at dusk", "fog", 5, H, W, path_from_preset("orbit_left", 1.0, 5))
    batched = generate(*args, SamplingParams(steps=3, shift=5.0, seed=3, batch_cfg=True), device="cpu")
    separate = generate(*args, SamplingParams(steps=3, shift=5.0, seed=3, batch_cfg=False), device="cpu")
    torch.testing.assert_close(batched, separate, rtol=1e-4, atol=1e-4)
