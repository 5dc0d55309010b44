"""One class per camera-path kind (pipeline/camera.py): each answers what it controls,
whether it can be cut into long-video windows, and gives the Fast chunks their keyframes;
an action string is parsed once however many cameras are built from it."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from comfyui_lingbot_world.pipeline import camera as camera_stage
from comfyui_lingbot_world.pipeline.camera import (ActFilesPath, ActionPath, PlayLogPath, PosePath, camera_condition,
                                                   path_from_actions, path_from_play_actions, path_from_preset)
from comfyui_lingbot_world.pipeline.fast import path_camera
from comfyui_lingbot_world.pipeline.long_video import WindowedCamera
from comfyui_lingbot_world.wan import camera_actions
from comfyui_lingbot_world.wan.camera import CameraError
from comfyui_lingbot_world.wan.camera_actions import act2cam_keyframes
from comfyui_lingbot_world.wan.long_video import plan_windows
from comfyui_lingbot_world.wan.play_camera import play_keyframes, play_keys

H, W = 32, 48


def test_each_kind_says_what_it_controls_and_whether_it_has_windows():
    pose = path_from_preset("pan_left", 1.0, 9)
    action = path_from_actions("w-4,l-4", 9, H, W)
    play = path_from_play_actions("w-4,l-4", 9, H, W)
    act = ActFilesPath(pose.poses, pose.intrinsics, "poses/action.npy", np.zeros((9, 4), dtype=np.float32))
    assert [type(p) for p in (pose, action, play)] == [PosePath, ActionPath, PlayLogPath]
    assert [p.controls for p in (pose, action, play, act)] == [("cam",), ("cam", "act"), ("cam",), ("act",)]
    assert [p.windowed for p in (pose, action, play, act)] == [True, True, False, True]
    with pytest.raises(CameraError, match="per-chunk"):
        play.path_steps(9)
    with pytest.raises(CameraError, match="Fast reads Base-Cam"):
        act.chunk_keyframes(9)


def test_chunk_keyframes_are_the_one_pass_keyframes():
    frames = 21
    action = path_from_actions("w-8,jw-6", frames, H, W)
    torch.testing.assert_close(action.chunk_keyframes(frames), act2cam_keyframes("w-8,jw-6", frames), rtol=0, atol=0)
    play = path_from_play_actions("w-8,jw-6", frames, H, W)
    torch.testing.assert_close(play.chunk_keyframes(frames), play_keyframes(play_keys("w-8,jw-6", frames), frames),
                               rtol=0, atol=0)
    pose = path_from_preset("pan_left", 1.0, frames)
    whole = camera_condition(pose, frames, H, W).plucker
    torch.testing.assert_close(path_camera(pose, frames, H, W).chunk(0, whole.shape[2]), whole)


def test_an_action_string_is_parsed_once(monkeypatch):
    calls = []
    parse = camera_actions.parse_actions

    def counted(text):
        calls.append(text)
        return parse(text)

    monkeypatch.setattr(camera_actions, "parse_actions", counted)
    frames = 17
    path = camera_stage.path_from_actions("w-8,l-8", frames, H, W)
    camera_condition(path, frames, H, W, control_type="cam")
    camera_condition(path, frames, H, W, control_type="act")
    windowed = WindowedCamera(path, frames, H, W, control_type="act")
    windowed.condition(plan_windows(frames, 9, 1)[1])
    path_camera(path, frames, H, W).chunk(0, 3)
    assert calls == ["w-8,l-8"]
