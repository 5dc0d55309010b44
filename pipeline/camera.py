"""Camera stage: a camera path (preset, .npy files, action string or pose export) -> the
Plücker conditioning the sampler reads.

Every source first becomes a ``CameraPath`` (the whole path, each file read once);
``camera_condition`` is the one place a ``CameraCondition`` is made from it: the ordinary
one-pass camera of a clip, or (called by ``long_video.WindowedCamera``) one window of a long
video.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..loaders.pose_import import import_poses
from ..loaders.trajectory import read_trajectory
from ..wan.camera import CameraError, camera_tensor, keyframe_camera, usable_frames, validate_trajectory
from ..wan.camera_actions import action_poses, default_intrinsics
from ..wan.camera_presets import preset_trajectory
from ..wan.play_camera import integrate_keys, play_action_frames, play_keyframes, play_keys
from ..wan.conditioning import check_frame_count, check_size
from ..wan.long_video import Window, window_camera
from .memory import check_video_fits


@dataclass
class CameraCondition:
    plucker: torch.Tensor  # [1, 384, F_lat, H/8, W/8] float32 on the CPU
    frames: int
    height: int
    width: int
    poses: np.ndarray  # [frames, 4, 4] the part of the path in use, for drawing


@dataclass
class CameraPath:
    """A whole camera path: camera-to-world poses (OpenCV axes) and one intrinsics row in
    480×832 pixels. Build with the ``path_from_*`` functions."""

    poses: np.ndarray  # [N, 4, 4]
    intrinsics: np.ndarray  # [4]
    source: str  # how messages name the path
    # The per-chunk (Play) timing (wan/play_camera.py): the keys of each action frame; the
    # one-pass camera then follows the Play law instead of the pose-file chain.
    play_keys: list[frozenset[str]] | None = None


# --------------------------------------------------------------------------- paths


def path_from_preset(name: str, speed: float, frames: int) -> CameraPath:
    """A built-in move (``wan.camera_presets``) of ``frames`` poses."""
    poses, k = preset_trajectory(name, frames, speed)
    return CameraPath(poses.astype(np.float64), k[0].astype(np.float64), f"preset {name!r}")


def path_from_files(poses: str | Path, intrinsics: str | Path) -> CameraPath:
    """poses.npy [N, 4, 4] and intrinsics.npy [N, 4] or [4]: read once, checked here."""
    p, k = read_trajectory(poses, intrinsics)
    source = f"{Path(poses).name}/{Path(intrinsics).name}"
    validate_trajectory(p, k, source=source)
    return CameraPath(np.asarray(p, dtype=np.float64), np.asarray(k, dtype=np.float64).reshape(-1, 4)[0], source)


def path_from_actions(actions: str, frames: int, height: int, width: int,
                      intrinsics: np.ndarray | None = None) -> CameraPath:
    """A keyboard action string (``wan.camera_actions``); square-pixel intrinsics for the
    output size unless ``intrinsics`` (one row) is given."""
    k = default_intrinsics(height, width) if intrinsics is None else np.asarray(intrinsics, dtype=np.float64)
    return CameraPath(action_poses(actions, frames), k, f"actions {actions!r}")


def path_from_play_actions(actions: str, frames: int, height: int, width: int,
                           intrinsics: np.ndarray | None = None) -> CameraPath:
    """An action string under the per-chunk (Play) timing (``wan.play_camera``): what a Play
    session's action log replays to. Its ``frames`` poses p_0 … p_{F−1} are kept for
    drawing; the camera is built from the keys."""
    keys = play_keys(actions, frames)
    k = default_intrinsics(height, width) if intrinsics is None else np.asarray(intrinsics, dtype=np.float64)
    return CameraPath(integrate_keys(keys), k, f"actions {actions!r} (per-chunk Play timing)", play_keys=keys)


def path_from_export(source: str | Path, height: int, width: int, name: str | None = None,
                     source_size: tuple[int, int] | None = None, normalize_scale: bool = True,
                     world_to_camera: bool = False) -> CameraPath:
    """A ViPE folder or pose export (``loaders.pose_import``); default intrinsics when the
    export has none."""
    imported = import_poses(source, name=name, source_size=source_size, normalize_scale=normalize_scale,
                            world_to_camera=world_to_camera)
    k = imported.intrinsics if imported.intrinsics is not None else default_intrinsics(height, width)
    return CameraPath(imported.poses, k, imported.source)


# --------------------------------------------------------------------------- condition


def check_path_covers(path: CameraPath, frames: int, height: int, width: int) -> None:
    """A valid size and trajectory whose poses reach frame ``frames``; CameraError naming the source."""
    check_size(height, width)
    validate_trajectory(path.poses, path.intrinsics, source=path.source)
    covered = usable_frames(frames, len(path.poses))
    if covered < frames:
        raise CameraError(f"{path.source}: {len(path.poses)} poses cover only {covered} frames but {frames} "
                          f"were asked; use frames <= {covered} or a longer path")


def camera_condition(path: CameraPath, frames: int, height: int, width: int, window: Window | None = None,
                     path_steps: torch.Tensor | None = None, scale: float = 1.0) -> CameraCondition:
    """The camera the sampler takes, for a clip of ``frames`` frames at ``height`` x ``width``.

    Without ``window``: the path's first ``frames`` frames through the reference chain
    (interpolate, relative poses, largest step = 1, rays, fold), after checking the size, the
    frame count, the memory and that the path covers the clip. With ``window`` (a long
    video's, whose whole path ``long_video.WindowedCamera`` checked once): that window's
    piece of ``path_steps`` (``wan.long_video.path_keyframes`` of the whole path) re-based to
    its first frame and divided by the whole path's ``scale``.
    """
    if window is None:
        check_frame_count(frames)
        check_size(height, width)
        check_video_fits(frames, height, width)  # the Plücker tensor grows with the video, like its frames
        check_path_covers(path, frames, height, width)
        if path.play_keys is not None:
            plucker = play_camera_tensor(path, frames, height, width)
        else:
            plucker = camera_tensor(path.poses, path.intrinsics, frames, height, width, dtype=torch.float32)
        return CameraCondition(plucker=plucker, frames=frames, height=height, width=width, poses=path.poses[:frames])
    if path.play_keys is not None:
        raise CameraError(f"{path.source}: the per-chunk (Play) timing is for one pass of the Fast sampler, not for "
                          "the windows of a long video; use the act2cam timing there")
    if path_steps is None or frames != window.frames:
        raise ValueError(f"window {window.index} of {window.frames} frames needs the whole path's steps "
                         f"(wan.long_video.path_keyframes) and frames={window.frames}; got frames={frames}")
    plucker = window_camera(path_steps, scale, window, path.intrinsics, height, width)
    return CameraCondition(plucker=plucker, frames=window.frames, height=height, width=width,
                           poses=path.poses[window.start:window.stop])


def play_camera_tensor(path: CameraPath, frames: int, height: int, width: int) -> torch.Tensor:
    """The Plücker tensor [1, 384, F_lat, H/8, W/8] float32 of a Play-timing path's first
    ``frames`` frames (``wan.play_camera.play_keyframes``): bitwise what a Play session fed
    its chunks."""
    keys = path.play_keys[:play_action_frames(frames)] if path.play_keys is not None else None
    if keys is None or len(keys) != play_action_frames(frames):
        raise CameraError(f"{path.source}: holds {0 if keys is None else len(keys)} action frames; {frames} frames "
                          f"take {play_action_frames(frames)} under the per-chunk (Play) timing")
    return keyframe_camera(play_keyframes(keys, frames), path.intrinsics, height, width, dtype=torch.float32)
