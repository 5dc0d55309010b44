"""LingBot-World Camera Plücker Conditioning: a camera path (preset or .npy files) for the sampler."""
from __future__ import annotations

import numpy as np
import torch
from comfy_api.latest import io

from ..pipeline.camera import CameraCondition, camera_from_files, camera_from_preset
from ..wan.camera import PRESETS, draw_trajectory
from . import types
from .model_files import NO_FILE, file_stamp, list_input_files, resolve_input_file

SOURCES = ("preset", "files")
DEFAULT_PRESET = "dolly_in"
PREVIEW_SIZE = (512, 512)


# Size and length inputs shared with the VAE Encode node; both must agree.
def width_input() -> io.Int.Input:
    return io.Int.Input("width", default=832, min=16, max=4096, step=16,
                        tooltip="Video width in pixels (a multiple of 16). Must match the VAE Encode node.")


def height_input() -> io.Int.Input:
    return io.Int.Input("height", default=480, min=16, max=4096, step=16,
                        tooltip="Video height in pixels (a multiple of 16). Must match the VAE Encode node.")


def frames_input() -> io.Int.Input:
    return io.Int.Input("frames", default=81, min=1, max=1601, step=4,
                        tooltip="Frames to generate: 4n+1 (81 = 5 s at 16 fps). Must match the VAE Encode node.")


def preview_image(poses: np.ndarray) -> torch.Tensor:
    """The top-down drawing of a path as a ComfyUI IMAGE batch [1, H, W, 3] in 0..1."""
    pixels = draw_trajectory(poses, size=PREVIEW_SIZE)
    return torch.from_numpy(np.ascontiguousarray(pixels)).float().div(255.0)[None]


class LingBotWorldCamera(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        npy_files = [NO_FILE] + list_input_files(".npy")
        return io.Schema(
            node_id="LingBotWorldCamera",
            display_name="LingBot-World Camera Plücker Conditioning",
            category=types.CATEGORY,
            description=(
                "Turns a camera path into the Plücker-ray conditioning LingBot-World follows. Use a preset "
                "move, or poses.npy ([N,4,4] camera-to-world, OpenCV axes) and intrinsics.npy ([N,4] fx, fy, "
                "cx, cy for 832x480) from ComfyUI's input folder. Also outputs a top-down drawing of the path."
            ),
            inputs=[
                io.Combo.Input("source", options=list(SOURCES), default="preset",
                               tooltip="preset: a built-in camera move; files: poses_file and intrinsics_file."),
                io.Combo.Input("preset", options=list(PRESETS), default=DEFAULT_PRESET,
                               tooltip="Camera move when source is preset."),
                io.Float.Input("speed", default=1.0, min=0.0, max=8.0, step=0.05,
                               tooltip="How far a preset pans, tilts or orbits (1 = 40 degrees over 81 frames). "
                               "A dolly's distance is normalized by the model, so speed does not change it."),
                io.Combo.Input("poses_file", options=npy_files,
                               tooltip="poses.npy in ComfyUI's input folder (or a subfolder): [N,4,4] camera-to-world."),
                io.Combo.Input("intrinsics_file", options=npy_files,
                               tooltip="intrinsics.npy in ComfyUI's input folder: [N,4] fx, fy, cx, cy in pixels of 832x480."),
                width_input(),
                height_input(),
                frames_input(),
            ],
            outputs=[
                types.Camera.Output("camera", display_name="camera",
                                     tooltip="Camera conditioning for the LingBot sampler."),
                io.Image.Output("path_preview", display_name="path_preview",
                                tooltip="Top-down view of the camera path used: green dot = start, red square = end, "
                                "ticks = view direction."),
            ],
        )

    @classmethod
    def fingerprint_inputs(cls, source, poses_file, intrinsics_file, **_):
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

    @classmethod
    def validate_inputs(cls, poses_file, intrinsics_file) -> bool | str:
        return types.offered(cls, poses_file=poses_file, intrinsics_file=intrinsics_file)

    @classmethod
    def execute(cls, source: str, preset: str, speed: float, poses_file: str, intrinsics_file: str,
                width: int, height: int, frames: int) -> io.NodeOutput:
        if source == "files":
            poses_path = resolve_input_file(poses_file, "poses_file", ".npy")
            intrinsics_path = resolve_input_file(intrinsics_file, "intrinsics_file", ".npy")
            camera: CameraCondition = camera_from_files(poses_path, intrinsics_path, frames, height, width)
        elif source == "preset":
            camera = camera_from_preset(preset, speed, frames, height, width)
        else:
            raise ValueError(f"source: {source!r} is not one of {', '.join(SOURCES)}")
        # The drawing shows the part of the path the video uses.
        return io.NodeOutput(camera, preview_image(camera.poses))
