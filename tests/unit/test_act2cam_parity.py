"""Action strings and Act controls against values from the official code (upstream 9660e94).

tests/data/act2cam_reference.npz holds what the official act2cam chain and 7-channel Act
builder produced for these inputs (tests/data/README.md says how it was made).

Index: the act2cam math (poses, keyframes, camera tensor) and the live integrator; the Act
control of the shared examples and of an action string; then the same strings through the
pipeline as every user reaches them: the one-pass camera (Camera node), a long video's
windows, the command line's --actions, and the Act control rebuilt for an Act checkpoint.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from comfyui_lingbot_world.loaders.trajectory import read_trajectory
from comfyui_lingbot_world.pipeline.camera import camera_condition, camera_for_checkpoint, path_from_actions
from comfyui_lingbot_world.pipeline.long_video import WindowedCamera
from comfyui_lingbot_world.tools import generate as generate_tool
from comfyui_lingbot_world.wan.long_video import plan_windows
from comfyui_lingbot_world.wan.act_control import act_control_from_actions, act_control_from_trajectory
from comfyui_lingbot_world.wan.camera_actions import (ActionIntegrator, act2cam_camera, act2cam_keyframes,
                                                      act2cam_poses, action_keys)

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "act2cam_reference.npz"
STRINGS = ["w-10,a-10,d-10,iw-15,none-10,j-10,l-10,s-15", "w-20,j-10,wj-8", "i-50,k-100,l-20", "l-90"]


@pytest.fixture(scope="module")
def ref() -> dict[str, np.ndarray]:
    with np.load(REFERENCE, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def _size(ref) -> tuple[int, int]:
    return int(ref["height"]), int(ref["width"])


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


@pytest.mark.parametrize("case", range(len(STRINGS)))
def test_act2cam_camera_equals_the_official_chain(ref, case: int) -> None:
    text, frames = str(ref[f"cam{case}_string"]), int(ref[f"cam{case}_frames"])
    assert text == STRINGS[case]
    h, w = _size(ref)
    # F + 1 poses (the start, one per frame, no keys after the string), as the reference integrates them.
    poses = act2cam_poses(text, frames)
    assert poses.shape == (frames + 1, 4, 4)
    np.testing.assert_allclose(poses, ref[f"cam{case}_poses"], rtol=0, atol=1e-12)
    keyframes = act2cam_keyframes(text, frames)
    torch.testing.assert_close(keyframes, torch.from_numpy(ref[f"cam{case}_keyframes"]), rtol=1e-5, atol=1e-6)
    cam = act2cam_camera(text, frames, h, w, ref["intrinsics"], dtype=torch.float32)
    want = torch.from_numpy(ref[f"cam{case}_tensor"])
    assert cam.shape == want.shape == (1, 384, (frames - 1) // 4 + 1, h // 8, w // 8)
    assert _rel_err(cam, want) <= 1e-5
    torch.testing.assert_close(cam, want, rtol=1e-5, atol=1e-5)


def test_the_integrator_steps_one_frame_at_a_time(ref) -> None:
    # Play mode drives the same camera live: stepping key sets one by one gives the same poses.
    text, frames = str(ref["cam1_string"]), int(ref["cam1_frames"])
    live = ActionIntegrator()
    keys = action_keys(text) + [""] * (frames - len(action_keys(text)))
    poses = [live.pose.copy()] + [live.step("".join(sorted(k))) for k in keys]
    np.testing.assert_array_equal(np.stack(poses), act2cam_poses(text, frames))
    np.testing.assert_allclose(np.stack(poses), ref["cam1_poses"], rtol=0, atol=1e-12)
    live.reset()
    assert np.array_equal(live.pose, np.eye(4)) and live.pitch == 0.0


@pytest.mark.parametrize("case", range(3))
def test_act_control_equals_the_official_builder_on_the_examples(ref, examples_dir, case: int) -> None:
    folder = examples_dir / f"0{case}"
    h, w = _size(ref)
    wasd = ref[f"act{case}_wasd"]
    poses, intrinsics = read_trajectory(folder / "poses.npy", folder / "intrinsics.npy")
    got, frames = act_control_from_trajectory(poses, intrinsics, wasd, 81, h, w)
    want = torch.from_numpy(ref[f"act{case}_tensor"])
    assert frames == int(ref[f"act{case}_frames"]) == 81
    assert got.shape == want.shape == (1, 448, 21, h // 8, w // 8)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_act_control_of_an_action_string_equals_the_official_builder(ref) -> None:
    text, frames = str(ref["actstr_string"]), int(ref["actstr_frames"])
    h, w = _size(ref)
    got = act_control_from_actions(text, frames, h, w, ref["intrinsics"])
    want = torch.from_numpy(ref["actstr_tensor"])
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


# --------------------------------------------------------------------------- through the pipeline


@pytest.mark.parametrize("case", range(len(STRINGS)))
def test_the_pipeline_camera_of_an_action_string_is_the_official_one(ref, case: int) -> None:
    """The Camera node's one-pass camera (``camera_condition``) and a long video of one window
    (``WindowedCamera``) are the official act2cam tensor."""
    text, frames = str(ref[f"cam{case}_string"]), int(ref[f"cam{case}_frames"])
    h, w = _size(ref)
    want = torch.from_numpy(ref[f"cam{case}_tensor"])
    path = path_from_actions(text, frames, h, w, ref["intrinsics"])
    one_pass = camera_condition(path, frames, h, w)
    assert one_pass.control_type == "cam" and _rel_err(one_pass.plucker, want) <= 1e-5
    torch.testing.assert_close(one_pass.plucker, want, rtol=1e-5, atol=1e-5)
    (only,) = plan_windows(frames, frames, 1)
    windowed = WindowedCamera(path, frames, h, w).condition(only)
    torch.testing.assert_close(windowed.plucker, want, rtol=1e-5, atol=1e-5)


def test_the_command_line_actions_are_the_official_camera(ref, tmp_path) -> None:
    text, frames = str(ref["cam1_string"]), int(ref["cam1_frames"])
    h, w = _size(ref)
    np.save(tmp_path / "k.npy", ref["intrinsics"])
    args = generate_tool.parse_args(["--package", "p", "--image", "i.png", "--out", "o.mp4", "--actions", text,
                                     "--intrinsics", str(tmp_path / "k.npy")])
    path = generate_tool.camera_path(args, frames, h, w)
    torch.testing.assert_close(camera_condition(path, frames, h, w).plucker, torch.from_numpy(ref["cam1_tensor"]),
                               rtol=1e-5, atol=1e-5)


def test_an_act_checkpoint_gets_the_official_act_control_of_the_string(ref) -> None:
    """The sampler, given an Act checkpoint, rebuilds an action string's camera as Act controls."""
    text, frames = str(ref["actstr_string"]), int(ref["actstr_frames"])
    h, w = _size(ref)
    base = camera_condition(path_from_actions(text, frames, h, w, ref["intrinsics"]), frames, h, w)
    act = camera_for_checkpoint(base, "act", "the test's checkpoint")
    assert act.control_type == "act" and camera_for_checkpoint(base, "cam", "x") is base
    torch.testing.assert_close(act.plucker, torch.from_numpy(ref["actstr_tensor"]), rtol=0, atol=1e-6)
