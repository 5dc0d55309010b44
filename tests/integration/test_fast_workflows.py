"""Acceptance: the two LingBot-World Fast templates in a real ComfyUI server, over HTTP.

The server has the tiny package of the other workflow tests with the tiny Fast transformer
where the official README puts it (``lingbot-world-base-cam-nf4/lingbot_world_fast/``, bf16,
quantized to NF4 while loading as the templates ask; tests/tiny_package.py). The graphs of
workflows/api/lingbot_fast_clip.json and lingbot_fast_walk.json are queued shrunk to 48x32
and a few chunks: the clip's LATENT decodes into a video of every frame, the walk writes
one .mp4 of every frame; progress moves once per forward and each chunk sends a preview.
A Cancel inside a chunk of the walk keeps the chunks written, leaves nothing loaded, and
the server goes on. The same graphs as shipped (tests/data/legacy_workflows/) still run.
"""
from __future__ import annotations

import json
import time

import pytest

import tiny_package
from comfy_host import ROOT
from comfy_server import ComfyServer, video_info

SAMPLER, DECODE, SAVE_VIDEO, STREAM = "6", "7", "9", "6"  # node ids of the shipped graphs
WIDTH, HEIGHT = 48, 32
STATUS = "/lingbot/status"


@pytest.fixture(scope="module")
def comfy_server_options() -> dict:
    return {"extra_args": ["--preview-method", "latent2rgb"]}


@pytest.fixture(scope="module")
def comfy_models(tmp_path_factory: pytest.TempPathFactory):
    return tiny_package.comfy_models_builder(tmp_path_factory)


def graph(name: str, frames: int, legacy: bool = False, **stream) -> dict:
    folder = ROOT / "tests" / "data" / "legacy_workflows" / "api" if legacy else ROOT / "workflows" / "api"
    shrunk = tiny_package.small_workflow(json.loads((folder / f"{name}.json").read_text()), frames=frames,
                                         width=WIDTH, height=HEIGHT)
    for node in shrunk.values():
        if node["class_type"] == "LingBotWorldFastLongVideo":
            node["inputs"].update(stream)
    return shrunk


def nothing_loaded(server: ComfyServer) -> bool:
    state = server.get(STATUS).json()
    return state["loaded_models"] == [] and state["experts_resident"] == [] and state["dit_models_alive"] == 0 \
        and state["vaes_alive"] == 0


def test_the_fast_clip_template_runs_and_its_latent_decodes(comfy_server: ComfyServer) -> None:
    previews_before = comfy_server._events._binary_frames
    result = comfy_server.run(graph("lingbot_fast_clip", 21), timeout=300)
    assert "execution_success" in [kind for kind, _ in result.events], result.describe()
    # The bar: 2 chunks x (4 steps + the commit), the last chunk without its commit.
    progress = [p for p in result.progress if p["node"] == SAMPLER]
    assert progress[-1]["value"] == progress[-1]["max"] == 9, progress
    assert comfy_server._events._binary_frames - previews_before >= 2  # a preview per chunk
    assert DECODE in result.executed_nodes  # the pack's VAE Decode read the LATENT
    (video,) = [f for f in comfy_server.output_files(result) if f.suffix == ".mp4"]
    info = video_info(video)
    assert (info.frames, info.width, info.height, info.fps) == (21, WIDTH, HEIGHT, 16), info
    assert len([f for f in comfy_server.output_files(result) if f.suffix == ".png"]) == 1  # the camera drawing
    assert nothing_loaded(comfy_server)


def test_the_fast_walk_template_writes_every_chunk_into_one_mp4(comfy_server: ComfyServer) -> None:
    result = comfy_server.run(graph("lingbot_fast_walk", 33, filename_prefix="LingBotWorld/fast_walk"), timeout=300)
    videos = [f for f in comfy_server.output_files(result) if f.suffix == ".mp4"]
    assert len(videos) == 1 and STREAM in result.outputs, comfy_server.output_files(result)
    assert videos[0].parent == comfy_server.output_dir / "LingBotWorld"
    info = video_info(videos[0])
    assert (info.frames, info.width, info.height, info.fps) == (33, WIDTH, HEIGHT, 16), info
    progress = [p for p in result.progress if p["node"] == STREAM]
    assert progress[-1]["value"] == progress[-1]["max"] == 3 * 5 - 1
    assert nothing_loaded(comfy_server)


def test_cancel_inside_a_chunk_keeps_the_chunks_written_and_the_server_serves(comfy_server: ComfyServer) -> None:
    # 96x64 and 69 frames (6 chunks): slow enough on a CPU that Cancel lands in chunk 2 or later.
    walk = graph("lingbot_fast_walk", 69, filename_prefix="LingBotWorld/fast_cancel", width=96, height=64)
    walk["5"]["inputs"].update(width=96, height=64)
    prompt_id = comfy_server.queue(walk)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # wait for the first step of chunk 2
        values = [d["value"] for kind, d in comfy_server._events.for_prompt(prompt_id)
                  if kind == "progress" and d.get("node") == STREAM]
        if values and max(values) >= 6:
            break
        time.sleep(0.05)
    during = comfy_server.get(STATUS).json()
    comfy_server.interrupt()
    result = comfy_server.wait(prompt_id, timeout=240)
    assert result.status == "interrupted", result.describe()
    (entry,) = during["loaded_models"]
    assert entry["class"] == "ExpertPatcher" and entry["expert"] == "fast", entry
    (video,) = sorted((comfy_server.output_dir / "LingBotWorld").glob("fast_cancel_*.mp4"))
    info = video_info(video)
    written = max(p["value"] for p in result.progress if p["node"] == STREAM) // 5  # whole chunks done
    assert info.frames in {12 * n - 3 for n in (written - 1, written) if n > 0}, (info, written)
    assert (info.width, info.height) == (96, 64) and info.frames < 69
    assert nothing_loaded(comfy_server)

    again = comfy_server.run(graph("lingbot_fast_walk", 9, filename_prefix="LingBotWorld/fast_after"), timeout=240)
    (after,) = [f for f in comfy_server.output_files(again) if f.suffix == ".mp4"]
    assert video_info(after).frames == 9


@pytest.mark.parametrize("name", ["lingbot_fast_clip", "lingbot_fast_walk"])
def test_the_fast_graphs_as_shipped_still_run(comfy_server: ComfyServer, name: str) -> None:
    shipped = graph(name, 9, legacy=True, filename_prefix=f"LingBotWorld/{name}_legacy")
    for node in shipped.values():
        if node["class_type"] == "LingBotWorldFastSampler":
            node["inputs"]["seed"] = 7  # not a cached repeat of the runs above
    result = comfy_server.run(shipped, timeout=240)
    (video,) = [f for f in comfy_server.output_files(result) if f.suffix == ".mp4"]
    assert video_info(video).frames == 9
