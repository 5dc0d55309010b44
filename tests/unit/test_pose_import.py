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
