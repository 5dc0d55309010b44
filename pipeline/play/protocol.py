"""The messages between a Play session and the page (docs/play_protocol.md): names, limits,
and the strict readers of the page's two request bodies.

Nothing here knows HTTP or ComfyUI: a reader takes the raw body and either returns the
message or raises ``PlayRequestError(status, message)``, which the routes answer as is.
Bodies are JSON objects with exactly the documented fields (an extra or missing field, a
wrong type, a key outside W A S D I J K L, or more than ``MAX_BODY_BYTES`` is refused); no
field names a file, and nothing in a message reaches a path.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ...wan.camera_actions import KEYS  # W/S forward/back, A/D left/right, I/K look up/down, J/L turn

MODES = ("turn", "continuous")
ACTIONS = ("step", "pause", "continue", "stop")
STATES = ("waiting", "running", "paused", "ended")
END_REASONS = ("stop", "budget", "idle", "interrupt", "error")

MAX_BODY_BYTES = 512
MAX_CLIENT_ID = 128  # ComfyUI's client ids are 32 hex digits; the frontend's are uuids
RATE_PER_S = 40.0  # messages a second one session accepts from its controller, sustained
RATE_BURST = 80  # ... and at once
MAX_PENDING_STEPS = 8  # Step presses queued while a chunk runs

EVENT_STARTING = "lingbot.play.starting"
EVENT_STARTED = "lingbot.play.started"
EVENT_FRAMES = "lingbot.play.frames"
EVENT_STATE = "lingbot.play.state"

# What a Play node is doing before its session takes keys, in order (EVENT_STARTING's step).
STARTING_MODEL = "loading the model"
STARTING_IMAGE = "encoding the image"
STARTING_WARMUP = "warming up"

_SESSION_ID = re.compile(r"^[0-9a-f]{32}$")
_CLIENT_ID = re.compile(r"^[A-Za-z0-9_-]{1,%d}$" % MAX_CLIENT_ID)


class PlayRequestError(Exception):
    """A request the session refuses: ``status`` (4xx) and a message for the page."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class KeysMessage:
    client_id: str
    keys: frozenset[str]


@dataclass(frozen=True)
class ControlMessage:
    client_id: str
    action: str


def check_session_id(text: str) -> str:
    """A session id as the node makes them (uuid4 hex); anything else is no session (404)."""
    if not isinstance(text, str) or not _SESSION_ID.match(text):
        raise PlayRequestError(404, "no such Play session (ids are 32 hex digits)")
    return text


def _body_object(raw: bytes, fields: dict[str, type]) -> dict:
    if len(raw) > MAX_BODY_BYTES:
        raise PlayRequestError(413, f"body too large: at most {MAX_BODY_BYTES} bytes")
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise PlayRequestError(400, "body is not JSON (UTF-8)") from None
    if not isinstance(body, dict):
        raise PlayRequestError(400, f"body must be a JSON object with {', '.join(fields)}")
    extra = sorted(set(body) - set(fields))
    if extra:
        raise PlayRequestError(400, f"unknown field(s) {', '.join(map(repr, extra))}; the body holds only "
                               f"{', '.join(fields)}")
    missing = [name for name in fields if name not in body]
    if missing:
        raise PlayRequestError(400, f"missing field(s) {', '.join(missing)}")
    for name, kind in fields.items():
        if type(body[name]) is not kind:  # noqa: E721 (bool is not an int here, and no subclass passes)
            raise PlayRequestError(400, f"{name} must be a {kind.__name__}, got {type(body[name]).__name__}")
    if not _CLIENT_ID.match(body["client_id"]):
        raise PlayRequestError(400, f"client_id must be 1 to {MAX_CLIENT_ID} letters, digits, '-' or '_'")
    return body


def parse_keys(raw: bytes) -> KeysMessage:
    """``{"client_id": str, "keys": str}``: the keys held now, a subset of "wasdijkl"."""
    body = _body_object(raw, {"client_id": str, "keys": str})
    keys = body["keys"]
    if len(keys) > len(KEYS):
        raise PlayRequestError(400, f"keys: at most {len(KEYS)} characters ({KEYS})")
    unknown = sorted({c for c in keys if c not in KEYS})
    if unknown:
        raise PlayRequestError(400, f"keys: unknown key(s) {', '.join(map(repr, unknown))}; keys are w a s d "
                               "(move) and i j k l (look), lower case")
    return KeysMessage(body["client_id"], frozenset(keys))


def parse_control(raw: bytes) -> ControlMessage:
    """``{"client_id": str, "action": "step" | "pause" | "continue" | "stop"}``."""
    body = _body_object(raw, {"client_id": str, "action": str})
    if body["action"] not in ACTIONS:
        raise PlayRequestError(400, f"action: {body['action'][:20]!r} is not one of {', '.join(ACTIONS)}")
    return ControlMessage(body["client_id"], body["action"])


def keys_text(keys: frozenset[str]) -> str:
    """Held keys as the protocol writes them: in the order w a s d i j k l ("" for none)."""
    return "".join(k for k in KEYS if k in keys)
