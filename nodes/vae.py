"""LingBot-World Wan VAE Encode / Decode: first frame -> I2V condition, latent -> video frames."""
from __future__ import annotations

import torch

import comfy.utils

from ..pipeline.decode import decode
from ..pipeline.image import I2VCondition, encode_image
from . import types
from .camera import FRAMES, HEIGHT, WIDTH
from .devices import DEVICE_CHOICES, DEVICE_TOOLTIP, VAE_WORKSPACE, check_interrupt, make_room, pick_device
from .model_files import VAE_KINDS, list_vae_files, resolve_model_path

VAE_TOOLTIP = "Wan2.1 VAE weights (Wan2.1_VAE.pth) from models/lingbot or models/vae."


def _vae_input():
    return (list_vae_files(), {"tooltip": VAE_TOOLTIP})


def video_to_images(video: torch.Tensor) -> torch.Tensor:
    """[3, F, H, W] in [-1, 1] -> ComfyUI IMAGE batch [F, H, W, 3] in [0, 1]."""
    return video.add(1.0).div_(2.0).clamp_(0.0, 1.0).permute(1, 2, 3, 0).contiguous()


class LingBotWorldVAEEncode:
    DESCRIPTION = (
        "Encodes the start image with the Wan2.1 VAE into the image-to-video condition (the first "
        "frame plus a mask for the frames to generate). The image is resized to width x height; "
        "the VAE is freed afterwards."
    )
    CATEGORY = types.CATEGORY
    RETURN_TYPES = (types.I2V,)
    RETURN_NAMES = ("i2v",)
    OUTPUT_TOOLTIPS = ("Image-to-video condition for the LingBot sampler.",)
    FUNCTION = "encode"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "image": ("IMAGE", {"tooltip": "Start frame of the video (the first image of a batch is used)."}),
                "vae": _vae_input(),
                "width": WIDTH,
                "height": HEIGHT,
                "frames": FRAMES,
                "device": (list(DEVICE_CHOICES), {"default": "auto", "tooltip": DEVICE_TOOLTIP}),
            }
        }

    def encode(self, image: torch.Tensor, vae: str, width: int, height: int, frames: int, device: str):
        vae_path = resolve_model_path(vae, VAE_KINDS, "vae", want_dir=False)
        if not isinstance(image, torch.Tensor) or image.dim() != 4 or image.shape[0] < 1 or image.shape[-1] not in (1, 3, 4):
            shape = tuple(image.shape) if isinstance(image, torch.Tensor) else type(image).__name__
            raise ValueError(f"image: expected a ComfyUI IMAGE batch [B, H, W, 3], got {shape}")
        target = pick_device(device)
        make_room(target, vae_path, VAE_WORKSPACE)
        condition: I2VCondition = encode_image(
            vae_path, image[0], frames, height, width, target, check_interrupt=check_interrupt
        )
        return (condition,)


class LingBotWorldVAEDecode:
    DESCRIPTION = (
        "Decodes the sampled latent into video frames with the Wan2.1 VAE, then frees the VAE. "
        "Feed the frames to Create Video (16 fps) and Save Video."
    )
    CATEGORY = types.CATEGORY
    RETURN_TYPES = ("IMAGE",)
    RETURN_NAMES = ("frames",)
    OUTPUT_TOOLTIPS = ("The video frames, [frames, height, width, 3] in 0..1.",)
    FUNCTION = "decode"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "samples": ("LATENT", {"tooltip": "Latent from the LingBot-World Dual-Expert Sampler."}),
                "vae": _vae_input(),
                "tile": ("INT", {
                    "default": 0, "min": 0, "max": 512, "step": 8,
                    "tooltip": "0 decodes whole frames. Otherwise the latent tile size (e.g. 32): lower "
                    "VRAM for large videos, a little slower.",
                }),
                "device": (list(DEVICE_CHOICES), {"default": "auto", "tooltip": DEVICE_TOOLTIP}),
            }
        }

    def decode(self, samples: dict, vae: str, tile: int, device: str):
        vae_path = resolve_model_path(vae, VAE_KINDS, "vae", want_dir=False)
        latent = samples.get("samples") if isinstance(samples, dict) else None
        if not isinstance(latent, torch.Tensor) or latent.dim() != 5 or latent.shape[1] != 16:
            shape = tuple(latent.shape) if isinstance(latent, torch.Tensor) else type(latent).__name__
            raise ValueError(
                f"samples: expected a LingBot latent [1, 16, frames, height/8, width/8], got {shape}; "
                "connect the LingBot-World Dual-Expert Sampler"
            )
        if latent.shape[0] != 1:
            raise ValueError(f"samples: holds {latent.shape[0]} videos; the decoder takes one at a time")
        target = pick_device(device)
        make_room(target, vae_path, VAE_WORKSPACE)
        progress = comfy.utils.ProgressBar(latent.shape[2])

        def on_progress(done: int, total: int) -> None:
            check_interrupt()
            progress.update_absolute(done, total)

        video = decode(vae_path, latent[0], target, tile=tile or None, on_progress=on_progress)
        return (video_to_images(video),)
