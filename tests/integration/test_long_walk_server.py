"""Acceptance: the shipped long-walk workflow in a real ComfyUI server, over HTTP.

The graph of workflows/api/lingbot_long_walk.json shrunk to 48x32 and several windows of
the tiny package: it must end in one .mp4 with every frame, shown on the Long Video node;
and a Cancel during window 2 must leave a playable file with window 1's frames while the
server goes on serving.
"""
from __future__ import annotations

import json
import time

import pytest

import tiny_package
from comfy_host import ROOT
from comfy_server import ComfyServer, video_info

LONG, CAMERA = "6", "5"  # node ids of the shipped graph
WIDTH, HEIGHT = 48, 32


@pytest.fixture(scope="module")
def comfy_server_options() -> dict:
    return {"extra_args": ["--preview-method", "latent2rgb"]}


@pytest.fixture(scope="module")
def comfy_models(tmp_path_factory: pytest.TempPathFactory):
    return tiny_package.comfy_models_builder(tmp_path_factory)


def long_walk(frames: int, window: int, steps: int, prefix: str) -> dict:
    graph = json.loads((ROOT / "workflows" / "api" / "lingbot_long_walk.json").read_text())
    graph = tiny_package.small_workflow(graph, frames=frames, width=WIDTH, height=HEIGHT, steps=steps, window=window)
    graph[LONG]["inputs"]["filename_prefix"] = prefix
    return graph


def test_long_walk_writes_every_window_into_one_mp4(comfy_server: ComfyServer) -> None:
    result = comfy_server.run(long_walk(25, 9, 2, "LingBotWorld/walk"), timeout=300)
    files = comfy_server.output_files(result)
    videos = [f for f in files if f.suffix == ".mp4"]
    assert len(videos) == 1 and LONG in result.outputs, files
    info = video_info(videos[0])
    assert (info.frames, info.width, info.height, info.fps) == (25, WIDTH, HEIGHT, 16), info
    assert videos[0].parent == comfy_server.output_dir / "LingBotWorld"
    assert len([f for f in files if f.suffix == ".png"]) == 1  # the path drawing with the cuts
    progress = [p for p in result.progress if p["node"] == LONG]
    assert progress[-1]["value"] == progress[-1]["max"] == 3 * 2  # 3 windows x 2 steps


def test_cancel_in_window_two_keeps_window_one_and_the_server_serves(comfy_server: ComfyServer) -> None:
    prefix = "LingBotWorld/cancel"
    # 96x64 and 60 steps per window: slow enough on a CPU that Cancel lands in window 2.
    graph = long_walk(25, 9, 60, prefix)
    for node in (graph[LONG], graph[CAMERA]):
        node["inputs"].update(width=96, height=64)
    prompt_id = comfy_server.queue(graph)
    comfy_server.wait_event(prompt_id, "progress", node=LONG, timeout=240)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # wait for the first step of window 2
        values = [d["value"] for kind, d in comfy_server._events.for_prompt(prompt_id)
                  if kind == "progress" and d.get("node") == LONG]
        if values and max(values) > 60:
            break
        time.sleep(0.2)
    comfy_server.interrupt()
    result = comfy_server.wait(prompt_id, timeout=240)
    assert result.status == "interrupted", result.describe()
    assert max(p["value"] for p in result.progress if p["node"] == LONG) < 120
    (video,) = sorted((comfy_server.output_dir / "LingBotWorld").glob("cancel_*.mp4"))
    info = video_info(video)
    assert (info.frames, info.width, info.height) == (9, 96, 64), info  # window 1, playable

    again = comfy_server.run(long_walk(13, 9, 1, "LingBotWorld/after"), timeout=240)
    (after,) = [f for f in comfy_server.output_files(again) if f.suffix == ".mp4"]
    assert video_info(after).frames == 13


def test_an_api_prompt_from_before_the_new_camera_inputs_still_runs(comfy_server: ComfyServer) -> None:
    graph = tiny_package.small_workflow(json.loads((ROOT / "workflows" / "api" / "lingbot_camera_preset.json").read_text()))
    for name in ("actions", "pose_export", "normalize_scale", "window", "overlap"):
        del graph[CAMERA]["inputs"][name]
    result = comfy_server.run(graph, timeout=180)
    (video,) = [f for f in comfy_server.output_files(result) if f.suffix == ".mp4"]
    assert video_info(video).frames == 5
