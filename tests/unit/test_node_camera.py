"""nodes/camera.py: LingBot-World Camera Plücker Conditioning inside the ComfyUI host (CPU):
every source (preset, files, actions, import), the one-pass camera, the whole path for
Long Video, the path drawing and the refusals."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from comfy_host import comfy_state_reset, use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
from node_runs import H, W  # noqa: E402
from comfyui_lingbot_world.nodes.camera import LingBotWorldCamera, _output_connected  # noqa: E402
from comfyui_lingbot_world.nodes.host import model_files  # noqa: E402
from comfyui_lingbot_world.pipeline.camera import CameraCondition, CameraPath, camera_condition, path_from_preset  # noqa: E402
from comfyui_lingbot_world.wan.camera import camera_tensor  # noqa: E402
from comfyui_lingbot_world.wan.camera_actions import (act2cam_camera, act2cam_poses, action_poses,  # noqa: E402
                                                      default_intrinsics)
from comfyui_lingbot_world.wan.act_control import act_control_from_trajectory, wasd_from_actions  # noqa: E402
from comfyui_lingbot_world.wan.camera_presets import preset_trajectory  # noqa: E402
from scipy.spatial.transform import Rotation  # noqa: E402

NONE = model_files.NO_FILE

clean_comfy_state = pytest.fixture(autouse=True)(comfy_state_reset)


def test_camera_preset_outputs_plucker_and_preview(comfy_dirs):
    camera, preview, _ = LingBotWorldCamera.execute("preset", "pan_left", 1.0, model_files.NO_FILE, model_files.NO_FILE, W, H, 9)
    assert isinstance(camera, CameraCondition)
    assert tuple(camera.plucker.shape) == (1, 384, 3, H // 8, W // 8)
    assert (camera.frames, camera.height, camera.width) == (9, H, W)
    assert preview.dtype == torch.float32 and tuple(preview.shape) == (1, 512, 512, 3)
    assert 0.0 <= float(preview.min()) and float(preview.max()) <= 1.0 and float(preview.std()) > 0


def test_camera_from_input_files(installed, trajectory):
    node = LingBotWorldCamera
    camera, preview, _ = node.execute("files", "static", 1.0, "traj/poses.npy", "traj/intrinsics.npy", W, H, 9)
    assert tuple(camera.plucker.shape) == (1, 384, 3, H // 8, W // 8)
    reference, _, _ = node.execute("preset", "orbit_left", 1.0, model_files.NO_FILE, model_files.NO_FILE, W, H, 9)
    torch.testing.assert_close(camera.plucker, reference.plucker)
    with pytest.raises(ValueError, match="intrinsics_file: choose"):
        node.execute("files", "static", 1.0, "traj/poses.npy", model_files.NO_FILE, W, H, 9)
    with pytest.raises(ValueError, match="13"):  # 9 poses cannot drive 13 frames
        node.execute("files", "static", 1.0, "traj/poses.npy", "traj/intrinsics.npy", W, H, 13)


def test_camera_is_changed_follows_file_contents(installed, trajectory):
    before = LingBotWorldCamera.fingerprint_inputs(source="files", poses_file="traj/poses.npy", intrinsics_file="traj/intrinsics.npy")
    assert LingBotWorldCamera.fingerprint_inputs(source="files", poses_file="traj/poses.npy",
                                    intrinsics_file="traj/intrinsics.npy") == before
    poses, _ = preset_trajectory("dolly_in", 13)
    np.save(installed["input"] / "traj" / "poses.npy", poses)
    assert LingBotWorldCamera.fingerprint_inputs(source="files", poses_file="traj/poses.npy",
                                    intrinsics_file="traj/intrinsics.npy") != before


# --------------------------------------------------------------------------- sources and the long-video path


def _camera(source="preset", preset="pan_left", poses=NONE, intrinsics=NONE, frames=9, actions="w-20,j-10,w-30",
            export=NONE, normalize=True, window=81, overlap=1, width=W, height=H, axes="opencv"):
    return LingBotWorldCamera.execute(source, preset, 1.0, poses, intrinsics, width, height, frames, actions, export,
                                      normalize, window, overlap, axes)


def test_preset_and_files_cameras_are_unchanged(installed):
    camera, preview, path = _camera("preset", "pan_left", frames=9)
    torch.testing.assert_close(camera.plucker, camera_condition(path_from_preset("pan_left", 1.0, 9), 9, H, W).plucker, rtol=0, atol=0)
    # The defaults of the new widgets give the same picture as the old node (no window cuts).
    old = LingBotWorldCamera.execute("preset", "pan_left", 1.0, NONE, NONE, W, H, 9)
    torch.testing.assert_close(preview, old[1], rtol=0, atol=0)
    assert isinstance(path, CameraPath) and len(path.poses) == 9
    np.testing.assert_allclose(path.poses, preset_trajectory("pan_left", 9)[0])
    traj = installed["input"] / "traj"
    traj.mkdir()
    poses, k = preset_trajectory("orbit_left", 9)
    np.save(traj / "poses.npy", poses)
    np.save(traj / "intrinsics.npy", k)
    from_files, _, path = _camera("files", poses="traj/poses.npy", intrinsics="traj/intrinsics.npy", frames=9)
    torch.testing.assert_close(from_files.plucker, camera_tensor(poses, k, 9, H, W, dtype=torch.float32))
    np.testing.assert_allclose(path.poses, poses)


def test_actions_source_gives_the_official_act2cam_camera(installed):
    """An action string is the official act2cam path: F + 1 poses (padded with no-key frames),
    keyframes at linspace(0, F, F_lat); exactly wan.camera_actions.act2cam_camera."""
    camera, preview, path = _camera("actions", frames=17, actions="w-8,l-8")
    np.testing.assert_allclose(path.poses, act2cam_poses("w-8,l-8", 17))
    assert len(path.poses) == 18 and path.actions == "w-8,l-8" and path.controls == ("cam", "act")
    np.testing.assert_allclose(path.intrinsics, default_intrinsics(H, W))
    torch.testing.assert_close(camera.plucker, act2cam_camera("w-8,l-8", 17, H, W), rtol=0, atol=0)
    assert camera.control_type == "cam" and camera.path is path
    # Not the old sampling of F poses at 0, 4, ..., F - 1.
    old = camera_tensor(action_poses("w-8,l-8", 17), default_intrinsics(H, W), 17, H, W, dtype=torch.float32)
    assert float((camera.plucker - old).abs().max()) > 1e-3
    assert tuple(preview.shape) == (1, 512, 512, 3)


def test_an_action_string_longer_than_the_video_is_refused_naming_both(installed):
    with pytest.raises(ValueError, match=r"actions: .*holds 30 action frames but the video has 25 frames.*33"):
        _camera("actions", frames=25, actions="w-20,j-10")
    camera, _, _ = _camera("actions", frames=29, actions="w-20,j-9")  # 29 frames of keys: fits
    assert camera.frames == 29


def test_actions_with_an_intrinsics_file(installed):
    np.save(installed["input"] / "k.npy", np.array([[400.0, 410.0, 416.0, 240.0]] * 3))
    _, _, path = _camera("actions", intrinsics="k.npy", frames=9, actions="w-8")
    np.testing.assert_allclose(path.intrinsics, [400.0, 410.0, 416.0, 240.0])


def test_bad_action_string_names_the_token(installed):
    with pytest.raises(ValueError, match=r"actions: .*'wq-5'"):
        _camera("actions", frames=9, actions="w-4,wq-5")
    with pytest.raises(ValueError, match="actions: .*empty"):
        _camera("actions", frames=9, actions="  ")


def test_import_source_reads_a_pose_export(installed):
    poses = action_poses("w-12,j-8", 21)
    poses[:, :3, 3] *= 3.0  # tracker units
    np.savez(installed["input"] / "walk.npz", poses=poses)
    assert "walk.npz" in LingBotWorldCamera.define_schema().inputs[9].options
    _, _, path = _camera("import", export="walk.npz", frames=21)
    # Scale normalized back to 0.05 a step (action steps are 0.05 / (1 + 1e-6), as the reference's).
    np.testing.assert_allclose(path.poses, action_poses("w-12,j-8", 21), atol=1e-6)
    np.testing.assert_allclose(path.intrinsics, default_intrinsics(H, W))
    _, _, raw = _camera("import", export="walk.npz", frames=21, normalize=False)
    np.testing.assert_allclose(raw.poses, poses)
    with pytest.raises(ValueError, match="pose_export: choose"):
        _camera("import", frames=21)
    with pytest.raises(ValueError, match="outside"):
        _camera("import", export="../x.npz", frames=21)


def test_long_path_has_no_one_pass_camera_and_shows_the_cuts(installed, monkeypatch):
    camera, preview, path = _camera("actions", frames=25, window=9, overlap=1, actions="w-24")
    assert camera is None and len(path.poses) == 26  # the act2cam path: F + 1 poses
    one_window, _, _ = _camera("actions", frames=9, window=9, overlap=1, actions="w-8")
    whole, _, _ = _camera("actions", frames=25, window=81, overlap=1, actions="w-24")
    assert one_window is not None and whole is not None
    _, uncut, _ = _camera("actions", frames=25, window=81, actions="w-24")
    assert float((preview - uncut).abs().max()) > 0  # the window bars are drawn
    # Used in a prompt with the one-pass sampler: a clear error instead of GBs of tensor.
    prompt = {"1": {"class_type": "LingBotWorldCamera", "inputs": {}},
              "2": {"class_type": "LingBotWorldSampler", "inputs": {"camera": ["1", 0]}}}
    assert _output_connected(SimpleNamespace(prompt=prompt, unique_id="1"), 0)
    assert not _output_connected(SimpleNamespace(prompt=prompt, unique_id="1"), 2)
    assert not _output_connected(None, 0)
    # What the host sets on the class it runs (its hidden inputs); the clone API differs between hosts.
    monkeypatch.setattr(LingBotWorldCamera, "hidden", SimpleNamespace(prompt=prompt, unique_id="1"))
    with pytest.raises(ValueError, match="camera_path to LingBot-World Long Video"):
        LingBotWorldCamera.execute("actions", "static", 1.0, NONE, NONE, W, H, 25, "w-24", NONE, True, 9, 1)


def test_path_shorter_than_the_video_is_refused(installed):
    traj = installed["input"] / "short"
    traj.mkdir()
    poses, k = preset_trajectory("dolly_in", 9)
    np.save(traj / "poses.npy", poses)
    np.save(traj / "intrinsics.npy", k)
    with pytest.raises(ValueError, match="cover only"):
        _camera("files", poses="short/poses.npy", intrinsics="short/intrinsics.npy", frames=25, window=9)


# --------------------------------------------------------------------------- Act files and camera axes


def _act_example(installed, frames=17, keys="w-8,d-8"):
    """input/act/: an orbit's poses.npy and intrinsics.npy with action.npy [F, 4] (int32, as the
    official examples store it) beside them."""
    folder = installed["input"] / "act"
    folder.mkdir()
    poses, k = preset_trajectory("orbit_left", frames)
    np.save(folder / "poses.npy", poses)
    np.save(folder / "intrinsics.npy", k)
    np.save(folder / "action.npy", wasd_from_actions(keys, frames).astype(np.int32))
    return folder, poses, k


def test_act_files_source_gives_the_act_control(installed):
    folder, poses, k = _act_example(installed)
    camera, preview, path = _camera("act_files", poses="act/poses.npy", intrinsics="act/intrinsics.npy", frames=17)
    assert camera.control_type == "act" and path.controls == ("act",) and "action.npy" in path.source
    assert tuple(camera.plucker.shape) == (1, 448, 5, H // 8, W // 8)
    expected, _ = act_control_from_trajectory(poses, k, wasd_from_actions("w-8,d-8", 17), 17, H, W)
    torch.testing.assert_close(camera.plucker, expected, rtol=0, atol=0)
    assert tuple(preview.shape) == (1, 512, 512, 3)
    # The files' stamps, action.npy's included, make ComfyUI run the node again.
    stamp = LingBotWorldCamera.fingerprint_inputs(source="act_files", poses_file="act/poses.npy",
                                                  intrinsics_file="act/intrinsics.npy")
    np.save(folder / "action.npy", wasd_from_actions("s-17", 17))
    assert LingBotWorldCamera.fingerprint_inputs(source="act_files", poses_file="act/poses.npy",
                                                 intrinsics_file="act/intrinsics.npy") != stamp


def test_act_files_refusals_name_the_file(installed):
    folder, _, _ = _act_example(installed)
    np.save(folder / "action.npy", np.zeros((9, 4)))
    with pytest.raises(ValueError, match=r"action\.npy: 9 rows cover only 9 frames but the video has 17"):
        _camera("act_files", poses="act/poses.npy", intrinsics="act/intrinsics.npy", frames=17)
    np.save(folder / "action.npy", np.full((17, 4), 2.0))
    with pytest.raises(ValueError, match=r"action\.npy: row 0 column 'w' is 2"):
        _camera("act_files", poses="act/poses.npy", intrinsics="act/intrinsics.npy", frames=17)
    np.save(folder / "action.npy", np.zeros((17, 3)))
    with pytest.raises(ValueError, match=r"action in .*action\.npy: action has shape \[17, 3\]"):
        _camera("act_files", poses="act/poses.npy", intrinsics="act/intrinsics.npy", frames=17)
    (folder / "action.npy").unlink()
    with pytest.raises(ValueError, match="no action.npy beside poses_file 'act/poses.npy'.* source files"):
        _camera("act_files", poses="act/poses.npy", intrinsics="act/intrinsics.npy", frames=17)


def test_act_files_through_the_windows_of_a_long_video(installed):
    """Long videos: each window's Act control is its directions-only camera plus the W/A/S/D
    rows window.start + 4j; one window is exactly the one-pass control."""
    _act_example(installed, frames=25, keys="w-6,a-6,s-6,d-7")
    camera, _, path = _camera("act_files", poses="act/poses.npy", intrinsics="act/intrinsics.npy", frames=25,
                              window=9)
    assert camera is None
    from comfyui_lingbot_world.pipeline.long_video import WindowedCamera
    from comfyui_lingbot_world.wan.long_video import plan_windows

    windows = WindowedCamera(path, 25, H, W)
    keys = wasd_from_actions("w-6,a-6,s-6,d-7", 25)
    for window in plan_windows(25, 9, 1):
        control = windows.condition(window)
        assert control.control_type == "act" and control.plucker.shape[1] == 448
        rows = control.plucker[0, 192::64, :, 0, 0].T  # the first pixel's w, a, s, d per latent frame
        np.testing.assert_array_equal(rows.numpy(), keys[window.start:window.stop:4])
    whole, _, _ = _camera("act_files", poses="act/poses.npy", intrinsics="act/intrinsics.npy", frames=25)
    one = WindowedCamera(path, 25, H, W).condition(plan_windows(25, 81, 1)[0])
    torch.testing.assert_close(one.plucker, whole.plucker, rtol=1e-6, atol=1e-6)


def test_import_source_turns_opengl_camera_axes_into_opencv(installed):
    poses = action_poses("w-12,j-8", 21)
    gl = poses @ np.diag([1.0, -1.0, -1.0, 1.0])  # the same cameras with y up, looking down -z (USD)
    np.savez(installed["input"] / "sim.npz", poses=gl)
    _, _, path = _camera("import", export="sim.npz", frames=21, normalize=False, axes="opengl")
    np.testing.assert_allclose(path.poses, poses, atol=1e-12)
    with pytest.raises(ValueError, match="camera_axes: 'usd' is not one of opencv, opengl, x_forward_z_up"):
        _camera("import", export="sim.npz", frames=21, axes="usd")


def test_import_source_lists_and_reads_a_csv_camera_log(installed):
    poses = action_poses("w-12,l-8", 21)
    quat = Rotation.from_matrix(poses[:, :3, :3]).as_quat()  # x, y, z, w
    rows = ["frame,x,y,z,qw,qx,qy,qz"] + [",".join([str(i)] + [f"{v:.17g}" for v in (*p[:3, 3], q[3], *q[:3])])
                                           for i, (p, q) in enumerate(zip(poses, quat))]
    (installed["input"] / "robot").mkdir()
    (installed["input"] / "robot" / "head.csv").write_text("\n".join(rows) + "\n")
    assert "robot/head.csv" in LingBotWorldCamera.define_schema().inputs[9].options
    camera, _, path = _camera("import", export="robot/head.csv", frames=21, normalize=False)
    np.testing.assert_allclose(path.poses, poses, atol=1e-9)
    torch.testing.assert_close(camera.plucker, camera_tensor(poses, default_intrinsics(H, W), 21, H, W,
                                                             dtype=torch.float32), rtol=1e-5, atol=1e-5)


def test_per_chunk_play_keyframes_give_the_play_camera_without_windows(installed):
    from comfyui_lingbot_world.nodes.camera import KEYFRAMES_PLAY
    from comfyui_lingbot_world.pipeline.play.chunk_camera import PlayCamera

    session = PlayCamera(H, W)
    live = torch.cat([session.next_chunk(keys) for keys in ("w", "", "jw", "l")], dim=2)
    frames = session.frames  # 45: more than the window below, which the Play timing ignores
    camera, preview, path = LingBotWorldCamera.execute("actions", "dolly_in", 1.0, NONE, NONE, W, H, frames,
                                                       actions=session.actions(), window=9,
                                                       keyframes=KEYFRAMES_PLAY).args
    assert torch.equal(camera.plucker, live) and camera.frames == frames and path.play_keys is not None
    assert preview.shape[0] == 1
    with pytest.raises(ValueError, match=r"actions: action string holds 45 action frames, but a 45-frame"):
        LingBotWorldCamera.execute("actions", "dolly_in", 1.0, NONE, NONE, W, H, frames,
                                   actions=session.actions() + ",w-1", keyframes=KEYFRAMES_PLAY)
    with pytest.raises(ValueError, match="keyframes: 'play' is not one of"):
        LingBotWorldCamera.execute("actions", "dolly_in", 1.0, NONE, NONE, W, H, frames, keyframes="play")
