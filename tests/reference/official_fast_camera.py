"""The official LingBot-World Fast camera for a frame count, restated for tests (own words;
the steps of ``WanI2VFast.generate`` in wan/image2video_fast.py of the official Fast code and
its cam_utils, read, not copied).

What matters for counts that are not whole chunks (961, 161, 85, 41): the poses are cut to
the frame count ASKED (rounded to 4n + 1 and to what the pose file holds), then resampled to
the latent count cut down to whole chunks of 3, evenly over the asked poses' indices; the
video is then made of that latent count ((count - 1) * 4 + 1 frames: 961 asked -> 957 made).
Independent of the pack: scipy interpolation, SE(3) inverses by transpose, float32 after the
resampling as there.
"""
from __future__ import annotations

import numpy as np
import torch
from scipy.interpolate import interp1d
from scipy.spatial.transform import Rotation, Slerp


def frames_made(frame_num: int, chunk: int = 3) -> int:
    latent = (frame_num - 1) // 4 + 1
    latent -= latent % chunk
    return (latent - 1) * 4 + 1


def _resample(c2ws: np.ndarray, count: int) -> torch.Tensor:
    n = len(c2ws)
    src, tgt = np.linspace(0, n - 1, n), np.linspace(0, n - 1, count)
    trans = interp1d(src, c2ws[:, :3, 3], axis=0, kind="linear")(tgt)
    quats = Rotation.from_matrix(c2ws[:, :3, :3]).as_quat()
    for i in range(1, n):  # sign continuity, as the official interpolation does by hand
        if np.dot(quats[i], quats[i - 1]) < 0:
            quats[i] = -quats[i]
    rot = Slerp(src, Rotation.from_quat(quats))(tgt).as_matrix()
    out = np.zeros((count, 4, 4))
    out[:, :3, :3], out[:, :3, 3], out[:, 3, 3] = rot, trans, 1.0
    return torch.from_numpy(out).float()


def _inverse(t: torch.Tensor) -> torch.Tensor:
    out = torch.eye(4, dtype=t.dtype).repeat(len(t), 1, 1)
    rot_t = t[:, :3, :3].transpose(-1, -2)
    out[:, :3, :3] = rot_t
    out[:, :3, 3:] = -torch.bmm(rot_t, t[:, :3, 3:])
    return out


def _framewise_relative(c2ws: torch.Tensor) -> torch.Tensor:
    rel = _inverse(c2ws[:1]) @ c2ws
    rel[0] = torch.eye(4, dtype=c2ws.dtype)
    if len(rel) > 1:
        rel[1:] = torch.bmm(_inverse(rel[:-1]), rel[1:])
    norm = rel[:, :3, 3].norm(dim=-1).max()
    if norm > 0:
        rel[:, :3, 3] = rel[:, :3, 3] / norm
    return rel


def resampled_keyframes(c2ws: np.ndarray, count: int) -> torch.Tensor:
    """``count`` keyframes evenly over all of ``c2ws``, chained frame to frame and normalized."""
    return _framewise_relative(_resample(np.asarray(c2ws, dtype=np.float64), count))


def official_fast_keyframes(poses: np.ndarray, frame_num: int, chunk: int = 3) -> torch.Tensor:
    """Relative keyframes [F_lat, 4, 4] float32 the official Fast code makes from a pose file
    of ``poses`` [N, 4, 4] for ``frame_num`` frames asked."""
    pose_frames = (len(poses) - 1) // 4 * 4 + 1
    frame_num = min((frame_num - 1) // 4 * 4 + 1, pose_frames)
    c2ws = np.asarray(poses, dtype=np.float64)[:frame_num]
    count = (len(c2ws) - 1) // 4 + 1
    count -= count % chunk
    return _framewise_relative(_resample(c2ws, count))
