"""Keyboard-style camera authoring: an action string → camera-to-world poses and the
camera tensor of the official "act2cam" path, and the default intrinsics for a frame of
any size (docs/conventions.md#camera-path, #action-strings-act2cam).

An action string is a comma-separated list of tokens ``KEYS-FRAMES``, e.g.
``w-20,j-10,w-30`` or ``iw-15,none-10``: the keys are held for that many video frames.
Keys follow the LingBot-World act2cam convention (the official repository's
``wan/utils/wasd_ijkl_to_c2ws.py``, upstream commit 9660e94):

- W / S move forward / back, D / A right / left, by ``MOVE_PER_FRAME`` (0.05) per frame,
  along the camera's view and right directions flattened onto the world's ground plane
  (x–z; y is down in OpenCV axes), so looking up or down never makes W climb. Like the
  reference, a flattened direction is divided by its length plus ``GROUND_EPS`` (1e-6),
  so a step is a millionth shorter than 0.05; kept for parity.
- I / K look up / down (pitch about the camera's own x axis), L / J turn right / left
  (yaw about the world's vertical y axis), by ``TURN_DEG_PER_FRAME`` (2°) per frame.
  Pitch stops at ±85°: a step that would pass it is dropped.
- Within one frame the rotation is applied first, then the move along the new directions.
- ``none`` (or nothing before the dash) holds still. Several keys in one token act
  together (``wj-10``).

Parsing follows the reference where it is stricter: a full-width comma counts as a comma,
whitespace anywhere is ignored, an empty token (``w-5,,j-3``, a leading or trailing comma)
and a signed count (``w-+3``) are errors. Errors are ``ActionError`` naming the token.

Poses: N action frames give N + 1 camera-to-world poses (the start, then one after each
frame), OpenCV axes like poses.npy. ``ActionIntegrator`` makes them one frame at a time
(for keys held live). ``action_poses`` lists them (for drawing a path).

The camera of an F-frame video (``act2cam_*``), as the reference builds it: the keys are
padded with no-key frames to F, giving F + 1 poses; the F_lat = (F − 1)/4 + 1 keyframes are
sampled at ``linspace(0, F, F_lat)`` of those poses (translation linear, rotation slerp),
then made frame-to-frame relative with translations divided by the largest (docs/conventions.md#camera-path).
This differs from a pose file, whose F poses are sampled at ``linspace(0, F − 1, F_lat)``.
A string longer than the video is refused, as the reference refuses it, rather than cut:
cutting would silently drop keys the user typed. Only this module's own code is used here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import torch

from .camera import (DEFAULT_INTRINSICS, INTRINSICS_HEIGHT, INTRINSICS_WIDTH, interpolate_poses, keyframe_camera,
                     relative_poses)
from .conditioning import check_frame_count
from .geometry import VAE_STRIDE_T, latent_frames

__all__ = [
    "ActionError",
    "ActionIntegrator",
    "ActionToken",
    "GROUND_EPS",
    "MOVE_PER_FRAME",
    "PITCH_LIMIT_DEG",
    "TURN_DEG_PER_FRAME",
    "act2cam_camera",
    "act2cam_keyframes_of",
    "integrate_keys",
    "key_set",
    "pad_act2cam_keys",
    "act2cam_keyframes",
    "act2cam_keys",
    "act2cam_poses",
    "action_frames",
    "cut_actions",
    "action_keys",
    "action_poses",
    "default_intrinsics",
    "frames_for_actions",
    "parse_actions",
]

MOVE_PER_FRAME = 0.05
TURN_DEG_PER_FRAME = 2.0
PITCH_LIMIT_DEG = 85.0
GROUND_EPS = 1e-6
KEYS = "wasdijkl"
HOLD_WORDS = ("none", "")
EXAMPLE = "w-20,j-10,w-30"
MAX_ACTION_FRAMES = 100_000

# Keys, a dash, an unsigned count (the reference reads the count with str.isdigit).
_TOKEN = re.compile(r"^([a-z]*)-(\d+)$")
# numpy's trigonometry and degree conversion, as the reference uses them.
_TURN = float(np.deg2rad(TURN_DEG_PER_FRAME))
_PITCH_LIMIT = float(np.deg2rad(PITCH_LIMIT_DEG))


class ActionError(ValueError):
    """An action string that cannot be read; the message names the token at fault."""


@dataclass(frozen=True)
class ActionToken:
    keys: frozenset[str]
    frames: int
    text: str


def parse_actions(text: str) -> list[ActionToken]:
    """Split an action string into tokens; raise ActionError naming the first bad token."""
    if not isinstance(text, str):
        raise ActionError(f"action string must be text; got {type(text).__name__}")
    cleaned = text.replace("，", ",")  # full-width comma, as typed with a CJK keyboard
    if not cleaned.strip():
        raise ActionError(f"action string is empty; write tokens KEYS-FRAMES such as {EXAMPLE!r}")
    tokens: list[ActionToken] = []
    total = 0
    for position, raw in enumerate(cleaned.split(","), start=1):
        token = "".join(raw.split()).lower()
        if not token:
            raise ActionError(f"action string {text!r}: token {position} is empty (two commas in a row, "
                              "or a comma at the start or end)")
        match = _TOKEN.match(token)
        if match is None:
            raise ActionError(f"action string: token {raw.strip()!r} is not KEYS-FRAMES (e.g. 'w-20', 'jw-10', "
                              "'none-5'; the frame count is a positive whole number)")
        keys_text, count_text = match.groups()
        count = int(count_text)
        if count <= 0:
            raise ActionError(f"action string: token {raw.strip()!r} has {count} frames; the frame count "
                              "must be a positive integer")
        if keys_text in HOLD_WORDS:
            keys: frozenset[str] = frozenset()
        else:
            unknown = sorted({c for c in keys_text if c not in KEYS})
            if unknown:
                raise ActionError(
                    f"action string: token {raw.strip()!r} has unknown key(s) {', '.join(map(repr, unknown))}; "
                    "keys are w a s d (move), i j k l (look), or 'none' to hold still"
                )
            keys = frozenset(keys_text)
        total += count
        if total > MAX_ACTION_FRAMES:
            raise ActionError(f"action string: token {raw.strip()!r} brings the total to {total} frames, "
                              f"more than {MAX_ACTION_FRAMES}")
        tokens.append(ActionToken(keys=keys, frames=count, text=raw.strip()))
    return tokens


def action_frames(text: str) -> int:
    """Action frames an action string holds (the sum of its counts)."""
    return sum(t.frames for t in parse_actions(text))


def frames_for_actions(text: str) -> int:
    """Video frame count for an action string: the smallest 4n + 1 at or above its total
    (the reference does the same when no frame count is given)."""
    total = action_frames(text)
    return total + (-(total - 1)) % VAE_STRIDE_T


def cut_actions(text: str, frames: int) -> str:
    """An action string holding only the first ``frames`` action frames of ``text`` (``text``
    itself when it fits), e.g. a long scripted walk for a shorter test or benchmark video:
    the camera refuses a string longer than the video rather than cutting it silently."""
    if isinstance(frames, bool) or int(frames) != frames or frames < 1:
        raise ActionError(f"frames must be a positive integer; got {frames!r}")
    parsed = parse_actions(text)
    if sum(t.frames for t in parsed) <= frames:
        return text
    tokens, left = [], int(frames)
    for token in parsed:
        if left == 0:
            break
        count = min(token.frames, left)
        tokens.append(f"{''.join(k for k in KEYS if k in token.keys) or 'none'}-{count}")
        left -= count
    return ",".join(tokens)


def action_keys(text: str) -> list[frozenset[str]]:
    """The keys held in each action frame of an action string, in order."""
    return [t.keys for t in parse_actions(text) for _ in range(t.frames)]


def act2cam_keys(text: str, frames: int) -> list[frozenset[str]]:
    """The keys of each of ``frames`` video frames (4n + 1): the string's, then no keys.

    A string with more action frames than the video is refused (ActionError naming both).
    """
    return pad_act2cam_keys(action_keys(text), frames, text)


def pad_act2cam_keys(keys: list[frozenset[str]], frames: int, text: str) -> list[frozenset[str]]:
    """``act2cam_keys`` of a string already parsed (``keys``: ``action_keys(text)``)."""
    check_frame_count(frames)
    if len(keys) > frames:
        raise ActionError(f"action string {_short(text)} holds {len(keys)} action frames but the video has "
                          f"{frames} frames; shorten the string or set frames to {frames_for_actions(text)}")
    return keys + [frozenset()] * (int(frames) - len(keys))


def _short(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


# --------------------------------------------------------------------------- integrator


def _rot_x(rad: float) -> np.ndarray:
    c, s = np.cos(rad), np.sin(rad)
    return np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])


def _rot_y(rad: float) -> np.ndarray:
    c, s = np.cos(rad), np.sin(rad)
    return np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])


def _ground(v: np.ndarray) -> np.ndarray:
    """``v`` projected on the x–z plane, divided by its length + GROUND_EPS (zero stays zero)."""
    flat = np.array([v[0], 0.0, v[2]])
    norm = np.linalg.norm(flat)
    return flat / (norm + GROUND_EPS) if norm > 0 else flat


def key_set(keys: str | Iterable[str]) -> frozenset[str]:
    """The keys held in one frame (``"wj"``, ``{"w", "j"}``), lower case; ActionError on a key outside KEYS."""
    chosen = frozenset(keys.lower() if isinstance(keys, str) else (str(k).lower() for k in keys))
    unknown = sorted(chosen - set(KEYS))
    if unknown:
        raise ActionError(f"keys: unknown key(s) {', '.join(map(repr, unknown))}; keys are w a s d (move), "
                          "i j k l (look)")
    return chosen


class ActionIntegrator:
    """The act2cam camera, advanced one video frame at a time by the keys held in it.

    ``pose`` is the current camera-to-world matrix (float64 [4, 4], OpenCV axes), ``pitch``
    the accumulated look up/down in radians. ``step(keys)`` applies one frame and returns
    the new pose; stepping through an action string's frames from the start gives its
    N + 1 poses (the start pose, then one per ``step``).
    """

    def __init__(self) -> None:
        self.pose = np.eye(4)
        self.pitch = 0.0

    def reset(self) -> None:
        self.pose = np.eye(4)
        self.pitch = 0.0

    def step(self, keys: str | Iterable[str]) -> np.ndarray:
        """One frame with ``keys`` held (e.g. ``"wj"``, ``{"w", "j"}``, ``""`` for none)."""
        keys = key_set(keys)
        d_pitch = 0.0
        if "i" in keys:
            d_pitch += _TURN
        if "k" in keys:
            d_pitch -= _TURN
        if -_PITCH_LIMIT <= self.pitch + d_pitch <= _PITCH_LIMIT:
            self.pitch = self.pitch + d_pitch
        else:
            d_pitch = 0.0  # the whole step is dropped at the limit
        d_yaw = 0.0
        if "j" in keys:
            d_yaw -= _TURN
        if "l" in keys:
            d_yaw += _TURN
        # Yaw about the world's vertical (pre-multiply), pitch about the camera's x (post).
        rot = _rot_y(d_yaw) @ self.pose[:3, :3] @ _rot_x(d_pitch)
        forward, right = _ground(rot[:, 2]), _ground(rot[:, 0])
        move = np.zeros(3)  # summed key by key in the reference's order, for equal rounding
        if "w" in keys:
            move += forward * MOVE_PER_FRAME
        if "s" in keys:
            move -= forward * MOVE_PER_FRAME
        if "d" in keys:
            move += right * MOVE_PER_FRAME
        if "a" in keys:
            move -= right * MOVE_PER_FRAME
        pose = np.eye(4)
        pose[:3, :3] = rot
        pose[:3, 3] = self.pose[:3, 3] + move
        self.pose = pose
        return pose.copy()


def integrate_keys(per_frame_keys: Iterable[Iterable[str] | str]) -> np.ndarray:
    """Poses [N + 1, 4, 4] float64 of N action frames: p_0 (the start), then one per frame."""
    camera = ActionIntegrator()
    return np.stack([camera.pose.copy()] + [camera.step(keys) for keys in per_frame_keys])


def action_poses(text: str, frames: int | None = None) -> np.ndarray:
    """Camera-to-world poses [N, 4, 4] float64 for an action string, pose i after i frames.

    ``frames`` None: the start plus one pose per action frame (N + 1). Otherwise exactly
    ``frames`` poses, one per video frame: cut, or padded by holding the last pose. (The
    official camera of an F-frame video uses F + 1 poses: see ``act2cam_poses``.)
    """
    per_frame = action_keys(text)
    if frames is not None:
        if isinstance(frames, bool) or int(frames) != frames or frames < 1:
            raise ActionError(f"frames must be a positive integer; got {frames!r}")
        per_frame = per_frame[: int(frames) - 1]
    poses = integrate_keys(per_frame)
    if frames is not None and len(poses) < frames:
        poses = np.concatenate([poses, np.repeat(poses[-1:], int(frames) - len(poses), axis=0)])
    return poses


# --------------------------------------------------------------------------- act2cam


def act2cam_poses(text: str, frames: int) -> np.ndarray:
    """The official act2cam poses of a ``frames``-frame video: [frames + 1, 4, 4] float64
    (the start, then one per video frame, no keys after the string's end)."""
    return integrate_keys(act2cam_keys(text, frames))


def act2cam_keyframes(text: str, frames: int, normalize: bool = True, count: int | None = None) -> torch.Tensor:
    """Relative keyframes [F_lat, 4, 4] float32 of the official act2cam camera.

    The F + 1 poses are sampled at ``linspace(0, F, F_lat)``, then chained frame to frame;
    with ``normalize`` translations are divided by the largest (one pass). Without it they
    are the whole path's steps for ``long_video.translation_scale`` / ``window_camera``.
    ``count``: F_lat when it is not ``latent_frames(frames)`` (LingBot-World Fast cuts the
    latent to whole chunks but spreads the keyframes over the F frames asked).
    """
    return act2cam_keyframes_of(act2cam_poses(text, frames), frames, normalize, count)


def act2cam_keyframes_of(poses: np.ndarray, frames: int, normalize: bool = True,
                         count: int | None = None) -> torch.Tensor:
    """``act2cam_keyframes`` from the act2cam poses [F + 1, 4, 4] already integrated."""
    return relative_poses(interpolate_poses(poses, latent_frames(frames) if count is None else count),
                          normalize=normalize)


def act2cam_camera(
    text: str,
    frames: int,
    height: int,
    width: int,
    intrinsics: np.ndarray | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """The Base-Cam Plücker tensor [1, 384, F_lat, height/8, width/8] of an action string,
    as the official act2cam path builds it. ``intrinsics``: (fx, fy, cx, cy) in 480×832
    pixels; None gives ``default_intrinsics(height, width)``."""
    k = default_intrinsics(height, width) if intrinsics is None else intrinsics
    return keyframe_camera(act2cam_keyframes(text, frames), k, height, width, dtype, device)


def default_intrinsics(height: int, width: int) -> np.ndarray:
    """(fx, fy, cx, cy) in the 480×832 frame the camera code expects, for an output of
    ``height``×``width`` with square pixels.

    The reference always reads an intrinsics.npy written for 480×832 and stretches it to
    the output size (fx with the width ratio, fy with the height ratio); its examples hold
    fx ≈ fy ≈ 477–503 at 480×832, and this pack's presets use 500. Stretching those to a
    portrait or square frame would give non-square pixels, so here the focal length is
    chosen for the output frame (the long side sees the same field of view as the 832-pixel
    side at f = 500, about 79°) and expressed back in 480×832 pixels. For 480×832 itself
    this is exactly (500, 500, 416, 240).
    """
    if height < 1 or width < 1:
        raise ValueError(f"height and width must be positive; got {height}×{width}")
    focal = DEFAULT_INTRINSICS[0] * max(height, width) / INTRINSICS_WIDTH
    return np.array([focal * INTRINSICS_WIDTH / width, focal * INTRINSICS_HEIGHT / height,
                     INTRINSICS_WIDTH / 2, INTRINSICS_HEIGHT / 2])
