"""LingBot-World Dual-Expert Sampler: high-noise expert first, then low-noise, one resident at a time."""
from __future__ import annotations

import logging

from comfy_api.latest import io

from ..pipeline.camera import CameraCondition, camera_for_checkpoint
from ..pipeline.image import I2VCondition
from ..pipeline.latent import to_comfy_latent
from ..pipeline.sampler_presets import SAMPLER_PRESETS, apply_preset
from ..pipeline.sampling import SamplingParams, check_camera_matches, sample
from ..pipeline.step_cache import StepStats
from ..wan.geometry import video_tokens
from . import inputs
from .host.devices import check_interrupt
from .host.expert_patcher import DiTExperts, run_experts
from .host.progress import LivePreview
from .inputs import check_input, pick_text

log = logging.getLogger(__name__)


def stats_line(stats: StepStats) -> str:
    """One line on what the step cache saved in a run (forwards = model evaluations, one per CFG branch)."""
    exact = stats.forwards + stats.skipped_forwards + stats.truncated_forwards
    return (f"{stats.forwards} of {exact} forwards computed over {stats.steps} steps "
            f"({stats.skipped_forwards} skipped by the step cache, {stats.truncated_forwards} dropped by CFG "
            f"truncation; cached steps: {stats.cached_steps or 'none'})")


class LingBotWorldSampler(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="LingBotWorldSampler",
            display_name="LingBot-World Dual-Expert Sampler",
            category=inputs.BASE_CATEGORY,
            **inputs.search_aliases("lingbot base", "lingbot act", "lingbot sampler", "lingbot act2cam"),
            description=(
                "Generates the video latent with LingBot-World's two experts: the high-noise expert for "
                "the steps above the boundary, then the low-noise expert. ComfyUI loads one expert at a "
                "time and drops it when the other takes over. The prompt comes from the text input or from "
                "core CLIP Text Encode nodes (positive and negative). The camera input is optional: without "
                "it the camera layers are skipped. A Base-Cam checkpoint follows camera paths and action strings; "
                "the Act checkpoint follows action strings and Act files (poses + action.npy)."
            ),
            inputs=[
                *inputs.model_inputs(),
                inputs.I2VCond.Input("i2v", tooltip="Start-frame condition from LingBot-World Wan VAE Encode."),
                io.Int.Input("steps", default=40, min=1, max=200,
                             tooltip="Denoising steps (the reference uses 70; 40 is common)."),
                *inputs.guidance_inputs("Seed of the starting noise."),
                inputs.Camera.Input("camera", optional=True,
                                   tooltip=f"Camera path from {inputs.CAMERA_NODE}. "
                                   "Its width, height and frames must match the VAE Encode node."),
                *inputs.conditioning_inputs(),
                # The step cache. Optional with "off" defaults, after every older widget: saved
                # workflows keep their widget order, and API graphs without them run exactly.
                io.Float.Input("cache_threshold", default=0.0, min=0.0, max=1.0, step=0.005, optional=True,
                               tooltip="Step caching (EasyCache, Zhou et al. 2025): reuse the model's last "
                               "change while its predicted change stays under this threshold. 0 = off (exact). "
                               "The authors use 0.05 for Wan2.2 I2V; higher skips more steps and drifts further "
                               "from the exact video."),
                io.Float.Input("cfg_truncate", default=0.0, min=0.0, max=1.0, step=0.05, optional=True,
                               tooltip="Skip the negative-prompt pass for this last fraction of the steps "
                               "(0 = off). Saves one of the two forwards of each of those steps."),
                inputs.attention_input("Attention kernel of this sampler's runs."),
                io.Combo.Input("preset", options=list(SAMPLER_PRESETS), default="none", optional=True,
                               tooltip="Overrides steps, shift, cfg, boundary and sampler. lightning_4step: the "
                               "Wan2.2-Lightning 4-step settings (4 steps, cfg 1, euler, shift 5, boundary 0.9; "
                               "caching off), for the Wan2.2-Lightning LoRAs (LingBot-World LoRA Loader), untested "
                               "on LingBot's fine-tuned experts. official_act2cam: the official act2cam example "
                               "(an action string on Base-Cam): 20 steps, unipc, shift 10, cfg 5/5, boundary 0.947, "
                               "with 121 frames on the Camera and VAE Encode nodes. official_act: the official Act "
                               "settings: the same with 70 steps, 81 frames."),
            ],
            outputs=[io.Latent.Output("samples", display_name="samples",
                                      tooltip="The denoised video latent (ComfyUI's Wan 2.1 format), for LingBot-World "
                                      "Wan VAE Decode or core VAE Decode.")],
        )

    @classmethod
    def execute(cls, dit, i2v, steps, shift, cfg_high, cfg_low, boundary, seed, sampler, text=None, camera=None,
                positive=None, negative=None, cache_threshold: float = 0.0, cfg_truncate: float = 0.0,
                attention: str = "auto", preset: str = "none") -> io.NodeOutput:
        check_input(dit, DiTExperts, "dit", "LingBot-World NF4 DiT Loader")
        text = pick_text(text, positive, negative, dit.config.text_dim)
        check_input(i2v, I2VCondition, "i2v", "LingBot-World Wan VAE Encode")
        if camera is not None:
            check_input(camera, CameraCondition, "camera", inputs.CAMERA_NODE)
            # Base-Cam or Act: the wrong pairing fails here, before an expert loads; an action
            # string's camera is rebuilt with the control the checkpoint reads.
            camera = camera_for_checkpoint(camera, dit.config.control_type, dit.label)
        inputs.check_sampler(sampler)
        if preset not in SAMPLER_PRESETS:
            raise ValueError(f"preset: {preset!r} is not one of {', '.join(SAMPLER_PRESETS)}")
        if not 0.0 <= cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold: {cache_threshold} is outside 0..1 (0 = off, 0.05 recommended)")
        if not 0.0 <= cfg_truncate <= 1.0:
            raise ValueError(f"cfg_truncate: {cfg_truncate} is outside 0..1 (a fraction of the steps)")
        check_camera_matches(camera, i2v)  # before any expert is loaded
        params = SamplingParams(steps=steps, shift=shift, cfg_high=cfg_high, cfg_low=cfg_low,
                                boundary=boundary, seed=seed, sampler=sampler, cache_threshold=cache_threshold,
                                cfg_truncate=cfg_truncate, attention=inputs.check_attention(attention))
        params = apply_preset(preset, params)
        steps = params.steps
        _, f_lat, lat_h, lat_w = i2v.y.shape
        tokens = video_tokens(f_lat, lat_h, lat_w, dit.config.patch_size)
        live = LivePreview(steps)

        comfy_source, source = run_experts(dit, tokens)  # with the LoRA Loaders' LoRAs
        stats = StepStats()
        try:
            latent = sample(source, text, i2v, camera, params, check_interrupt=check_interrupt, on_preview=live.on_preview,
                            stats=stats)
        finally:
            comfy_source.close()  # also on interrupt or a bad LoRA: no expert stays resident after this node
        log.info("LingBot sampler: %s", stats_line(stats))
        return io.NodeOutput({"samples": to_comfy_latent(latent)[None]})
