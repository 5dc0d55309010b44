"""Acceptance: the example workflows in the real ComfyUI frontend, as a user opens them.

Each UI-format workflow of example_workflows/ is loaded into the frontend (headless
Chromium), must use only node types the page knows, must convert (the frontend's own
graphToPrompt) to exactly the matching API graph in workflows/api/ (inputs that a newer
host adds to core nodes at their defaults aside), and is queued from the page after its
size widgets were set small, the way a user would edit them; it must show a latent preview
on the sampler (per step; per chunk on the LingBot-World Fast nodes; none on a Long Video
node, which is the output) and end in a saved video that its output node shows. Templates are
opened from the Templates dialog as a person does and must be readable there, and every
saved widget value must fit the node's widgets. A screenshot of each lands in
test-artifacts/browser/, and a thumbnail for the Templates dialog (set
LINGBOT_UPDATE_THUMBNAILS=1 to write them to example_workflows/).

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
from shipped_workflows import FAST_WORKFLOWS, LIVE_TEMPLATES, REPLAY_TEMPLATES, SHIPPED_BEFORE, TEMPLATES
from comfyui_lingbot_world.wan.camera_actions import cut_actions

UI_DIR = ROOT / "example_workflows"
API_DIR = ROOT / "workflows" / "api"
LEGACY_DIR = ROOT / "tests" / "data" / "legacy_workflows"  # the same graphs as shipped before
EXAMPLES = sorted(TEMPLATES)
# Run from the page to a saved video; a live session (Play) waits for keys: its own browser test drives it.
# A replay needs a session's log: test_play_replay_template_runs_from_a_log_in_the_page.
RUN_TO_END = [name for name in EXAMPLES if name not in LIVE_TEMPLATES + REPLAY_TEMPLATES]
# The graphs as shipped before (tests/data/legacy_workflows/, under their names then).
SAVED_BEFORE = sorted(SHIPPED_BEFORE)
SAMPLER = "6"  # the sampler, or the Long Video node of the long walk
LONG_WALK = "lingbot_long_walk"
LONG_WINDOW = 5  # the long walk runs as two windows of 5 frames (9 frames)
THUMB_SIZE = (800, 414)
FRAMES, WIDTH, HEIGHT, STEPS = 5, 48, 32, 3
FAST_WALK = "lingbot_fast_walk"
FAST_FRAMES, FAST_CHUNKS = 21, 2  # the Fast graphs run two chunks of 12 frames (the first 9)
DOCS_SHOT = ROOT / "docs" / "graph.png"
DOCS_WORKFLOW = TEMPLATES["lingbot_camera_files"]
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
def comfy_server_options() -> dict:
    # Latent previews on (most users have them): the sampler node shows one per step.
    return {"extra_args": ["--preview-method", "latent2rgb"]}


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


def ui_graph(name: str) -> dict:
    return json.loads((UI_DIR / f"{TEMPLATES[name]}.json").read_text())


def comparable(prompt: dict) -> dict:
    """What the server executes: node type and inputs (titles in _meta are for people)."""
    return {node_id: (node["class_type"], node["inputs"]) for node_id, node in prompt.items()}


def input_default(object_info: dict, class_type: str, name: str):
    spec = {**object_info[class_type]["input"].get("required", {}),
            **object_info[class_type]["input"].get("optional", {})}.get(name)
    if spec is None:
        return None
    if len(spec) > 1 and isinstance(spec[1], dict) and "default" in spec[1]:
        return spec[1]["default"]
    options = spec[0] if isinstance(spec[0], list) else spec[1].get("options") if spec[0] == "COMBO" else None
    return options[0] if options else None


def without_new_defaults(page: dict, shipped: dict, object_info: dict) -> dict:
    """The page's export minus inputs the shipped graph lacks that sit at the host's default.

    A newer host may add an input to a core node (Create Video's bit_depth in 0.27): the
    frontend exports it at its default, and the shipped graph, which predates it, means
    exactly that. Any other difference still fails the comparison.
    """
    out = {}
    for node_id, node in page.items():
        known = shipped.get(node_id, {}).get("inputs", {})
        inputs = {k: v for k, v in node["inputs"].items()
                  if k in known or v != input_default(object_info, node["class_type"], k)}
        out[node_id] = {**node, "inputs": inputs}
    return out


def page_prompt_matches(frontend: ComfyFrontend, server: ComfyServer, shipped: dict) -> None:
    page = without_new_defaults(frontend.graph_to_prompt(), shipped, server.object_info())
    assert comparable(page) == comparable(shipped)


# Record the latent previews the page receives over the websocket, with their node.
_JS_WATCH_PREVIEWS = """() => {
    const api = window.comfyAPI.api.api;
    window.__lingbotPreviews = [];
    api.addEventListener('b_preview_with_metadata', ({detail}) => window.__lingbotPreviews.push({
        node: String(detail.displayNodeId ?? detail.nodeId), type: detail.blob.type, bytes: detail.blob.size}));
}"""


def fit_and_shoot(frontend: ComfyFrontend, path: Path) -> np.ndarray:
    frontend.page.evaluate(_JS_FRAME_GRAPH, PANEL_MARGINS)
    frontend.page.wait_for_timeout(300)  # let the canvas draw the new view
    frontend.screenshot(path)
    pixels = np.asarray(Image.open(path).convert("L"), dtype=np.float32)
    assert pixels.std() > 5, f"{path} is blank: the graph did not render"
    return pixels


def test_templates_list_exactly_the_example_workflows(comfy_server: ComfyServer) -> None:
    templates = comfy_server.get("/workflow_templates").json()
    assert {pack: sorted(names) for pack, names in templates.items()} == {PACK_NAME: sorted(TEMPLATES.values())}
    assert EXAMPLES == sorted(p.stem for p in API_DIR.glob("*.json"))
    for title in TEMPLATES.values():  # what the Templates dialog fetches: the graph and its thumbnail
        graph = comfy_server.get(f"/api/workflow_templates/{PACK_NAME}/{title}.json")
        assert graph.status_code == 200 and graph.json() == json.loads((UI_DIR / f"{title}.json").read_text())
        thumb = comfy_server.get(f"/api/workflow_templates/{PACK_NAME}/{title}.jpg")
        assert thumb.status_code == 200 and thumb.headers["Content-Type"] == "image/jpeg", title
        assert thumb.content == (UI_DIR / f"{title}.jpg").read_bytes()


# Each card title of the pack's templates as the dialog shows it: its box (page pixels) and
# whether its text fits (a title cut by the card's ellipsis or clamp overflows its element).
_JS_CARD_TITLES = """(titles) => {
    const dialog = document.querySelector('[role=dialog]');
    const shown = [];
    for (const el of dialog.querySelectorAll('*')) {
        const text = [...el.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent).join('').trim();
        if (!titles.includes(text)) continue;
        const box = el.getBoundingClientRect();
        if (!box.width) continue;
        shown.push({title: text, top: Math.round(box.top), left: Math.round(box.left),
                    cut: el.scrollWidth > el.clientWidth + 1 || el.scrollHeight > el.clientHeight + 1});
    }
    return shown;
}"""


def test_template_cards_show_whole_titles_in_the_readme_order(frontend: ComfyFrontend) -> None:
    """Issue 27: the cards cut the titles, and the README's first template came last (the server
    lists a pack's templates in its folder's order on disk): every title whole on its card, the
    cards in TEMPLATES' order, the README's."""
    page = frontend.page
    page.get_by_role("button", name="Templates", exact=True).first.click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_text(PACK_NAME, exact=True).first.click()
    titles = list(TEMPLATES.values())
    dialog.get_by_text(titles[0], exact=True).first.wait_for(timeout=30_000)
    page.wait_for_timeout(500)  # the thumbnails load and the grid settles
    frontend.screenshot(artifacts_dir("browser") / "templates-dialog.png")
    shown = page.evaluate(_JS_CARD_TITLES, titles)
    assert sorted(s["title"] for s in shown) == sorted(titles), shown
    assert [s for s in shown if s["cut"]] == []
    in_order = [s["title"] for s in sorted(shown, key=lambda s: (s["top"], s["left"]))]
    assert in_order == titles


def open_from_the_templates_dialog(frontend: ComfyFrontend, title: str, nodes: int) -> None:
    """As a person does: the sidebar's Templates button, the pack's entry in the dialog's
    list, the card with the template's title; then wait until the graph is on the canvas."""
    page = frontend.page
    page.get_by_role("button", name="Templates", exact=True).first.click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_text(PACK_NAME, exact=True).first.click()
    dialog.get_by_text(title, exact=True).first.click()
    page.wait_for_function(
        """([title, nodes]) => !document.querySelector('[role=dialog]')
            && window.app.extensionManager?.workflow?.activeWorkflow?.filename === title
            && (window.app.graph.nodes || window.app.graph._nodes).length === nodes""",
        arg=[title, nodes], timeout=30_000)
    page.wait_for_timeout(500)  # the frontend's own fit of the view runs after the load


# The view a template opens at: its zoom, the page's low-quality flag after a draw, and in
# canvas units the visible area and every node's box (title bar included) with its badge
# band (the pack's source badge is drawn just above a node's title, right-aligned).
_JS_VIEW = """(badge) => {
    const canvas = window.app.canvas;
    canvas.draw(true, true);
    const title = window.LiteGraph.NODE_TITLE_HEIGHT || 30;
    const [ox, oy] = canvas.ds.offset, scale = canvas.ds.scale;
    const nodes = (window.app.graph.nodes || window.app.graph._nodes).map(n => ({
        id: String(n.id), type: n.type, box: [n.pos[0], n.pos[1] - title, n.size[0], n.size[1] + title],
        badge: n.type.startsWith('LingBotWorld') ? [n.pos[0], n.pos[1] - title - badge, n.size[0], badge] : null}));
    return {scale, lowQuality: !!canvas.low_quality, nodes,
            visible: [-ox, -oy, canvas.canvas.clientWidth / scale, canvas.canvas.clientHeight / scale]};
}"""
# LiteGraph's default LiteGraph.Canvas.MinFontSizeForLOD (8 px) over its 14 px node text:
# below this zoom the page draws every node as a grey box.
LOW_QUALITY_SCALE = 8 / 14
BADGE_HEIGHT = 26  # the source badge's box, in canvas units


def _overlap(a: list, b: list) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


@pytest.mark.parametrize("name", EXAMPLES)
def test_template_opened_from_the_templates_dialog_is_readable(frontend: ComfyFrontend, name: str) -> None:
    """Opened from the Templates dialog at the tests' 1280x800 window: node text is drawn
    (the zoom is at or above the page's low-quality threshold), every node is on screen, and
    no node or badge covers another (a badge over the DiT Loader hid its devices value)."""
    workflow = ui_graph(name)
    open_from_the_templates_dialog(frontend, TEMPLATES[name], len(workflow["nodes"]))
    view = frontend.page.evaluate(_JS_VIEW, BADGE_HEIGHT)
    frontend.screenshot(artifacts_dir("browser") / f"dialog-{name}.png")
    assert view["scale"] >= LOW_QUALITY_SCALE and not view["lowQuality"], view["scale"]
    vx, vy, vw, vh = view["visible"]
    for node in view["nodes"]:
        x, y, w, h = node["box"]
        assert vx <= x and vy <= y and x + w <= vx + vw and y + h <= vy + vh, (node, view["visible"])
    assert_nothing_covered(view["nodes"])


def assert_nothing_covered(nodes: list[dict]) -> None:
    """No node's box (title bar included) overlaps another's, nor a pack node's badge band."""
    for first in nodes:
        for second in nodes:
            if first is second:
                continue
            assert not (first["id"] < second["id"] and _overlap(first["box"], second["box"])), (first, second)
            assert not (first["badge"] and _overlap(first["badge"], second["box"])), (first, second)


# Each saved node against a fresh node of its type in this page (the widgets the frontend
# makes from the host's schema): how many values it saves, and whether each saved value
# fits its widget (a combo's options, a number's range, a toggle's or a text's type).
_JS_WIDGET_PROBLEMS = """([workflow, optional]) => {
    const problems = [];
    for (const saved of workflow.nodes) {
        const fresh = window.LiteGraph.createNode(saved.type);
        if (!fresh) { problems.push(`${saved.id} ${saved.type}: unknown node type`); continue; }
        const widgets = fresh.widgets || [];
        const expected = fresh.serialize().widgets_values || [];
        const values = saved.widgets_values || [];
        const missing = widgets.slice(values.length).filter(w => w.serialize !== false).map(w => w.name);
        // A newer host may add an optional input to a core node (Create Video's bit_depth in
        // 0.27): a file that also serves older hosts cannot carry it.
        const added = !saved.type.startsWith('LingBotWorld') && missing.every(n => (optional[saved.type] || []).includes(n));
        if (values.length !== expected.length && !(values.length < expected.length && added))
            problems.push(`${saved.id} ${saved.type}: ${values.length} widget values, its widgets take ${expected.length}`
                          + (missing.length ? ` (missing ${missing.join(', ')})` : ''));
        values.forEach((value, i) => {
            const w = widgets[i];
            if (!w || w.serialize === false) return;
            const where = `${saved.id} ${saved.type}.${w.name}=${JSON.stringify(value)}`;
            let options = w.options?.values;
            if (typeof options === 'function') options = options(w, fresh);
            if (Array.isArray(options)) {
                if (!options.includes(value)) problems.push(`${where}: not one of ${options.length} options`);
            } else if (typeof expected[i] === 'number') {
                if (typeof value !== 'number' || !Number.isFinite(value)) problems.push(`${where}: not a number`);
                else if ((w.options?.min ?? -Infinity) > value || value > (w.options?.max ?? Infinity))
                    problems.push(`${where}: outside ${w.options.min}..${w.options.max}`);
            } else if (expected[i] !== null && expected[i] !== undefined && typeof value !== typeof expected[i]) {
                problems.push(`${where}: a ${typeof value}, the widget holds a ${typeof expected[i]}`);
            }
        });
    }
    return problems;
}"""


@pytest.mark.parametrize("name", EXAMPLES)
def test_template_widget_values_fit_the_node_schemas(frontend: ComfyFrontend, comfy_server: ComfyServer,
                                                     name: str) -> None:
    """Every node of the shipped template holds a value for every widget its node has now,
    each one its widget can take (the fast-mode template's Camera held 8 of 13)."""
    if name in REPLAY_TEMPLATES:  # its log combo lists the Play logs of the output folder
        write_play_log(comfy_server, FAST_FRAMES, "w-8,wj-12")
        frontend.reload()
    info = comfy_server.object_info()
    optional = {kind: list(spec["input"].get("optional", {})) for kind, spec in info.items()}
    problems = frontend.page.evaluate(_JS_WIDGET_PROBLEMS, [ui_graph(name), optional])
    assert problems == []


# What a node shows now: its latent previews (the page draws them instead of its outputs)
# and the sources of the videos in its widgets.
_JS_SHOWN = """(id) => {
    const node = window.app.graph.getNodeById(Number(id));
    const previews = (window.app.nodePreviewImages || {})[id] || [];
    const videos = [];
    for (const w of node.widgets || []) {
        const el = w.element;
        if (!el) continue;
        for (const v of (el.tagName === 'VIDEO' ? [el] : el.querySelectorAll('video'))) videos.push(v.currentSrc || v.src);
    }
    return {previews: previews.length, videos};
}"""


@pytest.mark.parametrize("name", RUN_TO_END)
def test_example_workflow_loads_converts_and_runs_from_the_page(
        display: ComfyFrontend, frontend: ComfyFrontend, comfy_server: ComfyServer, name: str) -> None:
    workflow = ui_graph(name)
    frontend.load_workflow(workflow)
    assert frontend.missing_node_types() == []
    assert sorted(frontend.node_types()) == sorted(node["type"] for node in workflow["nodes"])

    api = api_graph(name)
    page_prompt_matches(frontend, comfy_server, api)

    long_walk, fast = name == LONG_WALK, name in FAST_WORKFLOWS
    frames = 2 * LONG_WINDOW - 1 if long_walk else FAST_FRAMES if fast else FRAMES
    size = {"width": WIDTH, "height": HEIGHT, "frames": frames}
    camera = {**size}
    camera_inputs = next((n["inputs"] for n in api.values() if n["class_type"] == "LingBotWorldCamera"), {})
    if camera_inputs.get("source") == "actions":  # a string longer than the video is refused: shorten it too
        camera["actions"] = cut_actions(camera_inputs["actions"], frames)
    if long_walk:
        changes = {"LingBotWorldCamera": {**camera, "window": LONG_WINDOW},
                   "LingBotWorldLongVideo": {**size, "window": LONG_WINDOW, "steps": STEPS}}
    elif fast:  # 4 fixed steps: only the size changes
        changes = {"LingBotWorldVAEEncode": size, "LingBotWorldCamera": camera, "LingBotWorldFastLongVideo": size}
    else:
        changes = {"LingBotWorldVAEEncode": size, "LingBotWorldCamera": camera, "LingBotWorldSampler": {"steps": STEPS}}
    changed = frontend.page.evaluate(_JS_SET_WIDGETS, changes)
    assert len(changed) == sum(len(v) for k, v in changes.items()
                               if any(n["class_type"] == k for n in api.values()))
    small = tiny_package.small_workflow(api, frames=frames, width=WIDTH, height=HEIGHT, steps=STEPS,
                                        window=LONG_WINDOW if long_walk else None)
    page_prompt_matches(frontend, comfy_server, small)

    frontend.page.evaluate(_JS_WATCH_PREVIEWS)
    result = comfy_server.wait(frontend.queue_current(), timeout=180)
    assert result.ok, f"{result.describe()}\n{comfy_server.log_tail()}"
    (video,) = [f for f in comfy_server.output_files(result) if f.suffix == ".mp4"]
    info = video_info(video)
    assert (info.frames, info.width, info.height) == (frames, WIDTH, HEIGHT), info

    # The page got the results too: the Save Video (or Long Video) node shows the clip.
    shows_video = SAMPLER if long_walk or name == FAST_WALK else "9"
    frontend.page.wait_for_function(
        f"() => (window.app.nodeOutputs?.['{shows_video}']?.images || []).some(i => i.filename.endsWith('.mp4'))",
        timeout=20_000)
    # ... and ends showing that video, not a latent preview nor a previous run's video (with
    # live previews on, the Long Video node kept showing its last preview).
    try:  # the page makes its video element on a later frame
        frontend.page.wait_for_function(
            f"(id) => ({_JS_SHOWN})(id).videos.some(src => src.includes('filename={video.name}&'))",
            arg=shows_video, timeout=10_000)
    except Exception:  # Playwright's TimeoutError: the assertion below says what the node shows
        pass
    shown = frontend.page.evaluate(_JS_SHOWN, shows_video)
    assert shown["previews"] == 0 and any(f"filename={video.name}&" in src for src in shown["videos"]), shown
    # The sampler node got a live preview image per step (the page shows the latest); the
    # Fast nodes one per chunk.
    previews = frontend.page.evaluate("() => window.__lingbotPreviews")
    on_sampler = [p for p in previews if p["node"] == SAMPLER]
    if shows_video == SAMPLER:  # an output node that samples sends none: the page would show them instead
        assert on_sampler == [], previews
    else:
        assert len(on_sampler) >= (FAST_CHUNKS if fast else STEPS) and all(
            p["type"].startswith("image/") and p["bytes"] > 0 for p in on_sampler), previews
    # Nodes that grew to show their picture or video cover no other node (the fast-mode
    # Camera, grown, covered the Preview Image's title).
    assert_nothing_covered(frontend.page.evaluate(_JS_VIEW, BADGE_HEIGHT)["nodes"])
    fit_and_shoot(frontend, artifacts_dir("browser") / f"{name}.png")
    assert not frontend.page_errors, frontend.page_errors

    # The card's picture: the template's own values, with what this run showed (the camera
    # path drawing, the video) on its nodes, so each card shows its own workflow.
    sized = next(n for n in api.values() if n["class_type"] in (
        "LingBotWorldVAEEncode", "LingBotWorldLongVideo", "LingBotWorldFastLongVideo"))["inputs"]
    shipped = {k: sized[k] for k in ("width", "height", "frames")}
    shipped_camera = {**shipped, **({"actions": camera_inputs["actions"]} if "actions" in camera else {})}
    if long_walk:
        shipped["window"] = sized["window"]
        restore = {"LingBotWorldCamera": {**shipped_camera, "window": sized["window"]},
                   "LingBotWorldLongVideo": {**shipped, "steps": sized["steps"]}}
    elif fast:
        restore = {"LingBotWorldVAEEncode": shipped, "LingBotWorldCamera": shipped_camera,
                   "LingBotWorldFastLongVideo": shipped}
    else:
        restore = {"LingBotWorldVAEEncode": shipped, "LingBotWorldCamera": shipped_camera,
                   "LingBotWorldSampler": {"steps": api[SAMPLER]["inputs"]["steps"]}}
    frontend.page.evaluate(_JS_SET_WIDGETS, restore)
    shoot_thumbnail(frontend, name)


REPLAY_LOG = "LingBotWorld/play_00001_.json"  # the name the replay template ships: a first session's log


def write_play_log(server: ComfyServer, frames: int, actions: str) -> dict:
    """A Play session's action log in the server's output folder as the Play node saves it
    (beside its .mp4), its start image the tiny package's: what the replay template reads."""
    import hashlib

    from PIL import ImageOps

    image = server.input_dir / tiny_package.START_IMAGE
    with Image.open(image) as file:
        pixels = np.array(ImageOps.exif_transpose(file).convert("RGB")).astype(np.float32) / 255.0
    log = {"actions": actions, "frames": frames, "seed": 3, "shift": 10.0, "kv_window": 6, "kv_sink": 3,
           "kv_dtype": "bf16", "keyframes": "per chunk (Play)", "width": WIDTH, "height": HEIGHT,
           "vae_precision": "fp32", "fps": 16, "mode": "turn", "ended": "stop", "prompt": "a harbour at dusk",
           "negative_prompt": "", "prompt_source": "text", "vae": "lingbot/lingbot-world-base-cam-nf4/Wan2.1_VAE.pth",
           "start_image": {"file": image.name, "sha256": hashlib.sha256(image.read_bytes()).hexdigest(),
                           "pixels_sha256": hashlib.sha256(pixels.tobytes()).hexdigest()}}
    path = server.output_dir / REPLAY_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(log, indent=1))
    path.with_suffix(".mp4").write_bytes(b"")
    return log


def test_play_replay_template_runs_from_a_log_in_the_page(display: ComfyFrontend, frontend: ComfyFrontend,
                                                          comfy_server: ComfyServer) -> None:
    """The replay template in the page: its Play Log node's outputs linked into the Fast clip
    nodes' widgets (kv_dtype and precision are combo links), converted to the shipped API graph,
    queued with a session's log in the output folder: the video has the log's frames and size."""
    name = "lingbot_play_replay"
    log = write_play_log(comfy_server, FAST_FRAMES, "w-8,wj-12")
    frontend.reload()  # the Play Log node's combo lists the new log
    workflow = ui_graph(name)
    frontend.load_workflow(workflow)
    assert frontend.missing_node_types() == []
    page_prompt_matches(frontend, comfy_server, api_graph(name))
    result = comfy_server.wait(frontend.queue_current(), timeout=180)
    assert result.ok, f"{result.describe()}\n{comfy_server.log_tail()}"
    (video,) = [f for f in comfy_server.output_files(result) if f.suffix == ".mp4"]
    info = video_info(video)
    assert (info.frames, info.width, info.height) == (log["frames"], WIDTH, HEIGHT), info
    assert_nothing_covered(frontend.page.evaluate(_JS_VIEW, BADGE_HEIGHT)["nodes"])
    fit_and_shoot(frontend, artifacts_dir("browser") / f"{name}.png")
    assert not frontend.page_errors, frontend.page_errors
    shoot_thumbnail(frontend, name)


@pytest.mark.parametrize("name", SAVED_BEFORE)
def test_a_workflow_saved_before_converts_to_its_prompt_in_the_page(
        frontend: ComfyFrontend, comfy_server: ComfyServer, name: str) -> None:
    """A user's copy of a shipped workflow as it was before: the frontend loads it with
    today's node definitions and converts it to the API prompt shipped with it."""
    frontend.load_workflow(json.loads((LEGACY_DIR / "ui" / f"{SHIPPED_BEFORE[name][0]}.json").read_text()))
    assert frontend.missing_node_types() == []
    page_prompt_matches(frontend, comfy_server, json.loads((LEGACY_DIR / "api" / f"{name}.json").read_text()))
    assert not frontend.page_errors, frontend.page_errors


def shoot_thumbnail(frontend: ComfyFrontend, name: str) -> Path:
    """The template's card picture: the whole graph framed in the card's shape.

    Written to test-artifacts/browser/; LINGBOT_UPDATE_THUMBNAILS=1 also writes it next to
    the template.
    """
    left, top, right, _ = PANEL_MARGINS
    width, height = frontend.page.viewport_size["width"], frontend.page.viewport_size["height"]
    top += 20  # below the Run bar's "job completed" note
    box = (left, top, width - right, top + round((width - left - right) * THUMB_SIZE[1] / THUMB_SIZE[0]))
    pad = 20  # a little floor around the graph
    margins = [box[0] + pad, box[1] + pad, width - box[2] + pad, height - box[3] + pad]
    frontend.page.evaluate("() => document.querySelectorAll('.p-toast-message').forEach(e => e.remove())")
    frontend.page.evaluate(_JS_FRAME_GRAPH, margins)
    frontend.page.wait_for_timeout(300)  # let the canvas draw the new view
    shot = frontend.screenshot(artifacts_dir("browser") / f"thumb-{name}.png")
    with Image.open(shot) as full:
        thumb = full.convert("RGB").crop(box).resize(THUMB_SIZE, Image.Resampling.LANCZOS)
    out = artifacts_dir("browser") / f"{TEMPLATES[name]}.jpg"
    thumb.save(out, quality=88)
    if os.environ.get("LINGBOT_UPDATE_THUMBNAILS") == "1":
        shutil.copyfile(out, UI_DIR / f"{TEMPLATES[name]}.jpg")
    return out


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
