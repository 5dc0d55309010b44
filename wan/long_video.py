"""Long videos as chained windows: the plan, the mask of given frames, and the camera
tensor of each window (pure PyTorch; docs/long_videos.md says why chained windows).

A video of F = 4n + 1 frames is cut into windows of at most ``window`` frames (4n + 1).
Each window after the first starts on the last ``overlap`` frames (4j + 1) of the one
before: those frames are given to the model through the I2V mask, exactly as the first
frame of a normal run is, and only the frames after them are new. Window starts are
multiples of 4, so every window's latent frames sit on the whole video's latent grid.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .camera import FOLD, fold_rays, interpolate_poses, plucker_rays, relative_poses, scale_intrinsics
from .conditioning import check_frame_count
from .geometry import VAE_STRIDE_T, latent_frames

__all__ = [
    "MAX_FRAMES",
    "Window",
    "path_keyframes",
    "plan_windows",
    "translation_scale",
    "window_camera",
    "window_cuts",
    "window_keyframes",
]

MAX_FRAMES = 961  # one minute at 16 fps, the reference's longest example


@dataclass(frozen=True)
class Window:
    index: int
    start: int  # first video frame of the whole video this window covers
    frames: int  # video frames in the window (4n + 1)
    given: int  # leading frames that are given (the image, or the previous window's tail)

    @property
    def stop(self) -> int:
        return self.start + self.frames

    @property
    def new_frames(self) -> int:
        """Frames this window adds to the video (the first window's image is one of them)."""
        return self.frames if self.index == 0 else self.frames - self.given

    @property
    def latent_start(self) -> int:
        return self.start // VAE_STRIDE_T

    @property
    def latent_frames(self) -> int:
        return latent_frames(self.frames)


def _check_4n1(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or int(value) != value or value < minimum or (value - 1) % VAE_STRIDE_T:
        raise ValueError(f"{name} must be 4n+1 and at least {minimum}; got {value!r}")


def plan_windows(frames: int, window: int = 81, overlap: int = 1) -> list[Window]:
    """Windows covering ``frames`` video frames; every window but the first starts on the
    last ``overlap`` frames of the previous one. One window when ``frames <= window``."""
    check_frame_count(frames)
    if frames > MAX_FRAMES:
        raise ValueError(f"frames must be at most {MAX_FRAMES} (one minute at 16 fps); got {frames}")
    _check_4n1("window", window, 5)
    _check_4n1("overlap", overlap, 1)
    if overlap >= window:
        raise ValueError(f"overlap ({overlap} frames) must be shorter than the window ({window} frames)")
    stride = window - overlap  # a multiple of 4 since both are 4n + 1
    plan = [Window(0, 0, min(window, frames), 1)]
    while plan[-1].stop < frames:
        start = plan[-1].start + stride
        plan.append(Window(len(plan), start, min(window, frames - start), overlap))
    return plan


# --------------------------------------------------------------------------- camera


def path_keyframes(c2ws: np.ndarray, frames: int) -> torch.Tensor:
    """Frame-to-frame motion [F_lat, 4, 4] float64 (first = identity) of the whole path at
    the latent rate, translations NOT normalized: the one-pass camera before its scale."""
    return relative_poses(interpolate_poses(np.asarray(c2ws, dtype=np.float64)[:frames], latent_frames(frames)),
                          normalize=False)


def translation_scale(steps: torch.Tensor, quantile: float = 1.0) -> float:
    """The one translation unit for a whole path: its largest latent-step translation
    (``quantile`` 1, what a one-pass run uses), or that quantile of the moving steps (a
    path with rare jumps, e.g. from a pose tracker, keeps its ordinary steps near 1).
    Returns 1.0 for a camera that only turns."""
    if not 0.0 < quantile <= 1.0:
        raise ValueError(f"quantile must be within (0, 1]; got {quantile}")
    norms = steps[:, :3, 3].norm(dim=-1)
    moving = norms[norms > 0]
    if moving.numel() == 0:
        return 1.0
    return float(moving.max() if quantile == 1.0 else torch.quantile(moving, quantile))


def window_keyframes(steps: torch.Tensor, scale: float, window: Window) -> torch.Tensor:
    """Relative keyframes [F_lat(window), 4, 4] float32 of one window: its piece of ``steps``
    (``path_keyframes`` of the whole path), taken relative to the window's own first frame
    (its first step is the identity, as the model saw in training) and divided by the whole
    path's ``scale``, so the speed does not jump where windows meet."""
    rel = steps[window.latent_start: window.latent_start + window.latent_frames].clone()
    if rel.shape[0] != window.latent_frames:
        raise ValueError(f"the path has {steps.shape[0]} latent frames; window {window.index} needs "
                         f"{window.latent_start}..{window.latent_start + window.latent_frames - 1}")
    rel[0] = torch.eye(4, dtype=rel.dtype)
    rel[:, :3, 3] /= scale
    return rel.to(torch.float32)


def window_camera(
    steps: torch.Tensor,
    scale: float,
    window: Window,
    intrinsics: np.ndarray | torch.Tensor,
    height: int,
    width: int,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Plücker tensor [1, 384, F_lat(window), height/8, width/8] of one window.

    ``steps`` from ``path_keyframes`` (the whole path), ``scale`` from ``translation_scale``;
    the window's keyframes are ``window_keyframes``. ``intrinsics`` in 480×832 pixels.
    """
    rel = window_keyframes(steps, scale, window)
    k = scale_intrinsics(intrinsics, height, width).to(torch.float32)
    out = torch.empty(1, 6 * FOLD * FOLD, rel.shape[0], height // FOLD, width // FOLD, dtype=dtype)
    for i in range(rel.shape[0]):  # one latent frame at a time: full-size rays are large
        out[0, :, i: i + 1] = fold_rays(plucker_rays(rel[i: i + 1], k, height, width)).to(dtype)
    return out


def window_cuts(plan: list[Window]) -> tuple[int, ...]:
    """Video frames (= pose indices) where windows after the first begin, for the preview."""
    return tuple(w.start for w in plan[1:])
