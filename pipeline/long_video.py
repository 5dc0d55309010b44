"""Long videos (up to 961 frames) as chained windows, streamed to an .mp4 as they finish.

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
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..loaders.package import find_package
from ..loaders.pose_import import import_poses
from ..loaders.trajectory import read_trajectory
from ..wan.camera import CameraError, camera_tensor, preset_trajectory, usable_frames, validate_trajectory
from ..wan.camera_actions import action_poses, default_intrinsics
from ..wan.conditioning import check_frame_count, check_size, latent_shape
from ..wan.long_video import Window, given_frames_mask, path_keyframes, plan_windows, translation_scale, window_camera
from . import experts as experts_mod
from .camera import CameraCondition
from .experts import DiskExperts
from .image import I2VCondition, ImageLike, VAESource, encode_image, open_vae, vae_dtype
from .lora import LoraExperts, LoraSpec
from .memory import release_module, resolve_device
from .sampling import MAX_SEED, ExpertSource, SamplingParams, sample
from .text import TextEmbeddings, encode_text
from .video_file import VideoWriter


@dataclass(frozen=True)
class WindowParams:
    window: int = 81  # video frames per window (4n + 1): the length the model was trained on
    overlap: int = 1  # frames each window takes from the previous one (4j + 1)
    scale_quantile: float = 1.0  # 1: the path's largest step is the unit (as one pass)


# --------------------------------------------------------------------------- camera paths


@dataclass
class CameraPath:
    """A whole camera path: camera-to-world poses (OpenCV axes) and one intrinsics row in
    480×832 pixels. Build with the ``path_from_*`` functions."""

    poses: np.ndarray  # [N, 4, 4]
    intrinsics: np.ndarray  # [4]
    source: str


def path_from_actions(actions: str, frames: int, height: int, width: int,
                      intrinsics: np.ndarray | None = None) -> CameraPath:
    k = default_intrinsics(height, width) if intrinsics is None else np.asarray(intrinsics, dtype=np.float64)
    return CameraPath(action_poses(actions, frames), k, f"actions {actions!r}")


def path_from_preset(name: str, speed: float, frames: int) -> CameraPath:
    poses, k = preset_trajectory(name, frames, speed)
    return CameraPath(poses.astype(np.float64), k[0].astype(np.float64), f"preset {name!r}")


def path_from_files(poses: str | Path, intrinsics: str | Path) -> CameraPath:
    p, k = read_trajectory(poses, intrinsics)
    validate_trajectory(p, k, source=f"{Path(poses).name}/{Path(intrinsics).name}")
    return CameraPath(np.asarray(p, dtype=np.float64), np.asarray(k, dtype=np.float64).reshape(-1, 4)[0],
                      f"{Path(poses).name}/{Path(intrinsics).name}")


def path_from_export(source: str | Path, height: int, width: int, name: str | None = None,
                     source_size: tuple[int, int] | None = None, normalize_scale: bool = True,
                     world_to_camera: bool = False) -> CameraPath:
    """A ViPE folder or pose export (``loaders.pose_import``); default intrinsics when the
    export has none."""
    imported = import_poses(source, name=name, source_size=source_size, normalize_scale=normalize_scale,
                            world_to_camera=world_to_camera)
    k = imported.intrinsics if imported.intrinsics is not None else default_intrinsics(height, width)
    return CameraPath(imported.poses, k, imported.source)


def _check_path_covers(path: CameraPath, frames: int, height: int, width: int) -> None:
    """A valid size and trajectory whose poses reach frame ``frames``; CameraError naming the source."""
    check_size(height, width)
    validate_trajectory(path.poses, path.intrinsics, source=path.source)
    covered = usable_frames(frames, len(path.poses))
    if covered < frames:
        raise CameraError(f"{path.source}: {len(path.poses)} poses cover only {covered} frames but {frames} "
                          f"were asked; use frames <= {covered} or a longer path")


def one_pass_condition(path: CameraPath, frames: int, height: int, width: int) -> CameraCondition:
    """The ordinary (one-pass sampler) camera of the path's first ``frames`` frames."""
    check_frame_count(frames)
    _check_path_covers(path, frames, height, width)
    k = np.tile(np.asarray(path.intrinsics, dtype=np.float64).reshape(1, 4), (len(path.poses), 1))
    plucker = camera_tensor(path.poses, k, frames, height, width, dtype=torch.float32)
    return CameraCondition(plucker=plucker, frames=frames, height=height, width=width, poses=path.poses[:frames])


class WindowedCamera:
    """A camera path cut into the windows of a plan; ``condition(window)`` is what
    ``sampling.sample`` takes for that window."""

    def __init__(self, path: CameraPath, frames: int, height: int, width: int, quantile: float = 1.0) -> None:
        _check_path_covers(path, frames, height, width)
        self.path, self.frames, self.height, self.width = path, frames, height, width
        self.steps = path_keyframes(path.poses, frames)
        self.scale = translation_scale(self.steps, quantile)

    def condition(self, window: Window) -> CameraCondition:
        plucker = window_camera(self.steps, self.scale, window, self.path.intrinsics, self.height, self.width)
        return CameraCondition(plucker=plucker, frames=window.frames, height=self.height, width=self.width,
                               poses=self.path.poses[window.start:window.stop])


# --------------------------------------------------------------------------- experts


class ResidentExperts(DiskExperts):
    """Both experts stay loaded once used (no reload per window): twice the expert memory
    (2 × ~9.6 GB NF4 at A14B), for cards that have it."""

    def acquire(self, name: str) -> torch.nn.Module:
        if name not in self._resident:
            self._resident[name] = experts_mod.load_expert(self.folders[name], self.device, self.quantize,
                                                           block_swap=self.block_swap)
        return self._resident[name]

    def release(self, name: str) -> None:  # kept until close()
        pass

    def close(self) -> None:
        for name in list(self._resident):
            DiskExperts.release(self, name)


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


def generate_long(
    package: str | Path,
    image: ImageLike,
    prompt: str,
    negative_prompt: str,
    frames: int,
    height: int,
    width: int,
    out: str | Path,
    camera: CameraPath | None = None,
    params: SamplingParams = SamplingParams(),
    windows: WindowParams = WindowParams(),
    device: torch.device | str | None = None,
    cache_dir: str | Path | None = None,
    quantize: str | None = None,
    decode_tile: int | None = None,
    fps: int = 16,
    keep_experts: bool = False,
    block_swap: int | None = None,
    loras: list[LoraSpec] | None = None,
    on_step: Callable[[int, int], None] | None = None,
    on_window: Callable[[int, int], None] | None = None,
    check_interrupt: Callable[[], None] | None = None,
) -> LongVideoResult:
    """The whole run outside ComfyUI, written to ``out`` (.mp4) window by window.

    ``loras``: adapters applied to the experts while they sample (unmerged)."""
    files = find_package(package)
    device = resolve_device(device)
    plan_windows(frames, windows.window, windows.overlap)  # fail early on bad sizes
    windowed = WindowedCamera(camera, frames, height, width, windows.scale_quantile) if camera else None
    text = encode_text(files.t5, files.tokenizer, prompt, negative_prompt, device, cache_dir)
    source = ResidentExperts if keep_experts else DiskExperts
    experts = source(files.high, files.low, device, quantize, block_swap=block_swap)
    adapted = LoraExperts(experts, loras) if loras else experts
    try:
        with VideoWriter(out, fps=fps) as writer:
            return sample_windows(adapted, text, files.vae, image, frames, height, width, windowed, params, windows,
                                  writer.write, device=device, decode_tile=decode_tile, on_step=on_step,
                                  on_window=on_window, check_interrupt=check_interrupt)
    finally:
        experts.close()
