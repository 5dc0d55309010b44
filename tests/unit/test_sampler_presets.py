"""The few-step preset: the Wan2.2-Lightning I2V schedule, split 2 + 2 between the experts."""
from __future__ import annotations

import pytest
import torch

from comfyui_lingbot_world.pipeline.sampler_presets import apply_preset, lightning_4step
from comfyui_lingbot_world.pipeline.sampling import SamplingParams, expert_for
from comfyui_lingbot_world.wan.scheduler import make_sampler


def test_lightning_preset_matches_the_distillation_schedule():
    p = lightning_4step(SamplingParams(seed=11, cache_threshold=0.05, attention="sdpa"))
    assert (p.steps, p.shift, p.cfg_high, p.cfg_low, p.sampler) == (4, 5.0, 1.0, 1.0, "euler")
    assert p.seed == 11 and p.attention == "sdpa" and p.cache_threshold == 0.0
    sampler = make_sampler(p.sampler, p.steps, p.shift)
    # lightx2v: [1000, 750, 500, 250] shifted by 5 -> sigmas 1, .9375, .8333, .625
    torch.testing.assert_close(sampler.sigmas[:4], torch.tensor([1.0, 0.9375, 0.83333, 0.625]), atol=1e-3, rtol=0)
    assert [expert_for(t, p.boundary) for t in sampler.timesteps.tolist()] == ["high", "high", "low", "low"]


def test_apply_preset():
    base = SamplingParams(steps=40)
    assert apply_preset("none", base) is base
    assert apply_preset("lightning_4step", base).steps == 4
    with pytest.raises(ValueError, match="unknown sampling preset 'turbo'"):
        apply_preset("turbo", base)
