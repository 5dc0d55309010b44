"""The long-video parts of the node layer inside the real ComfyUI host (CPU): the camera
node's new sources and camera_path output, and LingBot-World Long Video on the tiny package."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from comfy_host import comfy_state_reset, use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
import av  # noqa: E402
import comfy.model_management as mm  # noqa: E402
import comfy.utils  # noqa: E402
import folder_paths  # noqa: E402

import tiny_package  # noqa: E402
from comfyui_lingbot_world.nodes import model_files  # noqa: E402
from comfyui_lingbot_world.nodes.camera import LingBotWorldCamera, _output_connected  # noqa: E402
from comfyui_lingbot_world.nodes.dit_loader import LingBotWorldDiTLoader  # noqa: E402
from comfyui_lingbot_world.nodes.long_video import LingBotWorldLongVideo  # noqa: E402
from comfyui_lingbot_world.nodes.text_encode import LingBotWorldTextEncode  # noqa: E402
from comfyui_lingbot_world.pipeline.camera import camera_from_preset  # noqa: E402
from comfyui_lingbot_world.pipeline.long_video import CameraPath  # noqa: E402
from comfyui_lingbot_world.wan.camera import camera_tensor, preset_trajectory  # noqa: E402
from comfyui_lingbot_world.wan.camera_actions import action_poses, default_intrinsics  # noqa: E402

H, W = 32, 48
PKG = "lingbot/pkg"
NONE = model_files.NO_FILE


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    return tiny_package.build(tmp_path_factory.mktemp("lingbot_pkg"), "nf4")


@pytest.fixture
def dirs(tmp_path, monkeypatch, package) -> dict[str, Path]:
    lingbot = tmp_path / "models" / "lingbot"
    lingbot.mkdir(parents=True)
    (lingbot / "pkg").symlink_to(package, target_is_directory=True)
    monkeypatch.setitem(folder_paths.folder_names_and_paths, "lingbot",
                        ([str(lingbot)], set(folder_paths.supported_pt_extensions)))
    out = {"input": tmp_path / "input", "output": tmp_path / "output", "user": tmp_path / "user"}
    for path in out.values():
        path.mkdir()
    monkeypatch.setattr(folder_paths, "input_directory", str(out["input"]))
    monkeypatch.setattr(folder_paths, "output_directory", str(out["output"]))
    monkeypatch.setattr(folder_paths, "user_directory", str(out["user"]))
    return out


clean_comfy_state = pytest.fixture(autouse=True)(comfy_state_reset)


def _camera(source="preset", preset="pan_left", poses=NONE, intrinsics=NONE, frames=9, actions="w-20,j-10,w-30",
            export=NONE, normalize=True, window=81, overlap=1, width=W, height=H):
    return LingBotWorldCamera.execute(source, preset, 1.0, poses, intrinsics, width, height, frames, actions, export,
                                      normalize, window, overlap)


# --------------------------------------------------------------------------- camera node


def test_preset_and_files_cameras_are_unchanged(dirs):
    camera, preview, path = _camera("preset", "pan_left", frames=9)
    torch.testing.assert_close(camera.plucker, camera_from_preset("pan_left", 1.0, 9, H, W).plucker, rtol=0, atol=0)
    # The defaults of the new widgets give the same picture as the old node (no window cuts).
    old = LingBotWorldCamera.execute("preset", "pan_left", 1.0, NONE, NONE, W, H, 9)
    torch.testing.assert_close(preview, old[1], rtol=0, atol=0)
    assert isinstance(path, CameraPath) and len(path.poses) == 9
    np.testing.assert_allclose(path.poses, preset_trajectory("pan_left", 9)[0])
    traj = dirs["input"] / "traj"
    traj.mkdir()
    poses, k = preset_trajectory("orbit_left", 9)
    np.save(traj / "poses.npy", poses)
    np.save(traj / "intrinsics.npy", k)
    from_files, _, path = _camera("files", poses="traj/poses.npy", intrinsics="traj/intrinsics.npy", frames=9)
    torch.testing.assert_close(from_files.plucker, camera_tensor(poses, k, 9, H, W, dtype=torch.float32))
    np.testing.assert_allclose(path.poses, poses)


def test_actions_source_gives_the_engines_poses(dirs):
    camera, preview, path = _camera("actions", frames=17, actions="w-8,l-8")
    np.testing.assert_allclose(path.poses, action_poses("w-8,l-8", 17))
    np.testing.assert_allclose(path.intrinsics, default_intrinsics(H, W))
    expected = camera_tensor(action_poses("w-8,l-8", 17), np.tile(default_intrinsics(H, W), (17, 1)), 17, H, W,
                             dtype=torch.float32)
    torch.testing.assert_close(camera.plucker, expected)
    assert tuple(preview.shape) == (1, 512, 512, 3)


def test_actions_with_an_intrinsics_file(dirs):
    np.save(dirs["input"] / "k.npy", np.array([[400.0, 410.0, 416.0, 240.0]] * 3))
    _, _, path = _camera("actions", intrinsics="k.npy", frames=9, actions="w-8")
    np.testing.assert_allclose(path.intrinsics, [400.0, 410.0, 416.0, 240.0])


def test_bad_action_string_names_the_token(dirs):
    with pytest.raises(ValueError, match=r"actions: .*'wq-5'"):
        _camera("actions", frames=9, actions="w-4,wq-5")
    with pytest.raises(ValueError, match="actions: .*empty"):
        _camera("actions", frames=9, actions="  ")


def test_import_source_reads_a_pose_export(dirs):
    poses = action_poses("w-12,j-8", 21)
    poses[:, :3, 3] *= 3.0  # tracker units
    np.savez(dirs["input"] / "walk.npz", poses=poses)
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


def test_long_path_has_no_one_pass_camera_and_shows_the_cuts(dirs, monkeypatch):
    camera, preview, path = _camera("actions", frames=25, window=9, overlap=1, actions="w-30")
    assert camera is None and len(path.poses) == 25
    one_window, _, _ = _camera("actions", frames=9, window=9, overlap=1, actions="w-30")
    whole, _, _ = _camera("actions", frames=25, window=81, overlap=1, actions="w-30")
    assert one_window is not None and whole is not None
    _, uncut, _ = _camera("actions", frames=25, window=81, actions="w-30")
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
        LingBotWorldCamera.execute("actions", "static", 1.0, NONE, NONE, W, H, 25, "w-30", NONE, True, 9, 1)


def test_path_shorter_than_the_video_is_refused(dirs):
    traj = dirs["input"] / "short"
    traj.mkdir()
    poses, k = preset_trajectory("dolly_in", 9)
    np.save(traj / "poses.npy", poses)
    np.save(traj / "intrinsics.npy", k)
    with pytest.raises(ValueError, match="cover only"):
        _camera("files", poses="short/poses.npy", intrinsics="short/intrinsics.npy", frames=25, window=9)


# --------------------------------------------------------------------------- long video node


def _long(dirs, frames=13, window=9, steps=2, camera_path=None, **kw):
    text = LingBotWorldTextEncode.execute(f"{PKG}/models_t5_umt5-xxl-enc-bf16.pth", f"{PKG}/tokenizer",
                                          "a walk", "blurry", "auto")[0]
    dit = LingBotWorldDiTLoader.execute(f"{PKG}/high_noise_model_bnb_nf4", f"{PKG}/low_noise_model_bnb_nf4", "none")[0]
    image = torch.from_numpy(np.random.default_rng(0).random((1, 40, 60, 3), dtype=np.float32))
    args = dict(dit=dit, image=image, vae=f"{PKG}/Wan2.1_VAE.pth", width=W, height=H, frames=frames, window=window,
                overlap=1, scale_quantile=1.0, steps=steps, shift=5.0, cfg_high=4.0, cfg_low=4.0, boundary=0.9, seed=3,
                sampler="unipc", decode_tile=0, keep_experts=False, fps=16, filename_prefix="LingBotWorld/long",
                text=text, camera_path=camera_path)
    args.update(kw)
    return dit, LingBotWorldLongVideo.execute(**args)


def _frames_in(path: Path) -> int:
    with av.open(str(path)) as container:
        return sum(1 for _ in container.decode(video=0))


def test_long_video_node_writes_the_mp4_window_by_window(dirs):
    _, _, path = _camera("actions", frames=13, window=9, actions="w-6,l-6")
    seen = []
    comfy.utils.set_progress_bar_global_hook(lambda value, total, preview, node_id=None: seen.append((value, total)))
    dit, out = _long(dirs, camera_path=path)
    files = sorted((dirs["output"] / "LingBotWorld").glob("long_*.mp4"))
    assert [f.name for f in files] == ["long_00001_.mp4"]
    assert _frames_in(files[0]) == 13
    video = out.args[0]
    assert video.get_dimensions() == (W, H)
    assert out.ui.as_dict()["images"] == [{"filename": "long_00001_.mp4", "subfolder": "LingBotWorld", "type": "output"}]
    assert seen[-1] == (4, 4) and len(seen) == 4  # 2 windows x 2 steps
    assert dit.high.expert is None and dit.low.expert is None
    kept, _ = _long(dirs, keep_experts=True, steps=1)  # a second run gets a new file, experts kept then closed
    assert kept.high.expert is None and kept.low.expert is None
    assert len(list((dirs["output"] / "LingBotWorld").glob("long_*.mp4"))) == 2


def test_cancel_in_window_two_keeps_window_one(dirs):
    def hook(value, total, preview, node_id=None):
        if value == 3:  # the first step of window 2
            mm.interrupt_current_processing(True)

    comfy.utils.set_progress_bar_global_hook(hook)
    with pytest.raises(mm.InterruptProcessingException):
        dit, _ = _long(dirs, frames=17, window=9)
    files = list((dirs["output"] / "LingBotWorld").glob("long_*.mp4"))
    assert len(files) == 1 and _frames_in(files[0]) == 9


def test_long_video_node_checks_its_inputs(dirs):
    with pytest.raises(ValueError, match="camera_path: expected"):
        _long(dirs, camera_path="not a path")
    with pytest.raises(ValueError, match="overlap"):
        _long(dirs, overlap=9)
    _, _, short = _camera("actions", frames=9, window=9, actions="w-8")
    with pytest.raises(ValueError, match="cover only"):
        _long(dirs, camera_path=short)
    assert not list(dirs["output"].rglob("*.mp4"))  # nothing written before the checks pass
