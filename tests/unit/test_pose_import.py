"""Camera paths from ViPE output folders and pose exports."""
from __future__ import annotations

import numpy as np
import pytest

from comfyui_lingbot_world.loaders.pose_import import import_poses, normalize_translation
from comfyui_lingbot_world.wan.camera import CameraError
from comfyui_lingbot_world.wan.camera_actions import MOVE_PER_FRAME, action_poses


def vipe_folder(root, name="clip", poses=None, k=(600.0, 600.0, 640.0, 360.0)):
    poses = action_poses("w-10,l-10,w-10") * 1.0 if poses is None else poses
    poses = poses.copy()
    poses[:, :3, 3] *= 7.0  # tracker units: a step of 0.35
    (root / "pose").mkdir(parents=True, exist_ok=True)
    (root / "intrinsics").mkdir(exist_ok=True)
    np.savez(root / "pose" / f"{name}.npz", data=poses.astype(np.float32), inds=np.arange(len(poses)))
    np.savez(root / "intrinsics" / f"{name}.npz", data=np.tile(np.float32(k), (len(poses), 1)),
             inds=np.arange(len(poses)))
    return poses


def test_vipe_folder_poses_intrinsics_and_scale(tmp_path) -> None:
    raw = vipe_folder(tmp_path)
    got = import_poses(tmp_path)
    # 1280×720 source (principal point at the centre) → 480×832 pixels.
    np.testing.assert_allclose(got.intrinsics, [600 * 832 / 1280, 600 * 480 / 720, 416, 240], rtol=1e-6)
    np.testing.assert_allclose(got.poses[:, :3, :3], raw[:, :3, :3], atol=1e-6)
    steps = np.linalg.norm(np.diff(got.poses[:, :3, 3], axis=0), axis=1)
    assert np.median(steps[steps > 0]) == pytest.approx(MOVE_PER_FRAME, rel=1e-5)
    assert got.scale == pytest.approx(1 / 7, rel=1e-5)
    kept = import_poses(tmp_path, normalize_scale=False)
    np.testing.assert_allclose(kept.poses, raw, atol=1e-5)
    # An explicit source size wins over the principal point.
    sized = import_poses(tmp_path / "pose" / "clip.npz", source_size=(720, 1440))
    assert sized.intrinsics[0] == pytest.approx(600 * 832 / 1440)


def test_vipe_folder_with_several_clips_needs_a_name(tmp_path) -> None:
    vipe_folder(tmp_path, "a")
    vipe_folder(tmp_path, "b")
    with pytest.raises(CameraError, match="2 clips"):
        import_poses(tmp_path)
    assert import_poses(tmp_path, name="b").source.endswith("b.npz")
    with pytest.raises(CameraError, match="no pose/c.npz"):
        import_poses(tmp_path, name="c")


def test_npz_export_and_world_to_camera(tmp_path) -> None:
    poses = action_poses("wl-20")
    np.savez(tmp_path / "cams.npz", c2w=poses, intrinsics=np.array([500.0, 500.0, 416.0, 240.0]))
    got = import_poses(tmp_path / "cams.npz", normalize_scale=False)
    np.testing.assert_allclose(got.poses, poses)
    np.testing.assert_allclose(got.intrinsics, [500, 500, 416, 240])  # poses.npy convention: as they are
    np.savez(tmp_path / "w2c.npz", poses=np.linalg.inv(poses))
    got = import_poses(tmp_path / "w2c.npz", normalize_scale=False, world_to_camera=True)
    np.testing.assert_allclose(got.poses, poses, atol=1e-12)
    assert got.intrinsics is None


def test_bad_exports_name_the_file(tmp_path) -> None:
    np.savez(tmp_path / "x.npz", something=np.zeros(3))
    with pytest.raises(CameraError, match=r"x.npz: no poses array"):
        import_poses(tmp_path / "x.npz")
    bad = action_poses("w-5")
    bad[2, :3, :3] *= 2.0
    np.save(tmp_path / "poses.npy", bad)
    with pytest.raises(CameraError, match="pose 2 is not orthonormal|orthonormal"):
        import_poses(tmp_path)
    with pytest.raises(CameraError, match="no such file"):
        import_poses(tmp_path / "missing.npz")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CameraError, match="neither a ViPE output folder"):
        import_poses(tmp_path / "empty")


def test_normalize_translation_keeps_a_turning_camera() -> None:
    poses = action_poses("l-20")
    out, factor = normalize_translation(poses)
    assert factor == 1.0 and np.array_equal(out, poses)


# --------------------------------------------------------------------------- robot and simulator trajectories
# The recipe of README "Robot and simulator trajectories" and docs/trajectories.md.

# OpenCV world (x right, y down, z forward) -> a z-up world (x forward, y left, z up), e.g. Isaac Sim's stage.
CV_TO_Z_UP = np.array([[0.0, 0.0, 1.0, 0.0], [-1.0, 0.0, 0.0, 0.0], [0.0, -1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
USD_CAMERA = np.diag([1.0, -1.0, -1.0, 1.0])  # OpenCV camera axes <-> USD / OpenGL ones (its own inverse)


def _usd_walk() -> tuple[np.ndarray, np.ndarray]:
    """A walk in OpenCV axes, and the same walk as a simulator records it: z-up world, a USD
    camera (x right, y up, looking down -z)."""
    walk = action_poses("w-12,j-8,wl-12,i-4")
    return walk, CV_TO_Z_UP @ walk @ USD_CAMERA


def _write_csv(path, poses: np.ndarray, columns: str = "frame,x,y,z,qw,qx,qy,qz") -> None:
    from scipy.spatial.transform import Rotation

    names = columns.split(",")
    lines = [columns]
    for i, pose in enumerate(poses):
        qx, qy, qz, qw = Rotation.from_matrix(pose[:3, :3]).as_quat()
        value = {"frame": i, "x": pose[0, 3], "y": pose[1, 3], "z": pose[2, 3], "qx": qx, "qy": qy, "qz": qz, "qw": qw}
        lines.append(",".join(f"{value[n]:.17g}" for n in names))
    path.write_text("\n".join(lines) + "\n")


def test_a_usd_camera_becomes_opencv_with_the_fixed_rotation(tmp_path) -> None:
    from comfyui_lingbot_world.wan.camera import camera_tensor

    walk, recorded = _usd_walk()
    np.savez(tmp_path / "sim.npz", poses=recorded)
    got = import_poses(tmp_path / "sim.npz", normalize_scale=False, camera_axes="opengl")
    # Camera axes converted: each pose is the walk's, in the simulator's world.
    np.testing.assert_allclose(got.poses, CV_TO_Z_UP @ walk, atol=1e-12)
    # The world's axes do not matter to the model: it reads each pose relative to the first.
    k = np.array([500.0, 500.0, 416.0, 240.0])
    import torch

    torch.testing.assert_close(camera_tensor(got.poses, k, 33, 32, 48), camera_tensor(walk, k, 33, 32, 48),
                               rtol=0, atol=1e-5)
    # Without the conversion the camera looks backwards: forward (W) steps point away from its view.
    wrong = import_poses(tmp_path / "sim.npz", normalize_scale=False)
    step = np.linalg.inv(wrong.poses[0]) @ wrong.poses[1]
    assert step[2, 3] < 0
    with pytest.raises(CameraError, match="camera_axes: 'usd' is not one of opencv, opengl, x_forward_z_up"):
        import_poses(tmp_path / "sim.npz", camera_axes="usd")


def test_a_camera_looking_down_x_with_z_up_becomes_opencv(tmp_path) -> None:
    """Isaac Sim's "world" camera axes (a robot body frame): x forward, y left, z up."""
    walk = action_poses("w-12,j-8,wl-12,k-4")
    # Columns: the body frame's x (forward), y (left), z (up) in OpenCV camera axes.
    body_in_cv = np.array([[0.0, -1.0, 0.0, 0.0], [0.0, 0.0, -1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    np.savez(tmp_path / "robot.npz", poses=CV_TO_Z_UP @ walk @ body_in_cv)
    got = import_poses(tmp_path / "robot.npz", normalize_scale=False, camera_axes="x_forward_z_up")
    np.testing.assert_allclose(got.poses, CV_TO_Z_UP @ walk, atol=1e-12)


def test_a_simulator_csv_log_is_the_same_path(tmp_path) -> None:
    """A camera log as CSV: position and a scalar-first quaternion (Isaac Sim's get_world_pose
    order), rows out of order with a frame column: read by the column names."""
    walk, recorded = _usd_walk()
    _write_csv(tmp_path / "head.csv", recorded)
    lines = (tmp_path / "head.csv").read_text().splitlines()
    (tmp_path / "shuffled.csv").write_text("\n".join([lines[0]] + lines[1:][::-1]) + "\n")
    for name in ("head.csv", "shuffled.csv"):
        got = import_poses(tmp_path / name, normalize_scale=False, camera_axes="opengl")
        np.testing.assert_allclose(got.poses, CV_TO_Z_UP @ walk, atol=1e-9)
        assert got.intrinsics is None  # default intrinsics for the output size
    normalized = import_poses(tmp_path / "head.csv", camera_axes="opengl")
    steps = np.linalg.norm(np.diff(normalized.poses[:, :3, 3], axis=0), axis=1)
    assert np.median(steps[steps > 0]) == pytest.approx(MOVE_PER_FRAME, rel=1e-6)
