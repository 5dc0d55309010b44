"""nodes/long_video.py: LingBot-World Long Video inside the ComfyUI host (CPU) on the tiny
package: the .mp4 written window by window, cancel, and the checks of its inputs; the Act
checkpoint through the windows, and the refusal of a wrong checkpoint/controls pairing."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from comfy_host import comfy_state_reset, use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
import av  # noqa: E402
import comfy.model_management as mm  # noqa: E402
import comfy.utils  # noqa: E402

from node_runs import ACT_PKG, H, PKG, W  # noqa: E402
from comfyui_lingbot_world.nodes.camera import LingBotWorldCamera  # noqa: E402
from comfyui_lingbot_world.nodes.dit_loader import LingBotWorldDiTLoader  # noqa: E402
from comfyui_lingbot_world.nodes.host import model_files  # noqa: E402
from comfyui_lingbot_world.nodes.long_video import LingBotWorldLongVideo  # noqa: E402
from comfyui_lingbot_world.nodes.text_encode import LingBotWorldTextEncode  # noqa: E402

NONE = model_files.NO_FILE

clean_comfy_state = pytest.fixture(autouse=True)(comfy_state_reset)


def _camera(source="preset", preset="pan_left", poses=NONE, intrinsics=NONE, frames=9, actions="w-20,j-10,w-30",
            export=NONE, normalize=True, window=81, overlap=1, width=W, height=H):
    return LingBotWorldCamera.execute(source, preset, 1.0, poses, intrinsics, width, height, frames, actions, export,
                                      normalize, window, overlap)


def _long(installed, frames=13, window=9, steps=2, camera_path=None, package=PKG, **kw):
    text = LingBotWorldTextEncode.execute(f"{PKG}/models_t5_umt5-xxl-enc-bf16.pth", f"{PKG}/tokenizer",
                                          "a walk", "blurry", "auto")[0]
    dit = LingBotWorldDiTLoader.execute(f"{package}/high_noise_model_bnb_nf4", f"{package}/low_noise_model_bnb_nf4",
                                        "none")[0]
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


def test_long_video_node_writes_the_mp4_window_by_window(installed):
    _, _, path = _camera("actions", frames=13, window=9, actions="w-6,l-6")
    seen = []
    comfy.utils.set_progress_bar_global_hook(lambda value, total, preview, node_id=None: seen.append((value, total)))
    dit, out = _long(installed, camera_path=path)
    files = sorted((installed["output"] / "LingBotWorld").glob("long_*.mp4"))
    assert [f.name for f in files] == ["long_00001_.mp4"]
    assert _frames_in(files[0]) == 13
    video = out.args[0]
    assert video.get_dimensions() == (W, H)
    assert out.ui.as_dict()["images"] == [{"filename": "long_00001_.mp4", "subfolder": "LingBotWorld", "type": "output"}]
    assert seen[-1] == (4, 4) and len(seen) == 4  # 2 windows x 2 steps
    assert dit.high.expert is None and dit.low.expert is None
    kept, _ = _long(installed, keep_experts=True, steps=1)  # a second run gets a new file, experts kept then closed
    assert kept.high.expert is None and kept.low.expert is None
    assert len(list((installed["output"] / "LingBotWorld").glob("long_*.mp4"))) == 2


def test_cancel_in_window_two_keeps_window_one(installed):
    def hook(value, total, preview, node_id=None):
        if value == 3:  # the first step of window 2
            mm.interrupt_current_processing(True)

    comfy.utils.set_progress_bar_global_hook(hook)
    with pytest.raises(mm.InterruptProcessingException):
        dit, _ = _long(installed, frames=17, window=9)
    files = list((installed["output"] / "LingBotWorld").glob("long_*.mp4"))
    assert len(files) == 1 and _frames_in(files[0]) == 9


def test_long_video_node_checks_its_inputs(installed):
    with pytest.raises(ValueError, match="camera_path: expected"):
        _long(installed, camera_path="not a path")
    with pytest.raises(ValueError, match="overlap"):
        _long(installed, overlap=9)
    # A pose path of 9 frames cannot drive more (an action string can: the camera holds still after it).
    _, _, short = _camera("preset", frames=9, window=9)
    with pytest.raises(ValueError, match="cover only"):
        _long(installed, camera_path=short)
    assert not list(installed["output"].rglob("*.mp4"))  # nothing written before the checks pass


def test_the_act_checkpoint_through_the_windows(installed_act, monkeypatch):
    """An action string on the Act checkpoint, 13 frames in windows of 9: every window gets
    the Act control (directions + its W/A/S/D rows), and the video has every frame."""
    from comfyui_lingbot_world.pipeline import long_video as pipeline_long_video
    from comfyui_lingbot_world.wan.act_control import wasd_from_actions

    _, _, path = _camera("actions", frames=13, window=9, actions="w-3,d-4,s-5")
    seen = []
    real = pipeline_long_video.sample

    def spying_sample(experts, text, condition, camera, *args, **kwargs):
        seen.append(camera)
        return real(experts, text, condition, camera, *args, **kwargs)

    monkeypatch.setattr(pipeline_long_video, "sample", spying_sample)
    dit, _ = _long(installed_act, camera_path=path, package=ACT_PKG)
    assert dit.config.control_type == "act" and [c.control_type for c in seen] == ["act", "act"]
    keys = wasd_from_actions("w-3,d-4,s-5", 13)
    for camera, (start, frames) in zip(seen, ((0, 9), (8, 5))):  # windows 0..8 and 8..12
        assert camera.plucker.shape == (1, 448, (frames - 1) // 4 + 1, H // 8, W // 8)
        np.testing.assert_array_equal(camera.plucker[0, 192::64, :, 0, 0].T.numpy(), keys[start:start + frames:4])
    (video,) = (installed_act["output"] / "LingBotWorld").glob("long_*.mp4")
    assert _frames_in(video) == 13


def test_the_wrong_pairing_is_refused_before_any_expert_loads(installed_act, monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("an expert was loaded")

    monkeypatch.setattr(mm, "load_models_gpu", no_load)
    _, _, preset = _camera("preset", frames=13, window=9)
    with pytest.raises(ValueError, match=r"act/high_noise_model_bnb_nf4\) is an Act checkpoint .* the camera "
                                         r"\(preset 'pan_left'\) gives Base-Cam Plücker rays"):
        _long(installed_act, camera_path=preset, package=ACT_PKG)
    assert not list(installed_act["output"].rglob("*.mp4"))  # nothing written before the checks pass
