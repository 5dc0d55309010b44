"""Acceptance: "Play the world" in the real ComfyUI frontend, as a person plays it.

One session of a few chunks at the tiny geometry (CPU): the template **LingBot-World Play**
is opened (fetched and loaded by name as the Templates dialog does), Run, Step makes the
first chunk and its frames appear in the node's panel; then, with the panel focused, real
key presses (Playwright's keyboard, not synthetic events): hold W (a chunk), hold J too (a
chunk), release, Stop. A second tab, opened during the session, watches it. Checked:

- the panel: frames drawn on its canvas, the keys held lit, the state and counts;
- the second tab finds the running session, shows its frames marked view-only, buttons off;
- no shortcut of the page fired while the keys were held: no keydown reached ``window``
  (where ComfyUI's keybindings listen), the workflows sidebar (ComfyUI's W) stayed shut,
  the graph did not change. W is first shown to be a live shortcut on this page;
- the action log (the node's STRING output, in /history) holds the keys on the right
  chunks and frames; the .mp4 exists and decodes (PyAV) with every frame.

The panel's screenshot (test-artifacts/browser/play_panel.png) is the README's picture;
LINGBOT_UPDATE_DOCS_SCREENSHOT=1 also writes it to docs/play_panel.png. The template's card
picture is taken during the session, with the template's own values and the session on the
panel (LINGBOT_UPDATE_THUMBNAILS=1 writes it beside the template).
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import tiny_package
from comfy_host import PACK_NAME, ROOT, artifacts_dir
from comfy_server import ComfyServer, video_info
from frontend import ComfyFrontend
from shipped_workflows import TEMPLATES
from test_workflows_ui import shoot_thumbnail

TEMPLATE = TEMPLATES["lingbot_play"]
PLAY = "6"  # the Play node's id in the template
WIDTH, HEIGHT = 48, 32
CHUNK_BUDGET = 6
# Frames per chunk (the first is shorter) and the Play camera law's action frames of chunk c:
# 12c-4 ... 12c+7, chunk 0 from frame 0 (docs/play_protocol.md, "Timing of the keys").
FIRST_CHUNK, CHUNK = 9, 12
DOCS_SHOT = ROOT / "docs" / "play_panel.png"
MAX_DOCS_BYTES = 300 * 1024

# Readable screenshots: full-detail nodes at any zoom, no minimap or FPS box, no banner.
DISPLAY_SETTINGS = {
    "LiteGraph.Canvas.MinFontSizeForLOD": 0,
    "Comfy.Minimap.Visible": False,
    "Comfy.Graph.CanvasInfo": False,
}
DISMISS_BANNER = "localStorage.setItem('vueNodesBannerDismissed', 'true')"

PANEL = ".lingbot-play"
_JS_SIDEBAR_OPEN = """() => [...document.querySelectorAll('.sidebar-content-container')]
    .some(e => e.offsetParent !== null)"""
# Every keydown that reaches window (ComfyUI's keybinding handler listens there, bubbling).
_JS_WATCH_KEYDOWNS = """() => {
    window.__lingbotKeydowns = [];
    window.addEventListener('keydown', (e) => window.__lingbotKeydowns.push(e.key));
}"""
_JS_SET_WIDGETS = """([nodeId, values]) => {
    const node = window.app.graph.getNodeById(Number(nodeId));
    for (const [name, value] of Object.entries(values)) {
        const widget = node.widgets.find(w => w.name === name);
        if (!widget) throw new Error(`${node.type} has no widget ${name}`);
        widget.value = value;
        widget.callback?.(value, window.app.canvas, node);
    }
    window.app.graph.setDirtyCanvas(true, true);
}"""
# The graph as "Save" would write it, minus what drawing and running change (the view, the
# order of execution).
# Every frame the Play node's panel draws, by its video frame index.
_JS_RECORD_DRAWN = """(nodeId) => {
    const player = window.app.graph.getNodeById(Number(nodeId)).lingbotPlay.player;
    const onDraw = player.onDraw;
    window.__lingbotDrawn = [];
    player.onDraw = (p) => { window.__lingbotDrawn.push(p.lastFrameIndex); onDraw(p); };
}"""
_JS_GRAPH_SNAPSHOT = """() => {
    const g = window.app.graph.serialize();
    delete g.extra;
    return JSON.stringify(g.nodes.map(n => [n.id, n.type, n.pos, n.size, n.mode, n.flags, n.widgets_values]))
        + JSON.stringify(g.links) + JSON.stringify(g.groups);
}"""
_JS_CANVAS_SPREAD = """(selector) => {
    const c = document.querySelector(selector + ' canvas');
    const data = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    let sum = 0, sq = 0, n = 0;
    for (let i = 0; i < data.length; i += 4) { const v = data[i] + data[i + 1] + data[i + 2]; sum += v; sq += v * v; n++; }
    const mean = sum / n;
    return {width: c.width, height: c.height, std: Math.sqrt(sq / n - mean * mean)};
}"""


@pytest.fixture(scope="module")
def comfy_models(tmp_path_factory: pytest.TempPathFactory):
    return tiny_package.comfy_models_builder(tmp_path_factory)


@pytest.fixture(scope="module")
def display(comfy_server: ComfyServer, frontend_page: ComfyFrontend) -> ComfyFrontend:
    comfy_server.post("/settings", DISPLAY_SETTINGS).raise_for_status()
    frontend_page.page.add_init_script(DISMISS_BANNER)
    return frontend_page


def panel_data(frontend: ComfyFrontend) -> dict:
    return frontend.page.evaluate(f"() => ({{...document.querySelector('{PANEL}').dataset}})")


def wait_panel(frontend: ComfyFrontend, condition: str, what: str, timeout: float = 120) -> None:
    """Wait until ``condition`` (JS over the panel's dataset ``d``) holds on ``frontend``'s page."""
    try:
        frontend.page.wait_for_function(
            f"() => {{ const d = document.querySelector('{PANEL}')?.dataset; return !!d && ({condition}); }}",
            timeout=timeout * 1000)
    except Exception as exc:  # Playwright's TimeoutError: say what the panel showed
        raise AssertionError(f"panel never showed {what}: {panel_data(frontend)}\n"
                             f"{frontend.server.log_tail()}") from exc


def open_template(frontend: ComfyFrontend, server: ComfyServer) -> None:
    """As the Templates dialog does: the template fetched by name and loaded under it."""
    reply = server.get(f"/api/workflow_templates/{PACK_NAME}/{TEMPLATE}.json")
    assert reply.status_code == 200, reply.text
    frontend.page.evaluate(
        """async ([wf, name]) => {
            await window.app.loadGraphData(wf, true, true, name,
                {showMissingNodesDialog: false, showMissingModelsDialog: false});
            window.app.canvas.setDirty(true, true);
        }""", [reply.json(), TEMPLATE])


def per_frame_keys(actions: str) -> list[str]:
    """An action string ("none-8,w-12,wj-12") as one key set per action frame."""
    frames: list[str] = []
    for token in actions.split(","):
        keys, count = re.fullmatch(r"([a-z]+)-(\d+)", token.strip()).groups()
        frames += ["" if keys == "none" else keys] * int(count)
    return frames


# Zoom so that the panel is SHOT_WIDTH pixels wide, its top-left corner at (x, y) on screen.
_JS_ZOOM_ON_PANEL = """([nodeId, width, x, y]) => {
    const canvas = window.app.canvas;
    const node = window.app.graph.getNodeById(Number(nodeId));
    const widget = node.widgets.find(w => w.name === 'play');
    const scale = width / node.size[0];
    canvas.ds.scale = scale;
    canvas.ds.offset[0] = x / scale - node.pos[0];
    canvas.ds.offset[1] = y / scale - (node.pos[1] + widget.y);
    canvas.setDirty(true, true);
}"""
SHOT_WIDTH = 640


def shoot_panel(frontend: ComfyFrontend) -> Path:
    """The Play node's panel as the README shows it (PNG, 256 colours)."""
    shot = artifacts_dir("browser") / "play_panel.png"
    frontend.page.evaluate(_JS_ZOOM_ON_PANEL, [PLAY, SHOT_WIDTH, 90, 120])
    frontend.page.wait_for_timeout(300)  # the canvas and the DOM widget follow on the next frames
    box = frontend.page.locator(PANEL).bounding_box()
    pad = 6
    frontend.page.screenshot(path=str(shot), clip={"x": box["x"] - pad, "y": box["y"] - pad,
                                                   "width": box["width"] + 2 * pad,
                                                   "height": box["height"] + 2 * pad})
    Image.open(shot).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(shot, optimize=True)
    return shot


@pytest.fixture
def second_tab(browser, comfy_server: ComfyServer):
    """Another tab on the same server (a browser context of its own: another client id)."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.add_init_script(DISMISS_BANNER)
    try:
        yield ComfyFrontend(context.new_page(), comfy_server)
    finally:
        context.close()


def test_play_session_from_the_template_with_real_keys(display: ComfyFrontend, frontend: ComfyFrontend,
                                                        comfy_server: ComfyServer, second_tab: ComfyFrontend) -> None:
    page = frontend.page
    open_template(frontend, comfy_server)
    assert frontend.missing_node_types() == []
    wait_panel(frontend, "d.state === 'idle'", "its idle state before the run")

    # W is a live shortcut on this page (ComfyUI toggles the workflows sidebar with it), so
    # the checks below can fail: pressed with nothing focused, it opens and shuts the sidebar.
    # (Newer frontends focus the sidebar's search box: the focus is dropped before each press.)
    blur = "() => document.activeElement?.blur()"
    page.evaluate(blur)
    assert page.evaluate(_JS_SIDEBAR_OPEN) is False
    page.keyboard.press("w")
    page.wait_for_function(_JS_SIDEBAR_OPEN, timeout=10_000)
    page.evaluate(blur)
    page.keyboard.press("w")
    page.wait_for_function(f"() => !({_JS_SIDEBAR_OPEN})()", timeout=10_000)

    page.evaluate(_JS_SET_WIDGETS, [PLAY, {"width": WIDTH, "height": HEIGHT, "chunk_budget": CHUNK_BUDGET,
                                           "mode": "turn"}])
    page.evaluate(_JS_RECORD_DRAWN, PLAY)
    prompt_id = frontend.queue_current()
    wait_panel(frontend, "d.state === 'waiting' && d.role === 'controller'", "the session waiting for its controller")

    # Step: the first chunk, no keys; its frames play on the panel's canvas.
    page.click(f"{PANEL} button.lbp-step")
    wait_panel(frontend, f"d.chunks === '1' && d.state === 'waiting' && d.last === '{FIRST_CHUNK - 1}'",
               "the first chunk's frames")
    picture = page.evaluate(_JS_CANVAS_SPREAD, PANEL)
    assert (picture["width"], picture["height"]) == (WIDTH, HEIGHT) and picture["std"] > 1, picture

    # A second tab opened now finds the session and shows it, view-only.
    second_tab.open()
    open_template(second_tab, comfy_server)
    wait_panel(second_tab, "d.role === 'viewer' && d.state === 'waiting'", "the session as a viewer")
    assert "view-only" in second_tab.page.inner_text(f"{PANEL} .lbp-role")

    # The panel takes the keyboard (a click on the picture); from here on no key may reach the page.
    page.click(f"{PANEL} .lbp-screen")
    page.evaluate(_JS_WATCH_KEYDOWNS)
    graph_before = page.evaluate(_JS_GRAPH_SNAPSHOT)

    page.keyboard.down("w")  # a press: one chunk steered by W
    wait_panel(frontend, "d.chunks === '2' && d.state === 'waiting'", "the chunk steered by W")
    page.keyboard.down("j")  # J while W is held: one chunk steered by both
    wait_panel(frontend, f"d.chunks === '3' && d.state === 'waiting' && d.last === '{FIRST_CHUNK + 2 * CHUNK - 1}'",
               "the chunk steered by W and J")
    assert panel_data(frontend)["held"] == "wj"
    lit = page.evaluate(f"() => [...document.querySelectorAll('{PANEL} .lbp-cap.lbp-held')].map(c => c.dataset.key)")
    assert lit == ["w", "j"]
    assert page.evaluate("() => window.__lingbotKeydowns") == []
    assert page.evaluate(_JS_SIDEBAR_OPEN) is False
    assert page.evaluate(_JS_GRAPH_SNAPSHOT) == graph_before
    shot = shoot_panel(frontend)
    wait_panel(second_tab, f"d.chunks === '3' && d.last === '{FIRST_CHUNK + 2 * CHUNK - 1}'", "the frames, in the viewer")
    assert second_tab.page.evaluate(f"() => [...document.querySelectorAll('{PANEL} button')].every(b => b.disabled)")

    # The card's picture: the template's own values, the session on the panel, nothing selected.
    shipped = json.loads((ROOT / "workflows" / "api" / "lingbot_play.json").read_text())[PLAY]["inputs"]
    page.evaluate(_JS_SET_WIDGETS, [PLAY, {k: shipped[k] for k in ("width", "height", "chunk_budget", "mode")}])
    page.evaluate("() => window.app.canvas.deselectAll()")
    shoot_thumbnail(frontend, "lingbot_play")

    page.keyboard.up("j")
    page.keyboard.up("w")
    assert page.evaluate("() => window.__lingbotKeydowns") == []
    page.click(f"{PANEL} button.lbp-stop")
    result = comfy_server.wait(prompt_id, timeout=120)
    assert result.ok, f"{result.describe()}\n{comfy_server.log_tail()}"
    wait_panel(frontend, "d.state === 'ended'", "the session's end", timeout=20)
    assert "ended: stop" in page.inner_text(f"{PANEL} .lbp-state").lower()

    # The action log: the node's STRING output, as /history holds it.
    log = json.loads(result.outputs[PLAY]["text"][0])
    frames = FIRST_CHUNK + 2 * CHUNK
    assert (log["chunks"], log["frames"], log["ended"]) == (3, frames, "stop"), log
    assert log["chunk_keys"] == ["", "w", "wj"], log
    keys = per_frame_keys(log["actions"])
    assert len(keys) == frames - 1, log["actions"]
    chunk_of_frame = [0] * (FIRST_CHUNK - 1) + [1] * CHUNK + [2] * CHUNK
    assert keys == [log["chunk_keys"][c] for c in chunk_of_frame], log["actions"]

    (video,) = [f for f in comfy_server.output_files(result) if f.suffix == ".mp4"]
    info = video_info(video)
    assert (info.frames, info.width, info.height) == (frames, WIDTH, HEIGHT), info
    # Each chunk came in parts (one per latent frame): the panel drew the frames in video
    # order, every one of them but those skipped to catch up, the last one last.
    drawn = page.evaluate("() => window.__lingbotDrawn")
    dropped = page.evaluate(f"() => window.app.graph.getNodeById({PLAY}).lingbotPlay.player.dropped")
    assert drawn == sorted(set(drawn)) and drawn[-1] == frames - 1 and len(drawn) + dropped == frames, drawn
    wait_panel(second_tab, "d.state === 'ended'", "the session's end, in the viewer", timeout=20)
    assert not frontend.page_errors and not second_tab.page_errors, (frontend.page_errors, second_tab.page_errors)

    if os.environ.get("LINGBOT_UPDATE_DOCS_SCREENSHOT") == "1":
        shutil.copyfile(shot, DOCS_SHOT)
    assert DOCS_SHOT.is_file(), f"run with LINGBOT_UPDATE_DOCS_SCREENSHOT=1 to create {DOCS_SHOT}"
    assert DOCS_SHOT.stat().st_size < MAX_DOCS_BYTES
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=np.float32)
    assert pixels.std() > 5, "the panel's screenshot is blank"


_JS_NODE_BOX = """(nodeId) => {
    const node = window.app.graph.getNodeById(Number(nodeId));
    return {size: [...node.size], widgets: node.widgets.map(w => w.name)};
}"""
_JS_LINK_CLIPPED = f"""() => {{
    const a = document.querySelector('{PANEL} .lbp-video');
    const panel = document.querySelector('{PANEL}').getBoundingClientRect();
    const box = a.getBoundingClientRect();
    return {{text: a.textContent, clipped: a.scrollWidth > a.clientWidth + 1 || box.right > panel.right + 1}};
}}"""


def chunks_now(frontend: ComfyFrontend) -> int:
    return int(panel_data(frontend)["chunks"])


def test_play_in_continuous_mode_keeps_the_keys_through_continue_and_pause(display: ComfyFrontend,
                                                                           frontend: ComfyFrontend,
                                                                           comfy_server: ComfyServer) -> None:
    """Issue 27: after a click on Continue or Pause the buttons disabled themselves, the focus
    fell to the page and held keys went to ComfyUI (W opened the Workflows sidebar), the chunk
    ran as none. Here: Continue, then keys held; Pause, Continue, keys again; none reach the
    page, the chunks carry them; after the session the node keeps its size and the panel shows
    the file's whole name."""
    page = frontend.page
    open_template(frontend, comfy_server)
    wait_panel(frontend, "d.state === 'idle'", "its idle state before the run")
    page.evaluate(_JS_SET_WIDGETS, [PLAY, {"width": WIDTH, "height": HEIGHT, "chunk_budget": 40, "mode": "turn"}])
    size_before = page.evaluate(_JS_NODE_BOX, PLAY)["size"]
    prompt_id = frontend.queue_current()
    wait_panel(frontend, "d.state === 'waiting' && d.role === 'controller'", "the session waiting for its controller")
    page.evaluate(_JS_WATCH_KEYDOWNS)

    page.click(f"{PANEL} button.lbp-continue")  # the button disables itself once the session runs
    wait_panel(frontend, "d.state === 'running'", "the session running after Continue")
    assert page.evaluate(f"() => document.querySelector('{PANEL}').contains(document.activeElement)")
    start = chunks_now(frontend)
    page.keyboard.down("d")
    wait_panel(frontend, f"Number(d.chunks) >= {start + 2}", "two chunks with D held")
    page.keyboard.up("d")

    page.click(f"{PANEL} button.lbp-pause")
    wait_panel(frontend, "d.state === 'paused'", "the session paused")
    page.click(f"{PANEL} button.lbp-continue")
    wait_panel(frontend, "d.state === 'running'", "the session running again")
    start = chunks_now(frontend)
    page.keyboard.down("j")
    wait_panel(frontend, f"Number(d.chunks) >= {start + 2}", "two chunks with J held")
    page.keyboard.up("j")

    assert page.evaluate("() => window.__lingbotKeydowns") == []
    assert page.evaluate(_JS_SIDEBAR_OPEN) is False
    page.click(f"{PANEL} button.lbp-stop")
    result = comfy_server.wait(prompt_id, timeout=180)
    assert result.ok, f"{result.describe()}\n{comfy_server.log_tail()}"
    wait_panel(frontend, "d.state === 'ended'", "the session's end", timeout=30)
    log = json.loads(result.outputs[PLAY]["text"][0])
    assert "d" in log["chunk_keys"] and "j" in log["chunk_keys"], log["chunk_keys"]
    assert log["mode"] == "turn" and log["ended"] == "stop"
    # The log is the whole recipe: the template's prompt texts and its start image by name and hash.
    api = json.loads((ROOT / "workflows" / "api" / "lingbot_play.json").read_text())
    t5 = next(n["inputs"] for n in api.values() if n["class_type"] == "LingBotWorldTextEncode")
    assert (log["prompt"], log["negative_prompt"]) == (t5["prompt"], t5["negative_prompt"])
    assert log["start_image"]["file"] == tiny_package.START_IMAGE and len(log["start_image"]["sha256"]) == 64

    # The node stays the size it was: no player added under the panel; the file's name shows whole.
    page.wait_for_timeout(500)  # the frontend handles the executed message on its next frames
    after = page.evaluate(_JS_NODE_BOX, PLAY)
    assert after["size"][1] <= size_before[1] + 1 and after["size"][0] <= size_before[0] + 1, (size_before, after)
    link = page.evaluate(_JS_LINK_CLIPPED)
    assert link["text"].startswith("video: ") and not link["clipped"], link
    frontend.screenshot(artifacts_dir("browser") / "play_after_session.png")


# The Play node's box on screen and the boxes of what it must hold (screen pixels): with Nodes
# 2.0 the node is a DOM element of its own; on the classic canvas its box is node.pos/size (the
# title bar above pos) through the canvas' transform. Every <video> on the page is listed: in
# this graph only the Play node has a video output, so a player the frontend adds for it is one.
_JS_PLAY_LAYOUT = f"""(nodeId) => {{
    const canvas = window.app.canvas;
    const node = window.app.graph.getNodeById(Number(nodeId));
    const box = (e) => {{ const r = e.getBoundingClientRect();
        return {{left: r.left, top: r.top, right: r.right, bottom: r.bottom}}; }};
    const element = document.querySelector(`[data-node-id="${{nodeId}}"]`);
    let nodeBox;
    if (element) nodeBox = box(element);
    else {{
        const c = canvas.canvas.getBoundingClientRect();
        const [x0, y0] = canvas.ds.convertOffsetToCanvas([node.pos[0], node.pos[1] - window.LiteGraph.NODE_TITLE_HEIGHT]);
        const [x1, y1] = canvas.ds.convertOffsetToCanvas([node.pos[0] + node.size[0], node.pos[1] + node.size[1]]);
        nodeBox = {{left: c.left + x0, top: c.top + y0, right: c.left + x1, bottom: c.top + y1}};
    }}
    const panel = document.querySelector('{PANEL}');
    const part = (s) => panel.querySelector(s);
    // What a person sees at a line's middle: the line itself, or what covers it.
    const seen = (e) => {{ const b = box(e); const hit = document.elementFromPoint(
        (b.left + Math.min(b.right, b.left + 40)) / 2, (b.top + b.bottom) / 2);
        return !!hit && e.contains(hit); }};
    return {{
        vue: !!element, node: nodeBox, size: [...node.size],
        parts: {{panel: box(panel), top: box(part('.lbp-top')), screen: box(part('.lbp-screen')),
                 buttons: box(part('.lbp-buttons')), info: box(part('.lbp-info')), link: box(part('.lbp-video'))}},
        videos: [...document.querySelectorAll('video')].filter(v => v.offsetParent !== null).map(box),
        // The frontend's own preview of the node's output: a widget of the classic canvas, or
        // a picture or player of Nodes 2.0 in the node's element, outside the panel.
        previews: element
            ? [...element.querySelectorAll('img, video, .image-preview')].filter(e => !panel.contains(e))
                .map(e => e.className || e.tagName)
            : node.widgets.filter(w => /preview/i.test(w.name)).map(w => w.name),
        overflow: panel.scrollHeight - panel.clientHeight,
        seen: {{top: seen(part('.lbp-state')), link: seen(part('.lbp-video'))}},
        link: part('.lbp-video').textContent,
    }};
}}"""


# The Play node at ``scale``, its top-left corner at (x, y) on screen; toasts (Nodes 2.0's
# "Prefer the legacy design?") removed so that nothing covers the node.
_JS_FRAME_NODE = """([nodeId, scale, x, y]) => {
    document.querySelectorAll('.p-toast-message').forEach(e => e.remove());
    const canvas = window.app.canvas;
    const node = window.app.graph.getNodeById(Number(nodeId));
    canvas.ds.scale = scale;
    canvas.ds.offset[0] = x / scale - node.pos[0];
    canvas.ds.offset[1] = y / scale - node.pos[1];
    canvas.setDirty(true, true);
}"""


def outside(inner: dict, outer: dict, slack: float = 1.0) -> bool:
    return (inner["left"] < outer["left"] - slack or inner["top"] < outer["top"] - slack
            or inner["right"] > outer["right"] + slack or inner["bottom"] > outer["bottom"] + slack)


@pytest.mark.parametrize("nodes_2", [False, True], ids=["classic", "nodes_2"])
def test_play_node_holds_its_panel_and_video_after_a_session(display: ComfyFrontend, frontend: ComfyFrontend,
                                                            comfy_server: ComfyServer, nodes_2: bool) -> None:
    """Issue 27: after a session the Play node grew past the window (a video player under the
    panel, the file name half hidden, the panel's top line clipped). A one-chunk session, then
    Stop: the node's box on screen holds the panel, its top line, picture, buttons and file
    name line, and any video player of the node; nothing overflows the panel and its top line
    and file name are not covered. On the classic canvas and with Nodes 2.0 (the frontend's
    DOM nodes, ComfyUI's "Modern Node Design")."""
    page = frontend.page
    page.evaluate("(on) => window.app.extensionManager.setting.set('Comfy.VueNodes.Enabled', on)", nodes_2)
    try:
        open_template(frontend, comfy_server)
        wait_panel(frontend, "d.state === 'idle'", "its idle state before the run")
        page.evaluate(_JS_SET_WIDGETS, [PLAY, {"width": WIDTH, "height": HEIGHT, "chunk_budget": 4, "mode": "turn"}])
        page.evaluate("() => window.app.canvas.deselectAll()")
        page.evaluate(_JS_FRAME_NODE, [PLAY, 0.5, 120, 120])
        page.wait_for_timeout(500)  # Nodes 2.0 lays the DOM nodes out on the next frames
        before = page.evaluate(_JS_PLAY_LAYOUT, PLAY)
        assert before["vue"] == nodes_2, before
        prompt_id = frontend.queue_current()
        wait_panel(frontend, "d.state === 'waiting' && d.role === 'controller'", "the session waiting for its controller")
        page.click(f"{PANEL} button.lbp-step")
        wait_panel(frontend, f"d.chunks === '1' && d.state === 'waiting' && d.last === '{FIRST_CHUNK - 1}'",
                   "the first chunk's frames")
        page.click(f"{PANEL} button.lbp-stop")
        result = comfy_server.wait(prompt_id, timeout=120)
        assert result.ok, f"{result.describe()}\n{comfy_server.log_tail()}"
        wait_panel(frontend, "d.state === 'ended'", "the session's end", timeout=30)
        page.wait_for_timeout(1000)  # the frontend handles the executed message (its output preview) on its next frames
        page.evaluate(_JS_FRAME_NODE, [PLAY, 0.5, 120, 120])
        page.wait_for_timeout(300)
        after = page.evaluate(_JS_PLAY_LAYOUT, PLAY)
        frontend.screenshot(artifacts_dir("browser") / f"play_node_after_session-{'nodes2' if nodes_2 else 'classic'}.png")
    finally:
        page.evaluate("() => window.app.extensionManager.setting.set('Comfy.VueNodes.Enabled', false)")

    assert after["link"].startswith("video: "), after
    assert after["previews"] == [], f"a player or picture of the frontend's in the Play node: {after['previews']}"
    spilled = {name: b for name, b in after["parts"].items() if outside(b, after["node"])}
    spilled.update({f"video {i}": b for i, b in enumerate(after["videos"]) if outside(b, after["node"])})
    assert not spilled, f"outside the Play node {after['node']}: {spilled}"
    assert after["overflow"] <= 1, f"the panel's content is {after['overflow']} px taller than the panel"
    assert outside(after["parts"]["top"], after["parts"]["panel"]) is False, after["parts"]
    assert after["seen"] == {"top": True, "link": True}, after
    # The node keeps the size it had (it does not grow past the window).
    height = lambda b: b["bottom"] - b["top"]  # noqa: E731
    assert height(after["node"]) <= height(before["node"]) + 2, (before["node"], after["node"])
