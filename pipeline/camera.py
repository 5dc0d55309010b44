"""Camera stage: a camera path (preset, .npy files, action string, Act files, pose export, or
a Play session's action log) -> the control tensor the sampler reads.

Every source first becomes a ``CameraPath`` (the whole path, each file read once);
``camera_condition`` is the one place a ``CameraCondition`` is made from it: the ordinary
one-pass camera of a clip, or (called by ``long_video.WindowedCamera``) one window of a long
video.

Two checkpoints read two controls (docs/conventions.md#act-checkpoint): Base-Cam ("cam")
Plücker rays, 384 channels per latent cell; Act ("act") ray directions + W/A/S/D keys, 448.
A path says which it can drive (``CameraPath.controls``): a pose path only Base-Cam, Act
files (poses + action.npy) only Act, an action string both (Base-Cam: the official act2cam
camera; Act: its W/A/S/D columns with the act2cam rotations). ``check_controls`` and
``camera_for_checkpoint`` refuse a wrong pairing, naming the checkpoint and the source,
before any expert loads.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..loaders.pose_import import import_poses
from ..loaders.trajectory import read_action, read_trajectory
from ..wan.act_control import (act_control, act_control_from_actions, act_control_from_trajectory, check_wasd,
                               wasd_from_actions)
from ..wan.camera import CameraError, camera_tensor, keyframe_camera, usable_frames, validate_trajectory
from ..wan.camera_actions import act2cam_camera, act2cam_keys, act2cam_poses, default_intrinsics
from ..wan.camera_presets import preset_trajectory
from ..wan.play_camera import integrate_keys, play_action_frames, play_keyframes, play_keys
from ..wan.conditioning import check_frame_count, check_size
from ..wan.config import CONTROL_CHANNELS, CONTROL_NAMES
from ..wan.long_video import Window, window_camera, window_keyframes
from .memory import check_video_fits

ACT_CHECKPOINT = "robbyant/lingbot-world-base-act"


@dataclass
class CameraPath:
    """A whole camera path: camera-to-world poses (OpenCV axes) and one intrinsics row in
    480×832 pixels; for Act, the W/A/S/D keys. Build with the ``path_from_*`` functions."""

    poses: np.ndarray  # [N, 4, 4]
    intrinsics: np.ndarray  # [4]
    source: str  # how messages name the path
    # An action string: the camera is the official act2cam one (poses = its F + 1 poses).
    actions: str | None = None
    # W/A/S/D key states per video frame [N, 4] (action.npy): Act controls.
    wasd: np.ndarray | None = None
    # The per-chunk (Play) timing (wan/play_camera.py): the keys of each action frame; the
    # one-pass camera then follows the Play law instead of the pose-file chain (Base-Cam rays).
    play_keys: list[frozenset[str]] | None = None

    @property
    def controls(self) -> tuple[str, ...]:
        """The control types this path can give, the one a Camera node builds first."""
        if self.actions is not None:
            return ("cam", "act")
        if self.wasd is not None:
            return ("act",)
        return ("cam",)


@dataclass
class CameraCondition:
    # [1, C, F_lat, H/8, W/8] float32 on the CPU: C = 384 (Base-Cam Plücker rays) or 448
    # (Act: ray directions + W/A/S/D keys), see ``control_type``.
    plucker: torch.Tensor
    frames: int
    height: int
    width: int
    poses: np.ndarray  # the part of the path in use, for drawing
    control_type: str = "cam"
    path: CameraPath | None = None  # what it was built from (an action string's is rebuilt for Act)


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


def path_from_act_files(poses: str | Path, intrinsics: str | Path, action: str | Path) -> CameraPath:
    """Act controls from files: poses.npy and intrinsics.npy (their rotations give the ray
    directions) and action.npy [F, 4] (W/A/S/D per video frame), as the official Act examples
    hold them. Each file is read once; the keys are checked against the video's length
    when the condition is built."""
    path = path_from_files(poses, intrinsics)
    path.wasd = read_action(action)
    path.source = f"{path.source}/{Path(action).name}"
    return path


def path_from_actions(actions: str, frames: int, height: int, width: int,
                      intrinsics: np.ndarray | None = None) -> CameraPath:
    """A keyboard action string (``wan.camera_actions``) for a video of ``frames`` frames:
    the official act2cam path (``frames`` + 1 poses; the keys padded with no-key frames).
    A string longer than the video is refused (ActionError naming both lengths). Square-pixel
    intrinsics for the output size unless ``intrinsics`` (one row) is given."""
    k = default_intrinsics(height, width) if intrinsics is None else np.asarray(intrinsics, dtype=np.float64)
    shown = actions if len(actions) <= 60 else actions[:59] + "…"
    return CameraPath(act2cam_poses(actions, frames), k, f"actions {shown!r}", actions=actions)


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
                     world_to_camera: bool = False, camera_axes: str = "opencv") -> CameraPath:
    """A ViPE folder or pose export (``loaders.pose_import``); default intrinsics when the
    export has none."""
    imported = import_poses(source, name=name, source_size=source_size, normalize_scale=normalize_scale,
                            world_to_camera=world_to_camera, camera_axes=camera_axes)
    k = imported.intrinsics if imported.intrinsics is not None else default_intrinsics(height, width)
    return CameraPath(imported.poses, k, imported.source)


# --------------------------------------------------------------------------- which checkpoint


class ControlMismatch(ValueError):
    """Controls that the checkpoint cannot read; the message names the checkpoint and the source."""


def _a(name: str) -> str:
    return f"an {name}" if name[0] in "AEIOU" else f"a {name}"


def mismatch_message(checkpoint: str, control_type: str, source: str) -> str:
    """Why the camera from ``source`` does not fit ``checkpoint`` (which reads ``control_type``)."""
    if control_type == "act":
        return (f"{checkpoint} is an Act checkpoint (it reads ray directions + W/A/S/D keys) but the camera "
                f"({source}) gives Base-Cam Plücker rays, without keys. Give it Act controls: an action string, or "
                "poses.npy + intrinsics.npy with action.npy beside them (the Camera node's sources actions and "
                "act_files; the command line's --actions and --camera-dir); or load the Base-Cam checkpoint")
    return (f"{checkpoint} is a Base-Cam checkpoint (it reads Plücker rays) but the camera ({source}) gives Act "
            f"controls (ray directions + W/A/S/D keys from action.npy). Load the Act checkpoint ({ACT_CHECKPOINT}), "
            "or use the same poses.npy and intrinsics.npy without the keys (the Camera node's source files)")


def check_controls(path: CameraPath, control_type: str, checkpoint: str) -> None:
    """ControlMismatch naming both unless ``path`` can drive a ``control_type`` checkpoint."""
    if control_type not in CONTROL_CHANNELS:
        raise ValueError(f"control type {control_type!r} is not one of {', '.join(CONTROL_CHANNELS)}")
    if control_type not in path.controls:
        raise ControlMismatch(mismatch_message(checkpoint, control_type, path.source))


def camera_for_checkpoint(camera: CameraCondition, control_type: str, checkpoint: str) -> CameraCondition:
    """The camera a ``control_type`` checkpoint reads: ``camera`` itself, or for an action
    string the same clip rebuilt with the other control (Act: its W/A/S/D keys); otherwise
    ControlMismatch naming the checkpoint and the camera's source. Cheap next to loading an
    expert, and done before."""
    if camera.control_type == control_type:
        return camera
    if camera.path is None:
        raise ControlMismatch(mismatch_message(checkpoint, control_type,
                                               f"a {CONTROL_NAMES[camera.control_type]} camera tensor"))
    check_controls(camera.path, control_type, checkpoint)
    return camera_condition(camera.path, camera.frames, camera.height, camera.width, control_type=control_type)


# --------------------------------------------------------------------------- condition


def check_path_covers(path: CameraPath, frames: int, height: int, width: int) -> None:
    """A valid size and trajectory that reaches frame ``frames`` (an action string no longer
    than the video; Act keys for every frame); CameraError or ActionError naming the source."""
    check_size(height, width)
    validate_trajectory(path.poses, path.intrinsics, source=path.source)
    if path.actions is not None:
        act2cam_keys(path.actions, frames)  # refuses a string longer than the video, naming both lengths
        return
    covered = usable_frames(frames, len(path.poses))
    if covered < frames:
        raise CameraError(f"{path.source}: {len(path.poses)} poses cover only {covered} frames but {frames} "
                          f"were asked; use frames <= {covered} or a longer path")
    if path.wasd is not None:
        check_wasd(path.wasd, frames, path.source)


def video_keys(path: CameraPath, frames: int) -> np.ndarray:
    """W/A/S/D [frames, 4] float32 of the video: action.npy's first rows, or an action
    string's W/A/S/D columns (no keys after its end)."""
    if path.actions is not None:
        return wasd_from_actions(path.actions, frames)
    if path.wasd is None:
        raise ValueError(f"{path.source}: no W/A/S/D keys; Act controls need action.npy or an action string")
    return check_wasd(path.wasd, frames, path.source)


def _one_pass(path: CameraPath, frames: int, height: int, width: int, control_type: str) -> torch.Tensor:
    k = path.intrinsics
    if control_type == "act":
        if path.actions is not None:
            return act_control_from_actions(path.actions, frames, height, width, k)
        return act_control_from_trajectory(path.poses, k, path.wasd, frames, height, width,
                                           wasd_source=path.source)[0]
    if path.actions is not None:
        return act2cam_camera(path.actions, frames, height, width, k)
    if path.play_keys is not None:
        return play_camera_tensor(path, frames, height, width)
    return camera_tensor(path.poses, k, frames, height, width, dtype=torch.float32)


def camera_condition(path: CameraPath, frames: int, height: int, width: int, window: Window | None = None,
                     path_steps: torch.Tensor | None = None, scale: float = 1.0, control_type: str | None = None,
                     keys: np.ndarray | None = None) -> CameraCondition:
    """The camera the sampler takes, for a clip of ``frames`` frames at ``height`` x ``width``.

    ``control_type``: "cam" (Base-Cam rays) or "act" (Act rays + keys); None: the first the
    path gives. Without ``window``: the path's first ``frames`` frames through the reference
    chain (an action string: the official act2cam one), after checking the size, the frame
    count, the memory and that the path covers the clip. With ``window`` (a long video's,
    whose whole path ``long_video.WindowedCamera`` checked once): that window's piece of
    ``path_steps`` (the whole path's relative keyframes, translations not normalized)
    re-based to its first frame and divided by the whole path's ``scale``; for Act, with
    the W/A/S/D rows ``window.start + 4j`` of ``keys`` (the whole video's, ``video_keys``).
    """
    control_type = path.controls[0] if control_type is None else control_type
    if control_type not in path.controls:
        raise ControlMismatch(f"{path.source} cannot give {CONTROL_NAMES.get(control_type, control_type)} controls")
    if window is None:
        check_frame_count(frames)
        check_size(height, width)
        check_video_fits(frames, height, width)  # the Plücker tensor grows with the video, like its frames
        check_path_covers(path, frames, height, width)
        tensor = _one_pass(path, frames, height, width, control_type)
        return CameraCondition(plucker=tensor, frames=frames, height=height, width=width, poses=path.poses[:frames],
                               control_type=control_type, path=path)
    if path.play_keys is not None:
        raise CameraError(f"{path.source}: the per-chunk (Play) timing is for one pass of the Fast sampler, not for "
                          "the windows of a long video; use the act2cam timing there")
    if path_steps is None or frames != window.frames:
        raise ValueError(f"window {window.index} of {window.frames} frames needs the whole path's steps "
                         f"(wan.long_video.path_keyframes) and frames={window.frames}; got frames={frames}")
    if control_type == "act":
        if keys is None or len(keys) < window.stop:
            raise ValueError(f"window {window.index} needs the video's W/A/S/D rows up to frame {window.stop}")
        tensor = act_control(window_keyframes(path_steps, scale, window), path.intrinsics, height, width,
                             keys[window.start:window.stop])
    else:
        tensor = window_camera(path_steps, scale, window, path.intrinsics, height, width)
    return CameraCondition(plucker=tensor, frames=window.frames, height=height, width=width,
                           poses=path.poses[window.start:window.stop], control_type=control_type, path=path)


def play_camera_tensor(path: CameraPath, frames: int, height: int, width: int) -> torch.Tensor:
    """The Plücker tensor [1, 384, F_lat, H/8, W/8] float32 of a Play-timing path's first
    ``frames`` frames (``wan.play_camera.play_keyframes``): bitwise what a Play session fed
    its chunks."""
    keys = path.play_keys[:play_action_frames(frames)] if path.play_keys is not None else None
    if keys is None or len(keys) != play_action_frames(frames):
        raise CameraError(f"{path.source}: holds {0 if keys is None else len(keys)} action frames; {frames} frames "
                          f"take {play_action_frames(frames)} under the per-chunk (Play) timing")
    return keyframe_camera(play_keyframes(keys, frames), path.intrinsics, height, width, dtype=torch.float32)
