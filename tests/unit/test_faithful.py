"""Themed: the pack does what the reference does where that is easy to miss
(docs/conventions.md#reference-behaviours), checked against values written from the
reference's documented behaviour. Across wan/conditioning.py, wan/camera.py, the VAE stages.

1. resize: the first frame is bicubic and not clamped (test_first_frame_is_bicubic_without_clamp).
2. camera precision: keyframes and relative poses in float32 as upstream
   (test_pose_interpolation_returns_float32, test_relative_poses_are_composed_in_float32_like_the_reference,
   test_camera_tensor_follows_the_float32_chain).
3. VAE precision: float32 on every device unless bf16 is asked
   (test_vae_runs_in_float32_on_every_device_unless_asked,
   test_encode_and_decode_load_the_vae_in_the_asked_precision).
Empty prompt and negative prompt: test_text.py::test_empty_prompt_is_encoded_and_empty_negative_is_the_default.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from comfyui_lingbot_world.pipeline import image as image_stage
from comfyui_lingbot_world.pipeline.guards import vae_precision
from comfyui_lingbot_world.wan.camera import build_camera, interpolate_poses, relative_poses
from comfyui_lingbot_world.wan.conditioning import image_to_tensor


# --------------------------------------------------------------------------- 1. resize


def test_first_frame_is_bicubic_without_clamp():
    """Reference: to_tensor -> [-1, 1] -> interpolate(mode='bicubic'), and no clamp: the
    overshoot at a hard edge reaches the VAE as it is."""
    arr = np.zeros((72, 128, 3), dtype=np.uint8)
    arr[:, 64:] = 255  # one hard vertical edge
    arr[36:, :, 1] = 255
    expected = torch.from_numpy(arr).permute(2, 0, 1).float().div(255.0).sub(0.5).div(0.5)
    expected = F.interpolate(expected[None], size=(48, 80), mode="bicubic", align_corners=False)[0]
    ours = image_to_tensor(Image.fromarray(arr), 48, 80)
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-6)
    assert ours.max() > 1.05 and ours.min() < -1.05  # the overshoot is kept


# --------------------------------------------------------------------------- 2. camera precision


def _rotation_z(deg: float) -> np.ndarray:
    a = np.deg2rad(deg)
    return np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1]])


def _poses(n: int) -> np.ndarray:
    """A slow pan far from the origin: small frame-to-frame steps on large coordinates,
    where float32 loses digits."""
    poses = np.tile(np.eye(4), (n, 1, 1))
    for i in range(n):
        poses[i, :3, :3] = _rotation_z(0.7 * i)
        poses[i, :3, 3] = [1000.0 + 0.013 * i, -500.0 + 0.002 * i * i, 300.0]
    return poses


def _reference_relative_float32(c2ws: torch.Tensor) -> torch.Tensor:
    """The documented reference chain (docs/conventions.md#camera-path, #reference-behaviours):
    float32 poses, relative to the first
    (first set to identity), then frame to frame, then translations over the largest norm."""
    def inverse(t: torch.Tensor) -> torch.Tensor:
        out = torch.eye(4, dtype=t.dtype).repeat(t.shape[0], 1, 1)
        r_t = t[:, :3, :3].transpose(-1, -2)
        out[:, :3, :3] = r_t
        out[:, :3, 3:] = -torch.bmm(r_t, t[:, :3, 3:])
        return out

    rel = torch.matmul(inverse(c2ws[:1]), c2ws)
    rel[0] = torch.eye(4, dtype=c2ws.dtype)
    rel[1:] = torch.bmm(inverse(rel[:-1]), rel[1:])
    largest = rel[:, :3, 3].norm(dim=-1).max()
    if largest > 0:
        rel[:, :3, 3] = rel[:, :3, 3] / largest
    return rel


def test_pose_interpolation_returns_float32():
    out = interpolate_poses(_poses(9), 3)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out[1], _poses(9)[4].astype(np.float32), atol=1e-4)


def test_relative_poses_are_composed_in_float32_like_the_reference():
    keyframes = interpolate_poses(_poses(17), 5)
    ours = relative_poses(keyframes)
    assert ours.dtype == torch.float32
    expected = _reference_relative_float32(torch.from_numpy(keyframes))
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-7)
    # The float64 chain differs visibly here: the pack used to compute that one.
    in_float64 = _reference_relative_float32(torch.from_numpy(_poses(17)[::4].copy()))
    assert (ours[:, :3, 3] - in_float64[:, :3, 3].float()).abs().max() > 1e-5


def test_camera_tensor_follows_the_float32_chain():
    poses, k = _poses(17), np.array([500.0, 500.0, 416.0, 240.0])
    cam, frames = build_camera(poses, k, 17, 32, 48, dtype=torch.float32)
    rel = _reference_relative_float32(torch.from_numpy(interpolate_poses(poses, 5)))
    # channels 0..2 of each 8x8 fold are the ray origin = the relative translation
    origin = cam[0, 0:3 * 64:64, :, 0, 0].T  # [F_lat, 3]
    torch.testing.assert_close(origin, rel[:, :3, 3], rtol=0, atol=1e-7)
    assert frames == 17


# --------------------------------------------------------------------------- 3. VAE precision


def test_vae_runs_in_float32_on_every_device_unless_asked():
    for device in ("cpu", "cuda"):
        assert image_stage.vae_dtype(torch.device(device)) == torch.float32
        assert image_stage.vae_dtype(torch.device(device), "bf16") == torch.bfloat16
    with pytest.raises(ValueError, match="VAE precision 'fp16' is not one of fp32, bf16"):
        vae_precision("fp16")


def test_encode_and_decode_load_the_vae_in_the_asked_precision(monkeypatch, tmp_path):
    from comfyui_lingbot_world.tools.synthetic.vae import write_vae_checkpoint
    from comfyui_lingbot_world.pipeline import decode as decode_stage
    from comfyui_lingbot_world.wan.vae import VAEGeometry

    tiny = VAEGeometry(dim=8)
    path = write_vae_checkpoint(tmp_path / "vae.pth", tiny)
    seen = []
    real = image_stage.load_vae

    def recording(file, device, dtype):
        seen.append(dtype)
        return real(file, device, dtype)

    monkeypatch.setattr(image_stage, "load_vae", recording)
    monkeypatch.setattr(decode_stage, "load_vae", recording)
    picture = Image.fromarray(np.full((32, 48, 3), 128, dtype=np.uint8))
    cond = image_stage.encode_image(path, picture, 5, 32, 48, "cpu")
    image_stage.encode_image(path, picture, 5, 32, 48, "cpu", precision="bf16")
    video = decode_stage.decode(path, cond.y[4:], "cpu", precision="bf16")
    decode_stage.decode(path, cond.y[4:], "cpu")
    assert seen == [torch.float32, torch.bfloat16, torch.bfloat16, torch.float32]
    assert video.dtype == torch.float32 and video.shape == (3, 5, 32, 48)
