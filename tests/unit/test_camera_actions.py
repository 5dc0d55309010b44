"""Action strings → poses (hand-checked against the act2cam convention), default intrinsics."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from comfyui_lingbot_world.pipeline.camera_preview import draw_trajectory
from comfyui_lingbot_world.wan.camera import scale_intrinsics
from comfyui_lingbot_world.wan.camera_actions import (
    GROUND_EPS,
    MOVE_PER_FRAME,
    ActionError,
    action_frames,
    action_poses,
    default_intrinsics,
    frames_for_actions,
    parse_actions,
)


# A level step: the reference divides the ground direction by its length + 1e-6.
STEP = MOVE_PER_FRAME / (1 + GROUND_EPS)


def yaw_matrix(deg: float) -> np.ndarray:
    """Turning right by ``deg`` (about the y axis, which points down): z → (sin, 0, cos)."""
    c, s = math.cos(math.radians(deg)), math.sin(math.radians(deg))
    return np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]])


def test_pure_forward_moves_along_z_by_the_step() -> None:
    poses = action_poses("w-20")
    assert poses.shape == (21, 4, 4)
    np.testing.assert_allclose(poses[:, :3, :3], np.tile(np.eye(3), (21, 1, 1)), atol=1e-12)
    np.testing.assert_allclose(poses[:, :3, 3], np.stack([np.zeros(21), np.zeros(21), STEP * np.arange(21)], 1),
                               atol=1e-12)
    np.testing.assert_allclose(poses[-1, :3, 3], [0.0, 0.0, 20 * STEP], atol=1e-12)


def test_back_and_strafe() -> None:
    np.testing.assert_allclose(action_poses("s-10")[-1, :3, 3], [0, 0, -10 * STEP], atol=1e-12)
    np.testing.assert_allclose(action_poses("d-10")[-1, :3, 3], [10 * STEP, 0, 0], atol=1e-12)
    np.testing.assert_allclose(action_poses("a-10")[-1, :3, 3], [-10 * STEP, 0, 0], atol=1e-12)


def test_pure_yaw_turns_two_degrees_a_frame_without_moving() -> None:
    right = action_poses("l-45")
    np.testing.assert_allclose(right[:, :3, 3], 0.0, atol=1e-12)
    np.testing.assert_allclose(right[-1, :3, :3], yaw_matrix(90.0), atol=1e-12)
    np.testing.assert_allclose(right[-1, :3, 2], [1.0, 0.0, 0.0], atol=1e-12)  # looks along +x (right)
    left = action_poses("j-10")
    np.testing.assert_allclose(left[-1, :3, :3], yaw_matrix(-20.0), atol=1e-12)


def test_forward_then_turn_then_forward() -> None:
    # 10 frames forward (z 0.5), a quarter turn right, 10 frames forward along +x (x 0.5).
    poses = action_poses("w-10,l-45,w-10")
    assert poses.shape == (66, 4, 4)
    np.testing.assert_allclose(poses[10, :3, 3], [0, 0, 10 * STEP], atol=1e-12)
    np.testing.assert_allclose(poses[55, :3, 3], [0, 0, 10 * STEP], atol=1e-12)
    np.testing.assert_allclose(poses[-1, :3, 3], [10 * STEP, 0, 10 * STEP], atol=1e-12)
    np.testing.assert_allclose(poses[-1, :3, :3], yaw_matrix(90.0), atol=1e-12)


def test_turn_and_move_in_one_frame_turns_first() -> None:
    pose = action_poses("wl-1")[-1]
    a = math.radians(2.0)
    np.testing.assert_allclose(pose[:3, 3], [STEP * math.sin(a), 0, STEP * math.cos(a)], atol=1e-12)


def test_look_up_stops_at_85_degrees_and_w_stays_on_the_ground() -> None:
    up = action_poses("i-45")
    # The view (z axis) tilts towards −y (up); 42 steps reach 84°, the 43rd would pass 85°.
    view = up[-1, :3, 2]
    np.testing.assert_allclose(view, [0.0, -math.sin(math.radians(84)), math.cos(math.radians(84))], atol=1e-12)
    np.testing.assert_allclose(action_poses("k-1")[-1, :3, 2], [0, math.sin(math.radians(2)),
                                                                  math.cos(math.radians(2))], atol=1e-12)
    walk = action_poses("i-10,w-10")
    level = math.cos(math.radians(20))  # length of the view direction on the ground
    np.testing.assert_allclose(walk[-1, :3, 3], [0.0, 0.0, 10 * MOVE_PER_FRAME * level / (level + GROUND_EPS)],
                               atol=1e-12)


def test_frames_pad_by_holding_still_or_cut() -> None:
    poses = action_poses("w-4", frames=9)
    assert poses.shape == (9, 4, 4)
    np.testing.assert_array_equal(poses[5:], np.repeat(poses[4:5], 4, axis=0))
    np.testing.assert_array_equal(action_poses("w-20", frames=5), action_poses("w-20")[:5])
    assert action_frames("w-20, j-10 ,W-30") == 60
    assert frames_for_actions("w-20,j-10,w-30") == 61
    assert frames_for_actions("w-3") == 5 and frames_for_actions("w-1") == 1
    assert [t.keys for t in parse_actions("none-3,iw-2")] == [frozenset(), frozenset("iw")]


@pytest.mark.parametrize("text, names", [
    ("", "empty"),
    ("   ", "empty"),
    ("w-20,x-5", "'x-5'"),
    ("w-0", "'w-0'"),
    ("j--3", "'j--3'"),
    ("w-5,,j-3", "token 2 is empty"),
    ("w5", "'w5'"),
    ("w-2.5", "'w-2.5'"),
])
def test_bad_strings_name_the_token(text: str, names: str) -> None:
    with pytest.raises(ActionError) as info:
        parse_actions(text)
    assert names in str(info.value)


def test_unknown_key_message_lists_the_keys() -> None:
    with pytest.raises(ActionError, match=r"unknown key\(s\) 'q'.*w a s d"):
        action_poses("qw-3")


def test_default_intrinsics_square_pixels_at_any_size() -> None:
    np.testing.assert_allclose(default_intrinsics(480, 832), [500.0, 500.0, 416.0, 240.0])
    for h, w in ((480, 832), (832, 480), (512, 512), (720, 1280)):
        k = scale_intrinsics(default_intrinsics(h, w), h, w).numpy()
        assert k[0] == pytest.approx(k[1])  # square pixels
        assert k[2] == pytest.approx(w / 2) and k[3] == pytest.approx(h / 2)
        # The long side sees the field of view of the 832-pixel side at f = 500.
        assert 2 * math.atan(max(h, w) / 2 / k[0]) == pytest.approx(2 * math.atan(416 / 500))


def test_trajectory_picture_marks_window_cuts() -> None:
    poses = action_poses("w-20,l-20,w-40")
    plain = draw_trajectory(poses, (256, 256))
    cut = draw_trajectory(poses, (256, 256), cuts=(32, 64))
    assert plain.shape == cut.shape == (256, 256, 3)
    assert (plain != cut).any(axis=-1).sum() > 50
    with pytest.raises(ValueError, match="cut at pose 99"):
        draw_trajectory(poses, (256, 256), cuts=(99,))
    torch.testing.assert_close(torch.from_numpy(plain), torch.from_numpy(draw_trajectory(poses, (256, 256))))


def test_cut_actions_keeps_the_first_frames() -> None:
    from comfyui_lingbot_world.wan.camera_actions import action_keys, cut_actions

    assert cut_actions("w-20,jw-10,none-5", 40) == "w-20,jw-10,none-5"  # fits: unchanged
    assert cut_actions("w-20,jw-10,none-5", 25) == "w-20,wj-5"
    assert cut_actions("w-20,jw-10,none-5", 32) == "w-20,wj-10,none-2"
    assert action_keys(cut_actions("w-20,jw-10", 24)) == action_keys("w-20,jw-10")[:24]
    with pytest.raises(ActionError, match="positive integer"):
        cut_actions("w-3", 0)
