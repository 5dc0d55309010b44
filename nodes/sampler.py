"""LingBot-World Dual-Expert Sampler: high-noise expert first, then low-noise, one resident at a time."""
from __future__ import annotations

import torch
from comfy_api.latest import io

import comfy.latent_formats
import comfy.model_management as mm
import comfy.utils
import latent_preview

from ..pipeline.camera import CameraCondition
from ..pipeline.image import I2VCondition
from ..pipeline.latent import to_comfy_latent
from ..pipeline.sampling import SamplingParams, check_camera_matches, sample
from ..pipeline.text import TextEmbeddings
from ..pipeline.text_conditioning import text_from_conditioning
from . import types
from .devices import check_interrupt
from .expert_patcher import ComfyExpertSource, DiTExperts

SAMPLERS = ("unipc", "euler")
MAX_SEED = 0xFFFF_FFFF_FFFF_FFFF
PREVIEW_FORMAT = "JPEG"


def _check_input(value, kind: type, field: str, source: str) -> None:
    if not isinstance(value, kind):
        raise ValueError(f"{field}: expected the output of {source}, got {type(value).__name__}")


def pick_text(text, positive, negative, text_dim: int) -> TextEmbeddings:
    """The prompt embeddings from exactly one source: the pack's T5 node or core CONDITIONING."""
    core = positive is not None or negative is not None
    if text is not None and core:
        raise ValueError("text and positive/negative are both connected; connect either LingBot-World T5 Encode "
                         "+ Unload to text, or CLIP Text Encode nodes to positive and negative")
    if text is None and not core:
        raise ValueError("no prompt: connect LingBot-World T5 Encode + Unload to text, or CLIP Text Encode "
                         "(CLIPLoader type wan) to positive and negative")
    if text is not None:
        _check_input(text, TextEmbeddings, "text", "LingBot-World T5 Encode + Unload")
        return text
    if positive is None:
        raise ValueError("positive: connect a CLIP Text Encode with the prompt next to negative")
    embeddings = text_from_conditioning(positive, negative)
    if embeddings.positive.shape[-1] != text_dim:
        raise ValueError(
            f"positive: the text encoder gives {embeddings.positive.shape[-1]} features per token but the DiT takes "
            f"{text_dim}; load umt5_xxl with CLIPLoader type wan"
        )
    return embeddings


class LingBotWorldSampler(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="LingBotWorldSampler",
            display_name="LingBot-World Dual-Expert Sampler",
            category=types.CATEGORY,
            description=(
                "Generates the video latent with LingBot-World's two experts: the high-noise expert for "
                "the steps above the boundary, then the low-noise expert. ComfyUI loads one expert at a "
                "time and drops it when the other takes over. The prompt comes from the text input or from "
                "core CLIP Text Encode nodes (positive and negative). The camera input is optional: without "
                "it the camera layers are skipped."
            ),
            inputs=[
                types.DiT.Input("dit", tooltip="Both experts, from the LingBot-World NF4 DiT Loader."),
                types.Text.Input("text", optional=True,
                                 tooltip="Prompt embeddings from LingBot-World T5 Encode + Unload. Leave empty when "
                                 "positive and negative are connected."),
                types.I2VCond.Input("i2v", tooltip="Start-frame condition from LingBot-World Wan VAE Encode."),
                io.Int.Input("steps", default=40, min=1, max=200,
                             tooltip="Denoising steps (the reference uses 70; 40 is common)."),
                io.Float.Input("shift", default=10.0, min=0.1, max=100.0, step=0.1,
                               tooltip="Flow-matching sigma shift; higher spends more steps at high noise."),
                io.Float.Input("cfg_high", default=5.0, min=1.0, max=30.0, step=0.1,
                               tooltip="Guidance scale while the high-noise expert runs (1 = no negative pass)."),
                io.Float.Input("cfg_low", default=5.0, min=1.0, max=30.0, step=0.1,
                               tooltip="Guidance scale while the low-noise expert runs (1 = no negative pass)."),
                io.Float.Input("boundary", default=0.947, min=0.0, max=1.0, step=0.001,
                               tooltip="Switch from the high- to the low-noise expert when the timestep "
                               "falls below boundary x 1000."),
                io.Int.Input("seed", default=0, min=0, max=MAX_SEED, control_after_generate=True,
                             tooltip="Seed of the starting noise."),
                io.Combo.Input("sampler", options=list(SAMPLERS), default="unipc",
                               tooltip="unipc: the reference solver; euler: plain flow-matching steps."),
                types.Camera.Input("camera", optional=True,
                                   tooltip="Camera path from LingBot-World Camera Plücker Conditioning. "
                                   "Its width, height and frames must match the VAE Encode node."),
                io.Conditioning.Input("positive", optional=True,
                                      tooltip="Instead of text: the prompt from CLIP Text Encode, with umt5_xxl "
                                      "loaded by CLIPLoader (type wan)."),
                io.Conditioning.Input("negative", optional=True,
                                      tooltip="With positive: the negative prompt from CLIP Text Encode."),
            ],
            outputs=[io.Latent.Output("samples", display_name="samples",
                                      tooltip="The denoised video latent (ComfyUI's Wan 2.1 format), for LingBot-World "
                                      "Wan VAE Decode or core VAE Decode.")],
        )

    @classmethod
    def execute(cls, dit, i2v, steps, shift, cfg_high, cfg_low, boundary, seed, sampler, text=None, camera=None,
                positive=None, negative=None) -> io.NodeOutput:
        _check_input(dit, DiTExperts, "dit", "LingBot-World NF4 DiT Loader")
        text = pick_text(text, positive, negative, dit.config.text_dim)
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
        # ComfyUI's own previewer: it follows the user's preview setting (none, latent2rgb,
        # or the TAE video decoder lighttaew2_1 from models/vae_approx).
        previewer = latent_preview.get_previewer(mm.get_torch_device(), comfy.latent_formats.Wan21())
        progress = comfy.utils.ProgressBar(steps)

        def on_preview(done: int, total: int, x0: torch.Tensor) -> None:
            image = previewer.decode_latent_to_preview_image(PREVIEW_FORMAT, x0[None].float()) if previewer else None
            progress.update_absolute(done, total, image)

        source = ComfyExpertSource(dit, inference_memory=dit.high.inference_memory(tokens, dit.config.dim))
        try:
            latent = sample(source, text, i2v, camera, params, check_interrupt=check_interrupt, on_preview=on_preview)
        finally:
            source.close()  # also on interrupt: no expert stays resident after this node
        return io.NodeOutput({"samples": to_comfy_latent(latent)[None]})
