"""LingBot-World Camera Plücker Conditioning: a camera path (preset or .npy files) for the sampler."""
from __future__ import annotations

import numpy as np
import torch

from ..pipeline.camera import CameraCondition, camera_from_files, camera_from_preset
from ..wan.camera import PRESETS, draw_trajectory
from . import types
from .model_files import NO_FILE, file_stamp, list_input_files, resolve_input_file

SOURCES = ("preset", "files")
DEFAULT_PRESET = "dolly_in"
PREVIEW_SIZE = (512, 512)
# Size and length inputs shared with the VAE Encode node; both must agree.
WIDTH = ("INT", {"default": 832, "min": 16, "max": 4096, "step": 16,
                 "tooltip": "Video width in pixels (a multiple of 16). Must match the VAE Encode node."})
HEIGHT = ("INT", {"default": 480, "min": 16, "max": 4096, "step": 16,
                  "tooltip": "Video height in pixels (a multiple of 16). Must match the VAE Encode node."})
FRAMES = ("INT", {"default": 81, "min": 1, "max": 1601, "step": 4,
                  "tooltip": "Frames to generate: 4n+1 (81 = 5 s at 16 fps). Must match the VAE Encode node."})


def preview_image(poses: np.ndarray) -> torch.Tensor:
    """The top-down drawing of a path as a ComfyUI IMAGE batch [1, H, W, 3] in 0..1."""
    pixels = draw_trajectory(poses, size=PREVIEW_SIZE)
    return torch.from_numpy(np.ascontiguousarray(pixels)).float().div(255.0)[None]


class LingBotWorldCamera:
    DESCRIPTION = (
        "Turns a camera path into the Plücker-ray conditioning LingBot-World follows. Use a preset "
        "move, or poses.npy ([N,4,4] camera-to-world, OpenCV axes) and intrinsics.npy ([N,4] fx, fy, "
        "cx, cy for 832x480) from ComfyUI's input folder. Also outputs a top-down drawing of the path."
    )
    CATEGORY = types.CATEGORY
    RETURN_TYPES = (types.CAMERA, "IMAGE")
    RETURN_NAMES = ("camera", "path_preview")
    OUTPUT_TOOLTIPS = (
        "Camera conditioning for the LingBot sampler.",
        "Top-down view of the camera path used: green dot = start, red square = end, ticks = view direction.",
    )
    FUNCTION = "build"

    @classmethod
    def INPUT_TYPES(cls):
        npy_files = [NO_FILE] + list_input_files(".npy")
        return {
            "required": {
                "source": (list(SOURCES), {
                    "default": "preset",
                    "tooltip": "preset: a built-in camera move; files: poses_file and intrinsics_file.",
                }),
                "preset": (list(PRESETS), {"default": DEFAULT_PRESET, "tooltip": "Camera move when source is preset."}),
                "speed": ("FLOAT", {
                    "default": 1.0, "min": 0.0, "max": 8.0, "step": 0.05,
                    "tooltip": "How far a preset pans, tilts or orbits (1 = 40 degrees over 81 frames). "
                    "A dolly's distance is normalized by the model, so speed does not change it.",
                }),
                "poses_file": (npy_files, {
                    "tooltip": "poses.npy in ComfyUI's input folder (or a subfolder): [N,4,4] camera-to-world.",
                }),
                "intrinsics_file": (npy_files, {
                    "tooltip": "intrinsics.npy in ComfyUI's input folder: [N,4] fx, fy, cx, cy in pixels of 832x480.",
                }),
                "width": WIDTH,
                "height": HEIGHT,
                "frames": FRAMES,
            }
        }

    @classmethod
    def IS_CHANGED(cls, source, poses_file, intrinsics_file, **_):
        # Same names, new contents: the files' stamps make ComfyUI run the node again.
        if source != "files":
            return source
        stamps = []
        for field, name in (("poses_file", poses_file), ("intrinsics_file", intrinsics_file)):
            try:
                stamps.append(file_stamp(resolve_input_file(name, field, ".npy")))
            except (ValueError, OSError):
                stamps.append(str(name))  # the run itself reports the problem
        return "|".join(stamps)

    def build(self, source: str, preset: str, speed: float, poses_file: str, intrinsics_file: str,
              width: int, height: int, frames: int):
        if source == "files":
            poses_path = resolve_input_file(poses_file, "poses_file", ".npy")
            intrinsics_path = resolve_input_file(intrinsics_file, "intrinsics_file", ".npy")
            camera: CameraCondition = camera_from_files(poses_path, intrinsics_path, frames, height, width)
        elif source == "preset":
            camera = camera_from_preset(preset, speed, frames, height, width)
        else:
            raise ValueError(f"source: {source!r} is not one of {', '.join(SOURCES)}")
        # The drawing shows the part of the path the video uses.
        return (camera, preview_image(camera.poses))
