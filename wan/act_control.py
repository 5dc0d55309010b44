"""The control tensor of the LingBot-World Act checkpoint (docs/conventions.md#act-checkpoint): ray directions plus
W/A/S/D keys, folded onto the latent grid.

Act reads 7 channels per pixel where Base-Cam reads 6: the 3 ray directions of the
relative keyframe poses (no ray origins: the keys drive the movement), then the 4 key
columns w, a, s, d. A video of F = 4n + 1 frames has F_lat = n + 1 latent frames; the key
row of latent frame j is the row of video frame 4j (rows 0, 4, 8, …), the same for every
pixel. Both parts are folded 8×8 into channels (channel = c·64 + dy·8 + dx) and stacked,
directions first: 3·64 + 4·64 = 448 channels per latent cell.

Sources of the keys: an ``action.npy`` [F, 4] beside a pose file (its rotations give the
rays), or an action string (``wasd_from_actions``; its rays come from the act2cam
trajectory, ``camera_actions.act2cam_keyframes``).
"""
from __future__ import annotations

import numpy as np
import torch

from .camera import FOLD, check_camera_size, keyframe_camera, trajectory_keyframes
from .camera_actions import act2cam_keyframes, act2cam_keys, default_intrinsics
from .conditioning import check_frame_count
from .geometry import VAE_STRIDE_T, video_frames

__all__ = [
    "ACT_CHANNELS",
    "ActError",
    "WASD_KEYS",
    "act_control",
    "act_control_from_actions",
    "act_control_from_trajectory",
    "check_wasd",
    "wasd_from_actions",
    "wasd_rows",
]

WASD_KEYS = "wasd"  # column order of action.npy
ACT_CHANNELS = (3 + len(WASD_KEYS)) * FOLD * FOLD  # 448


class ActError(ValueError):
    """Act controls that cannot be used; the message names the field (and file) at fault."""


def _where(source: str) -> str:
    return f" in {source}" if source else ""


def check_wasd(wasd: np.ndarray | torch.Tensor, frames: int, source: str = "") -> np.ndarray:
    """A W/A/S/D array [N, 4] (columns w, a, s, d, values 0..1) cut to ``frames`` rows, as
    float32; ActError naming ``wasd`` (and ``source``, e.g. the action.npy path) otherwise.

    Like the reference (``action[:frame_num]``), rows past the video are ignored; an array
    shorter than the video is refused.
    """
    check_frame_count(frames)
    where = _where(source)
    if isinstance(wasd, torch.Tensor):
        wasd = wasd.detach().cpu().numpy()
    if np.iscomplexobj(wasd):
        raise ActError(f"wasd{where}: holds complex numbers; give 0/1 key states")
    try:
        arr = np.asarray(wasd, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ActError(f"wasd{where}: not a numeric array ({exc})") from exc
    if arr.ndim != 2 or arr.shape[1] != len(WASD_KEYS):
        raise ActError(f"wasd{where}: expected shape [frames, 4] (columns w, a, s, d), got {list(arr.shape)}")
    if arr.shape[0] < frames:
        raise ActError(f"wasd{where}: {arr.shape[0]} rows cover only {arr.shape[0]} frames but the video has "
                       f"{frames}; give one row per video frame")
    arr = arr[:frames]
    bad = np.argwhere(~np.isfinite(arr))
    if bad.size:
        raise ActError(f"wasd{where}: row {int(bad[0, 0])} holds NaN or inf")
    bad = np.argwhere((arr < 0) | (arr > 1))
    if bad.size:
        r, c = (int(v) for v in bad[0])
        raise ActError(f"wasd{where}: row {r} column {WASD_KEYS[c]!r} is {arr[r, c]:g}; key states are 0 "
                       "(released) to 1 (held)")
    return arr.astype(np.float32)


def wasd_from_actions(text: str, frames: int) -> np.ndarray:
    """The W/A/S/D columns [frames, 4] float32 of an action string (1 = held), padded with
    released keys to ``frames``; a string longer than the video is refused (ActionError).
    I/J/K/L are not keys here: they turn the camera (the rays)."""
    return wasd_rows(act2cam_keys(text, frames))


def wasd_rows(keys: list[frozenset[str]]) -> np.ndarray:
    """W/A/S/D rows [len(keys), 4] float32 (1 = held) of per-frame key sets."""
    return np.array([[float(k in held) for k in WASD_KEYS] for held in keys], dtype=np.float32)


def act_control(
    keyframes: torch.Tensor,
    intrinsics: np.ndarray | torch.Tensor,
    height: int,
    width: int,
    wasd: np.ndarray | torch.Tensor,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Act control tensor [1, 448, F_lat, height/8, width/8].

    ``keyframes``: relative poses [F_lat, 4, 4] (only their rotations matter here);
    ``intrinsics``: (fx, fy, cx, cy) in 480×832 pixels; ``wasd``: [F, 4] key states of the
    F = 4·(F_lat − 1) + 1 video frames (``check_wasd`` cuts a longer array).
    """
    check_camera_size(height, width)
    keyframes = torch.as_tensor(keyframes)
    if keyframes.dim() != 3 or tuple(keyframes.shape[1:]) != (4, 4) or keyframes.shape[0] < 1:
        raise ActError(f"keyframes: expected shape [F_lat, 4, 4], got {list(keyframes.shape)}")
    n_lat = keyframes.shape[0]
    frames = video_frames(n_lat)
    checked = check_wasd(wasd, frames)  # shape and values; too few rows is an error there
    if np.shape(wasd)[0] != frames:
        raise ActError(f"wasd: {np.shape(wasd)[0]} rows for {n_lat} latent frames; give one row per video "
                       f"frame ({frames}; check_wasd cuts a longer array)")
    keys = torch.from_numpy(checked[::VAE_STRIDE_T].copy()).to(device)  # [F_lat, 4]: rows 0, 4, 8, …
    rays = keyframe_camera(keyframes, intrinsics, height, width, dtype, device, directions_only=True)
    lat_h, lat_w = height // FOLD, width // FOLD
    # Folding a per-pixel constant repeats each key 64 times: channel = c·64 + dy·8 + dx.
    folded = keys.T.to(dtype).repeat_interleave(FOLD * FOLD, dim=0)  # [4·64, F_lat]
    held = folded[None, :, :, None, None].expand(1, -1, n_lat, lat_h, lat_w)
    return torch.cat([rays, held], dim=1)


def act_control_from_trajectory(
    poses: np.ndarray,
    intrinsics: np.ndarray,
    wasd: np.ndarray | torch.Tensor,
    frame_num: int,
    height: int,
    width: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    wasd_source: str = "",
) -> tuple[torch.Tensor, int]:
    """The reference's Act input from the arrays of poses.npy + intrinsics.npy and
    action.npy (read by ``loaders.trajectory``): (control [1, 448, F_lat, h/8, w/8], F = the frames it covers).

    The poses are sampled as for Base-Cam (F poses at ``linspace(0, F − 1, F_lat)``) and
    ``frame_num`` is cut to what they can drive, like ``camera.build_camera``.
    """
    keyframes, k, frames = trajectory_keyframes(poses, intrinsics, frame_num)
    keys = check_wasd(wasd, frames, wasd_source)
    return act_control(keyframes, k, height, width, keys, dtype, device), frames


def act_control_from_actions(
    text: str,
    frames: int,
    height: int,
    width: int,
    intrinsics: np.ndarray | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Act input of an action string: its W/A/S/D columns, and rays turned by its act2cam
    trajectory (the F + 1 poses sampled at ``linspace(0, F, F_lat)``). ``intrinsics`` None:
    ``default_intrinsics(height, width)``."""
    k = default_intrinsics(height, width) if intrinsics is None else intrinsics
    return act_control(act2cam_keyframes(text, frames), k, height, width, wasd_from_actions(text, frames), dtype,
                       device)
