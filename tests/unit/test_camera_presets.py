"""wan/camera_presets.py: the built-in camera moves (a table of motions) as valid
trajectories that turn the way OpenCV axes say."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from comfyui_lingbot_world.wan.camera import camera_tensor, validate_trajectory
from comfyui_lingbot_world.wan.camera_presets import CAMERA_PRESETS, preset_trajectory


@pytest.mark.parametrize("name", CAMERA_PRESETS)
def test_presets_are_valid_trajectories(name: str) -> None:
    poses, intr = preset_trajectory(name, 17, speed=1.5)
    assert poses.shape == (17, 4, 4) and intr.shape == (17, 4)
    validate_trajectory(poses, intr, source=name)
    np.testing.assert_allclose(poses[0], np.eye(4), atol=1e-7)
    cam = camera_tensor(poses, intr, 17, 16, 32, dtype=torch.float32)
    assert cam.shape == (1, 384, 5, 2, 4) and torch.isfinite(cam).all()


def view_dir(poses: np.ndarray) -> np.ndarray:
    return poses[-1, :3, 2]


def test_preset_directions_follow_opencv_axes() -> None:
    assert view_dir(preset_trajectory("pan_left", 9)[0])[0] < 0  # looks towards -x
    assert view_dir(preset_trajectory("pan_right", 9)[0])[0] > 0
    assert view_dir(preset_trajectory("tilt_up", 9)[0])[1] < 0  # y points down
    assert view_dir(preset_trajectory("tilt_down", 9)[0])[1] > 0
    assert preset_trajectory("dolly_in", 9)[0][-1, 2, 3] > 0
    assert preset_trajectory("dolly_out", 9)[0][-1, 2, 3] < 0
    orbit = preset_trajectory("orbit_left", 41)[0]
    assert orbit[-1, 0, 3] < 0 and view_dir(orbit)[0] > 0  # moves left, turns right
    # The orbit keeps facing the same point two units ahead of the start.
    to_target = np.array([0.0, 0.0, 2.0]) - orbit[:, :3, 3]
    cos = np.einsum("ni,ni->n", to_target / np.linalg.norm(to_target, axis=1, keepdims=True), orbit[:, :3, 2])
    np.testing.assert_allclose(cos, 1.0, atol=1e-6)
    assert np.array_equal(preset_trajectory("static", 5)[0], np.tile(np.eye(4, dtype=np.float32), (5, 1, 1)))


def test_preset_speed_scales_the_turn() -> None:
    slow = view_dir(preset_trajectory("pan_right", 21, speed=1.0)[0])
    fast = view_dir(preset_trajectory("pan_right", 21, speed=2.0)[0])
    assert math.degrees(math.atan2(fast[0], fast[2])) == pytest.approx(2 * math.degrees(math.atan2(slow[0], slow[2])), rel=1e-5)


def test_preset_errors() -> None:
    with pytest.raises(ValueError, match="'zoom'.*static"):
        preset_trajectory("zoom", 9)
    with pytest.raises(ValueError, match="frames"):
        preset_trajectory("static", 0)


