"""Acceptance: every shipped template and API workflow runs in a real ComfyUI server at its OWN
frame count, window and camera settings; only the resolution and the step count are shrunk.

The other workflow tests shrink the frames too (to 5 or 9), so a template whose own frame
count the nodes refuse (act2cam shipped 121 frames with a window of 81) passed them. Here each
UI template of example_workflows/ is turned into the prompt the page queues (with the server's
own /object_info, tests/shipped_workflows.py) and run to its video, whose frame count must be
the graph's own; the API graph of workflows/api/ beside it runs too when it is another prompt.
One server for the module with the tiny package (tests/tiny_package.py), 16x16 and one or two
steps, so the 961-frame walks stay affordable on a 2-core CI box. The live Play session waits for keys: its
API graph runs in test_play_server.py and its template in tests/browser/test_play_ui.py; the replay
of a session from its log (it needs a session) in test_play_replay.py, template and API graph.
"""
from __future__ import annotations

import json

import pytest

import tiny_package
from comfy_host import ROOT
from comfy_server import ComfyServer, video_info
from shipped_workflows import LIVE_TEMPLATES, REPLAY_TEMPLATES, TEMPLATES, template_prompt

WIDTH, HEIGHT = 16, 16  # the smallest the nodes take: the 961-frame walks stay minutes on 2 cores
STEPS = {"LingBotWorldSampler": 2, "LingBotWorldLongVideo": 1}  # the only other value shrunk
SIZED = ("LingBotWorldVAEEncode", "LingBotWorldCamera", "LingBotWorldLongVideo", "LingBotWorldFastLongVideo")
RUN = sorted(name for name in TEMPLATES if name not in LIVE_TEMPLATES + REPLAY_TEMPLATES)


@pytest.fixture(scope="module")
def comfy_models(tmp_path_factory: pytest.TempPathFactory):
    return tiny_package.comfy_models_builder(tmp_path_factory)


@pytest.fixture(scope="module")
def object_info(comfy_server: ComfyServer) -> dict:
    return comfy_server.object_info()


def shrunk(graph: dict) -> dict:
    """``graph`` at WIDTH x HEIGHT and STEPS; frames, windows and camera as they are."""
    graph = json.loads(json.dumps(graph))
    for node in graph.values():
        if node["class_type"] in SIZED:
            node["inputs"].update(width=WIDTH, height=HEIGHT)
        if node["class_type"] in STEPS:
            node["inputs"]["steps"] = STEPS[node["class_type"]]
    return graph


def own_frames(graph: dict) -> int:
    counts = {node["inputs"]["frames"] for node in graph.values() if "frames" in node["inputs"]}
    assert len(counts) == 1, f"the graph's nodes disagree on the frame count: {counts}"
    return counts.pop()


def run_to_video(server: ComfyServer, graph: dict, what: str) -> None:
    frames = own_frames(graph)
    result = server.run(shrunk(graph), timeout=900, check=False)
    assert result.ok, f"{what} fails as shipped at {frames} frames: {result.describe()}"
    videos = [f for f in server.output_files(result) if f.suffix in (".mp4", ".webm", ".mov")]
    assert len(videos) == 1, f"{what}: {server.output_files(result)}"
    video = video_info(videos[0])
    assert (video.frames, video.width, video.height) == (frames, WIDTH, HEIGHT), f"{what}: {video}"


def test_every_shipped_workflow_is_run_here() -> None:
    assert sorted(p.stem for p in (ROOT / "workflows" / "api").glob("*.json")) == sorted(TEMPLATES)
    assert set(RUN) | set(LIVE_TEMPLATES) | set(REPLAY_TEMPLATES) == set(TEMPLATES)


def api_prompt(graph: dict) -> dict:
    return {k: {"class_type": n["class_type"], "inputs": n["inputs"]} for k, n in graph.items()}


@pytest.mark.parametrize("name", RUN)
def test_template_and_api_workflow_run_at_their_own_frame_count(comfy_server: ComfyServer, object_info: dict,
                                                                  name: str) -> None:
    """The template as the page queues it, then the API graph when it is another prompt (the
    unit tests hold them equal: tests/unit/test_shipped_workflows.py; one run then covers both)."""
    ui = json.loads((ROOT / "example_workflows" / f"{TEMPLATES[name]}.json").read_text(encoding="utf-8"))
    api = api_prompt(json.loads((ROOT / "workflows" / "api" / f"{name}.json").read_text(encoding="utf-8")))
    template = template_prompt(ui, object_info)
    run_to_video(comfy_server, template, f"template {TEMPLATES[name]!r}")
    if template != api:
        run_to_video(comfy_server, api, f"workflows/api/{name}.json")
