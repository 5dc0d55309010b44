"""LingBot-World Wan VAE Encode / Decode: first frame -> I2V condition, latent -> video frames.

The VAE is either a file from the combo or a core ComfyUI VAE (VAELoader with
wan_2.1_vae.safetensors) on the optional ``vae_model`` input: the pack then builds its own
WanVAE from that VAE's state dict, so the arithmetic is the same either way.
"""
from __future__ import annotations

from pathlib import Path

import torch
from comfy_api.latest import io

import comfy.utils

from ..pipeline.decode import decode
from ..pipeline.image import I2VCondition, VAESource, encode_image
from ..pipeline.latent import from_comfy_latent
from . import types
from .camera import frames_input, height_input, width_input
from .devices import DEVICE_CHOICES, DEVICE_TOOLTIP, VAE_WORKSPACE, check_interrupt, make_room, pick_device
from .model_files import NO_FILE, VAE_KINDS, list_vae_files, resolve_model_path

VAE_TOOLTIP = (
    "Wan2.1 VAE weights (Wan2.1_VAE.pth or wan_2.1_vae.safetensors) from models/lingbot or models/vae. "
    "Not used when vae_model is connected."
)
VAE_MODEL_TOOLTIP = (
    "Optional: a core Load VAE node with wan_2.1_vae.safetensors. When connected it is used instead of "
    "the vae file."
)


def vae_file_inputs() -> list[io.Input]:
    files = list_vae_files()
    return [
        # "(none)" lets a workflow that only uses vae_model carry no file name; a fresh node
        # still defaults to the first file found.
        io.Combo.Input("vae", options=files + [NO_FILE], default=files[0] if files else NO_FILE, tooltip=VAE_TOOLTIP),
    ]


def vae_model_input() -> io.Vae.Input:
    return io.Vae.Input("vae_model", optional=True, tooltip=VAE_MODEL_TOOLTIP)


PRECISIONS = ("fp32", "bf16")


def _precision_input() -> io.Combo.Input:
    # Optional and last: graphs saved before it keep their widget values and validate.
    return io.Combo.Input(
        "precision", options=list(PRECISIONS), default="fp32", optional=True,
        tooltip="fp32 matches the reference VAE. bf16 halves the VAE's memory (480x832x81 decode: 4.4 instead "
        "of 8.7 GiB on an H100) and is ~1.7x faster; its decoded pixels differed from fp32 by 0.006 on "
        "average (max 0.06, on the -1..1 scale; synthetic weights, bench/RESULTS.md).",
    )


def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision: {precision!r} is not one of {', '.join(PRECISIONS)}")


def vae_source(vae: str, vae_model) -> tuple[VAESource, int | Path]:
    """What the pipeline loads (a state dict or a file) and its size for make_room."""
    if vae_model is not None:
        get_sd = getattr(vae_model, "get_sd", None)
        if get_sd is None:
            raise ValueError(f"vae_model: expected a VAE from Load VAE, got {type(vae_model).__name__}")
        tensors = get_sd()
        return tensors, sum(t.numel() * t.element_size() for t in tensors.values())
    if vae == NO_FILE:
        raise ValueError("vae: choose a Wan2.1 VAE file, or connect a Load VAE node to vae_model")
    path = resolve_model_path(vae, VAE_KINDS, "vae", want_dir=False)
    return path, path


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
            category=types.CATEGORY,
            description=(
                "Encodes the start image with the Wan2.1 VAE into the image-to-video condition (the first "
                "frame plus a mask for the frames to generate). The image is resized to width x height; "
                "the VAE is freed afterwards."
            ),
            inputs=[
                io.Image.Input("image", tooltip="Start frame of the video (the first image of a batch is used)."),
                *vae_file_inputs(),
                width_input(),
                height_input(),
                frames_input(),
                io.Combo.Input("device", options=list(DEVICE_CHOICES), default="auto", tooltip=DEVICE_TOOLTIP),
                vae_model_input(),
                _precision_input(),
            ],
            outputs=[types.I2VCond.Output("i2v", display_name="i2v",
                                          tooltip="Image-to-video condition for the LingBot sampler.")],
        )

    @classmethod
    def validate_inputs(cls, vae) -> bool | str:
        return types.offered(cls, vae=vae)

    @classmethod
    def execute(cls, image: torch.Tensor, vae: str, width: int, height: int, frames: int, device: str,
                vae_model=None, precision: str = "fp32") -> io.NodeOutput:
        _check_precision(precision)
        source, size = vae_source(vae, vae_model)
        if not isinstance(image, torch.Tensor) or image.dim() != 4 or image.shape[0] < 1 or image.shape[-1] not in (1, 3, 4):
            shape = tuple(image.shape) if isinstance(image, torch.Tensor) else type(image).__name__
            raise ValueError(f"image: expected a ComfyUI IMAGE batch [B, H, W, 3], got {shape}")
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
            category=types.CATEGORY,
            description=(
                "Decodes the sampled latent into video frames with the Wan2.1 VAE, then frees the VAE. "
                "Feed the frames to Create Video (16 fps) and Save Video. Takes any Wan 2.1 LATENT, "
                "so core VAE Decode works on the sampler's output as well."
            ),
            inputs=[
                io.Latent.Input("samples", tooltip="Latent from the LingBot-World Dual-Expert Sampler "
                                "(or any Wan 2.1 video latent)."),
                *vae_file_inputs(),
                io.Int.Input("tile", default=0, min=0, max=512, step=8,
                             tooltip="0 decodes whole frames. Otherwise the latent tile size (e.g. 32): lower "
                             "VRAM for large videos, a little slower."),
                io.Combo.Input("device", options=list(DEVICE_CHOICES), default="auto", tooltip=DEVICE_TOOLTIP),
                vae_model_input(),
                _precision_input(),
            ],
            outputs=[io.Image.Output("frames", display_name="frames",
                                     tooltip="The video frames, [frames, height, width, 3] in 0..1.")],
        )

    @classmethod
    def validate_inputs(cls, vae) -> bool | str:
        return types.offered(cls, vae=vae)

    @classmethod
    def execute(cls, samples: dict, vae: str, tile: int, device: str, vae_model=None,
                precision: str = "fp32") -> io.NodeOutput:
        _check_precision(precision)
        latent = samples.get("samples") if isinstance(samples, dict) else None
        if not isinstance(latent, torch.Tensor) or latent.dim() != 5 or latent.shape[1] != 16:
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
