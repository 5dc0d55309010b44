"""pipeline/camera_preview.py: the top-down drawing of a camera path."""
from __future__ import annotations

import numpy as np
import pytest

from comfyui_lingbot_world.pipeline.camera_preview import draw_trajectory
from comfyui_lingbot_world.wan.camera import CameraError
from comfyui_lingbot_world.wan.camera_presets import preset_trajectory


@pytest.mark.parametrize("name,size", [("orbit_right", (320, 200)), ("static", (64, 96)), ("pan_left", (512, 512))])
def test_draw_trajectory_size_and_content(name: str, size) -> None:
    img = draw_trajectory(preset_trajectory(name, 33)[0], size=size)
    assert img.dtype == np.uint8 and img.shape == (size[1], size[0], 3)
    background = img[1, -2].copy()
    assert (np.abs(img.astype(int) - background).sum(axis=-1) > 60).sum() > 30  # something drawn


def test_draw_trajectory_of_an_example(examples_dir) -> None:
    poses = np.load(examples_dir / "01" / "poses.npy")
    img = draw_trajectory(poses)
    assert img.shape == (512, 512, 3)
    with pytest.raises(CameraError, match="poses"):
        draw_trajectory(np.eye(3))
