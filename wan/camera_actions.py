"""Keyboard-style camera authoring: an action string → camera-to-world poses, and the
default intrinsics for a frame of any size (docs/conventions.md#camera-path).

An action string is a comma-separated list of tokens ``KEYS-FRAMES``, e.g.
``w-20,j-10,w-30`` or ``iw-15,none-10``: the keys are held for that many video frames.
Keys follow the LingBot-World "act2cam" convention of the official repository
(``wan/utils/wasd_ijkl_to_c2ws.py`` in its Act release):

- W / S move forward / back, D / A right / left, by ``MOVE_PER_FRAME`` (0.05) per frame,
  along the camera's view and right directions flattened onto the world's ground plane
  (x–z; y is down in OpenCV axes), so looking up or down never makes W climb.
- I / K look up / down (pitch about the camera's own x axis), L / J turn right / left
  (yaw about the world's vertical y axis), by ``TURN_DEG_PER_FRAME`` (2°) per frame.
  Pitch stops at ±85°: a step that would pass it is dropped.
- Within one frame the rotation is applied first, then the move along the new directions.
- ``none`` (or ``-``) holds still. Several keys in one token act together (``wj-10``).

N action frames give N + 1 poses (the first is the identity); a video of F frames uses the
first F poses, padded by holding still when the string is shorter. Poses are OpenCV
camera-to-world matrices like poses.npy. Only this module's own code is used here.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from .camera import DEFAULT_INTRINSICS, INTRINSICS_HEIGHT, INTRINSICS_WIDTH

__all__ = [
    "ActionError",
    "ActionToken",
    "MOVE_PER_FRAME",
    "PITCH_LIMIT_DEG",
    "TURN_DEG_PER_FRAME",
    "action_frames",
    "action_poses",
    "default_intrinsics",
    "frames_for_actions",
    "parse_actions",
]

MOVE_PER_FRAME = 0.05
TURN_DEG_PER_FRAME = 2.0
PITCH_LIMIT_DEG = 85.0
KEYS = "wasdijkl"
HOLD_WORDS = ("none", "")
EXAMPLE = "w-20,j-10,w-30"
MAX_ACTION_FRAMES = 100_000

_TOKEN = re.compile(r"^([a-z]*)-([+-]?\d+)$")


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
                              "'none-5')")
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
    return total + (-(total - 1)) % 4


def _rot_x(rad: float) -> np.ndarray:
    c, s = math.cos(rad), math.sin(rad)
    return np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])


def _rot_y(rad: float) -> np.ndarray:
    c, s = math.cos(rad), math.sin(rad)
    return np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])


def _ground(v: np.ndarray) -> np.ndarray:
    """``v`` projected on the x–z plane and made unit length (zero stays zero)."""
    flat = np.array([v[0], 0.0, v[2]])
    norm = float(np.linalg.norm(flat))
    return flat / norm if norm > 0 else flat


def action_poses(text: str, frames: int | None = None) -> np.ndarray:
    """Camera-to-world poses [F, 4, 4] float64 for an action string.

    ``frames`` None: one pose per action frame plus the start (N + 1). Otherwise exactly
    ``frames`` poses: cut, or padded by holding the last pose.
    """
    tokens = parse_actions(text)
    per_frame = [t.keys for t in tokens for _ in range(t.frames)]
    if frames is not None:
        if isinstance(frames, bool) or int(frames) != frames or frames < 1:
            raise ActionError(f"frames must be a positive integer; got {frames!r}")
        per_frame = per_frame[: int(frames) - 1]
    turn = math.radians(TURN_DEG_PER_FRAME)
    limit = math.radians(PITCH_LIMIT_DEG)
    rot = np.eye(3)
    pos = np.zeros(3)
    pitch = 0.0
    out = [np.eye(4)]
    for keys in per_frame:
        d_pitch = turn * (("i" in keys) - ("k" in keys))
        if abs(pitch + d_pitch) <= limit:
            pitch += d_pitch
        else:
            d_pitch = 0.0
        d_yaw = turn * (("l" in keys) - ("j" in keys))
        # Yaw about the world's vertical (pre-multiply), pitch about the camera's x (post).
        rot = _rot_y(d_yaw) @ rot @ _rot_x(d_pitch)
        forward, right = _ground(rot[:, 2]), _ground(rot[:, 0])
        pos = pos + MOVE_PER_FRAME * ((("w" in keys) - ("s" in keys)) * forward
                                      + (("d" in keys) - ("a" in keys)) * right)
        pose = np.eye(4)
        pose[:3, :3], pose[:3, 3] = rot, pos
        out.append(pose)
    poses = np.stack(out)
    if frames is not None and len(poses) < frames:
        poses = np.concatenate([poses, np.repeat(poses[-1:], int(frames) - len(poses), axis=0)])
    return poses


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
