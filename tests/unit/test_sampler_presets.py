"""The sampler presets: the few-step Wan2.2-Lightning I2V schedule, split 2 + 2 between the
experts, and the official LingBot-World settings (act2cam, Act)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from stand_in_dit import TinyDiT

from comfyui_lingbot_world.pipeline.image import I2VCondition
from comfyui_lingbot_world.pipeline.sampler_presets import PRESET_FRAMES, SAMPLER_PRESETS, apply_preset, lightning_4step
from comfyui_lingbot_world.pipeline.sampling import SamplingParams, expert_for, initial_noise, sample
from comfyui_lingbot_world.pipeline.text import TextEmbeddings
from comfyui_lingbot_world.wan.scheduler import flow_sigmas, flow_timesteps, make_sampler


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


# --------------------------------------------------------------------------- what the DiT sees

# Wan2.2-Lightning / LightX2V: step list 1000, 750, 500, 250 shifted by 5 (docs/conventions.md#wan22-lightning).
PUBLISHED_SIGMAS = [1.0, 0.9375, 5 / 6, 0.625]
PUBLISHED_TIMESTEPS = [1000.0, 937.5, 2500 / 3, 625.0]


class RecordingDiT(TinyDiT):
    """The stand-in DiT, keeping every timestep tensor it is called with."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.timesteps: list[torch.Tensor] = []

    def forward(self, x, t, contexts, y=None, camera_tokens=None, cancel=None):
        self.timesteps.append(t.detach().clone())
        return super().forward(x, t, contexts, y=y, camera_tokens=camera_tokens, cancel=cancel)


class RecordingExperts:
    def __init__(self) -> None:
        self.models = {"high": RecordingDiT(1), "low": RecordingDiT(2)}

    def acquire(self, name):
        return self.models[name]

    def release(self, name):
        pass


def _inputs():
    g = torch.Generator().manual_seed(5)
    text = TextEmbeddings(positive=torch.randn(6, 8, generator=g), negative=torch.randn(6, 8, generator=g),
                          from_cache=False)
    return text, I2VCondition(y=torch.randn(20, 3, 4, 6, generator=g), frames=9, height=32, width=48)


def test_lightning_preset_feeds_the_dit_the_published_float_timesteps():
    text, condition = _inputs()
    experts = RecordingExperts()
    params = lightning_4step(SamplingParams(seed=4))
    latent = sample(experts, text, condition, None, params)
    high, low = experts.models["high"].timesteps, experts.models["low"].timesteps
    assert len(high) == 2 and len(low) == 2  # guidance 1: one forward per step, 2 + 2 between experts
    seen = torch.cat(high + low)
    assert seen.dtype == torch.float32
    assert torch.equal(seen, torch.tensor(PUBLISHED_TIMESTEPS, dtype=torch.float32))

    # Euler on the published sigmas (1, 0.9375, 0.8333, 0.625, then 0), written out.
    sigmas = PUBLISHED_SIGMAS + [0.0]
    x = initial_noise(condition, 4)
    for i, t in enumerate(PUBLISHED_TIMESTEPS):
        model = RecordingDiT(1 if i < 2 else 2)
        with torch.inference_mode():
            v = model(x[None], torch.tensor([t]), [text.positive], y=condition.y[None])[0].float()
        x = x + (float(np.float32(sigmas[i + 1])) - float(np.float32(sigmas[i]))) * v
    torch.testing.assert_close(latent, x, rtol=0, atol=1e-6)


def test_lightning_schedule_values_and_unipc_refused():
    torch.testing.assert_close(flow_sigmas(4, 5.0, schedule="lightning"),
                               torch.tensor(PUBLISHED_SIGMAS + [0.0], dtype=torch.float32), rtol=0, atol=0)
    assert flow_timesteps(4, 5.0, schedule="lightning").tolist() == pytest.approx(PUBLISHED_TIMESTEPS, abs=1e-4)
    # The reference's own schedule is unchanged (integer timesteps from 999).
    assert flow_timesteps(4, 5.0).tolist() == [999.0, 937.0, 833.0, 624.0]
    with pytest.raises(ValueError, match="use the euler sampler"):
        make_sampler("unipc", 4, 5.0, schedule="lightning")
    with pytest.raises(ValueError, match="schedule must be one of"):
        SamplingParams(schedule="karras")


@pytest.mark.parametrize("name, steps, frames", [("official_act2cam", 20, 121), ("official_act", 70, 81)])
def test_official_presets_are_the_published_settings(name: str, steps: int, frames: int) -> None:
    """The official act2cam example (Base-Cam, action string: 20 steps, 121 frames) and the
    official Act settings (70 steps, 81 frames): unipc, shift 10, guidance 5/5, boundary 0.947,
    the reference schedule; seed and the run options kept."""
    base = SamplingParams(steps=3, shift=2.0, cfg_high=1.0, cfg_low=2.0, boundary=0.5, sampler="euler", seed=9,
                          attention="sdpa", schedule="lightning", cache_threshold=0.05)
    p = apply_preset(name, base)
    assert (p.steps, p.shift, p.cfg_high, p.cfg_low, p.boundary, p.sampler, p.schedule) == \
        (steps, 10.0, 5.0, 5.0, 0.947, "unipc", "wan")
    assert (p.seed, p.attention, p.cache_threshold) == (9, "sdpa", 0.05)
    assert PRESET_FRAMES[name] == frames
    assert name in SAMPLER_PRESETS
    with pytest.raises(ValueError, match="unknown sampling preset 'official'"):
        apply_preset("official", base)
