"""Acceptance: the LingBot-World Act checkpoint in a real ComfyUI server, over HTTP.

The server has the tiny Base-Cam package where the shipped workflows expect it and a tiny
Act package (``make_checkpoint --model act``) beside it, plus an official-style Act example
in input/ (poses.npy, intrinsics.npy and action.npy [F, 4]). API prompts built from the
shipped act2cam graph are queued: the Act checkpoint driven by an action string, by the Act
files, and through the windows of Long Video, each ending in a video; and the wrong pairing
(Base-Cam with Act files, Act with a preset) is refused with a message naming the
checkpoint and the controls, before any expert loads.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import tiny_package
from comfy_host import ROOT
from comfy_server import ComfyServer, video_info

WIDTH, HEIGHT, FRAMES = 48, 32, 5
SAMPLER, CAMERA, DIT = "6", "5", "4"  # node ids of the shipped graphs
ACT = f"lingbot/{tiny_package.ACT_PACKAGE_NAME}"
STATUS = "/lingbot/status"


@pytest.fixture(scope="module")
def comfy_models(tmp_path_factory: pytest.TempPathFactory):
    def extra(models: Path, package: Path) -> None:
        act = tiny_package.build(tmp_path_factory.getbasetemp() / "tiny-packages", "nf4", model="act")
        (models / "lingbot" / tiny_package.ACT_PACKAGE_NAME).symlink_to(act, target_is_directory=True)
        from comfyui_lingbot_world.wan.act_control import wasd_from_actions
        from comfyui_lingbot_world.wan.camera_presets import preset_trajectory

        example = models.parent / "input" / "act_example"
        example.mkdir(parents=True)
        poses, k = preset_trajectory("orbit_left", 9)
        np.save(example / "poses.npy", poses)
        np.save(example / "intrinsics.npy", k)
        np.save(example / "action.npy", wasd_from_actions("w-4,d-5", 9).astype(np.int32))

    return tiny_package.comfy_models_builder(tmp_path_factory, extra)


def act2cam(package: str | None = None, **camera) -> dict:
    """The shipped act2cam graph at 48x32x5, 2 steps; the DiT Loader on ``package``."""
    graph = json.loads((ROOT / "workflows" / "api" / "lingbot_act2cam.json").read_text())
    graph = tiny_package.small_workflow(graph, frames=FRAMES, width=WIDTH, height=HEIGHT, steps=2)
    if package is not None:
        graph[DIT]["inputs"].update(high_noise=f"{package}/high_noise_model_bnb_nf4",
                                    low_noise=f"{package}/low_noise_model_bnb_nf4")
    graph[CAMERA]["inputs"].update(camera)
    return graph


def the_video(server: ComfyServer, result) -> Path:
    (video,) = [f for f in server.output_files(result) if f.suffix == ".mp4"]
    info = video_info(video)
    assert (info.frames, info.width, info.height) == (FRAMES, WIDTH, HEIGHT), info
    return video


def test_the_act_checkpoint_follows_an_action_string(comfy_server: ComfyServer) -> None:
    result = comfy_server.run(act2cam(ACT, actions="w-2,dj-2"), timeout=180)
    assert "execution_success" in [kind for kind, _ in result.events], result.describe()
    the_video(comfy_server, result)
    sampler_progress = [p for p in result.progress if p["node"] == SAMPLER]
    assert sampler_progress[-1]["value"] == sampler_progress[-1]["max"] == 2


def test_the_act_checkpoint_follows_poses_and_action_npy(comfy_server: ComfyServer) -> None:
    graph = act2cam(ACT, source="act_files", poses_file="act_example/poses.npy",
                    intrinsics_file="act_example/intrinsics.npy")
    result = comfy_server.run(graph, timeout=180)
    assert result.ok, result.describe()
    the_video(comfy_server, result)


def test_the_act_checkpoint_through_the_windows_of_a_long_video(comfy_server: ComfyServer) -> None:
    graph = json.loads((ROOT / "workflows" / "api" / "lingbot_long_walk.json").read_text())
    graph = tiny_package.small_workflow(graph, frames=9, width=WIDTH, height=HEIGHT, steps=1, window=5)
    graph[DIT]["inputs"].update(high_noise=f"{ACT}/high_noise_model_bnb_nf4",
                                low_noise=f"{ACT}/low_noise_model_bnb_nf4")
    graph["6"]["inputs"]["filename_prefix"] = "LingBotWorld/act_walk"
    result = comfy_server.run(graph, timeout=240)
    assert result.ok, result.describe()
    (video,) = [f for f in comfy_server.output_files(result) if f.suffix == ".mp4"]
    assert video_info(video).frames == 9
    progress = [p for p in result.progress if p["node"] == "6"]
    assert progress[-1]["value"] == progress[-1]["max"] == 2  # 2 windows x 1 step


@pytest.mark.parametrize("package, camera, words", [
    (None, {"source": "act_files", "poses_file": "act_example/poses.npy",
            "intrinsics_file": "act_example/intrinsics.npy"},
     ["lingbot-world-base-cam-nf4/high_noise_model_bnb_nf4) is a Base-Cam checkpoint",
      "the camera (poses.npy/intrinsics.npy/action.npy) gives Act controls", "robbyant/lingbot-world-base-act"]),
    (ACT, {"source": "preset", "preset": "dolly_in"},
     ["lingbot-world-base-act-nf4/high_noise_model_bnb_nf4) is an Act checkpoint",
      "the camera (preset 'dolly_in') gives Base-Cam Plücker rays, without keys", "action.npy"]),
], ids=["base-cam-with-act-files", "act-with-a-preset"])
def test_the_wrong_pairing_is_refused_naming_both(comfy_server: ComfyServer, package, camera, words) -> None:
    result = comfy_server.run(act2cam(package, **camera), timeout=120, check=False)
    assert result.status == "error", result.describe()
    error = result.error
    assert error["node_id"] == SAMPLER and error["node_type"] == "LingBotWorldSampler", error
    for word in words:
        assert word in error["exception_message"], error["exception_message"]
    assert not [p for p in result.progress if p["node"] == SAMPLER]  # refused before the first step
    state = comfy_server.get(STATUS).json()
    assert state["experts_resident"] == [] and state["dit_models_alive"] == 0, state  # no expert was loaded
    assert comfy_server.alive
