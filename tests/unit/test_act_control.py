"""The Act checkpoint's inputs: W/A/S/D keys, the 448-channel control, detection by shape,
and the action-string rules shared with act2cam."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch

from comfyui_lingbot_world.wan.act_control import (ACT_CHANNELS, ActError, act_control, check_wasd,
                                                   wasd_from_actions)
from comfyui_lingbot_world.wan.camera import keyframe_camera
from comfyui_lingbot_world.wan.camera_actions import (ActionError, ActionIntegrator, act2cam_keyframes, act2cam_keys,
                                                      act2cam_poses, parse_actions)
from comfyui_lingbot_world.wan.config import (TINY, TINY_ACT, DiTConfig, control_type_from_features,
                                              with_control_weight)
from comfyui_lingbot_world.wan.model import LingBotDiT

K = np.array([500.0, 500.0, 416.0, 240.0])


def test_wasd_columns_of_an_action_string() -> None:
    wasd = wasd_from_actions("wd-2,i-1,none-1,as-2", 9)
    assert wasd.dtype == np.float32 and wasd.shape == (9, 4)
    np.testing.assert_array_equal(wasd, [[1, 0, 0, 1], [1, 0, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0],
                                         [0, 1, 1, 0], [0, 1, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])


def test_a_string_longer_than_the_video_is_refused_naming_both_lengths() -> None:
    with pytest.raises(ActionError, match=r"holds 12 action frames but the video has 9 frames.*frames to 13"):
        act2cam_keys("w-10,j-2", 9)
    with pytest.raises(ActionError, match="12 action frames"):
        wasd_from_actions("w-10,j-2", 9)
    assert len(act2cam_keys("w-9", 9)) == 9  # as long as the video: fine
    with pytest.raises(ValueError, match="4n\\+1"):
        act2cam_poses("w-3", 4)


def test_grammar_follows_the_reference_parser() -> None:
    # Full-width comma, whitespace anywhere, case: all accepted as the reference does.
    assert [(t.keys, t.frames) for t in parse_actions(" W - 2 0 ，none-3,Jw-1")] == [
        (frozenset("w"), 20), (frozenset(), 3), (frozenset("jw"), 1)]
    for bad, names in (("w-+3", "'w-+3'"), ("w-3,", "token 2 is empty"), (",w-3", "token 1 is empty"),
                       ("w-3,,a-1", "token 2 is empty"), ("w-1.5", "'w-1.5'"), ("x-3", "'x-3'")):
        with pytest.raises(ActionError, match=re.escape(names)):
            parse_actions(bad)


def test_integrator_holds_the_pitch_limit_and_refuses_unknown_keys() -> None:
    camera = ActionIntegrator()
    for _ in range(50):
        camera.step("i")
    assert camera.pitch == pytest.approx(np.deg2rad(84.0))  # the 43rd step would pass 85°
    before = camera.pose.copy()
    assert np.array_equal(camera.step({"i"}), before)  # dropped at the limit, nothing else held
    with pytest.raises(ActionError, match=r"unknown key\(s\) 'q'"):
        camera.step("wq")


def test_act_control_layout_directions_then_keys() -> None:
    frames, h, w = 9, 16, 24
    keyframes = act2cam_keyframes("l-4,wj-5", frames)
    wasd = np.zeros((frames, 4), dtype=np.float32)
    wasd[0, 0] = wasd[3, 1] = wasd[4, 2] = wasd[8, 3] = 1.0  # row 3 is between sampled rows 0 and 4
    got = act_control(keyframes, K, h, w, wasd)
    assert got.shape == (1, ACT_CHANNELS, 3, h // 8, w // 8) == (1, 448, 3, 2, 3)
    rays = keyframe_camera(keyframes, K, h, w, torch.float32)
    torch.testing.assert_close(got[:, :192], rays[:, 192:], rtol=0, atol=0)  # the directions, not the origins
    keys = got[0, 192:].reshape(4, 64, 3, 2, 3)
    assert torch.equal(keys, keys[:, :1].expand_as(keys))  # one value per 8x8 block of pixels
    per_latent = keys[:, 0, :, 0, 0].T  # [F_lat, 4]: rows 0, 4, 8 of wasd
    torch.testing.assert_close(per_latent, torch.tensor([[1.0, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]))


def test_act_control_names_the_bad_field() -> None:
    keyframes = act2cam_keyframes("w-8", 9)
    with pytest.raises(ActError, match=r"wasd: expected shape \[frames, 4\]"):
        act_control(keyframes, K, 16, 16, np.zeros((9, 3)))
    with pytest.raises(ActError, match="wasd: 5 rows cover only 5 frames but the video has 9"):
        act_control(keyframes, K, 16, 16, np.zeros((5, 4)))
    with pytest.raises(ActError, match="wasd: 13 rows for 3 latent frames"):
        act_control(keyframes, K, 16, 16, np.zeros((13, 4)))
    with pytest.raises(ActError, match=r"keyframes: expected shape \[F_lat, 4, 4\]"):
        act_control(keyframes[:, :3], K, 16, 16, np.zeros((9, 4)))
    with pytest.raises(ValueError, match="multiples of 8"):
        act_control(keyframes, K, 12, 16, np.zeros((9, 4)))
    bad = np.zeros((9, 4))
    bad[2, 1] = np.nan
    with pytest.raises(ActError, match="wasd in clip/action.npy: row 2 holds NaN"):
        check_wasd(bad, 9, "clip/action.npy")
    bad[2, 1] = -1.0
    with pytest.raises(ActError, match="row 2 column 'a' is -1"):
        check_wasd(bad, 9)
    assert check_wasd(np.ones((12, 4)), 9).shape == (9, 4)  # rows past the video are ignored, as there


def test_control_type_from_the_weight_shape() -> None:
    assert control_type_from_features(1536) == "cam"
    assert control_type_from_features(1792) == "act"
    with pytest.raises(ValueError, match=r"1600 input features.*1536 \(Base-Cam, 6 channels\).*1792 \(Act, 7"):
        control_type_from_features(1600)
    config = with_control_weight(TINY, (64, 1792))
    assert config.control_type == "act" and config.camera_in_features == 1792 and config.control_channels == 7
    assert with_control_weight(config, [64, 1536]).control_type == "cam"
    with pytest.raises(ValueError, match=r"shape \[1792\]"):
        with_control_weight(TINY, (1792,))
    # Not a config.json field: written configs stay as before, and a stray entry is ignored.
    assert "control_type" not in TINY_ACT.to_dict()
    assert DiTConfig.from_dict({**TINY.to_dict(), "control_type": "act"}).control_type == "cam"
    with pytest.raises(ValueError, match="control_type='joystick'"):
        dataclasses.replace(TINY, control_type="joystick")


def test_a_control_of_the_other_checkpoint_is_refused_naming_both() -> None:
    with torch.device("meta"):
        act, cam = LingBotDiT(TINY_ACT), LingBotDiT(TINY)
    assert act.patch_embedding_wancamctrl.in_features == 1792
    assert cam.patch_embedding_wancamctrl.in_features == 1536
    with pytest.raises(ValueError, match=r"a Base-Cam control tensor \(384 channels\) was given to an Act "
                                         r"checkpoint, which reads 448"):
        act.prepare_camera(torch.zeros(1, 384, 2, 2, 2, device="meta"))
    with pytest.raises(ValueError, match=r"an Act control tensor \(448 channels\) was given to a Base-Cam"):
        cam.prepare_camera(torch.zeros(1, 448, 2, 2, 2, device="meta"))
