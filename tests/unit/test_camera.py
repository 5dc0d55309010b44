"""wan/camera.py (camera path → Plücker tensor: geometry, layout, validation) and
pipeline/camera.py (camera paths from files, the one builder of the sampler's condition).

The presets are in test_camera_presets.py, the drawing of a path in test_camera_preview.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.interpolate import interp1d
from scipy.spatial.transform import Rotation, Slerp

from comfyui_lingbot_world.loaders.trajectory import read_trajectory
from comfyui_lingbot_world.pipeline.camera import camera_condition, path_from_files, path_from_preset
from comfyui_lingbot_world.wan.camera import (
    CameraError,
    build_camera,
    camera_tensor,
    cut_trajectory,
    fold_rays,
    interpolate_poses,
    keyframe_camera,
    plucker_rays,
    relative_poses,
    scale_intrinsics,
    usable_frames,
    validate_trajectory,
)
from comfyui_lingbot_world.wan.camera_presets import preset_trajectory


def pose(rot: np.ndarray | None = None, t=(0.0, 0.0, 0.0)) -> np.ndarray:
    m = np.eye(4)
    if rot is not None:
        m[:3, :3] = rot
    m[:3, 3] = t
    return m


def yaw(deg: float) -> np.ndarray:
    return Rotation.from_euler("y", deg, degrees=True).as_matrix()


K = torch.tensor([10.0, 12.0, 8.0, 6.0])  # fx, fy, cx, cy for a 12×16 frame


def pinhole_dirs(k: torch.Tensor, h: int, w: int) -> torch.Tensor:
    v, u = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
    d = torch.stack([(u - k[2]) / k[0], (v - k[3]) / k[1], torch.ones(h, w)], dim=-1)
    return d / d.norm(dim=-1, keepdim=True)


# ----------------------------------------------------------------------------- rays


def test_identity_pose_gives_pinhole_directions_and_zero_origin() -> None:
    rays = plucker_rays(torch.eye(4)[None].repeat(2, 1, 1), K, 12, 16)
    assert rays.shape == (2, 12, 16, 6)
    assert torch.equal(rays[..., :3], torch.zeros(2, 12, 16, 3))
    torch.testing.assert_close(rays[0, ..., 3:], pinhole_dirs(K, 12, 16))
    torch.testing.assert_close(rays[..., 3:].norm(dim=-1), torch.ones(2, 12, 16))
    # The pixel whose centre is the principal point looks straight down +z.
    torch.testing.assert_close(rays[0, 5, 7, 3:], pinhole_dirs(K, 12, 16)[5, 7])
    centre = plucker_rays(torch.eye(4)[None], torch.tensor([10.0, 10.0, 7.5, 5.5]), 12, 16)
    torch.testing.assert_close(centre[0, 5, 7, 3:], torch.tensor([0.0, 0.0, 1.0]))


def test_pure_translation_moves_origins_only() -> None:
    c2w = torch.from_numpy(pose(t=(1.0, -2.0, 3.0))).float()[None]
    rays = plucker_rays(c2w, K, 12, 16)
    torch.testing.assert_close(rays[..., :3], torch.tensor([1.0, -2.0, 3.0]).expand(1, 12, 16, 3))
    torch.testing.assert_close(rays[0, ..., 3:], pinhole_dirs(K, 12, 16))


def test_yaw_of_90_degrees_turns_the_centre_ray_to_plus_x() -> None:
    k = torch.tensor([10.0, 10.0, 8.0, 6.0])
    c2w = torch.from_numpy(pose(yaw(90.0))).float()[None]
    rays = plucker_rays(c2w, k, 12, 16)
    # Pixel (row 5, col 7) has centre (7.5, 5.5): half a pixel left of and above (cx, cy).
    d_cam = pinhole_dirs(k, 12, 16)[5, 7]
    expect = torch.tensor([d_cam[2], d_cam[1], -d_cam[0]])  # R_y(90°)·d
    torch.testing.assert_close(rays[0, 5, 7, 3:], expect)
    assert rays[0, 5, 7, 3] > 0.99  # the view axis now points along world +x


def test_fold_layout_is_channel_dy_dx() -> None:
    h, w = 16, 24
    rays = torch.arange(2 * h * w * 6, dtype=torch.float32).reshape(2, h, w, 6)
    folded = fold_rays(rays)
    assert folded.shape == (384, 2, 2, 3)
    f, c, dy, dx, by, bx = 1, 4, 3, 5, 1, 2  # a known pixel in block (1, 2)
    assert folded[c * 64 + dy * 8 + dx, f, by, bx] == rays[f, by * 8 + dy, bx * 8 + dx, c]


# ----------------------------------------------------------------------------- poses


def test_slerp_midpoint_is_half_angle_rotation() -> None:
    poses = np.stack([pose(yaw(0.0), (0, 0, 0)), pose(yaw(80.0), (2.0, 0.0, 4.0))])
    mid = interpolate_poses(poses, 3)[1]
    np.testing.assert_allclose(mid[:3, :3], yaw(40.0), atol=1e-12)
    np.testing.assert_allclose(mid[:3, 3], [1.0, 0.0, 2.0])
    np.testing.assert_allclose(mid[3], [0, 0, 0, 1])


def test_interpolation_ignores_quaternion_signs() -> None:
    """q and -q are one rotation: feeding alternating signs must not change the path."""
    rots = Rotation.from_euler("zyx", np.linspace(0, 170, 5)[:, None] * [1, 0.5, 0.2], degrees=True)
    mats = rots.as_matrix()
    quats = rots.as_quat()
    flipped = Rotation.from_quat(quats * np.array([1, -1, 1, -1, 1])[:, None]).as_matrix()
    poses = np.tile(np.eye(4), (5, 1, 1))
    poses[:, :3, :3] = mats
    poses_f = poses.copy()
    poses_f[:, :3, :3] = flipped
    np.testing.assert_allclose(interpolate_poses(poses, 9), interpolate_poses(poses_f, 9), atol=1e-12)


def reference_interpolation(c2ws: np.ndarray, n_out: int) -> np.ndarray:
    """The reference's steps restated: interp1d on translations, quaternion sign
    continuity fixed by hand, then Slerp."""
    n = len(c2ws)
    src, tgt = np.linspace(0, n - 1, n), np.linspace(0, n - 1, n_out)
    trans = interp1d(src, c2ws[:, :3, 3], axis=0, kind="linear")(tgt)
    q = Rotation.from_matrix(c2ws[:, :3, :3]).as_quat()
    for i in range(1, n):
        if np.dot(q[i], q[i - 1]) < 0:
            q[i] = -q[i]
    rot = Slerp(src, Rotation.from_quat(q))(tgt).as_matrix()
    out = np.tile(np.eye(4), (n_out, 1, 1))
    out[:, :3, :3], out[:, :3, 3] = rot, trans
    return out


def reference_relative(c2ws: torch.Tensor) -> torch.Tensor:
    """Relative to the first pose, then frame to frame, then unit-scaled translations."""
    rel = torch.linalg.inv(c2ws[0]) @ c2ws
    rel[0] = torch.eye(4, dtype=c2ws.dtype)
    rel[1:] = torch.linalg.inv(rel[:-1].clone()) @ rel[1:].clone()
    norm = rel[:, :3, 3].norm(dim=-1).max()
    if norm > 0:
        rel[:, :3, 3] /= norm
    return rel


def test_relative_poses_match_the_reference_two_stage_construction() -> None:
    rng = np.random.default_rng(5)
    poses = np.stack(
        [pose(Rotation.random(random_state=int(s)).as_matrix(), rng.normal(size=3) * 50) for s in range(6)]
    )
    ours = relative_poses(poses)
    expect = reference_relative(torch.from_numpy(poses))
    torch.testing.assert_close(ours, expect, atol=1e-10, rtol=1e-10)
    assert torch.equal(ours[0], torch.eye(4, dtype=torch.float64))
    assert ours[:, :3, 3].norm(dim=-1).max().item() == pytest.approx(1.0)


def test_relative_poses_of_pure_rotation_keep_zero_translation() -> None:
    poses = np.stack([pose(yaw(a)) for a in (0.0, 10.0, 25.0)])
    rel = relative_poses(poses)
    assert torch.equal(rel[:, :3, 3], torch.zeros(3, 3, dtype=torch.float64))
    np.testing.assert_allclose(rel[2, :3, :3].numpy(), yaw(15.0), atol=1e-12)


def test_usable_frames() -> None:
    assert usable_frames(81, 961) == 81
    assert usable_frames(81, 50) == 49
    assert usable_frames(81, 52) == 49
    assert usable_frames(81, 53) == 53
    assert usable_frames(5, 1) == 1


def test_intrinsics_rescaling() -> None:
    k = np.array([500.0, 480.0, 416.0, 240.0])
    half_w = scale_intrinsics(k, 480, 416)
    torch.testing.assert_close(half_w, torch.tensor([250.0, 480.0, 208.0, 240.0], dtype=torch.float32))
    to_720p = scale_intrinsics(k, 720, 1280)
    torch.testing.assert_close(to_720p, torch.tensor([500 * 1280 / 832, 480 * 1.5, 640.0, 360.0], dtype=torch.float32))


def test_camera_tensor_of_a_static_camera_is_the_folded_pinhole_grid() -> None:
    n, h, w = 9, 32, 48
    poses = np.tile(np.eye(4), (n, 1, 1))
    k832 = np.array([400.0, 300.0, 416.0, 240.0])
    cam, frames = build_camera(poses, k832, 9, h, w, dtype=torch.float32)
    assert frames == 9 and cam.shape == (1, 384, 3, h // 8, w // 8)
    k = scale_intrinsics(k832, h, w).float()
    dirs = pinhole_dirs(k, h, w)
    c, dy, dx, by, bx = 5, 2, 7, 3, 4  # channel 5 = direction z
    assert cam[0, c * 64 + dy * 8 + dx, 2, by, bx].item() == pytest.approx(dirs[by * 8 + dy, bx * 8 + dx, 2].item(), abs=1e-6)
    assert torch.equal(cam[0, : 3 * 64], torch.zeros(3 * 64, 3, h // 8, w // 8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("directions_only", [False, True], ids=["cam", "act"])
def test_keyframe_camera_is_the_fold_of_origin_and_direction_rays(dtype, directions_only) -> None:
    """The origin channels are filled per frame and only the directions are folded: the same
    bits as folding the whole origin ⊕ direction rays (``plucker_rays`` → ``fold_rays``)."""
    h, w, n = 48, 80, 4
    g = np.random.default_rng(3)
    rotations = Rotation.random(n, random_state=4).as_matrix()
    keyframes = np.tile(np.eye(4), (n, 1, 1))
    keyframes[:, :3, :3], keyframes[:, :3, 3] = rotations, g.normal(size=(n, 3))
    keyframes = torch.as_tensor(keyframes, dtype=torch.float32)
    k832 = np.array([480.0, 470.0, 416.0, 240.0])
    got = keyframe_camera(keyframes, k832, h, w, dtype=dtype, directions_only=directions_only)
    rays = plucker_rays(keyframes, scale_intrinsics(k832, h, w).float(), h, w)
    want = fold_rays(rays[..., 3:] if directions_only else rays).to(dtype)[None]
    assert got.shape == want.shape and torch.equal(got, want)


@pytest.mark.parametrize("example", ["00", "01", "02"])
@pytest.mark.parametrize("frames", [81, 17])
def test_example_trajectories(examples_dir, example: str, frames: int) -> None:
    folder = examples_dir / example
    cam, used = build_camera(*read_trajectory(folder / "poses.npy", folder / "intrinsics.npy"), frames, 480, 832)
    f_lat = (frames - 1) // 4 + 1
    assert used == frames
    assert cam.shape == (1, 384, f_lat, 60, 104) and cam.dtype == torch.bfloat16
    assert torch.isfinite(cam.float()).all()
    # Directions are unit vectors; translations are at most 1 after normalization.
    rays = cam[0, :, [0, 1, f_lat - 1]].float().reshape(6, 64, 3, 60, 104)
    torch.testing.assert_close(rays[3:].norm(dim=0), torch.ones(64, 3, 60, 104), atol=2e-2, rtol=0)
    assert rays[:3].norm(dim=0).max() <= 1.0 + 1e-2
    assert torch.equal(rays[:3, :, 0], torch.zeros(3, 64, 60, 104))  # first keyframe: identity
    assert rays[:3, :, 1:].abs().max() > 0.05  # later keyframes move


def test_example_interpolation_matches_reference_steps(examples_dir) -> None:
    c2ws, k, frames = cut_trajectory(*read_trajectory(examples_dir / "00" / "poses.npy",
                                                      examples_dir / "00" / "intrinsics.npy"), 81)
    assert c2ws.shape == (81, 4, 4) and k.shape == (4,) and frames == 81
    np.testing.assert_allclose(interpolate_poses(c2ws, 21), reference_interpolation(c2ws, 21), atol=1e-9)


def test_camera_tensor_cuts_to_the_trajectory_length() -> None:
    poses, intr = preset_trajectory("pan_left", 23)
    cam, used = build_camera(poses, intr, 81, 16, 16, dtype=torch.float32)
    assert used == 21 and cam.shape == (1, 384, 6, 2, 2)
    assert camera_tensor(poses, intr, 81, 16, 16).shape == (1, 384, 6, 2, 2)
    with pytest.raises(ValueError, match="4n\\+1"):
        camera_tensor(poses, intr, 20, 16, 16)
    with pytest.raises(ValueError, match="multiples of 8"):
        camera_tensor(poses, intr, 17, 20, 16)


# ----------------------------------------------------------------------------- validation

GOOD_POSES = np.tile(np.eye(4), (3, 1, 1))
GOOD_K = np.tile([500.0, 500.0, 416.0, 240.0], (3, 1))


def broken(fn) -> np.ndarray:
    p = GOOD_POSES.copy()
    fn(p)
    return p


def _nan(p):
    p[1, 0, 3] = np.nan


def _inf(p):
    p[2, 1, 1] = np.inf


def _shear(p):
    p[1, 0, 1] = 0.3


def _mirror(p):
    p[2, 0, 0] = -1.0


def _bottom(p):
    p[0, 3, 0] = 0.5


@pytest.mark.parametrize(
    "poses,intrinsics,field,words",
    [
        (np.eye(4), GOOD_K, "poses", "[N, 4, 4]"),
        (np.zeros((3, 3, 4)), GOOD_K, "poses", "[N, 4, 4]"),
        (np.zeros((0, 4, 4)), GOOD_K, "poses", "empty"),
        (broken(_nan), GOOD_K, "poses", "pose 1 holds NaN"),
        (broken(_inf), GOOD_K, "poses", "pose 2 holds NaN or inf"),
        (broken(_shear), GOOD_K, "poses", "not orthonormal"),
        (broken(_mirror), GOOD_K, "poses", "determinant -1"),
        (broken(_bottom), GOOD_K, "poses", "last row"),
        (GOOD_POSES, np.ones((3, 3)), "intrinsics", "[N, 4] or [4]"),
        (GOOD_POSES, np.array([500.0, np.nan, 416, 240]), "intrinsics", "NaN"),
        (GOOD_POSES, np.array([[500.0, 500, 416, 240]] * 2 + [[500.0, np.inf, 1, 1]]), "intrinsics", "row 2"),
        (GOOD_POSES, np.array([0.0, 500, 416, 240]), "intrinsics", "fx=0"),
        (GOOD_POSES, np.array([500.0, -3, 416, 240]), "intrinsics", "fy=-3"),
        (GOOD_POSES, GOOD_K[:2], "intrinsics", "2 rows for 3 poses"),
        (GOOD_POSES, [["a", "b", "c", "d"]], "intrinsics", "not a numeric array"),
    ],
)
def test_validation_names_the_field(poses, intrinsics, field: str, words: str) -> None:
    with pytest.raises(CameraError) as info:
        validate_trajectory(poses, intrinsics, source="shot.npy")
    msg = str(info.value)
    assert msg.startswith(f"{field} in shot.npy"), msg
    assert words in msg, msg
    assert isinstance(info.value, ValueError)


def test_validation_accepts_good_input_and_a_single_intrinsics_row() -> None:
    validate_trajectory(GOOD_POSES, GOOD_K)
    validate_trajectory(GOOD_POSES, GOOD_K[0])
    validate_trajectory(torch.eye(4)[None], torch.tensor([1.0, 1.0, 0.0, 0.0]))


# ----------------------------------------------------------------------------- pipeline/camera.py


def test_load_trajectory_names_the_file(tmp_path) -> None:
    """Files are read once, by loaders/trajectory.py, for every camera path (this was the
    second reader in wan/camera.py's load_trajectory)."""
    p = broken(_mirror)
    np.save(tmp_path / "poses.npy", p)
    np.save(tmp_path / "intrinsics.npy", GOOD_K)
    with pytest.raises(CameraError, match="poses in .*poses.npy"):
        path_from_files(tmp_path / "poses.npy", tmp_path / "intrinsics.npy")
    np.save(tmp_path / "good.npy", GOOD_POSES)
    with pytest.raises(CameraError, match="intrinsics in .*missing.npy"):
        path_from_files(tmp_path / "good.npy", tmp_path / "missing.npy")


def test_the_one_condition_builder_is_the_reference_chain(tmp_path) -> None:
    poses, k = preset_trajectory("orbit_left", 13, 1.0)
    np.save(tmp_path / "poses.npy", poses)
    np.save(tmp_path / "intrinsics.npy", k)
    expected = camera_tensor(poses, k, 9, 32, 48, dtype=torch.float32)
    from_files = path_from_files(tmp_path / "poses.npy", tmp_path / "intrinsics.npy")
    for path in (path_from_preset("orbit_left", 1.0, 13), from_files):
        condition = camera_condition(path, 9, 32, 48)
        assert torch.equal(condition.plucker, expected)
        assert (condition.frames, condition.height, condition.width) == (9, 32, 48) and len(condition.poses) == 9
    with pytest.raises(CameraError, match="13 poses cover only 13 frames but 17 were asked"):
        camera_condition(path_from_preset("orbit_left", 1.0, 13), 17, 32, 48)
