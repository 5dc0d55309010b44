"""Sampling presets: settings a distilled adapter was trained for, as plain SamplingParams."""
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

SAMPLER_PRESETS = ("none", "lightning_4step")


def lightning_4step(base: SamplingParams = SamplingParams()) -> SamplingParams:
    """``base`` with the Wan2.2-Lightning I2V 4-step settings; seed, batch_cfg and attention kept.

    Step caching and CFG truncation are switched off: there is nothing left to skip."""
    return replace(base, steps=LIGHTNING_STEPS, shift=LIGHTNING_SHIFT, cfg_high=1.0, cfg_low=1.0,
                   boundary=LIGHTNING_BOUNDARY, sampler=LIGHTNING_SAMPLER, schedule=LIGHTNING_SCHEDULE,
                   cache_threshold=0.0, cfg_truncate=0.0)


def apply_preset(name: str, base: SamplingParams) -> SamplingParams:
    """The sampler node's ``preset`` input: "none" returns ``base`` unchanged."""
    if name == "none":
        return base
    if name == "lightning_4step":
        return lightning_4step(base)
    raise ValueError(f"unknown sampling preset {name!r}; choose one of {', '.join(SAMPLER_PRESETS)}")
