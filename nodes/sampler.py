"""LingBot-World Dual-Expert Sampler: high-noise expert first, then low-noise, one resident at a time."""
from __future__ import annotations

import comfy.utils

from ..pipeline.camera import CameraCondition
from ..pipeline.image import I2VCondition
from ..pipeline.sampling import SamplingParams, check_camera_matches, sample
from ..pipeline.text import TextEmbeddings
from . import types
from .devices import check_interrupt
from .expert_patcher import ComfyExpertSource, DiTExperts

SAMPLERS = ("unipc", "euler")
MAX_SEED = 0xFFFF_FFFF_FFFF_FFFF


def _check_input(value, kind: type, field: str, source: str) -> None:
    if not isinstance(value, kind):
        raise ValueError(f"{field}: expected the output of {source}, got {type(value).__name__}")


class LingBotWorldSampler:
    DESCRIPTION = (
        "Generates the video latent with LingBot-World's two experts: the high-noise expert for "
        "the steps above the boundary, then the low-noise expert. ComfyUI loads one expert at a "
        "time and drops it when the other takes over. The camera input is optional: without it "
        "the camera layers are skipped."
    )
    CATEGORY = types.CATEGORY
    RETURN_TYPES = ("LATENT",)
    RETURN_NAMES = ("samples",)
    OUTPUT_TOOLTIPS = ("The denoised video latent, for the LingBot-World Wan VAE Decode node.",)
    FUNCTION = "generate"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "dit": (types.DIT, {"tooltip": "Both experts, from the LingBot-World NF4 DiT Loader."}),
                "text": (types.TEXT, {"tooltip": "Prompt embeddings from LingBot-World T5 Encode + Unload."}),
                "i2v": (types.I2V, {"tooltip": "Start-frame condition from LingBot-World Wan VAE Encode."}),
                "steps": ("INT", {"default": 40, "min": 1, "max": 200,
                                  "tooltip": "Denoising steps (the reference uses 70; 40 is common)."}),
                "shift": ("FLOAT", {"default": 10.0, "min": 0.1, "max": 100.0, "step": 0.1,
                                    "tooltip": "Flow-matching sigma shift; higher spends more steps at high noise."}),
                "cfg_high": ("FLOAT", {"default": 5.0, "min": 1.0, "max": 30.0, "step": 0.1,
                                       "tooltip": "Guidance scale while the high-noise expert runs (1 = no negative pass)."}),
                "cfg_low": ("FLOAT", {"default": 5.0, "min": 1.0, "max": 30.0, "step": 0.1,
                                      "tooltip": "Guidance scale while the low-noise expert runs (1 = no negative pass)."}),
                "boundary": ("FLOAT", {"default": 0.947, "min": 0.0, "max": 1.0, "step": 0.001,
                                       "tooltip": "Switch from the high- to the low-noise expert when the timestep "
                                       "falls below boundary x 1000."}),
                "seed": ("INT", {"default": 0, "min": 0, "max": MAX_SEED, "control_after_generate": True,
                                 "tooltip": "Seed of the starting noise."}),
                "sampler": (list(SAMPLERS), {"default": "unipc",
                                             "tooltip": "unipc: the reference solver; euler: plain flow-matching steps."}),
            },
            "optional": {
                "camera": (types.CAMERA, {"tooltip": "Camera path from LingBot-World Camera Plücker Conditioning. "
                                          "Its width, height and frames must match the VAE Encode node."}),
            },
        }

    def generate(self, dit, text, i2v, steps, shift, cfg_high, cfg_low, boundary, seed, sampler, camera=None):
        _check_input(dit, DiTExperts, "dit", "LingBot-World NF4 DiT Loader")
        _check_input(text, TextEmbeddings, "text", "LingBot-World T5 Encode + Unload")
        _check_input(i2v, I2VCondition, "i2v", "LingBot-World Wan VAE Encode")
        if camera is not None:
            _check_input(camera, CameraCondition, "camera", "LingBot-World Camera Plücker Conditioning")
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler: {sampler!r} is not one of {', '.join(SAMPLERS)}")
        check_camera_matches(camera, i2v)  # before any expert is loaded
        params = SamplingParams(steps=steps, shift=shift, guide_high=cfg_high, guide_low=cfg_low,
                                boundary=boundary, seed=seed, sampler=sampler)
        _, f_lat, lat_h, lat_w = i2v.y.shape
        pt, ph, pw = dit.config.patch_size
        tokens = (f_lat // pt) * (lat_h // ph) * (lat_w // pw)
        source = ComfyExpertSource(dit, inference_memory=dit.high.inference_memory(tokens, dit.config.dim))
        progress = comfy.utils.ProgressBar(steps)
        try:
            latent = sample(source, text, i2v, camera, params,
                            on_step=lambda done, total: progress.update_absolute(done, total),
                            check_interrupt=check_interrupt)
        finally:
            source.close()  # also on interrupt: no expert stays resident after this node
        return ({"samples": latent[None]},)
