"""The Play camera law (wan/play_camera.py) and a session's camera (pipeline/play/chunk_camera.py):
which action frames a chunk's keys drive, latent frame i at pose 4i, the fixed unit, the
live chunks equal to the whole-video replay bit for bit, the action log round trip, and
the Camera node's per-chunk (Play) timing through pipeline/camera.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from comfyui_lingbot_world.pipeline.camera import (camera_condition, path_from_actions, path_from_play_actions)
from comfyui_lingbot_world.pipeline.play.chunk_camera import PlayCamera
from comfyui_lingbot_world.wan.camera import CameraError, keyframe_camera, relative_poses
from comfyui_lingbot_world.wan.camera_actions import GROUND_EPS, ActionError, action_keys, default_intrinsics
from comfyui_lingbot_world.wan.play_camera import (PLAY_UNIT, PlayCameraLaw, chunk_action_frames, format_actions,
                                                   integrate_keys, play_action_frames, play_keyframes, play_keys)

H, W = 32, 48


def test_chunk_keys_drive_the_frames_from_the_last_keyframe_to_the_chunks_last():
    assert [(r.start, r.stop) for r in map(chunk_action_frames, range(4))] == [(0, 8), (8, 20), (20, 32), (32, 44)]
    # C chunks: 12C - 4 action frames, an F = 12C - 3 frame video takes F - 1 of them
    law = PlayCameraLaw()
    for c in range(5):
        law.next_chunk("w")
        assert len(law.keys_per_frame) == 12 * (c + 1) - 4 == play_action_frames(law.frames)
    with pytest.raises(ValueError, match="chunk must be 0 or more"):
        chunk_action_frames(-1)


def test_latent_frame_i_takes_pose_4i_and_a_straight_walk_steps_one_unit():
    law = PlayCameraLaw()
    first, second = law.next_chunk("w"), law.next_chunk("w")
    keyframes = torch.cat([first, second])
    assert keyframes.shape == (6, 4, 4) and keyframes.dtype == torch.float32
    assert torch.equal(keyframes[0], torch.eye(4))
    step = 4 * 0.05 / (1 + GROUND_EPS) / PLAY_UNIT  # 4 frames of W, over the fixed unit 0.2
    for rel in keyframes[1:]:
        assert torch.allclose(rel[:3, 3], torch.tensor([0.0, 0.0, step]), atol=1e-6)
        assert torch.allclose(rel[:3, :3], torch.eye(3), atol=1e-6)
    # the translation is NOT rescaled by the path: a slower path keeps its smaller steps
    half = PlayCameraLaw()
    half.next_chunk("")
    assert torch.equal(half.next_chunk("")[:, :3, 3], torch.zeros(3, 3))


def test_keys_pressed_at_chunk_start_move_that_chunks_first_keyframe():
    law = PlayCameraLaw()
    law.next_chunk("")
    turned = law.next_chunk("l")  # frames 8..19: p_12 already turned by 4 frames of 2 degrees
    yaw = np.degrees(np.arctan2(turned[0, 0, 2].item(), turned[0, 2, 2].item()))
    assert yaw == pytest.approx(8.0, abs=1e-4)
    assert law.keys_per_frame[:8] == [frozenset()] * 8 and law.keys_per_frame[8:] == [frozenset("l")] * 12


def test_live_chunks_equal_the_whole_replay_bit_for_bit():
    law = PlayCameraLaw()
    sequence = ["w", "wj", "", "l", "dk", "i", "sa", ""]
    chunks = [law.next_chunk(k) for k in sequence]
    log = format_actions(law.keys_per_frame)
    whole = play_keyframes(play_keys(log, law.frames), law.frames)
    assert torch.equal(torch.cat(chunks), whole)
    # and the rays: made one latent frame at a time, so a chunk's slice is the same bits
    k = default_intrinsics(H, W)
    live = torch.cat([keyframe_camera(c, k, H, W, dtype=torch.float32) for c in chunks], dim=2)
    assert torch.equal(live, keyframe_camera(whole, k, H, W, dtype=torch.float32))


def test_the_relative_chain_matches_relative_poses_order():
    poses = integrate_keys(action_keys("w-10,l-20,wj-18"))[::4]
    ours = play_keyframes(action_keys("w-10,l-20,wj-18"), 49)
    reference = relative_poses(torch.from_numpy(poses.astype(np.float32)), normalize=False)
    reference[:, :3, 3] /= PLAY_UNIT
    assert torch.allclose(ours, reference, atol=1e-6)


def test_action_log_round_trip_and_grammar():
    keys = [frozenset("w")] * 8 + [frozenset("jw")] * 12 + [frozenset()] * 12
    text = format_actions(keys)
    assert text == "w-8,wj-12,none-12"
    assert action_keys(text) == keys
    assert format_actions([]) == ""
    with pytest.raises(ActionError, match="unknown key"):
        format_actions(["x"])


def test_play_keys_pad_with_no_keys_and_refuse_a_string_longer_than_the_video():
    assert play_keys("w-3", 9) == [frozenset("w")] * 3 + [frozenset()] * 5
    with pytest.raises(ActionError, match=r"holds 9 action frames, but a 9-frame video takes 8 .*set frames to 13"):
        play_keys("w-9", 9)
    with pytest.raises(ActionError, match="takes 8 action frames, got 7"):
        play_keyframes([frozenset()] * 7, 9)


def test_play_timing_path_gives_the_sessions_camera_and_refuses_windows():
    camera = PlayCamera(H, W)
    live = torch.cat([camera.next_chunk(k) for k in ("w", "j", "w")], dim=2)
    frames = camera.frames
    assert frames == 33 and live.shape == (1, 384, 9, H // 8, W // 8)
    path = path_from_play_actions(camera.actions(), frames, H, W)
    assert path.poses.shape == (frames, 4, 4) and path.play_keys is not None
    condition = camera_condition(path, frames, H, W)
    assert torch.equal(condition.plucker, live)
    # the official act2cam timing of the same string is a different camera
    official = camera_condition(path_from_actions(camera.actions(), frames, H, W), frames, H, W)
    assert not torch.equal(official.plucker, live)
    with pytest.raises(CameraError, match=r"per-chunk \(Play\) timing is for one pass"):
        from comfyui_lingbot_world.wan.long_video import plan_windows

        camera_condition(path, 9, H, W, window=plan_windows(33, 9, 1)[0], path_steps=torch.zeros(3, 4, 4))
