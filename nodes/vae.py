"""LingBot-World Wan VAE Encode / Decode: first frame -> I2V condition, latent -> video frames.

The VAE is either a file from the combo or a core ComfyUI VAE (VAELoader with
wan_2.1_vae.safetensors) on the optional ``vae_model`` input: the pack then builds its own
WanVAE from that VAE's state dict, so the arithmetic is the same either way.
"""
from __future__ import annotations

import torch
from comfy_api.latest import io

import comfy.utils

from ..pipeline.decode import decode
from ..pipeline.image import I2VCondition, encode_image
from ..pipeline.latent import from_comfy_latent
from ..wan.geometry import LATENT_CHANNELS
from . import inputs
from .host.devices import VAE_WORKSPACE, check_interrupt, make_room, pick_device
from .inputs import check_precision, vae_source


def video_to_images(video: torch.Tensor) -> torch.Tensor:
    """[3, F, H, W] in [-1, 1] -> ComfyUI IMAGE batch [F, H, W, 3] in [0, 1], with one copy
    (the IMAGE batch, rescaled in place): what pipeline.memory.DECODE_BYTES_PER_PIXEL counts."""
    images = torch.empty((*video.shape[1:], 3), dtype=video.dtype, device=video.device)
    images.copy_(video.permute(1, 2, 3, 0))
    return images.add_(1.0).div_(2.0).clamp_(0.0, 1.0)


class LingBotWorldVAEEncode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="LingBotWorldVAEEncode",
            display_name="LingBot-World Wan VAE Encode",
            category=inputs.FILES_CATEGORY,
            **inputs.search_aliases("lingbot vae", "lingbot image", "lingbot video"),
            description=(
                "Encodes the start image with the Wan2.1 VAE into the image-to-video condition (the first "
                "frame plus a mask for the frames to generate). The image is resized to width x height; "
                "the VAE is freed afterwards."
            ),
            inputs=[
                inputs.image_input(),
                *inputs.vae_file_inputs(),
                inputs.width_input(inputs.MATCH_CAMERA),
                inputs.height_input(inputs.MATCH_CAMERA),
                inputs.frames_input(match=inputs.MATCH_CAMERA),
                inputs.device_input(),
                inputs.vae_model_input(),
                inputs.precision_input(),
            ],
            outputs=[inputs.I2VCond.Output("i2v", display_name="i2v",
                                          tooltip="Image-to-video condition for the LingBot sampler.")],
        )

    @classmethod
    def validate_inputs(cls, vae) -> bool | str:
        return inputs.offered(cls, vae=vae)

    @classmethod
    def execute(cls, image: torch.Tensor, vae: str, width: int, height: int, frames: int, device: str,
                vae_model=None, precision: str = "fp32") -> io.NodeOutput:
        check_precision(precision)
        source, size = vae_source(vae, vae_model)
        inputs.check_image(image)
        target = pick_device(device)
        make_room(target, size, VAE_WORKSPACE)
        condition: I2VCondition = encode_image(
            source, image[0], frames, height, width, target, check_interrupt=check_interrupt, precision=precision
        )
        return io.NodeOutput(condition)


class LingBotWorldVAEDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="LingBotWorldVAEDecode",
            display_name="LingBot-World Wan VAE Decode",
            category=inputs.FILES_CATEGORY,
            **inputs.search_aliases("lingbot vae", "lingbot image", "lingbot video"),
            description=(
                "Decodes the sampled latent into video frames with the Wan2.1 VAE, then frees the VAE. "
                "Feed the frames to Create Video (16 fps) and Save Video. Takes any Wan 2.1 LATENT, "
                "so core VAE Decode works on the sampler's output as well."
            ),
            inputs=[
                io.Latent.Input("samples", tooltip="Latent from the LingBot-World Dual-Expert Sampler "
                                "(or any Wan 2.1 video latent)."),
                *inputs.vae_file_inputs(),
                io.Int.Input("tile", default=0, min=0, max=512, step=8,
                             tooltip="0 decodes whole frames. Otherwise the latent tile size (e.g. 32): lower "
                             "VRAM for large videos, a little slower."),
                inputs.device_input(),
                inputs.vae_model_input(),
                inputs.precision_input(),
            ],
            outputs=[io.Image.Output("frames", display_name="frames",
                                     tooltip="The video frames, [frames, height, width, 3] in 0..1.")],
        )

    @classmethod
    def validate_inputs(cls, vae) -> bool | str:
        return inputs.offered(cls, vae=vae)

    @classmethod
    def execute(cls, samples: dict, vae: str, tile: int, device: str, vae_model=None,
                precision: str = "fp32") -> io.NodeOutput:
        check_precision(precision)
        latent = samples.get("samples") if isinstance(samples, dict) else None
        if not isinstance(latent, torch.Tensor) or latent.dim() != 5 or latent.shape[1] != LATENT_CHANNELS:
            shape = tuple(latent.shape) if isinstance(latent, torch.Tensor) else type(latent).__name__
            raise ValueError(
                f"samples: expected a Wan 2.1 latent [1, 16, frames, height/8, width/8], got {shape}; "
                "connect the LingBot-World Dual-Expert Sampler"
            )
        if latent.shape[0] != 1:
            raise ValueError(f"samples: holds {latent.shape[0]} videos; the decoder takes one at a time")
        # The LATENT holds the raw VAE latent (ComfyUI's Wan21 convention); the pack's VAE
        # decodes the normalized one. Converted (and its shape checked) before any room is made.
        normalized = from_comfy_latent(latent[0], "samples")
        source, size = vae_source(vae, vae_model)
        target = pick_device(device)
        make_room(target, size, VAE_WORKSPACE)
        progress = comfy.utils.ProgressBar(latent.shape[2])

        def on_progress(done: int, total: int) -> None:
            progress.update_absolute(done, total)

        # Cancel is checked before every decoded frame.
        video = decode(source, normalized, target, tile=tile or None, on_progress=on_progress,
                       check_interrupt=check_interrupt, precision=precision)
        return io.NodeOutput(video_to_images(video))
