"""Long videos (up to 961 frames) as chained windows, each handed to a writer as it finishes.

Each window is one ordinary run of ``sampling.sample`` (the sampler's loop is not touched):
window 0 starts on the user's image; window k > 0 starts on the last ``overlap`` frames of
window k − 1, decoded, re-encoded by the VAE and marked as given in the I2V mask. Its
camera is the whole path's piece, re-based to the window's first frame, with one
translation scale for the whole path. After each window its new frames are decoded and
written, so memory holds one window at a time; a cancel between (or inside) windows leaves
a playable file with every finished window. docs/long_videos.md explains the choice.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch

from ..wan.geometry import MAX_SEED, latent_shape
from ..wan.conditioning import given_frames_mask
from ..wan.long_video import Window, plan_windows, translation_scale
from .camera import CameraCondition, CameraPath, ControlMismatch, camera_condition
from .image import I2VCondition, ImageLike, VAESource, encode_image, open_vae, vae_dtype
from .memory import release_module, resolve_device
from .sampling import ExpertSource, SamplingParams, sample
from .text import TextEmbeddings


@dataclass(frozen=True)
class WindowParams:
    window: int = 81  # video frames per window (4n + 1): the length the model was trained on
    overlap: int = 1  # frames each window takes from the previous one (4j + 1)
    scale_quantile: float = 1.0  # 1: the path's largest step is the unit (as one pass)


# --------------------------------------------------------------------------- camera


class WindowedCamera:
    """A camera path cut into the windows of a plan; ``condition(window)`` is what
    ``sampling.sample`` takes for that window.

    ``control_type``: the checkpoint's ("cam" Base-Cam rays, "act" Act rays + W/A/S/D keys;
    None: the first the path gives). The whole path's steps are those of its one-pass camera:
    an action string's are the official act2cam keyframes (F + 1 poses sampled at
    linspace(0, F, F_lat)), a pose path's its F poses at the latent rate.
    """

    def __init__(self, path: CameraPath, frames: int, height: int, width: int, quantile: float = 1.0,
                 control_type: str | None = None) -> None:
        path.check_covers(frames, height, width)
        self.control_type = path.controls[0] if control_type is None else control_type
        if self.control_type not in path.controls:
            raise ControlMismatch(f"{path.source} cannot give {self.control_type!r} controls")
        self.path, self.frames, self.height, self.width = path, frames, height, width
        self.steps = path.path_steps(frames)
        self.scale = translation_scale(self.steps, quantile)
        self.keys = path.video_keys(frames) if self.control_type == "act" else None  # [frames, 4]

    def condition(self, window: Window) -> CameraCondition:
        return camera_condition(self.path, window.frames, self.height, self.width, window=window,
                                path_steps=self.steps, scale=self.scale, control_type=self.control_type,
                                keys=self.keys)


# --------------------------------------------------------------------------- windows


def _continuation(vae: torch.nn.Module, tail: torch.Tensor, window: Window, device: torch.device) -> I2VCondition:
    """The I2V condition of a window that starts on ``tail`` [3, given, H, W] in [-1, 1]."""
    _, given, height, width = tail.shape
    clip = tail.new_zeros(3, window.frames, height, width)
    clip[:, :given] = tail
    with torch.inference_mode():
        latent = vae.encode(clip[None].to(device, vae_dtype(device)))[0].float().cpu()
    n_lat, lat_h, lat_w = latent_shape(window.frames, height, width)
    mask = given_frames_mask(window.frames, given, lat_h, lat_w)
    return I2VCondition(y=torch.cat([mask, latent]), frames=window.frames, height=height, width=width)


@dataclass
class LongVideoResult:
    frames_written: int
    windows: list[Window]
    windows_done: int


def sample_windows(
    experts: ExpertSource,
    text: TextEmbeddings,
    vae_file: VAESource,
    image: ImageLike,
    frames: int,
    height: int,
    width: int,
    camera: WindowedCamera | None,
    params: SamplingParams,
    windows: WindowParams,
    write: Callable[[torch.Tensor], None],
    device: torch.device | str | None = None,
    decode_tile: int | None = None,
    on_step: Callable[[int, int], None] | None = None,
    on_window: Callable[[int, int], None] | None = None,
    check_interrupt: Callable[[], None] | None = None,
    on_latent: Callable[[Window, torch.Tensor], None] | None = None,
    on_preview: Callable[[int, int, torch.Tensor], None] | None = None,
) -> LongVideoResult:
    """Sample, decode and ``write`` the video window by window (see the module docstring).

    ``write`` receives each window's new frames [3, n, H, W] in [-1, 1] in order. Window k
    samples with seed ``params.seed + k``. With one window this is the ordinary run:
    ``encode_image`` → ``sample`` → decode, the same numbers. ``on_step(done, total)`` counts
    steps over all windows, as does ``on_preview(done, total, x0)`` (``sample``'s live preview
    of the window's clean latent). ``vae_file``: a file or a state dict. An exception (a cancel from ``check_interrupt`` included) is
    raised after the frames of the finished windows were written.
    """
    device = resolve_device(device)
    plan = plan_windows(frames, windows.window, windows.overlap)
    if camera is not None and (camera.frames, camera.height, camera.width) != (frames, height, width):
        raise ValueError(f"camera is for {camera.frames} frames at {camera.width}x{camera.height}, the video "
                         f"{frames} frames at {width}x{height}")
    total_steps = params.steps * len(plan)
    result = LongVideoResult(frames_written=0, windows=plan, windows_done=0)
    condition = encode_image(vae_file, image, plan[0].frames, height, width, device, check_interrupt)
    for window in plan:
        if check_interrupt:
            check_interrupt()
        cam = camera.condition(window) if camera is not None else None
        done_before = window.index * params.steps

        def step(i: int, n: int, base: int = done_before) -> None:
            if on_step:
                on_step(base + i, total_steps)

        def preview(i: int, n: int, x0: torch.Tensor, base: int = done_before) -> None:
            if on_preview:
                on_preview(base + i, total_steps, x0)

        seed = (params.seed + window.index) % (MAX_SEED + 1)  # seed + k stays a valid seed at the top
        latent = sample(experts, text, condition, cam, dataclasses.replace(params, seed=seed),
                        on_step=step, check_interrupt=check_interrupt, on_preview=preview if on_preview else None)
        del cam, condition
        if on_latent:
            on_latent(window, latent)
        following = plan[window.index + 1] if window.index + 1 < len(plan) else None
        vae = open_vae(vae_file, device, vae_dtype(device))
        try:
            with torch.inference_mode():
                video = vae.decode(latent[None].to(device, vae_dtype(device)), tile=decode_tile or None)[0]
            video = video.float().cpu()
            del latent
            write(video[:, window.frames - window.new_frames:])
            result.frames_written += window.new_frames
            result.windows_done += 1
            if following is not None:
                tail = video[:, window.frames - following.given:].clone()
                del video
                condition = _continuation(vae, tail, following, device)
                del tail
            else:
                del video
        finally:
            release_module(vae)
            del vae
        if on_window:
            on_window(window.index + 1, len(plan))
    return result
