"""The whole image-to-video run outside ComfyUI (the CLI's ``generate`` and the tests):
package files -> prompt embeddings -> experts -> the video, window by window.

A clip of at most one window is one ordinary pass (``sample_windows`` with one window is
``encode_image`` -> ``sample`` -> decode); a longer one is chained windows
(``long_video.py``). Each stage frees its model before the next loads.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from ..loaders.expert_config import read_expert_pair
from ..loaders.new_file import GrowingFile
from ..loaders.package import find_package
from ..wan.long_video import plan_windows
from .camera import CameraPath, check_controls
from .experts import AS_STORED, DiskExperts
from .image import ImageLike
from .long_video import LongVideoResult, WindowedCamera, WindowParams, sample_windows
from .lora import LoraExperts, LoraSpec
from .memory import resolve_device
from .sampling import SamplingParams
from .text import encode_text
from .video_file import VideoWriter

VideoOut = str | Path | GrowingFile | Callable[[torch.Tensor], None]


def generate(
    package: str | Path,
    image: ImageLike,
    prompt: str,
    negative_prompt: str,
    frames: int,
    height: int,
    width: int,
    out: VideoOut,
    camera: CameraPath | None = None,
    params: SamplingParams = SamplingParams(),
    windows: WindowParams = WindowParams(),
    device: torch.device | str | None = None,
    cache_dir: str | Path | None = None,
    quantize: str | None = None,
    weights: str = AS_STORED,
    decode_tile: int | None = None,
    fps: int = 16,
    keep_resident: bool = False,
    blocks_on_gpu: int | None = None,
    loras: list[LoraSpec] | None = None,
    on_step: Callable[[int, int], None] | None = None,
    on_window: Callable[[int, int], None] | None = None,
    check_interrupt: Callable[[], None] | None = None,
) -> LongVideoResult:
    """Make the video and hand it to ``out`` window by window.

    ``out``: an .mp4 written with PyAV at ``fps`` as a ``GrowingFile`` (a new file beside the
    target that takes the target's name after the first window while that name is free, and
    replaces an existing file only when the video is complete; a path is a ``GrowingFile`` with
    overwrite; the caller that passes its own reads from it what was kept after a failure or a
    cancel), or a callable that receives each window's new frames [3, n, H, W] in [-1, 1], in
    order. ``loras``: adapters applied to the experts while they sample (unmerged).
    ``weights``: the kind the experts' linears are held in (``pipeline.experts.WEIGHT_CHOICES``,
    decided by ``weight_kind_for``; ``quantize``: what "as stored" does to a bf16 folder).
    ``blocks_on_gpu``: DiT blocks kept on the GPU (None: all; the rest stream from pinned RAM).
    ``keep_resident``: both experts stay loaded across windows.
    The package's checkpoint (Base-Cam or Act, told by its weights' headers) must be one
    ``camera`` can drive: otherwise ``ControlMismatch`` before anything loads.
    """
    files = find_package(package)
    device = resolve_device(device)
    plan_windows(frames, windows.window, windows.overlap)  # fail early on bad sizes
    control_type = read_expert_pair(files.high, files.low).control_type
    windowed = None
    if camera is not None:
        check_controls(camera, control_type, f"the package {package}")
        windowed = WindowedCamera(camera, frames, height, width, windows.scale_quantile, control_type)
    text = encode_text(files.t5, files.tokenizer, prompt, negative_prompt, device, cache_dir)
    experts = DiskExperts(files.high, files.low, device, quantize, blocks_on_gpu=blocks_on_gpu,
                          keep_resident=keep_resident, weights=weights)
    adapted = LoraExperts(experts, loras) if loras else experts

    def run(write: Callable[[torch.Tensor], None]) -> LongVideoResult:
        return sample_windows(adapted, text, files.vae, image, frames, height, width, windowed, params, windows,
                              write, device=device, decode_tile=decode_tile, on_step=on_step, on_window=on_window,
                              check_interrupt=check_interrupt)

    try:
        if callable(out):
            return run(out)
        video = out if isinstance(out, GrowingFile) else GrowingFile(out, overwrite=True)
        with video, VideoWriter(video.path, fps=fps) as writer:

            def write(piece: torch.Tensor) -> None:  # one window's new frames
                writer.write(piece)
                video.piece_done()

            return run(write)
    finally:
        experts.close()
