"""The Play routes (nodes/host/play_routes.py) on an aiohttp server in this process, in
front of a session's real input state: status codes and messages for every refusal, a
session left as it was by what is refused, the controller and the viewers, the body read
no further than its limit, and the websocket helpers outside a server. The same routes in
a real ComfyUI server: tests/integration/test_play_server.py."""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import sys

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from comfy_host import use_comfy_in_process

use_comfy_in_process()

from comfyui_lingbot_world.nodes.host import play_routes  # noqa: E402
from comfyui_lingbot_world.pipeline.play.controls import PlayControls  # noqa: E402
from comfyui_lingbot_world.pipeline.play.protocol import RATE_BURST  # noqa: E402
from comfyui_lingbot_world.pipeline.play.registry import SessionRegistry  # noqa: E402

SESSION = "ab" * 16
CONTROLLER, VIEWER = "controller-tab", "viewer-tab"


class Session:
    """What the routes read of a session: its id, controller, input state and status."""

    def __init__(self, controller: str | None = CONTROLLER) -> None:
        self.session_id = SESSION
        self.controller = controller
        self.controls = PlayControls("turn")
        self.ended = False
        self.end_reason = None

    def state(self) -> str:
        return "ended" if self.ended else self.controls.state()

    def status(self) -> dict:
        return {"session_id": self.session_id, "state": self.state(), "controller": self.controller}


def run(scenario, session: Session | None = None):
    """Run ``scenario(client, session)`` against the routes of a fresh registry."""
    registry = SessionRegistry()
    if session is not None:
        registry.begin(session)
    handlers = play_routes.make_handlers(registry)
    app = web.Application()
    root = play_routes.PLAY_ROUTE
    app.router.add_get(root, handlers["list"])
    app.router.add_get(root + "/{session_id}", handlers["status"])
    app.router.add_post(root + "/{session_id}/keys", handlers["keys"])
    app.router.add_post(root + "/{session_id}/control", handlers["control"])

    async def main():
        async with TestClient(TestServer(app)) as client:
            return await scenario(client, session)

    # A thread of its own: in a whole-suite run the browser tests' Playwright keeps an event
    # loop running in the main thread, where asyncio.run() refuses to start another.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, main()).result()


async def post(client, path: str, body, raw: bytes | None = None) -> tuple[int, dict]:
    data = raw if raw is not None else json.dumps(body).encode()
    response = await client.post(f"{play_routes.PLAY_ROUTE}/{path}", data=data,
                                 headers={"Content-Type": "application/json"})
    return response.status, await response.json()


def test_the_controller_steers_and_status_reports_it():
    async def scenario(client, session):
        listed = await (await client.get(play_routes.PLAY_ROUTE)).json()
        assert listed == {"sessions": [SESSION]}
        assert await post(client, f"{SESSION}/keys", {"client_id": CONTROLLER, "keys": "wj"}) == (
            200, {"state": "waiting", "keys": "wj"})
        assert session.controls.keys == frozenset("wj") and session.controls.take_request().why == "press"
        session.controls.chunk_done()
        assert await post(client, f"{SESSION}/control", {"client_id": CONTROLLER, "action": "continue"}) == (
            200, {"state": "running"})
        status = await (await client.get(f"{play_routes.PLAY_ROUTE}/{SESSION}")).json()
        assert status["state"] == "running" and status["controller"] == CONTROLLER

    run(scenario, Session())


@pytest.mark.parametrize("path, body, raw, status, message", [
    ("00" * 16 + "/keys", {"client_id": CONTROLLER, "keys": "w"}, None, 404, "no such Play session"),
    ("not-a-session/keys", {"client_id": CONTROLLER, "keys": "w"}, None, 404, "no such Play session"),
    (SESSION + "/keys", None, b"{", 400, "not JSON"),
    (SESSION + "/keys", {"client_id": CONTROLLER, "keys": "wz"}, None, 400, "unknown key(s) 'z'"),
    (SESSION + "/keys", {"client_id": CONTROLLER, "keys": "w", "file": "/etc/passwd"}, None, 400, "unknown field"),
    (SESSION + "/keys", {"client_id": CONTROLLER, "keys": 1}, None, 400, "keys must be a str"),
    (SESSION + "/control", {"client_id": CONTROLLER, "action": "delete"}, None, 400, "not one of"),
    (SESSION + "/keys", None, b'{"client_id": "x", "keys": "' + b"w" * 600 + b'"}', 413, "at most 512 bytes"),
    (SESSION + "/keys", {"client_id": VIEWER, "keys": "w"}, None, 409, "view-only"),
    (SESSION + "/control", {"client_id": VIEWER, "action": "stop"}, None, 409, "view-only"),
])
def test_refusals_answer_4xx_with_a_message_and_leave_the_session_as_it_was(path, body, raw, status, message):
    async def scenario(client, session):
        answer = await post(client, path, body, raw)
        assert answer[0] == status and message in answer[1]["error"], answer
        assert session.controls.keys == frozenset() and not session.controls.stop_requested
        assert session.controls.take_request() is None and session.controls.refused == 0

    run(scenario, Session())


def test_a_flood_is_bounded_and_the_session_goes_on():
    # The bucket reads a clock of the test's own: on a loaded CI box the flood itself takes
    # long enough for real time to hand tokens back, and the count would depend on the load.
    now = [0.0]

    async def scenario(client, session):
        answers = [await post(client, f"{SESSION}/keys", {"client_id": CONTROLLER, "keys": "w" if i % 2 else ""})
                   for i in range(RATE_BURST + 20)]
        codes = [code for code, _ in answers]
        assert codes == [200] * RATE_BURST + [429] * 20
        assert "too many messages" in answers[-1][1]["error"]
        assert session.controls.refused == 20
        now[0] += 0.2  # tokens come back: the controller is heard again
        assert (await post(client, f"{SESSION}/keys", {"client_id": CONTROLLER, "keys": "d"}))[0] == 200
        assert session.controls.keys == frozenset("d")

    session = Session()
    session.controls = PlayControls("turn", clock=lambda: now[0])
    run(scenario, session)


def test_an_ended_session_answers_410_and_a_prompt_without_client_takes_any():
    async def scenario(client, session):
        assert (await post(client, f"{SESSION}/keys", {"client_id": "any-tab", "keys": "s"}))[0] == 200
        session.ended, session.end_reason = True, "idle"
        assert await post(client, f"{SESSION}/control", {"client_id": "any-tab", "action": "step"}) == (
            410, {"error": "this Play session has ended (idle)"})

    run(scenario, Session(controller=None))


def test_an_oversized_body_is_not_read_to_its_end():
    async def scenario(client, session):
        async def endless():
            for _ in range(10_000):  # 10 MB, chunked: no Content-Length to refuse it by
                yield b"x" * 1024

        response = await client.post(f"{play_routes.PLAY_ROUTE}/{SESSION}/keys", data=endless())
        assert response.status == 413

    run(scenario, Session())


def test_outside_a_server_nothing_is_registered_or_sent():
    saved = sys.modules.pop("server", None)
    try:
        assert play_routes.register_play_routes() is False
        assert play_routes.controller_id() is None
        play_routes.emitter()("lingbot.play.state", {})  # no server: dropped
        assert play_routes.client_connected("tab")() is False
    finally:
        if saved is not None:
            sys.modules["server"] = saved
