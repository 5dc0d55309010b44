"""Sampling presets: settings a distilled adapter was trained for, and the official
LingBot-World run settings, as plain SamplingParams. A preset sets the sampler's settings
only; the frame count is the Camera / VAE Encode nodes' (``PRESET_FRAMES`` says which)."""
from __future__ import annotations

from dataclasses import replace

from .sampling import SamplingParams

# Wan2.2-Lightning I2V-A14B (lightx2v, "Wan2.2-I2V-A14B-4steps-lora-rank64-Seko-V1"):
# 4 steps without CFG, flow-matching Euler over the step list [1000, 750, 500, 250]
# shifted with shift 5, the first two steps on the high-noise expert (their
# boundary_step_index 2, boundary 0.9). ComfyUI's own Wan2.2 I2V template with the
# 4-step LoRAs uses the same: 4 steps, cfg 1, euler, shift 5, high-noise steps 0-2.
# The "lightning" schedule gives their sigmas 1, 0.9375, 0.8333, 0.625 and the float
# timesteps 1000, 937.5, 833.33, 625 they feed the DiT (docs/conventions.md#wan22-lightning); the reference's own
# schedule would give 999, 937, 833, 624 (top sigma 1 - 1/1000, truncated to integers).
LIGHTNING_STEPS = 4
LIGHTNING_SHIFT = 5.0
LIGHTNING_BOUNDARY = 0.9  # 937.5 >= 900: steps 0-1 high-noise, 2-3 low-noise
LIGHTNING_SAMPLER = "euler"
LIGHTNING_SCHEDULE = "lightning"

# The official LingBot-World settings (upstream wan/configs/wan_i2v_A14B.py and README,
# docs/conventions.md#official-run-settings): unipc, shift 10, guidance 5 on both experts,
# expert switch at 0.947. Act runs them with 70 steps on 81 frames; the README's act2cam
# example (an action string on Base-Cam) with 20 steps on 121 frames.
OFFICIAL_SHIFT = 10.0
OFFICIAL_CFG = 5.0
OFFICIAL_BOUNDARY = 0.947
OFFICIAL_SAMPLER = "unipc"
OFFICIAL_ACT_STEPS = 70
OFFICIAL_ACT2CAM_STEPS = 20

SAMPLER_PRESETS = ("none", "lightning_4step", "official_act2cam", "official_act")
# The video length each official preset was published with (set on the Camera and VAE Encode nodes).
PRESET_FRAMES = {"official_act2cam": 121, "official_act": 81}


def lightning_4step(base: SamplingParams = SamplingParams()) -> SamplingParams:
    """``base`` with the Wan2.2-Lightning I2V 4-step settings; seed, batch_cfg and attention kept.

    Step caching and CFG truncation are switched off: there is nothing left to skip."""
    return replace(base, steps=LIGHTNING_STEPS, shift=LIGHTNING_SHIFT, cfg_high=1.0, cfg_low=1.0,
                   boundary=LIGHTNING_BOUNDARY, sampler=LIGHTNING_SAMPLER, schedule=LIGHTNING_SCHEDULE,
                   cache_threshold=0.0, cfg_truncate=0.0)


def official(steps: int, base: SamplingParams = SamplingParams()) -> SamplingParams:
    """``base`` with the official LingBot-World settings at ``steps`` steps; seed, batch_cfg,
    attention and the step-cache options kept."""
    return replace(base, steps=steps, shift=OFFICIAL_SHIFT, cfg_high=OFFICIAL_CFG, cfg_low=OFFICIAL_CFG,
                   boundary=OFFICIAL_BOUNDARY, sampler=OFFICIAL_SAMPLER, schedule="wan")


def apply_preset(name: str, base: SamplingParams) -> SamplingParams:
    """The sampler node's ``preset`` input: "none" returns ``base`` unchanged."""
    if name == "none":
        return base
    if name == "lightning_4step":
        return lightning_4step(base)
    if name == "official_act2cam":
        return official(OFFICIAL_ACT2CAM_STEPS, base)
    if name == "official_act":
        return official(OFFICIAL_ACT_STEPS, base)
    raise ValueError(f"unknown sampling preset {name!r}; choose one of {', '.join(SAMPLER_PRESETS)}")
