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
from ..wan.act_control import act_control, act_control_from_trajectory, check_wasd, wasd_rows
from ..wan.camera import (CameraError, camera_tensor, cut_trajectory, interpolate_poses, keyframe_camera,
                          relative_poses, usable_frames, validate_trajectory)
from ..wan.camera_actions import (act2cam_keyframes_of, action_keys, default_intrinsics, integrate_keys,
                                  pad_act2cam_keys)
from ..wan.camera_presets import preset_trajectory
from ..wan.play_camera import play_action_frames, play_keyframes, play_keys
from ..wan.conditioning import check_frame_count, check_size
from ..wan.config import CONTROL_CHANNELS, CONTROL_NAMES
from ..wan.geometry import latent_frames
from ..wan.long_video import Window, path_keyframes, window_camera, window_keyframes
from .memory import check_video_fits

ACT_CHECKPOINT = "robbyant/lingbot-world-base-act"


class CameraPath:
    """A whole camera path: camera-to-world poses (OpenCV axes) and one intrinsics row in
    480×832 pixels. One subclass per kind (``PosePath``, ``ActionPath``, ``PlayLogPath``,
    ``ActFilesPath``), each answering what it controls (``controls``), whether it covers a
    video (``check_covers``), its one-pass tensor, its whole-path steps for long-video
    windows (``path_steps``) and its keyframes for the Fast chunks (``chunk_keyframes``).
    Build with the ``path_from_*`` functions."""

    controls: tuple[str, ...] = ("cam",)  # the control types it can give; the first is a Camera node's
    windowed = True  # whether it can be cut into the windows of a long video (else: one pass only)

    def __init__(self, poses: np.ndarray, intrinsics: np.ndarray, source: str) -> None:
        self.poses = poses  # [N, 4, 4]
        self.intrinsics = intrinsics  # [4]
        self.source = source  # how messages name the path

    def check_covers(self, frames: int, height: int, width: int) -> None:
        """A valid size and trajectory that reaches frame ``frames``; CameraError or
        ActionError naming the source."""
        check_size(height, width)
        validate_trajectory(self.poses, self.intrinsics, source=self.source)
        covered = usable_frames(frames, len(self.poses))
        if covered < frames:
            raise CameraError(f"{self.source}: {len(self.poses)} poses cover only {covered} frames but {frames} "
                              f"were asked; use frames <= {covered} or a longer path")

    def video_keys(self, frames: int) -> np.ndarray:
        """W/A/S/D [frames, 4] float32 of the video (Act controls)."""
        raise ValueError(f"{self.source}: no W/A/S/D keys; Act controls need action.npy or an action string")

    def one_pass(self, frames: int, height: int, width: int, control_type: str) -> torch.Tensor:
        """The control tensor of the path's first ``frames`` frames (checked by the caller)."""
        return camera_tensor(self.poses, self.intrinsics, frames, height, width, dtype=torch.float32)

    def path_steps(self, frames: int) -> torch.Tensor:
        """The whole path's relative keyframes (translations not normalized), cut into the
        windows of a long video by ``wan.long_video``."""
        self.check_windowed()
        return path_keyframes(self.poses, frames)

    def check_windowed(self) -> None:
        """CameraError unless the path can be cut into the windows of a long video."""
        if not self.windowed:
            raise CameraError(f"{self.source}: the per-chunk (Play) timing is for one pass of the Fast sampler, "
                              "not for the windows of a long video; use the act2cam timing there")

    def chunk_keyframes(self, frames: int, count: int | None = None) -> torch.Tensor:
        """Relative keyframes [count, 4, 4] of the one-pass camera over ``frames`` frames, cut
        into Fast chunks by ``pipeline.fast.KeyframeCamera``. ``count``: the latent frames made
        when it is not ``latent_frames(frames)`` (LingBot-World Fast, as the official
        ``generate_fast``, spreads the keyframes over the frames asked and cuts the latent to
        whole chunks)."""
        c2ws, _, used = cut_trajectory(self.poses, self.intrinsics, frames, self.source)
        if used < frames:
            raise CameraError(f"{self.source}: {len(self.poses)} poses cover only {used} frames but {frames} were "
                              f"asked; use frames <= {used} or a longer path")
        return relative_poses(interpolate_poses(c2ws, latent_frames(frames) if count is None else count))


class PosePath(CameraPath):
    """Poses from a preset, pose files or a pose export: Base-Cam rays through the reference chain."""


class ActionPath(CameraPath):
    """A keyboard action string under the official act2cam timing: Base-Cam rays, or Act
    rays + its W/A/S/D columns. The text is parsed once; ``poses`` are the F + 1 act2cam
    poses of the video it was made for."""

    controls = ("cam", "act")

    def __init__(self, actions: str, frames: int, intrinsics: np.ndarray) -> None:
        self.actions = actions
        self._keys = action_keys(actions)  # the one parse of the text
        self._poses: dict[int, np.ndarray] = {}
        shown = actions if len(actions) <= 60 else actions[:59] + "…"
        super().__init__(self.act2cam_poses(frames), intrinsics, f"actions {shown!r}")

    def padded_keys(self, frames: int) -> list[frozenset[str]]:
        """The keys of each of ``frames`` video frames (no keys after the string's end); a
        string longer than the video is refused (ActionError naming both)."""
        return pad_act2cam_keys(self._keys, frames, self.actions)

    def act2cam_poses(self, frames: int) -> np.ndarray:
        """The official act2cam poses [frames + 1, 4, 4] float64 of a ``frames``-frame video."""
        if frames not in self._poses:
            self._poses[frames] = integrate_keys(self.padded_keys(frames))
        return self._poses[frames]

    def keyframes(self, frames: int, normalize: bool = True, count: int | None = None) -> torch.Tensor:
        return act2cam_keyframes_of(self.act2cam_poses(frames), frames, normalize, count)

    def check_covers(self, frames: int, height: int, width: int) -> None:
        check_size(height, width)
        validate_trajectory(self.poses, self.intrinsics, source=self.source)
        self.padded_keys(frames)  # refuses a string longer than the video, naming both lengths

    def video_keys(self, frames: int) -> np.ndarray:
        return wasd_rows(self.padded_keys(frames))

    def one_pass(self, frames: int, height: int, width: int, control_type: str) -> torch.Tensor:
        if control_type == "act":
            return act_control(self.keyframes(frames), self.intrinsics, height, width, self.video_keys(frames))
        return keyframe_camera(self.keyframes(frames), self.intrinsics, height, width, dtype=torch.float32)

    def path_steps(self, frames: int) -> torch.Tensor:
        return self.keyframes(frames, normalize=False)

    def chunk_keyframes(self, frames: int, count: int | None = None) -> torch.Tensor:
        return self.keyframes(frames, count=count)


class PlayLogPath(CameraPath):
    """An action string under the per-chunk (Play) timing (``wan.play_camera``): what a Play
    session's action log replays to. Base-Cam rays for one pass of the Fast sampler; no
    windows. ``poses`` p_0 … p_{F−1} are kept for drawing."""

    windowed = False

    def __init__(self, actions: str, frames: int, intrinsics: np.ndarray) -> None:
        self.play_keys = play_keys(actions, frames)
        super().__init__(integrate_keys(self.play_keys), intrinsics, f"actions {actions!r} (per-chunk Play timing)")

    def _keyframes(self, frames: int) -> torch.Tensor:
        keys = self.play_keys[:play_action_frames(frames)]
        if len(keys) != play_action_frames(frames):
            raise CameraError(f"{self.source}: holds {len(keys)} action frames; {frames} frames "
                              f"take {play_action_frames(frames)} under the per-chunk (Play) timing")
        return play_keyframes(keys, frames)

    def one_pass(self, frames: int, height: int, width: int, control_type: str) -> torch.Tensor:
        """Bitwise what a Play session fed its chunks."""
        return keyframe_camera(self._keyframes(frames), self.intrinsics, height, width, dtype=torch.float32)

    def chunk_keyframes(self, frames: int, count: int | None = None) -> torch.Tensor:
        # The Play law is per chunk: the keyframes of the chunks made are a prefix either way.
        return self._keyframes(frames)


class ActFilesPath(CameraPath):
    """Act controls from files: poses.npy and intrinsics.npy (their rotations give the ray
    directions) and action.npy [F, 4] (W/A/S/D per video frame). Act checkpoints only."""

    controls = ("act",)

    def __init__(self, poses: np.ndarray, intrinsics: np.ndarray, source: str, wasd: np.ndarray) -> None:
        super().__init__(poses, intrinsics, source)
        self.wasd = wasd

    def check_covers(self, frames: int, height: int, width: int) -> None:
        super().check_covers(frames, height, width)
        check_wasd(self.wasd, frames, self.source)

    def video_keys(self, frames: int) -> np.ndarray:
        return check_wasd(self.wasd, frames, self.source)

    def one_pass(self, frames: int, height: int, width: int, control_type: str) -> torch.Tensor:
        return act_control_from_trajectory(self.poses, self.intrinsics, self.wasd, frames, height, width,
                                           wasd_source=self.source)[0]

    def chunk_keyframes(self, frames: int, count: int | None = None) -> torch.Tensor:
        raise CameraError(f"{self.source}: gives Act controls (W/A/S/D keys from action.npy), but LingBot-World "
                          "Fast reads Base-Cam Plücker rays; use the same poses.npy and intrinsics.npy without the "
                          "keys (the Camera node's source files)")


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
    return PosePath(poses.astype(np.float64), k[0].astype(np.float64), f"preset {name!r}")


def _read_files(poses: str | Path, intrinsics: str | Path) -> tuple[np.ndarray, np.ndarray, str]:
    p, k = read_trajectory(poses, intrinsics)
    source = f"{Path(poses).name}/{Path(intrinsics).name}"
    validate_trajectory(p, k, source=source)
    return np.asarray(p, dtype=np.float64), np.asarray(k, dtype=np.float64).reshape(-1, 4)[0], source


def path_from_files(poses: str | Path, intrinsics: str | Path) -> CameraPath:
    """poses.npy [N, 4, 4] and intrinsics.npy [N, 4] or [4]: read once, checked here."""
    return PosePath(*_read_files(poses, intrinsics))


def path_from_act_files(poses: str | Path, intrinsics: str | Path, action: str | Path) -> CameraPath:
    """Act controls from files: poses.npy and intrinsics.npy (their rotations give the ray
    directions) and action.npy [F, 4] (W/A/S/D per video frame), as the official Act examples
    hold them. Each file is read once; the keys are checked against the video's length
    when the condition is built."""
    p, k, source = _read_files(poses, intrinsics)
    return ActFilesPath(p, k, f"{source}/{Path(action).name}", read_action(action))


def path_from_actions(actions: str, frames: int, height: int, width: int,
                      intrinsics: np.ndarray | None = None) -> CameraPath:
    """A keyboard action string (``wan.camera_actions``) for a video of ``frames`` frames:
    the official act2cam path (``frames`` + 1 poses; the keys padded with no-key frames).
    A string longer than the video is refused (ActionError naming both lengths). Square-pixel
    intrinsics for the output size unless ``intrinsics`` (one row) is given."""
    k = default_intrinsics(height, width) if intrinsics is None else np.asarray(intrinsics, dtype=np.float64)
    return ActionPath(actions, frames, k)


def path_from_play_actions(actions: str, frames: int, height: int, width: int,
                           intrinsics: np.ndarray | None = None) -> CameraPath:
    """An action string under the per-chunk (Play) timing (``wan.play_camera``): what a Play
    session's action log replays to. Its ``frames`` poses p_0 … p_{F−1} are kept for
    drawing; the camera is built from the keys."""
    k = default_intrinsics(height, width) if intrinsics is None else np.asarray(intrinsics, dtype=np.float64)
    return PlayLogPath(actions, frames, k)


def path_from_export(source: str | Path, height: int, width: int, name: str | None = None,
                     source_size: tuple[int, int] | None = None, normalize_scale: bool = True,
                     world_to_camera: bool = False, camera_axes: str = "opencv") -> CameraPath:
    """A ViPE folder or pose export (``loaders.pose_import``); default intrinsics when the
    export has none."""
    imported = import_poses(source, name=name, source_size=source_size, normalize_scale=normalize_scale,
                            world_to_camera=world_to_camera, camera_axes=camera_axes)
    k = imported.intrinsics if imported.intrinsics is not None else default_intrinsics(height, width)
    return PosePath(imported.poses, k, imported.source)


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
        path.check_covers(frames, height, width)
        tensor = path.one_pass(frames, height, width, control_type)
        return CameraCondition(plucker=tensor, frames=frames, height=height, width=width, poses=path.poses[:frames],
                               control_type=control_type, path=path)
    path.check_windowed()
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
