"""The Play routes on ComfyUI's own server, and the session's link to its websocket
(docs/play_protocol.md).

    GET  /lingbot/play                      -> {"sessions": [running session ids]}
    GET  /lingbot/play/{session_id}         -> the session's status
    POST /lingbot/play/{session_id}/keys    {"client_id": str, "keys": str}
    POST /lingbot/play/{session_id}/control {"client_id": str, "action": "step"|"pause"|"continue"|"stop"}

Every refusal is a 4xx with ``{"error": message}`` and leaves the session as it was: an
unknown session 404, a body over 512 bytes 413 (read no further), malformed JSON, a
missing or extra field, a wrong type or an unknown key 400, an input from a client that
is not the session's controller 409 (view-only), an input to a session that has ended
410, more messages than the rate limit 429. No route takes or returns a file path; the
handlers only touch the session's in-memory input state (``pipeline/play/controls.py``).

Frames and state go to every page through ``PromptServer.send_sync`` (a broadcast: other
tabs view the session). The controller is the ``client_id`` the prompt was queued with
(``PromptServer.client_id`` while it runs); a prompt queued without one (a script) has no
controller and takes input from any client.
"""
from __future__ import annotations

import logging
import sys
from typing import Any, Callable

from ...pipeline.play.protocol import (MAX_BODY_BYTES, PlayRequestError, check_session_id, keys_text, parse_control,
                                       parse_keys)
from ...pipeline.play.registry import SESSIONS, SessionRegistry

log = logging.getLogger(__name__)

PLAY_ROUTE = "/lingbot/play"


def prompt_server() -> Any | None:
    """ComfyUI's running ``PromptServer``; None outside a server (tests, tools)."""
    server = sys.modules.get("server")
    return getattr(getattr(server, "PromptServer", None), "instance", None)


def controller_id() -> str | None:
    """The client that queued the prompt being executed (None: queued without a client id)."""
    server = prompt_server()
    client = getattr(server, "client_id", None)
    return client if isinstance(client, str) and client else None


def emitter() -> Callable[[str, dict], None]:
    """``emit(event, data)``: a JSON event to every connected page (nothing outside a server)."""
    server = prompt_server()

    def emit(event: str, data: dict) -> None:
        if server is not None:
            server.send_sync(event, data)

    return emit


def client_connected(client_id: str | None) -> Callable[[], bool]:
    """Whether ``client_id`` has a websocket open right now (no client id: never connected,
    so an unattended session ends after its idle timeout)."""
    server = prompt_server()

    def connected() -> bool:
        sockets = getattr(server, "sockets", None)
        return client_id is not None and isinstance(sockets, dict) and client_id in sockets

    return connected


# --------------------------------------------------------------------------- handlers


async def read_body(request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The request body, refused with 413 as soon as it passes ``limit`` bytes."""
    if request.content_length is not None and request.content_length > limit:
        raise PlayRequestError(413, f"body too large: at most {limit} bytes")
    body = bytearray()
    while True:
        piece = await request.content.read(limit + 1 - len(body))
        if not piece:
            return bytes(body)
        body += piece
        if len(body) > limit:
            raise PlayRequestError(413, f"body too large: at most {limit} bytes")


def find_session(registry: SessionRegistry, session_id: str):
    session = registry.get(check_session_id(session_id))
    if session is None:
        raise PlayRequestError(404, "no such Play session (it never ran here, or another one started since)")
    return session


def check_input_allowed(session, client_id: str) -> None:
    if session.ended:
        raise PlayRequestError(410, f"this Play session has ended ({session.end_reason})")
    if session.controller is not None and client_id != session.controller:
        raise PlayRequestError(409, "view-only: this session is controlled by another tab")


def make_handlers(registry: SessionRegistry = SESSIONS) -> dict[str, Callable]:
    from aiohttp import web

    def refused(error: PlayRequestError):
        return web.json_response({"error": error.message}, status=error.status)

    async def list_sessions(request):
        return web.json_response({"sessions": registry.running()})

    async def session_status(request):
        try:
            return web.json_response(find_session(registry, request.match_info["session_id"]).status())
        except PlayRequestError as error:
            return refused(error)

    async def keys(request):
        try:
            session = find_session(registry, request.match_info["session_id"])
            message = parse_keys(await read_body(request))
            check_input_allowed(session, message.client_id)
            session.controls.set_keys(message.keys)
            return web.json_response({"state": session.state(), "keys": keys_text(session.controls.keys)})
        except PlayRequestError as error:
            return refused(error)

    async def control(request):
        try:
            session = find_session(registry, request.match_info["session_id"])
            message = parse_control(await read_body(request))
            check_input_allowed(session, message.client_id)
            session.controls.act(message.action)
            return web.json_response({"state": session.state()})
        except PlayRequestError as error:
            return refused(error)

    return {"list": list_sessions, "status": session_status, "keys": keys, "control": control}


def register_play_routes() -> bool:
    """Add the Play routes to the running ComfyUI server; False outside one."""
    server = prompt_server()
    routes = getattr(server, "routes", None)
    if routes is None:
        return False
    if any(getattr(route, "path", None) == PLAY_ROUTE for route in routes):
        return True  # the pack was imported twice; aiohttp refuses duplicate routes
    handlers = make_handlers()
    routes.get(PLAY_ROUTE)(handlers["list"])
    routes.get(PLAY_ROUTE + "/{session_id}")(handlers["status"])
    routes.post(PLAY_ROUTE + "/{session_id}/keys")(handlers["keys"])
    routes.post(PLAY_ROUTE + "/{session_id}/control")(handlers["control"])
    log.debug("LingBot: registered the Play routes under %s", PLAY_ROUTE)
    return True
