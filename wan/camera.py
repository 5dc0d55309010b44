"""Camera path → Plücker-ray tensor for the DiT's camera layers (docs/conventions.md#camera-path).

Poses are camera-to-world 4×4 matrices in OpenCV axes (x right, y down, z forward);
intrinsics are (fx, fy, cx, cy) in pixels of a 480×832 frame. The chain is:
validate → cut to the usable frame count → interpolate to one pose per latent frame →
frame-to-frame relative poses with unit-scale translations → per-pixel rays
(origin ⊕ unit direction) → fold each 8×8 pixel block into 384 channels.

Pure math on arrays: files are read by ``loaders.trajectory``, presets are in
``camera_presets.py``, the drawing of a path in ``pipeline/camera_preview.py``.
"""
from __future__ import annotations

from typing import Union

import numpy as np
import torch
from scipy.spatial.transform import Rotation, Slerp

from .conditioning import check_frame_count
from .geometry import latent_frames, video_frames

__all__ = [
    "CameraError",
    "DEFAULT_INTRINSICS",
    "INTRINSICS_HEIGHT",
    "INTRINSICS_WIDTH",
    "as_float_array",
    "build_camera",
    "camera_tensor",
    "check_camera_size",
    "cut_trajectory",
    "fold_rays",
    "interpolate_poses",
    "keyframe_camera",
    "plucker_rays",
    "relative_poses",
    "rigid_inverse",
    "scale_intrinsics",
    "trajectory_keyframes",
    "usable_frames",
    "validate_trajectory",
]

# Intrinsics files are written for this frame size; they are rescaled to the output size.
INTRINSICS_HEIGHT = 480
INTRINSICS_WIDTH = 832
# Intrinsics of a 480×832 frame close to those of the reference examples (presets, actions).
DEFAULT_INTRINSICS = (500.0, 500.0, INTRINSICS_WIDTH / 2, INTRINSICS_HEIGHT / 2)
# Pixels per latent cell along each spatial axis (VAE stride), folded into channels.
FOLD = 8
ROTATION_TOLERANCE = 1e-3

PoseArray = Union[np.ndarray, torch.Tensor]


class CameraError(ValueError):
    """A camera trajectory that cannot be used; the message names the field at fault."""


# --------------------------------------------------------------------------- validation


def _where(source: str) -> str:
    return f" in {source}" if source else ""


def as_float_array(value: object, field: str, source: str = "") -> np.ndarray:
    """``value`` (array, tensor, nested lists) as float64; CameraError naming ``field`` otherwise."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().double().numpy()
    if np.iscomplexobj(value):  # a float cast would silently drop the imaginary part
        raise CameraError(f"{field}{_where(source)}: holds complex numbers; give real values")
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise CameraError(f"{field}{_where(source)}: not a numeric array ({exc})") from exc
    return arr


def validate_trajectory(poses: np.ndarray, intrinsics: np.ndarray, source: str = "") -> None:
    """Raise CameraError unless ``poses`` [N,4,4] and ``intrinsics`` [N,4] or [4] are usable.

    Poses must be finite rigid transforms (orthonormal rotation, det +1, last row 0 0 0 1);
    intrinsics finite with positive focal lengths; one intrinsics row per pose when given
    per frame. ``source`` (a file or node name) is put into the messages.
    """
    where = _where(source)
    p = as_float_array(poses, "poses", source)
    k = as_float_array(intrinsics, "intrinsics", source)

    if p.ndim != 3 or p.shape[1:] != (4, 4):
        raise CameraError(f"poses{where}: expected shape [N, 4, 4], got {list(p.shape)}")
    if p.shape[0] < 1:
        raise CameraError(f"poses{where}: the trajectory is empty (N = 0)")
    bad = np.argwhere(~np.isfinite(p).all(axis=(1, 2)))
    if bad.size:
        raise CameraError(f"poses{where}: pose {int(bad[0, 0])} holds NaN or inf values")
    last_row_err = np.abs(p[:, 3, :] - np.array([0.0, 0.0, 0.0, 1.0])).max(axis=1)
    bad = np.argwhere(last_row_err > ROTATION_TOLERANCE)
    if bad.size:
        i = int(bad[0, 0])
        raise CameraError(
            f"poses{where}: pose {i} has last row {p[i, 3].tolist()}, expected [0, 0, 0, 1]"
        )
    rot = p[:, :3, :3]
    ortho_err = np.abs(rot @ rot.transpose(0, 2, 1) - np.eye(3)).max(axis=(1, 2))
    bad = np.argwhere(ortho_err > ROTATION_TOLERANCE)
    if bad.size:
        i = int(bad[0, 0])
        raise CameraError(
            f"poses{where}: the rotation part of pose {i} is not orthonormal "
            f"(max |R·Rᵀ − I| = {ortho_err[i]:.3g}); poses must be rigid camera-to-world matrices"
        )
    det = np.linalg.det(rot)
    bad = np.argwhere(np.abs(det - 1.0) > ROTATION_TOLERANCE)
    if bad.size:
        i = int(bad[0, 0])
        raise CameraError(
            f"poses{where}: the rotation part of pose {i} has determinant {det[i]:.4g}, expected +1 "
            "(a reflection or a left-handed frame; OpenCV camera axes are x right, y down, z forward)"
        )

    if k.ndim == 1:
        k = k[None]
    if k.ndim != 2 or k.shape[1] != 4:
        raise CameraError(
            f"intrinsics{where}: expected shape [N, 4] or [4] (fx, fy, cx, cy), got {list(np.shape(intrinsics))}"
        )
    bad = np.argwhere(~np.isfinite(k).all(axis=1))
    if bad.size:
        raise CameraError(f"intrinsics{where}: row {int(bad[0, 0])} holds NaN or inf values")
    bad = np.argwhere((k[:, 0] <= 0) | (k[:, 1] <= 0))
    if bad.size:
        i = int(bad[0, 0])
        raise CameraError(
            f"intrinsics{where}: row {i} has focal lengths fx={k[i, 0]:g}, fy={k[i, 1]:g}; both must be > 0"
        )
    if np.ndim(intrinsics) == 2 and k.shape[0] != p.shape[0]:
        raise CameraError(
            f"intrinsics{where}: {k.shape[0]} rows for {p.shape[0]} poses; give one row per pose or a single row"
        )


# --------------------------------------------------------------------------- frame counts


def usable_frames(frame_num: int, n_poses: int) -> int:
    """Frames a trajectory of ``n_poses`` poses can drive: at most 4·⌊(N−1)/4⌋ + 1."""
    if n_poses < 1:
        raise CameraError("poses: the trajectory is empty (N = 0)")
    return min(int(frame_num), video_frames(latent_frames(n_poses)))


# --------------------------------------------------------------------------- pose math


def cut_trajectory(
    poses: PoseArray, intrinsics: PoseArray, frame_num: int, source: str = ""
) -> tuple[np.ndarray, np.ndarray, int]:
    """Validate a trajectory and cut it to the frames it can drive.

    Returns (c2ws [F,4,4] float64, K [4] = the first intrinsics row in 480×832 pixels,
    F = the frame count actually used, ≤ ``frame_num``). ``source`` names the trajectory
    in error messages (files are read by ``loaders.trajectory``).
    """
    check_frame_count(frame_num)
    validate_trajectory(poses, intrinsics, source)
    p = as_float_array(poses, "poses", source)
    k = as_float_array(intrinsics, "intrinsics", source).reshape(-1, 4)
    frames = usable_frames(frame_num, len(p))
    return p[:frames], k[0], frames


def interpolate_poses(c2ws: np.ndarray | torch.Tensor, n_out: int) -> np.ndarray:
    """Resample N poses to ``n_out`` poses evenly spread over source indices 0..N−1.

    Translation is interpolated linearly, rotation by spherical linear interpolation
    (scipy's Slerp). Slerp interpolates each segment through the rotation vector of the
    relative rotation, which always takes the short way round, so the sign of the stored
    quaternions (q and −q are one rotation) cannot cause jumps: the reference's explicit
    sign flipping is already implied. Computed in float64 and returned as float32
    [n_out, 4, 4], as the reference does (``torch.from_numpy(poses).float()``): everything
    downstream then runs in float32 like there (docs/conventions.md#reference-behaviours).
    """
    if isinstance(c2ws, torch.Tensor):
        c2ws = c2ws.detach().cpu().double().numpy()
    c2ws = np.asarray(c2ws, dtype=np.float64)
    n_src = c2ws.shape[0]
    if n_out < 1:
        raise ValueError(f"n_out must be >= 1; got {n_out}")
    out = np.zeros((n_out, 4, 4))
    out[:, 3, 3] = 1.0
    if n_src == 1:
        out[:] = c2ws[0]
        return out.astype(np.float32)
    src = np.arange(n_src, dtype=np.float64)
    tgt = np.linspace(0.0, n_src - 1.0, n_out)
    for axis in range(3):
        out[:, axis, 3] = np.interp(tgt, src, c2ws[:, axis, 3])
    slerp = Slerp(src, Rotation.from_matrix(c2ws[:, :3, :3]))
    out[:, :3, :3] = slerp(tgt).as_matrix()
    return out.astype(np.float32)


def rigid_inverse(t: torch.Tensor) -> torch.Tensor:
    """Inverse of rigid transforms [..., 4, 4] via Rᵀ and −Rᵀ·t (no general matrix inverse)."""
    inv = torch.zeros_like(t)
    r_t = t[..., :3, :3].transpose(-1, -2)
    inv[..., :3, :3] = r_t
    inv[..., :3, 3:] = -r_t @ t[..., :3, 3:]
    inv[..., 3, 3] = 1.0
    return inv


def relative_poses(c2ws: np.ndarray | torch.Tensor, normalize: bool = True) -> torch.Tensor:
    """Frame-to-frame motion T_{i−1}⁻¹·T_i (first = identity), translations unit-scaled.

    Composed as the reference does, in the input's dtype (float32 from
    ``interpolate_poses``): all poses relative to the first (T₀⁻¹T_i, first set to the
    identity), then consecutive differences of those. Algebraically that is T_{i−1}⁻¹T_i, but
    in float32 the two-step order rounds differently, and the reference's rounding is what
    the model saw. With ``normalize`` the translations are divided by the largest
    translation norm when that is > 0 (a camera that only rotates stays as it is).
    """
    t = c2ws if isinstance(c2ws, torch.Tensor) else torch.from_numpy(np.asarray(c2ws))
    if not t.is_floating_point():
        t = t.float()
    first = rigid_inverse(t[:1]) @ t
    first[0] = torch.eye(4, dtype=t.dtype, device=t.device)
    rel = first.clone()
    if t.shape[0] > 1:
        rel[1:] = rigid_inverse(first[:-1]) @ first[1:]
    if normalize:
        largest = rel[:, :3, 3].norm(dim=-1).max()
        if largest > 0:
            rel[:, :3, 3] = rel[:, :3, 3] / largest
    return rel


# --------------------------------------------------------------------------- rays


def scale_intrinsics(k: np.ndarray | torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(fx, fy, cx, cy) of a 480×832 frame → the same camera at height×width.

    x quantities (fx, cx) scale with the width ratio, y quantities (fy, cy) with the height
    ratio; the frame is resized, not cropped, so there is no principal-point offset.
    """
    # float32 like the reference (``torch.from_numpy(np.load(...)).float()`` then scaled).
    k = torch.as_tensor(np.asarray(k, dtype=np.float32)).reshape(-1, 4)[0]
    sx = width / INTRINSICS_WIDTH
    sy = height / INTRINSICS_HEIGHT
    return torch.stack([k[0] * sx, k[1] * sy, k[2] * sx, k[3] * sy])


def _camera_directions(K: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Unit view directions through pixel centres in camera axes: [k, h·w, 3] for K [k, 4]."""
    dtype, device = K.dtype, K.device
    fx, fy, cx, cy = (K[:, i].view(-1, 1, 1) for i in range(4))
    u = torch.arange(w, dtype=dtype, device=device).view(1, 1, w) + 0.5
    v = torch.arange(h, dtype=dtype, device=device).view(1, h, 1) + 0.5
    x = ((u - cx) / fx).expand(-1, h, w)
    y = ((v - cy) / fy).expand(-1, h, w)
    dirs = torch.stack([x, y, torch.ones_like(x)], dim=-1).reshape(K.shape[0], h * w, 3)
    return dirs / dirs.norm(dim=-1, keepdim=True)


def plucker_rays(c2ws: torch.Tensor, K: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Per-pixel rays [F, h, w, 6] = camera origin ⊕ unit view direction in world axes.

    Rays pass through pixel centres (+0.5); the camera-frame direction
    ((u − cx)/fx, (v − cy)/fy, 1) is normalized, then rotated by the pose's rotation.
    This is the (origin, direction) form the model was trained on, not the o×d moment.
    ``K`` is [4] or [F, 4] in pixels of the h×w frame. Computed in ``c2ws``' dtype.
    """
    K = torch.as_tensor(K, dtype=c2ws.dtype, device=c2ws.device).reshape(-1, 4)
    return _rays(c2ws, _camera_directions(K, h, w), h, w)


def _rays(c2ws: torch.Tensor, cam_dirs: torch.Tensor, h: int, w: int, directions_only: bool = False) -> torch.Tensor:
    """Rays [F, h, w, 6] (or [F, h, w, 3] directions only) from camera-axis directions [1 or F, h·w, 3]."""
    n_frames = c2ws.shape[0]
    # Row vectors times Rᵀ apply R to every direction.
    dirs = cam_dirs @ c2ws[:, :3, :3].transpose(-1, -2)
    if directions_only:
        return dirs.view(n_frames, h, w, 3)
    origins = c2ws[:, None, :3, 3].expand(n_frames, h * w, 3)
    return torch.cat([origins, dirs], dim=-1).view(n_frames, h, w, 6)


def fold_rays(rays: torch.Tensor) -> torch.Tensor:
    """[F, h, w, C] → [C·8·8, F, h/8, w/8], channel index = c·64 + dy·8 + dx."""
    f, h, w, c = rays.shape
    blocks = rays.reshape(f, h // FOLD, FOLD, w // FOLD, FOLD, c)
    # (f, H, dy, W, dx, c) → (c, dy, dx, f, H, W)
    return blocks.permute(5, 2, 4, 0, 1, 3).reshape(c * FOLD * FOLD, f, h // FOLD, w // FOLD)


def check_camera_size(height: int, width: int) -> None:
    """Raise ValueError unless the frame folds into whole 8×8 pixel blocks."""
    if height % FOLD or width % FOLD or height < FOLD or width < FOLD:
        raise ValueError(f"height and width must be positive multiples of {FOLD}; got {height}×{width}")


def trajectory_keyframes(
    poses: PoseArray, intrinsics: PoseArray, frame_num: int
) -> tuple[torch.Tensor, np.ndarray, int]:
    """A pose file's camera at the latent rate: (relative keyframes [F_lat, 4, 4] float32,
    K [4] in 480×832 pixels, F = the frame count used).

    The F poses in use (poses.npy convention: pose i belongs to video frame i) are sampled
    at ``linspace(0, F − 1, F_lat)``, then made frame-to-frame relative with unit-scale
    translations (docs/conventions.md#camera-path).
    """
    c2ws, k, frames = cut_trajectory(poses, intrinsics, frame_num)
    return relative_poses(interpolate_poses(c2ws, latent_frames(frames))), k, frames


def keyframe_camera(
    keyframes: torch.Tensor,
    intrinsics: np.ndarray | torch.Tensor,
    height: int,
    width: int,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
    directions_only: bool = False,
) -> torch.Tensor:
    """Ray tensor [1, C·64, F_lat, height/8, width/8] from relative keyframes [F_lat, 4, 4].

    C = 6 (origin ⊕ direction: the Base-Cam Plücker tensor) or, with ``directions_only``,
    3 (the Act checkpoint's rays, docs/conventions.md#act-checkpoint). ``intrinsics``: one row (fx, fy, cx, cy) in
    480×832 pixels, rescaled to height×width. Rays are computed in float32.
    """
    check_camera_size(height, width)
    keyframes = torch.as_tensor(keyframes).to(device=device, dtype=torch.float32)
    n_lat = keyframes.shape[0]
    channels = 3 if directions_only else 6
    k_out = scale_intrinsics(intrinsics, height, width).to(device=device, dtype=torch.float32)
    cam_dirs = _camera_directions(k_out[None], height, width)  # one K for all frames
    out = torch.empty(1, channels * FOLD * FOLD, n_lat, height // FOLD, width // FOLD, dtype=dtype, device=device)
    # One latent frame at a time: full-resolution float32 rays for 21 frames at 720p
    # would take ~0.7 GB. The origin channels hold one value per frame and channel, so they
    # are filled, not folded: only the directions go through the per-pixel fold (the same
    # numbers as folding origin ⊕ direction; a Play chunk's rays are made between chunks).
    first = channels * FOLD * FOLD - 3 * FOLD * FOLD  # the direction channels start here
    for i in range(n_lat):
        directions = _rays(keyframes[i : i + 1], cam_dirs, height, width, directions_only=True)
        out[0, first:, i : i + 1] = fold_rays(directions).to(dtype)
        for c in range(first // (FOLD * FOLD)):
            out[0, c * FOLD * FOLD:(c + 1) * FOLD * FOLD, i] = keyframes[i, c, 3].to(dtype)
    return out


def build_camera(
    poses: PoseArray,
    intrinsics: PoseArray,
    frame_num: int,
    height: int,
    width: int,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, int]:
    """The camera tensor [1, 384, F_lat, height/8, width/8] and the frame count it covers.

    The frame count is ``frame_num`` cut to what the trajectory can drive
    (docs/conventions.md#camera-path); the video must be generated with that many frames for
    the latent grids to line up.
    """
    check_camera_size(height, width)
    keyframes, k, frames = trajectory_keyframes(poses, intrinsics, frame_num)
    return keyframe_camera(keyframes, k, height, width, dtype, device), frames


def camera_tensor(
    poses: PoseArray,
    intrinsics: PoseArray,
    frame_num: int,
    height: int,
    width: int,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Plücker tensor [1, 384, F_lat, height/8, width/8] for the DiT (see ``build_camera``).

    F_lat is ``(F − 1)//4 + 1`` for F = ``usable_frames(frame_num, N)``; use
    ``build_camera`` to get F itself.
    """
    return build_camera(poses, intrinsics, frame_num, height, width, dtype, device)[0]
