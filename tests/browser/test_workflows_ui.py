"""Acceptance: the example workflows in the real ComfyUI frontend, as a user opens them.

Each UI-format workflow of example_workflows/ is loaded into the frontend (headless
Chromium), must use only node types the page knows, must convert (the frontend's own
graphToPrompt) to exactly the matching API graph in workflows/api/, and is queued from
the page after its size widgets were set small, the way a user would edit them, and must
end in a saved video. A screenshot of each lands in test-artifacts/browser/.

docs/graph.png (the README's picture) is the camera-files workflow at 1600x900; set
LINGBOT_UPDATE_DOCS_SCREENSHOT=1 to rewrite it from this run.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import tiny_package
from comfy_host import PACK_NAME, ROOT, artifacts_dir
from comfy_server import ComfyServer, video_info
from frontend import ComfyFrontend

UI_DIR = ROOT / "example_workflows"
API_DIR = ROOT / "workflows" / "api"
EXAMPLES = sorted(p.stem for p in UI_DIR.glob("*.json"))
FRAMES, WIDTH, HEIGHT, STEPS = 5, 48, 32, 3
DOCS_SHOT = ROOT / "docs" / "graph.png"
DOCS_WORKFLOW = "lingbot_camera_files"
DOCS_VIEWPORT = {"width": 1600, "height": 900}
MAX_DOCS_BYTES = 400 * 1024

# Settings for readable screenshots: full-detail nodes at any zoom, no minimap or FPS box.
DISPLAY_SETTINGS = {
    "LiteGraph.Canvas.MinFontSizeForLOD": 0,
    "Comfy.Minimap.Visible": False,
    "Comfy.Graph.CanvasInfo": False,
}
# The frontend's "Introducing Nodes 2.0" banner remembers its dismissal in localStorage.
DISMISS_BANNER = "localStorage.setItem('vueNodesBannerDismissed', 'true')"

# Set widgets by node type and name, as typing into them does (value, then callback).
_JS_SET_WIDGETS = """(changes) => {
    const graph = window.app.graph;
    const done = [];
    for (const node of (graph.nodes || graph._nodes)) {
        const values = changes[node.type];
        if (!values) continue;
        for (const [name, value] of Object.entries(values)) {
            const widget = (node.widgets || []).find(w => w.name === name);
            if (!widget) throw new Error(`${node.type} has no widget ${name}`);
            widget.value = value;
            widget.callback?.(value, window.app.canvas, node);
            done.push(`${node.id}.${name}`);
        }
    }
    graph.setDirtyCanvas(true, true);
    return done.sort();
}"""
# Zoom and pan so that the whole graph fills the canvas between the page's own panels
# (margins in screen pixels): like "Fit view", but with less empty border.
_JS_FRAME_GRAPH = """([left, top, right, bottom]) => {
    const canvas = window.app.canvas;
    const title = window.LiteGraph.NODE_TITLE_HEIGHT || 30;
    let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
    for (const n of (window.app.graph.nodes || window.app.graph._nodes)) {
        x0 = Math.min(x0, n.pos[0]); y0 = Math.min(y0, n.pos[1] - title);
        x1 = Math.max(x1, n.pos[0] + n.size[0]); y1 = Math.max(y1, n.pos[1] + n.size[1]);
    }
    const width = canvas.canvas.clientWidth - left - right;
    const height = canvas.canvas.clientHeight - top - bottom;
    const scale = Math.min(width / (x1 - x0), height / (y1 - y0));
    canvas.ds.scale = scale;
    canvas.ds.offset[0] = (left + (width - (x1 - x0) * scale) / 2) / scale - x0;
    canvas.ds.offset[1] = (top + (height - (y1 - y0) * scale) / 2) / scale - y0;
    canvas.setDirty(true, true);
    return scale;
}"""
# Left: the sidebar; top: workflow tabs, the workflow menu and the Run bar; bottom: zoom controls.
PANEL_MARGINS = [75, 105, 25, 70]


@pytest.fixture(scope="module")
def comfy_models(tmp_path_factory: pytest.TempPathFactory):
    return tiny_package.comfy_models_builder(tmp_path_factory)


@pytest.fixture(scope="module")
def display(comfy_server: ComfyServer, frontend_page: ComfyFrontend) -> ComfyFrontend:
    """The module's page with screenshot-friendly settings (they apply from the next load)."""
    comfy_server.post("/settings", DISPLAY_SETTINGS).raise_for_status()
    frontend_page.page.add_init_script(DISMISS_BANNER)
    return frontend_page


def api_graph(name: str) -> dict:
    return json.loads((API_DIR / f"{name}.json").read_text())


def comparable(prompt: dict) -> dict:
    """What the server executes: node type and inputs (titles in _meta are for people)."""
    return {node_id: (node["class_type"], node["inputs"]) for node_id, node in prompt.items()}


def fit_and_shoot(frontend: ComfyFrontend, path: Path) -> np.ndarray:
    frontend.page.evaluate(_JS_FRAME_GRAPH, PANEL_MARGINS)
    frontend.page.wait_for_timeout(300)  # let the canvas draw the new view
    frontend.screenshot(path)
    pixels = np.asarray(Image.open(path).convert("L"), dtype=np.float32)
    assert pixels.std() > 5, f"{path} is blank: the graph did not render"
    return pixels


def test_templates_list_exactly_the_example_workflows(comfy_server: ComfyServer) -> None:
    templates = comfy_server.get("/workflow_templates").json()
    assert {pack: sorted(names) for pack, names in templates.items()} == {PACK_NAME: EXAMPLES}
    assert EXAMPLES == sorted(p.stem for p in API_DIR.glob("*.json"))
    for name in EXAMPLES:  # what the Templates dialog fetches: the graph and its thumbnail
        graph = comfy_server.get(f"/api/workflow_templates/{PACK_NAME}/{name}.json")
        assert graph.status_code == 200 and graph.json() == json.loads((UI_DIR / f"{name}.json").read_text())
        thumb = comfy_server.get(f"/api/workflow_templates/{PACK_NAME}/{name}.jpg")
        assert thumb.status_code == 200 and thumb.headers["Content-Type"] == "image/jpeg", name
        assert thumb.content == (UI_DIR / f"{name}.jpg").read_bytes()


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_workflow_loads_converts_and_runs_from_the_page(
        display: ComfyFrontend, frontend: ComfyFrontend, comfy_server: ComfyServer, name: str) -> None:
    workflow = json.loads((UI_DIR / f"{name}.json").read_text())
    frontend.load_workflow(workflow)
    assert frontend.missing_node_types() == []
    assert sorted(frontend.node_types()) == sorted(node["type"] for node in workflow["nodes"])

    api = api_graph(name)
    assert comparable(frontend.graph_to_prompt()) == comparable(api)

    size = {"width": WIDTH, "height": HEIGHT, "frames": FRAMES}
    changed = frontend.page.evaluate(_JS_SET_WIDGETS, {
        "LingBotWorldVAEEncode": size, "LingBotWorldCamera": size, "LingBotWorldSampler": {"steps": STEPS}})
    sized = [n for n in api.values() if n["class_type"] in ("LingBotWorldVAEEncode", "LingBotWorldCamera")]
    assert len(changed) == 3 * len(sized) + 1  # width, height, frames of each; the sampler's steps
    small = tiny_package.small_workflow(api, frames=FRAMES, width=WIDTH, height=HEIGHT, steps=STEPS)
    assert comparable(frontend.graph_to_prompt()) == comparable(small)

    result = comfy_server.wait(frontend.queue_current(), timeout=180)
    assert result.ok, f"{result.describe()}\n{comfy_server.log_tail()}"
    (video,) = [f for f in comfy_server.output_files(result) if f.suffix == ".mp4"]
    info = video_info(video)
    assert (info.frames, info.width, info.height) == (FRAMES, WIDTH, HEIGHT), info

    # The page got the results too: the Save Video node shows the clip.
    frontend.page.wait_for_function(
        "() => (window.app.nodeOutputs?.['9']?.images || []).some(i => i.filename.endsWith('.mp4'))",
        timeout=20_000)
    fit_and_shoot(frontend, artifacts_dir("browser") / f"{name}.png")
    assert not frontend.page_errors, frontend.page_errors


def test_docs_screenshot_of_the_camera_files_workflow(display: ComfyFrontend, frontend: ComfyFrontend) -> None:
    frontend.page.set_viewport_size(DOCS_VIEWPORT)
    try:
        workflow = json.loads((UI_DIR / f"{DOCS_WORKFLOW}.json").read_text())
        # Named, so that the tab shows the workflow's name instead of "Unsaved Workflow".
        frontend.page.evaluate(
            """async ([wf, name]) => {
                await window.app.loadGraphData(wf, true, true, name,
                    {showMissingNodesDialog: false, showMissingModelsDialog: false});
            }""", [workflow, DOCS_WORKFLOW])
        assert frontend.missing_node_types() == []
        shot = artifacts_dir("browser") / "graph.png"
        pixels = fit_and_shoot(frontend, shot)
    finally:
        frontend.page.set_viewport_size({"width": 1280, "height": 800})
    assert pixels.shape == (DOCS_VIEWPORT["height"], DOCS_VIEWPORT["width"])
    # Shrink for the README: a 256-colour palette keeps the UI's flat colours and text sharp.
    Image.open(shot).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(shot, optimize=True)
    assert shot.stat().st_size < MAX_DOCS_BYTES

    if os.environ.get("LINGBOT_UPDATE_DOCS_SCREENSHOT") == "1":
        shutil.copyfile(shot, DOCS_SHOT)
    assert DOCS_SHOT.is_file(), f"run with LINGBOT_UPDATE_DOCS_SCREENSHOT=1 to create {DOCS_SHOT}"
    with Image.open(DOCS_SHOT) as docs:
        assert docs.size == (DOCS_VIEWPORT["width"], DOCS_VIEWPORT["height"])
    assert DOCS_SHOT.stat().st_size < MAX_DOCS_BYTES
