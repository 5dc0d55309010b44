"""The Play panel's modules (web/js/play/) in headless Chromium, without ComfyUI.

A plain static server serves web/ beside a page that imports the modules as the frontend
would; the tests drive them with real keyboard and mouse events (Playwright) and a fake
clock for the frame player. The page counts every keydown that reaches ``window``, which
is where ComfyUI's keybinding handler listens: a play key must never get there.

- keys.js: play keys by physical position, the held set's order, the sender's order
- panel.js: focus gives the keys to the session, Escape / a click elsewhere / the window
  losing focus releases them (the server is sent ""), other plain keys stay in the panel,
  the buttons follow the state, a viewer gets no keys and no buttons
- frame_player.js: frames drawn one per 1/fps, not all at once; behind, the latest chunk;
  a chunk arriving in parts (one per latent frame) plays in video order on one beat
"""
from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path
from typing import Iterator

import pytest

from comfy_host import ROOT

HARNESS = """<!doctype html>
<html><head><meta charset="utf-8"></head><body>
<div id="host" style="width: 480px; height: 360px"></div>
<button id="elsewhere">elsewhere</button>
<script type="module">
import * as keys from "./web/js/play/keys.js";
import { FramePlayer } from "./web/js/play/frame_player.js";
import { PlayPanel } from "./web/js/play/panel.js";
window.play = { ...keys, FramePlayer, PlayPanel };
// What ComfyUI's keybinding handler (a bubbling keydown listener on window) would see.
window.shortcuts = [];
window.addEventListener("keydown", (e) => window.shortcuts.push(e.key));
// JPEG frames of flat colours, base64 as the server sends them.
window.jpegFrames = (n, w = 32, h = 16) => {
    const c = document.createElement("canvas");
    c.width = w; c.height = h;
    const g = c.getContext("2d");
    return Array.from({length: n}, (_, i) => {
        g.fillStyle = `rgb(${(i * 40) % 256}, ${255 - (i * 20) % 256}, 90)`;
        g.fillRect(0, 0, w, h);
        return c.toDataURL("image/jpeg", 0.9).split(",")[1];
    });
};
window.harnessReady = true;
</script>
</body></html>
"""

# A panel on the page whose calls to the server are recorded instead of sent.
_JS_NEW_PANEL = """(controller) => {
    document.getElementById("host").replaceChildren();
    window.sent = [];
    window.controls = [];
    const panel = new window.play.PlayPanel({
        onKeys: (k) => window.sent.push(k),
        onControl: (a) => window.controls.push(a),
    });
    document.getElementById("host").append(panel.element);
    panel.startSession({sessionId: "abc", controller, mode: "turn", fps: 16, width: 32, height: 16});
    panel.showState({state: "waiting", chunks_done: 0, frames_done: 0});
    window.panel = panel;
    window.shortcuts.length = 0;
}"""


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def harness_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("play_harness")
    (folder / "index.html").write_text(HARNESS)
    (folder / "web").symlink_to(ROOT / "web", target_is_directory=True)
    handler = functools.partial(_Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/index.html"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def page(browser, harness_url: str):
    context = browser.new_context(viewport={"width": 800, "height": 600})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.goto(harness_url)
    page.wait_for_function("() => window.harnessReady === true", timeout=20_000)
    yield page
    context.close()
    assert errors == [], errors


def root_data(page) -> dict:
    return page.evaluate("() => ({...window.panel.element.dataset})")


# ----- keys.js -----------------------------------------------------------------------------

def test_play_keys_are_read_by_position_and_written_in_protocol_order(page) -> None:
    result = page.evaluate("""() => {
        const {playKeyOf, HeldKeys} = window.play;
        const of = (init) => playKeyOf(new KeyboardEvent("keydown", init));
        const held = new HeldKeys();
        const changes = ["l", "w", "j", "w", "x"].map((k) => held.press(k));
        return {
            byCode: of({code: "KeyW", key: "z"}),       // W's place on an AZERTY keyboard
            byKey: of({key: "J"}),                       // no code: the letter, any case
            notPlay: of({code: "KeyR", key: "r"}),
            withCtrl: of({code: "KeyS", key: "s", ctrlKey: true}),
            arrow: of({code: "ArrowUp", key: "ArrowUp"}),
            changes, value: held.value,
            releaseMissing: held.release("a"), afterRelease: (held.release("w"), held.value),
            cleared: held.clear(), empty: held.value, clearedAgain: held.clear(),
        };
    }""")
    assert result == {"byCode": "w", "byKey": "j", "notPlay": None, "withCtrl": None, "arrow": None,
                      "changes": [True, True, True, False, False], "value": "wjl",
                      "releaseMissing": False, "afterRelease": "jl",
                      "cleared": True, "empty": "", "clearedAgain": False}


def test_key_sender_posts_every_state_in_order_one_at_a_time(page) -> None:
    result = page.evaluate("""async () => {
        const {KeySender} = window.play;
        const posted = [], results = [];
        let inFlight = 0, most = 0;
        const post = async (keys) => {
            inFlight += 1; most = Math.max(most, inFlight);
            await new Promise((r) => setTimeout(r, 5 + Math.random() * 15));
            inFlight -= 1;
            posted.push(keys);
            return keys === "x" ? {ok: false, status: 400, message: "unknown key x"} : {ok: true, status: 200};
        };
        const sender = new KeySender(post, {onResult: (k, r) => results.push([k, r.status])});
        for (const keys of ["w", "", "w", "wj", "x", "j", ""]) sender.send(keys);
        await sender.idle();
        // Far behind: the waiting states collapse to the newest.
        const slow = [];
        const slowPost = async (k) => {
            slow.push(k);
            await new Promise((r) => setTimeout(r, 30));
            return {ok: true};
        };
        const jammed = new KeySender(slowPost, {maxWaiting: 3});
        for (const keys of ["w", "a", "s", "d", "i", "j"]) jammed.send(keys);
        await jammed.idle();
        return {posted, results, most, slow};
    }""")
    assert result["posted"] == ["w", "", "w", "wj", "x", "j", ""]
    assert result["results"][4] == ["x", 400]
    assert result["most"] == 1
    assert result["slow"][0] == "w" and result["slow"][-1] == "j" and len(result["slow"]) < 6, result["slow"]


# ----- panel.js ----------------------------------------------------------------------------

def test_focused_panel_takes_play_keys_and_no_shortcut_fires(page) -> None:
    page.evaluate(_JS_NEW_PANEL, True)
    assert root_data(page)["role"] == "controller"
    page.keyboard.down("w")  # not focused yet: the page's shortcuts get it, the session does not
    page.keyboard.up("w")
    assert page.evaluate("() => window.shortcuts") == ["w"] and page.evaluate("() => window.sent") == []

    page.evaluate("() => window.shortcuts.length = 0")
    page.click(".lingbot-play button.lbp-play")  # the Play button gives the keyboard to the panel
    assert page.evaluate("() => window.panel.capturing") is True
    page.keyboard.down("w")
    page.keyboard.down("w")  # auto-repeat of a held key changes nothing
    page.keyboard.down("j")
    assert root_data(page)["held"] == "wj"
    caps = page.evaluate("() => [...document.querySelectorAll('.lbp-cap.lbp-held')].map(c => c.dataset.key)")
    assert caps == ["w", "j"]
    page.keyboard.press("r")  # another single-key shortcut (reload node definitions) stays in too
    page.keyboard.up("w")
    page.keyboard.up("j")
    assert page.evaluate("() => window.sent") == ["w", "wj", "j", ""]
    assert page.evaluate("() => window.shortcuts") == []


@pytest.mark.parametrize("how", ["escape", "click elsewhere", "window blur"])
def test_leaving_the_panel_releases_every_key(page, how: str) -> None:
    page.evaluate(_JS_NEW_PANEL, True)
    page.click(".lingbot-play .lbp-screen")  # a click on the picture gives it the keyboard too
    page.keyboard.down("a")
    page.keyboard.down("i")
    if how == "escape":
        page.keyboard.press("Escape")
    elif how == "click elsewhere":
        page.click("#elsewhere")
    else:
        page.evaluate("() => window.dispatchEvent(new Event('blur'))")
    assert page.evaluate("() => window.sent") == ["a", "ai", ""]
    assert page.evaluate("() => window.panel.capturing") is False
    assert root_data(page)["held"] == ""
    page.keyboard.up("a")  # the real keys come up later: nothing more is sent
    page.keyboard.up("i")
    page.keyboard.down("d")
    assert page.evaluate("() => window.sent") == ["a", "ai", ""]
    page.keyboard.up("d")


def test_buttons_follow_the_state_and_send_their_action(page) -> None:
    page.evaluate(_JS_NEW_PANEL, True)

    def enabled() -> dict:
        return page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('.lingbot-play button')]
            .map(b => [b.dataset.action, !b.disabled]))""")

    def primary() -> list:
        return page.evaluate(
            "() => [...document.querySelectorAll('.lingbot-play button.lbp-primary')].map(b => b.dataset.action)")

    assert enabled() == {"play": True, "pause": False, "step": True, "continue": True, "stop": True}
    assert primary() == ["step"]  # turn-based: one chunk per step
    page.click(".lingbot-play button.lbp-step")
    page.evaluate("() => window.panel.showState({state: 'running', chunks_done: 0, frames_done: 0})")
    assert enabled() == {"play": True, "pause": True, "step": False, "continue": False, "stop": True}
    page.evaluate("() => window.panel.showState({state: 'waiting', chunks_done: 1, frames_done: 9})")
    page.click(".lingbot-play button.lbp-continue")
    page.evaluate("() => window.panel.showState({state: 'running', chunks_done: 1, frames_done: 9})")
    page.click(".lingbot-play button.lbp-pause")
    page.evaluate("() => window.panel.showState({state: 'paused', chunks_done: 2, frames_done: 21})")
    page.click(".lingbot-play button.lbp-stop")
    assert page.evaluate("() => window.controls") == ["step", "continue", "pause", "stop"]
    page.evaluate("""() => window.panel.showState({state: 'ended', reason: 'stop', chunks_done: 2, frames_done: 21,
        video: {filename: 'play_00001.mp4', subfolder: '', type: 'output'}}, '/view?filename=play_00001.mp4')""")
    assert enabled() == {"play": False, "pause": False, "step": False, "continue": False, "stop": False}
    text = page.inner_text(".lingbot-play")
    assert "ended: stop" in text.lower() and "chunk 2 · 21 frames" in text and "play_00001.mp4" in text


def test_a_viewer_gets_no_keys_and_no_buttons(page) -> None:
    page.evaluate(_JS_NEW_PANEL, False)
    assert root_data(page)["role"] == "viewer"
    assert "view-only" in page.inner_text(".lingbot-play .lbp-role")
    assert page.evaluate("() => [...document.querySelectorAll('.lingbot-play button')].every(b => b.disabled)")
    page.click(".lingbot-play .lbp-screen")
    page.keyboard.down("w")
    page.keyboard.up("w")
    assert page.evaluate("() => window.sent") == []
    # Issue 27: the keys are the controlling tab's; here they are swallowed, not the page's
    # shortcuts (A opened the Media Assets sidebar), and the panel says where they go.
    assert page.evaluate("() => window.shortcuts") == []
    assert "tab that runs it" in page.inner_text(".lingbot-play .lbp-overlay")
    page.keyboard.press("r")  # not a play key: the page's own
    assert page.evaluate("() => window.shortcuts") == ["r"]
    # The caps show the keys that steered the chunk on screen.
    page.evaluate("() => window.panel.showFrames({chunk: 0, first_frame: 0, frames: window.jpegFrames(2), keys: 'sk'})")
    caps = page.evaluate("() => [...document.querySelectorAll('.lbp-cap.lbp-held')].map(c => c.dataset.key)")
    assert caps == ["s", "k"]


def test_a_viewer_shows_no_lit_key_once_the_session_ends(page) -> None:
    page.evaluate(_JS_NEW_PANEL, False)
    page.evaluate("() => window.panel.showFrames({chunk: 0, first_frame: 0, frames: window.jpegFrames(2), keys: 'wj'})")
    assert root_data(page)["held"] == ""  # a viewer holds nothing; the caps show the session's keys
    page.evaluate("() => window.panel.showState({state: 'ended', reason: 'stop', chunks_done: 1, frames_done: 9})")
    caps = page.evaluate("() => [...document.querySelectorAll('.lbp-cap.lbp-held')].map(c => c.dataset.key)")
    assert caps == []
    page.keyboard.press("w")  # the session is over: the page's shortcuts are back
    assert page.evaluate("() => window.shortcuts") == ["w"]


def _focus_in_panel(page) -> bool:
    return page.evaluate("() => window.panel.element.contains(document.activeElement)")


@pytest.mark.parametrize("sequence", ["continue", "pause-continue", "step"])
def test_a_button_that_disables_itself_keeps_the_keyboard_in_the_panel(page, sequence: str) -> None:
    """Continue and Pause disable themselves once the session answers; the keyboard must stay
    in the panel (it fell to the page: held W opened ComfyUI's Workflows sidebar)."""
    page.evaluate(_JS_NEW_PANEL, True)
    states = {"continue": "running", "pause": "paused", "step": "running"}
    clicks = {"continue": ["continue"], "pause-continue": ["continue", "pause", "continue"], "step": ["step"]}[sequence]
    for action in clicks:
        page.click(f".lingbot-play button.lbp-{action}")
        page.evaluate(f"() => window.panel.showState({{state: '{states[action]}', chunks_done: 1, frames_done: 9}})")
        assert page.evaluate(f"() => document.querySelector('.lingbot-play button.lbp-{action}').disabled")
        assert _focus_in_panel(page), f"after {action}: focus on {page.evaluate('() => document.activeElement.tagName')}"
        assert page.evaluate("() => window.panel.capturing") is True
        page.keyboard.down("w")
        page.keyboard.up("w")
    assert page.evaluate("() => window.shortcuts") == []
    assert page.evaluate("() => window.sent") == ["w", ""] * len(clicks)
    assert root_data(page)["keyboard"] == "session"
    assert page.inner_text(".lingbot-play .lbp-keyboard") == "keys: session"


def test_the_panel_gives_the_keyboard_back_visibly_when_the_session_ends(page) -> None:
    page.evaluate(_JS_NEW_PANEL, True)
    page.click(".lingbot-play .lbp-screen")
    assert page.inner_text(".lingbot-play .lbp-keyboard") == "keys: session"
    page.evaluate("() => window.panel.showState({state: 'ended', reason: 'budget', chunks_done: 2, frames_done: 21})")
    assert not _focus_in_panel(page)
    assert page.inner_text(".lingbot-play .lbp-keyboard") == "keys: ComfyUI"
    assert root_data(page)["keyboard"] == "page"
    page.keyboard.press("w")
    assert page.evaluate("() => window.shortcuts") == ["w"] and page.evaluate("() => window.sent") == []


def test_a_late_reply_to_stop_does_not_bring_an_ended_session_back(page) -> None:
    """The reply to Stop holds the state of its moment ("waiting"); when it arrives after the
    "ended" event the panel stayed "waiting" for good (the browser test's end-of-session race)."""
    page.evaluate(_JS_NEW_PANEL, True)
    page.click(".lingbot-play button.lbp-stop")
    page.evaluate("() => window.panel.showState({state: 'ended', reason: 'stop', chunks_done: 3, frames_done: 33})")
    page.evaluate("() => window.panel.showState({state: 'waiting'})")  # the reply, late
    assert root_data(page)["state"] == "ended"
    assert "ended: stop" in page.inner_text(".lingbot-play .lbp-state").lower()
    # A new session on the same panel starts afresh.
    page.evaluate("() => window.panel.startSession({sessionId: 'def', controller: true, mode: 'turn', fps: 16})")
    assert root_data(page)["state"] == "waiting"


# ----- frame_player.js ---------------------------------------------------------------------

_JS_PLAYER = """async ({chunks, steps, fps}) => {
    // A canvas, a fake clock and a hand-cranked paint loop: each tick() is one paint.
    const canvas = document.createElement("canvas");
    let now = 0, pending = [];
    const player = new window.play.FramePlayer(canvas, {fps, now: () => now, schedule: (cb) => pending.push(cb)});
    let first = 0;
    for (const n of chunks) {
        const frames = window.jpegFrames(n);
        player.push(frames, first);
        first += n;
    }
    // Let every queued image decode before the clock moves.
    await Promise.all(player._queue.map((img) => img.decode()));
    const shownAt = [];
    for (let i = 0; i < steps; i++) {
        const run = pending; pending = [];
        run.forEach((cb) => cb());
        shownAt.push(player.shown);
        now += 1000 / fps / 2;  // two paints per frame period
    }
    const pixel = [...canvas.getContext("2d").getImageData(5, 5, 1, 1).data];
    return {shownAt, shown: player.shown, dropped: player.dropped, last: player.lastFrameIndex,
            size: [canvas.width, canvas.height], pixel, waiting: player.waiting};
}"""


def test_frames_are_drawn_one_per_frame_period(page) -> None:
    out = page.evaluate(_JS_PLAYER, {"chunks": [9], "steps": 24, "fps": 16})
    # Two paints per period: a new frame every other paint, never the chunk at once.
    assert out["shownAt"][:6] == [1, 1, 2, 2, 3, 3], out["shownAt"]
    assert out["shown"] == 9 and out["dropped"] == 0 and out["last"] == 8 and out["waiting"] == 0
    assert out["size"] == [32, 16] and out["pixel"][3] == 255 and max(out["pixel"][:3]) > 50


def test_a_player_behind_skips_to_the_latest_chunk(page) -> None:
    out = page.evaluate(_JS_PLAYER, {"chunks": [9, 12, 12], "steps": 40, "fps": 16})
    assert out["dropped"] == 21 and out["shown"] == 12 and out["last"] == 9 + 12 + 11


# A chunk in parts, as the server sends it (one part per latent frame: 1 + 4 + 4 frames for
# the first chunk, 4 + 4 + 4 after). ``parts``: [paint, first, n, chunkFrames], pushed just
# before that paint; every frame drawn is recorded.
_JS_PLAYER_PARTS = """async ({parts, steps, fps}) => {
    const canvas = document.createElement("canvas");
    let now = 0, pending = [];
    const drawn = [], shownAt = [];
    const player = new window.play.FramePlayer(canvas, {fps, now: () => now, schedule: (cb) => pending.push(cb),
                                                        onDraw: (p) => drawn.push(p.lastFrameIndex)});
    for (let i = 0; i < steps; i++) {
        const due = parts.filter((part) => part[0] === i);
        for (const [, first, n, chunkFrames] of due) player.push(window.jpegFrames(n), first, chunkFrames);
        if (due.length) await Promise.all(player._queue.map((img) => img.decode()));
        const run = pending; pending = [];
        run.forEach((cb) => cb());
        shownAt.push(player.shown);
        now += 1000 / fps / 2;  // two paints per frame period
    }
    return {drawn, shownAt, dropped: player.dropped, waiting: player.waiting};
}"""


def test_parts_of_chunks_play_in_order_on_one_beat(page) -> None:
    # Each part arrives while the frames before it still play (as a decode of ~0.1 s per
    # latent frame does against 4 frames of 62.5 ms): no frame waits, none is dropped.
    parts = [[0, 0, 1, 9], [1, 1, 4, 9], [4, 5, 4, 9], [12, 9, 4, 12], [16, 13, 4, 12], [20, 17, 4, 12]]
    out = page.evaluate(_JS_PLAYER_PARTS, {"parts": parts, "steps": 44, "fps": 16})
    assert out["drawn"] == list(range(21)) and out["dropped"] == 0 and out["waiting"] == 0
    assert out["shownAt"][::2][:21] == list(range(1, 22)), out["shownAt"]  # a new frame every period


def test_parts_arriving_out_of_order_play_in_video_order_and_never_jump_back(page) -> None:
    parts = [[0, 0, 1, 9], [0, 5, 4, 9], [0, 1, 4, 9], [30, 2, 1, 9]]  # the last: a frame long shown
    out = page.evaluate(_JS_PLAYER_PARTS, {"parts": parts, "steps": 40, "fps": 16})
    assert out["drawn"] == list(range(9)) and out["dropped"] == 1


def test_a_player_behind_skips_to_the_latest_chunk_sent_in_parts(page) -> None:
    # Three chunks in parts at once: as when each came whole, only the newest plays, all of it.
    parts = [[0, 0, 1, 9], [0, 1, 4, 9], [0, 5, 4, 9]] + [[0, f, 4, 12] for f in range(9, 33, 4)]
    out = page.evaluate(_JS_PLAYER_PARTS, {"parts": parts, "steps": 40, "fps": 16})
    assert out["drawn"] == list(range(21, 33)) and out["dropped"] == 21


# ----- what the node is doing before its session starts ----------------------------------

_JS_FRESH_PANEL = """() => {
    document.getElementById("host").replaceChildren();
    const panel = new window.play.PlayPanel({});
    document.getElementById("host").append(panel.element);
    window.panel = panel;
}"""


def test_the_panel_shows_what_the_node_does_before_the_session_starts(page) -> None:
    """The panel read "IDLE — Run the workflow to start a session" for the whole start (380 s
    on a CPU) while the node loaded the model and encoded the image."""
    page.evaluate(_JS_FRESH_PANEL)
    assert root_data(page)["state"] == "idle"
    for step in ("loading the model", "encoding the image", "warming up"):
        page.evaluate(f"() => window.panel.showStarting('{step}')")
        assert root_data(page)["state"] == "starting"
        assert page.text_content(".lingbot-play .lbp-state") == f"starting: {step}"  # shown in capitals
        assert step in page.inner_text(".lingbot-play .lbp-overlay")
        assert "Run the workflow" not in page.inner_text(".lingbot-play .lbp-overlay")
    page.evaluate("() => window.panel.startSession({sessionId: 'abc', controller: true, width: 32, height: 16})")
    assert root_data(page)["state"] == "waiting" and root_data(page)["role"] == "controller"
    # a late step of this start, or a failure notice, does not take the live session back
    page.evaluate("() => window.panel.showStarting('warming up')")
    page.evaluate("() => window.panel.showStarting(null, 'out of memory')")
    assert root_data(page)["state"] == "waiting"


def test_a_start_that_fails_goes_back_to_idle_with_the_nodes_error(page) -> None:
    page.evaluate(_JS_FRESH_PANEL)
    page.evaluate("() => window.panel.showStarting('loading the model')")
    page.evaluate("() => window.panel.showStarting(null, 'CUDA out of memory while loading the transformer')")
    assert root_data(page)["state"] == "idle"
    assert "Run the workflow" in page.inner_text(".lingbot-play .lbp-overlay")
    assert page.inner_text(".lingbot-play .lbp-error") == \
        "the session did not start: CUDA out of memory while loading the transformer"
    page.evaluate("() => window.panel.showStarting('loading the model')")  # queued again
    assert page.inner_text(".lingbot-play .lbp-error") == ""


def test_a_state_sent_before_a_chunks_frames_does_not_take_the_counts_back(page) -> None:
    """A view-only tab showed chunk 4 while the controller showed chunk 5: a state event sent
    as a chunk was generated (its counts without that chunk) arrived after the chunk's frames
    and took the counts back."""
    page.evaluate(_JS_NEW_PANEL, False)
    page.evaluate("""() => {
        window.panel.showFrames({chunk: 0, first_frame: 0, frames: window.jpegFrames(9), chunk_frames: 9});
        window.panel.showFrames({chunk: 1, first_frame: 9, frames: window.jpegFrames(12), chunk_frames: 12});
        window.panel.showState({state: 'paused', chunks_done: 1, frames_done: 9});
    }""")
    data = root_data(page)
    assert (data["state"], data["chunks"], data["frames"]) == ("paused", "2", "21")
    page.evaluate("() => window.panel.startSession({sessionId: 'next', controller: false, width: 32, height: 16})")
    page.evaluate("() => window.panel.showState({state: 'waiting', chunks_done: 0, frames_done: 0})")
    assert (root_data(page)["chunks"], root_data(page)["frames"]) == ("0", "0")  # a new session starts at 0
