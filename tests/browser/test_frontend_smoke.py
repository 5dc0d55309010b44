"""The real ComfyUI frontend loads, converts and queues a core-only workflow.

Checks the browser harness itself (Chromium, Playwright, the frontend package and the
frontend's own loader / converter / queue path) so that workflow tests built on it can
trust what it reports.
"""
from __future__ import annotations

import copy

import numpy as np
from PIL import Image

from comfy_host import artifacts_dir
from comfy_server import ComfyServer
from frontend import ComfyFrontend

WIDTH, HEIGHT, RED = 64, 48, 0xFF0000

# UI format, as the frontend saves it: EmptyImage -> SaveImage.
CORE_WORKFLOW = {
    "last_node_id": 2,
    "last_link_id": 1,
    "nodes": [
        {"id": 1, "type": "EmptyImage", "pos": [60, 120], "size": [315, 130], "flags": {},
         "order": 0, "mode": 0, "inputs": [],
         "outputs": [{"name": "IMAGE", "type": "IMAGE", "links": [1], "slot_index": 0}],
         "properties": {"Node name for S&R": "EmptyImage"},
         "widgets_values": [WIDTH, HEIGHT, 1, RED]},
        {"id": 2, "type": "SaveImage", "pos": [460, 120], "size": [315, 270], "flags": {},
         "order": 1, "mode": 0, "inputs": [{"name": "images", "type": "IMAGE", "link": 1}],
         "outputs": [], "properties": {"Node name for S&R": "SaveImage"},
         "widgets_values": ["browser_smoke"]},
    ],
    "links": [[1, 1, 0, 2, 0, "IMAGE"]],
    "groups": [],
    "config": {},
    "extra": {},
    "version": 0.4,
}


def test_page_registers_core_and_pack_nodes(frontend: ComfyFrontend, comfy_server: ComfyServer) -> None:
    registered = set(frontend.registered_node_types())
    assert {"EmptyImage", "SaveImage", "LoadImage"} <= registered
    assert set(comfy_server.pack_node_types()) <= registered


def test_missing_node_types_are_reported(frontend: ComfyFrontend) -> None:
    workflow = copy.deepcopy(CORE_WORKFLOW)
    workflow["nodes"][0]["type"] = "NoSuchNodeAnywhere"
    frontend.load_workflow(workflow)
    assert frontend.missing_node_types() == ["NoSuchNodeAnywhere"]


def test_core_workflow_converts_queues_and_renders(frontend: ComfyFrontend,
                                                   comfy_server: ComfyServer) -> None:
    frontend.load_workflow(CORE_WORKFLOW)
    assert sorted(frontend.node_types()) == ["EmptyImage", "SaveImage"]
    assert frontend.missing_node_types() == []

    prompt = frontend.graph_to_prompt()
    # "_meta" (titles) is for people; the server reads class_type and inputs.
    assert {k: (v["class_type"], v["inputs"]) for k, v in prompt.items()} == {
        "1": ("EmptyImage", {"width": WIDTH, "height": HEIGHT, "batch_size": 1, "color": RED}),
        "2": ("SaveImage", {"images": ["1", 0], "filename_prefix": "browser_smoke"}),
    }

    result = comfy_server.wait(frontend.queue_current(), timeout=60)
    assert result.ok, result.describe()
    (saved,) = comfy_server.output_files(result)
    pixels = np.asarray(Image.open(saved).convert("RGB"))
    assert pixels.shape == (HEIGHT, WIDTH, 3) and (pixels == [255, 0, 0]).all()

    shot = frontend.screenshot(artifacts_dir("browser") / "core-workflow.png")
    image = np.asarray(Image.open(shot).convert("L"), dtype=np.float32)
    assert image.shape == (800, 1280)
    assert image.std() > 5, "the screenshot is blank: the page did not render"
    assert not frontend.page_errors, frontend.page_errors
