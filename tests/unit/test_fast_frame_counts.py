"""LingBot-World Fast at a frame count that is not whole chunks (961, 161, 85): the camera
equals the official ``generate_fast``'s (tests/reference/official_fast_camera.py), which
spreads the keyframes over the frames ASKED and cuts the latent to whole chunks; and the
Fast Long Video node says what it makes without contradicting itself."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from comfyui_lingbot_world.pipeline.camera import ActionPath, CameraPath
from comfyui_lingbot_world.pipeline.fast import frames_note, path_camera, stream_frames
from comfyui_lingbot_world.wan.camera_actions import act2cam_keyframes, act2cam_poses
from comfyui_lingbot_world.wan.camera_presets import preset_trajectory
from reference.official_fast_camera import frames_made, official_fast_keyframes, resampled_keyframes

HEIGHT, WIDTH = 48, 64


def _walk(frames: int) -> CameraPath:
    """A path that turns and speeds up (so where the keyframes fall shows in every pose)."""
    poses, k = preset_trajectory("orbit_left", frames, 2.0)
    poses = poses.copy()
    poses[:, :3, 3] *= np.linspace(1.0, 3.0, frames)[:, None] ** 2
    return CameraPath(poses, np.asarray(k, dtype=np.float64).reshape(-1, 4)[0], "test walk")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("frames", [961, 161, 85])
def test_fast_camera_at_a_count_that_is_not_whole_chunks_equals_the_official(frames):
    path = _walk(frames)
    official = official_fast_keyframes(path.poses, frames)
    camera = path_camera(path, frames, HEIGHT, WIDTH)
    assert camera.keyframes.shape == official.shape == ((frames_made(frames) - 1) // 4 + 1, 4, 4)
    assert _rel(camera.keyframes, official) < 1e-5
    # Every chunk the stream asks for exists, and none past the frames made.
    latent = (stream_frames(frames) - 1) // 4 + 1
    assert camera.chunk(latent - 3, 3).shape[2] == 3
    with pytest.raises(ValueError, match="latent frames"):
        camera.chunk(latent, 3)


def test_action_string_keyframes_spread_over_the_frames_asked():
    """The README's long walk (960 action frames) at 961 frames: accepted (not "set frames to
    961" with 961 set), keyframes over the 962 act2cam poses, cut to whole chunks."""
    actions = "w-480,d-240,w-240"
    frames = 961
    path = ActionPath(actions, frames, np.array([500.0, 500.0, 416.0, 240.0]))
    camera = path_camera(path, frames, HEIGHT, WIDTH)
    whole = act2cam_keyframes(actions, frames)  # 241 keyframes over the same poses
    assert camera.keyframes.shape[0] == 240
    # The F + 1 act2cam poses (as the official act2cam string path makes them) resampled onto
    # the 240 keyframes of the whole chunks, with the official resampling and chaining.
    expected = resampled_keyframes(act2cam_poses(actions, frames), 240)
    assert _rel(camera.keyframes, expected) < 1e-5
    assert _rel(camera.keyframes, whole[:240]) > 1e-3  # not the first 240 of the 241


def test_the_node_message_says_what_is_made_and_never_asks_for_the_count_already_set():
    assert frames_note(957) is None and frames_note(81) is None
    note = frames_note(961)
    assert note is not None and "957" in note and "961" in note and "set frames" not in note
