"""LingBot-World Play in a real ComfyUI server (tiny Fast transformer, CPU), driven over HTTP
and the websocket as the page drives it:

* a session steered over HTTP: frames of each chunk with the keys that steered it, Stop, the
  .mp4 (plays), the action log (in /history and beside the .mp4), nothing left in memory;
* the routes' refusals in the server (unknown keys, malformed and oversized bodies, extra
  fields, a wrong or path-like session id, a flood) answer 4xx with a message while the
  session goes on, and no route reads or writes a file (input/ and output/ unchanged
  except the session's own .mp4 and log);
* two clients: the other tab sees the frames and gets 409 on input;
* faults: the page gone (idle end: the session ends, keeps the video, memory back to the
  idle level), Cancel mid-chunk (interrupted like any prompt, the video kept, nothing left
  in memory, the next prompt runs), /free after a session.
"""
from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

import tiny_package
from comfy_host import ROOT
from comfy_server import ComfyServer, _EventCollector, video_info, wait_for

PLAY = "6"
WIDTH, HEIGHT = 48, 32
ROUTE = "/lingbot/play"
TOLERANCE = 0.05  # of the idle RssAnon


TINY_VAE = tiny_package.TINY_VIDEO_VAE  # the name core's Load VAE lists from models/vae_approx


def write_tiny_vae(models: Path, _package) -> None:
    from comfy_host import comfy_root

    tiny_package.write_tiny_video_vae(models, comfy_root())


@pytest.fixture(scope="module")
def comfy_models(tmp_path_factory: pytest.TempPathFactory):
    return tiny_package.comfy_models_builder(tmp_path_factory, extra=write_tiny_vae)


def play_graph(**changes) -> dict:
    """The shipped Play workflow at the tiny size, with a fresh prompt (no cache hit)."""
    graph = json.loads((ROOT / "workflows" / "api" / "lingbot_play.json").read_text())
    graph[PLAY]["inputs"].update({"width": WIDTH, "height": HEIGHT, "chunk_budget": 6, "idle_timeout": 60, **changes})
    graph["2"]["inputs"]["prompt"] = f"a walk through a pine forest, take {uuid.uuid4().hex[:8]}"
    return graph


def play_events(server: ComfyServer, session_id: str | None = None, kind: str | None = None,
                collector: _EventCollector | None = None) -> list[dict]:
    events = (collector or server._events).all_events
    return [data for event, data in events if event.startswith("lingbot.play.")
            and (kind is None or event == f"lingbot.play.{kind}")
            and (session_id is None or data.get("session_id") == session_id)]


def start_session(server: ComfyServer, client_id: str | None = None, **changes) -> tuple[str, str]:
    """Queue a Play prompt; (prompt_id, session_id) once the session has started."""
    before = {d["session_id"] for d in play_events(server, kind="started")}
    prompt_id = server.queue(play_graph(**changes), client_id=client_id)
    started = wait_for(lambda: [d for d in play_events(server, kind="started") if d["session_id"] not in before],
                       "the session to start", server)
    return prompt_id, started[0]["session_id"]


def post(server: ComfyServer, session_id: str, what: str, body=None, raw: bytes | None = None,
         client_id: str | None = None) -> requests.Response:
    if raw is None:
        body = {"client_id": client_id or server._events.client_id, **(body or {})}
        raw = json.dumps(body).encode()
    return requests.post(f"{server.url}{ROUTE}/{session_id}/{what}", data=raw,
                         headers={"Content-Type": "application/json"}, timeout=30)


def whole_chunk(parts: list[dict]) -> dict:
    """A chunk's frames events (one per latent frame, in order) as one: its first part's
    fields, every frame, and ``parts``: (first_frame, frames) of each."""
    assert [p["part"] for p in parts] == list(range(len(parts))) and parts[-1]["last"], parts
    assert all(p["chunk"] == parts[0]["chunk"] and p["latency_s"] == parts[0]["latency_s"] for p in parts)
    return {**parts[0], "frames": [f for p in parts for f in p["frames"]],
            "parts": [(p["first_frame"], len(p["frames"])) for p in parts]}


def chunk_events(server: ComfyServer, session_id: str, done: int, what: str,
                 collector: _EventCollector | None = None) -> dict:
    """The first chunk whose frames events come after the first ``done``, once its last part is in."""
    def complete():
        new = play_events(server, session_id, "frames", collector=collector)[done:]
        ends = [i for i, d in enumerate(new) if d["last"]]
        return new[:ends[0] + 1] if ends else None
    return whole_chunk(wait_for(complete, what, server))


def press(server: ComfyServer, session_id: str, keys: str, client_id: str | None = None) -> dict:
    """Release, then hold ``keys`` (a press in turn mode); the frames of the chunk it starts."""
    done = len(play_events(server, session_id, "frames"))
    wait_for(lambda: server.get(f"{ROUTE}/{session_id}").json()["state"] != "running", "the chunk to end", server)
    assert post(server, session_id, "keys", {"keys": ""}, client_id=client_id).status_code == 200
    reply = post(server, session_id, "keys", {"keys": keys}, client_id=client_id)
    assert reply.status_code == 200, reply.text
    return chunk_events(server, session_id, done, f"the chunk of {keys!r}")


def stop(server: ComfyServer, session_id: str, prompt_id: str, client_id: str | None = None):
    assert post(server, session_id, "control", {"action": "stop"}, client_id=client_id).status_code == 200
    return server.wait(prompt_id, timeout=120)


def lingbot_status(server: ComfyServer) -> dict:
    return server.get("/lingbot/status").json()


def assert_nothing_alive(server: ComfyServer, when: str) -> None:
    status = lingbot_status(server)
    alive = {key: status[key] for key in ("loaded_models", "dit_models_alive", "text_encoders_alive", "vaes_alive")}
    assert alive == {"loaded_models": [], "dit_models_alive": 0, "text_encoders_alive": 0, "vaes_alive": 0}, \
        f"{when}: {alive}"


def files_under(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def idle(comfy_server: ComfyServer) -> int:
    """RssAnon after two whole sessions and /free (imports and first-use caches done)."""
    for _ in range(2):
        prompt_id, session_id = start_session(comfy_server, mode="continuous", chunk_budget=1)
        assert comfy_server.wait(prompt_id, timeout=180).ok
    return comfy_server.rss_anon_after_free()


# --------------------------------------------------------------------------- a whole session

def test_a_session_steered_over_http_saves_the_video_and_its_action_log(comfy_server: ComfyServer, idle: int):
    prompt_id, session_id = start_session(comfy_server)
    started = play_events(comfy_server, session_id, "started")[0]
    assert started["controller"] == comfy_server._events.client_id and started["node_id"] == PLAY
    assert (started["mode"], started["width"], started["height"], started["keys"]) == ("turn", WIDTH, HEIGHT,
                                                                                       "wasdijkl")
    assert comfy_server.get(ROUTE).json() == {"sessions": [session_id]}
    first = press(comfy_server, session_id, "w")
    second = press(comfy_server, session_id, "wj")
    assert (first["chunk"], first["first_frame"], len(first["frames"]), first["keys"]) == (0, 0, 9, "w")
    assert (second["chunk"], second["first_frame"], len(second["frames"]), second["keys"]) == (1, 9, 12, "wj")
    # each chunk in parts over the websocket, one per latent frame, in order
    assert first["parts"] == [(0, 1), (1, 4), (5, 4)] and second["parts"] == [(9, 4), (13, 4), (17, 4)]
    assert first["latency_s"] is not None and second["chunk_s"] > 0
    result = stop(comfy_server, session_id, prompt_id)
    assert result.ok, result.describe()

    (video,) = [f for f in comfy_server.output_files(result) if f.suffix == ".mp4"]
    info = video_info(video)
    assert (info.frames, info.width, info.height) == (21, WIDTH, HEIGHT)
    log = json.loads(result.outputs[PLAY]["text"][0])
    assert log["actions"] == "w-8,wj-12" and log["chunk_keys"] == ["w", "wj"] and log["frames"] == 21
    assert log["keyframes"] == "per chunk (Play)" and log["ended"] == "stop"
    assert json.loads(video.with_suffix(".json").read_text()) == log
    ended = play_events(comfy_server, session_id, "state")[-1]
    assert ended["state"] == "ended" and ended["reason"] == "stop"
    assert ended["video"] == {"filename": video.name, "subfolder": video.parent.name, "type": "output"}
    status = comfy_server.get(f"{ROUTE}/{session_id}").json()
    assert status["state"] == "ended" and status["chunks_done"] == 2
    assert post(comfy_server, session_id, "keys", {"keys": "w"}).status_code == 410
    assert comfy_server.get(ROUTE).json() == {"sessions": []}
    assert_nothing_alive(comfy_server, "after a session")


# --------------------------------------------------------------------------- routes in the server

def test_refusals_answer_4xx_and_the_session_goes_on_touching_no_file(comfy_server: ComfyServer):
    inputs_before = files_under(comfy_server.input_dir)
    outputs_before = files_under(comfy_server.output_dir)
    prompt_id, session_id = start_session(comfy_server)
    client = comfy_server._events.client_id
    cases = [
        (post(comfy_server, session_id, "keys", {"keys": "wx"}), 400, "unknown key(s) 'x'"),
        (post(comfy_server, session_id, "keys", raw=b"{not json"), 400, "not JSON"),
        (post(comfy_server, session_id, "keys", raw=json.dumps(
            {"client_id": client, "keys": "w", "path": "../../models"}).encode()), 400, "unknown field"),
        (post(comfy_server, session_id, "control", raw=json.dumps(
            {"client_id": client, "action": "stop", "file": "x.mp4"}).encode()), 400, "unknown field"),
        (post(comfy_server, session_id, "keys", raw=json.dumps(
            {"client_id": client, "keys": "w" * 1000}).encode()), 413, "at most 512 bytes"),
        (post(comfy_server, uuid.uuid4().hex, "keys", {"keys": "w"}), 404, "no such Play session"),
        (post(comfy_server, "..%2F..%2Fetc%2Fpasswd", "keys", {"keys": "w"}), 404, ""),
        (requests.get(f"{comfy_server.url}{ROUTE}/{'0' * 32}", timeout=30), 404, "no such Play session"),
    ]
    for reply, status, message in cases:
        assert reply.status_code == status, (reply.status_code, reply.text)
        if message:
            assert message in reply.json()["error"], reply.text
    # a flood from 16 connections at once: bounded by the rate limit, each refusal a 429 with its reason
    url = f"{comfy_server.url}{ROUTE}/{session_id}/keys"
    body = json.dumps({"client_id": client, "keys": ""}).encode()  # no key pressed: no chunk starts

    def flood(_: int) -> list[tuple[int, str]]:
        with requests.Session() as http:
            return [(r.status_code, r.text) for r in (http.post(url, data=body, timeout=30) for _ in range(25))]

    with ThreadPoolExecutor(16) as pool:
        answers = [answer for batch in pool.map(flood, range(16)) for answer in batch]
    codes = [code for code, _ in answers]
    assert codes.count(429) > 0 and set(codes) <= {200, 429}, codes
    assert all("too many messages" in text for code, text in answers if code == 429)
    time.sleep(0.5)  # tokens come back
    frames = press(comfy_server, session_id, "d")  # the session was unaffected
    assert frames["chunk"] == 0 and frames["keys"] == "d"
    result = stop(comfy_server, session_id, prompt_id)
    assert result.ok, result.describe()
    assert files_under(comfy_server.input_dir) == inputs_before
    new = set(files_under(comfy_server.output_dir)) - set(outputs_before)
    (video,) = [f for f in comfy_server.output_files(result) if f.suffix == ".mp4"]
    session_files = {str(video.relative_to(comfy_server.output_dir)),
                     str(video.with_suffix(".json").relative_to(comfy_server.output_dir))}
    assert new == session_files, new


def test_a_second_client_sees_the_frames_and_is_refused_as_view_only(comfy_server: ComfyServer):
    viewer = _EventCollector(f"ws://127.0.0.1:{comfy_server.port}/ws")
    viewer.start()
    try:
        prompt_id, session_id = start_session(comfy_server)
        reply = post(comfy_server, session_id, "keys", {"keys": "w"}, client_id=viewer.client_id)
        assert reply.status_code == 409 and "view-only" in reply.json()["error"]
        reply = post(comfy_server, session_id, "control", {"action": "stop"}, client_id=viewer.client_id)
        assert reply.status_code == 409
        press(comfy_server, session_id, "s")
        seen = chunk_events(comfy_server, session_id, 0, "the viewer's frames", collector=viewer)
        assert seen["keys"] == "s" and len(seen["frames"]) == 9
        assert stop(comfy_server, session_id, prompt_id).ok
    finally:
        viewer.stop()


# --------------------------------------------------------------------------- faults

def test_the_page_gone_ends_the_session_after_the_idle_timeout(comfy_server: ComfyServer, idle: int):
    page = _EventCollector(f"ws://127.0.0.1:{comfy_server.port}/ws")
    page.start()
    prompt_id, session_id = start_session(comfy_server, client_id=page.client_id, idle_timeout=2)
    press(comfy_server, session_id, "w", client_id=page.client_id)
    page.stop()  # the tab closes: no more input, no websocket of the controller
    gone = time.monotonic()
    result = comfy_server.wait(prompt_id, timeout=120)
    assert result.ok, result.describe()
    assert time.monotonic() - gone >= 1.5
    assert json.loads(result.outputs[PLAY]["text"][0])["ended"] == "idle"
    (video,) = [f for f in comfy_server.output_files(result) if f.suffix == ".mp4"]
    assert video_info(video).frames == 9
    assert_nothing_alive(comfy_server, "after the idle end")
    now = comfy_server.rss_anon_after_free(target=int(idle * (1 + TOLERANCE)))
    assert now <= idle * (1 + TOLERANCE), f"RssAnon {now / 2**20:.1f} MB, idle level {idle / 2**20:.1f} MB"


def test_cancel_mid_chunk_ends_the_session_keeps_the_video_and_the_next_prompt_runs(comfy_server: ComfyServer,
                                                                                   idle: int):
    prompt_id, session_id = start_session(comfy_server, mode="continuous", chunk_budget=300)
    wait_for(lambda: play_events(comfy_server, session_id, "frames"), "the first chunk", comfy_server)
    comfy_server.interrupt()
    result = comfy_server.wait(prompt_id, timeout=120)
    assert result.status == "interrupted", result.describe()
    ended = wait_for(lambda: [d for d in play_events(comfy_server, session_id, "state") if d["state"] == "ended"],
                     "the ended state", comfy_server)[0]
    assert ended["reason"] == "interrupt" and ended["chunks_done"] >= 1
    video = comfy_server.output_dir / ended["video"]["subfolder"] / ended["video"]["filename"]
    assert video_info(video).frames == 9 + 12 * (ended["chunks_done"] - 1)
    log = json.loads(video.with_suffix(".json").read_text())
    assert log["chunks"] == ended["chunks_done"] and log["ended"] == "interrupt"
    assert_nothing_alive(comfy_server, "right after Cancel")
    prompt_id, session_id = start_session(comfy_server, mode="continuous", chunk_budget=1)
    assert comfy_server.wait(prompt_id, timeout=120).ok
    now = comfy_server.rss_anon_after_free(target=int(idle * (1 + TOLERANCE)))
    assert now <= idle * (1 + TOLERANCE), f"RssAnon {now / 2**20:.1f} MB, idle level {idle / 2**20:.1f} MB"


def test_free_after_a_session_leaves_nothing_loaded(comfy_server: ComfyServer):
    prompt_id, session_id = start_session(comfy_server, mode="continuous", chunk_budget=1)
    assert comfy_server.wait(prompt_id, timeout=120).ok
    comfy_server.free()
    assert_nothing_alive(comfy_server, "after /free")
    assert lingbot_status(comfy_server)["experts_resident"] == []


def test_a_live_decoder_from_core_load_vae_makes_the_sessions_frames(comfy_server: ComfyServer):
    """Core's Load VAE with the tiny video VAE from models/vae_approx into Play's live_decoder:
    the session runs over HTTP, its .mp4 holds every frame and its log says who decoded them."""
    graph = play_graph()
    graph["40"] = {"class_type": "VAELoader", "inputs": {"vae_name": TINY_VAE}}
    graph[PLAY]["inputs"]["live_decoder"] = ["40", 0]
    before = {d["session_id"] for d in play_events(comfy_server, kind="started")}
    prompt_id = comfy_server.queue(graph)
    started = wait_for(lambda: [d for d in play_events(comfy_server, kind="started") if d["session_id"] not in before],
                       "the session to start", comfy_server)
    session_id = started[0]["session_id"]
    chunk = press(comfy_server, session_id, "d")
    assert chunk["parts"] == [(0, 1), (1, 4), (5, 4)]
    result = stop(comfy_server, session_id, prompt_id)
    assert result.ok, result.describe()
    (video,) = [f for f in comfy_server.output_files(result) if f.suffix == ".mp4"]
    assert video_info(video).frames == 9
    log = json.loads(result.outputs[PLAY]["text"][0])
    assert log["live_decoder"].startswith("tiny video VAE")
