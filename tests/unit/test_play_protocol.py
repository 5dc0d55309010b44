"""The readers of the page's Play messages (pipeline/play/protocol.py): exactly the
documented fields and types, the key set, the size limit, and session ids."""
from __future__ import annotations

import json
import re

import pytest

from comfyui_lingbot_world.pipeline.play.protocol import (MAX_BODY_BYTES, PlayRequestError, check_session_id,
                                                          keys_text, parse_control, parse_keys)

CLIENT = "0123456789abcdef0123456789abcdef"


def body(**fields) -> bytes:
    return json.dumps(fields).encode()


def refusal(call, raw: bytes | str) -> tuple[int, str]:
    with pytest.raises(PlayRequestError) as info:
        call(raw)
    return info.value.status, info.value.message


def test_keys_and_control_messages_are_read():
    message = parse_keys(body(client_id=CLIENT, keys="jw"))
    assert message.client_id == CLIENT and message.keys == frozenset("wj")
    assert parse_keys(body(client_id="a-b_c", keys="")).keys == frozenset()
    assert parse_control(body(client_id=CLIENT, action="step")).action == "step"
    assert keys_text(frozenset("lwj")) == "wjl"


@pytest.mark.parametrize("raw, match", [
    (b"not json", "not JSON"),
    (b"\xff\xfe", "not JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (body(client_id=CLIENT), "missing field"),
    (body(client_id=CLIENT, keys="w", path="/etc/passwd"), "unknown field.*'path'"),
    (body(client_id=CLIENT, keys=["w"]), "keys must be a str, got list"),
    (body(client_id=7, keys="w"), "client_id must be a str"),
    (body(client_id="../../x", keys="w"), "client_id must be"),
    (body(client_id=CLIENT, keys="wq"), "unknown key.*'q'"),
    (body(client_id=CLIENT, keys="W"), "unknown key.*'W'.*lower case"),
    (body(client_id=CLIENT, keys="wasdijklw"), "at most 8 characters"),
])
def test_malformed_keys_messages_are_refused_with_400(raw, match):
    status, message = refusal(parse_keys, raw)
    assert status == 400 and re.search(match, message), message


def test_control_refuses_unknown_actions_and_true_as_a_string():
    assert refusal(parse_control, body(client_id=CLIENT, action="restart")) == (
        400, "action: 'restart' is not one of step, pause, continue, stop")
    assert refusal(parse_control, body(client_id=CLIENT, action=True)) == (400, "action must be a str, got bool")


def test_bodies_over_the_limit_are_refused_with_413():
    raw = body(client_id=CLIENT, keys="w" + " " * MAX_BODY_BYTES)
    assert refusal(parse_keys, raw) == (413, "body too large: at most 512 bytes")


@pytest.mark.parametrize("session_id", ["", "x" * 32, "0" * 31, "0" * 33, "../" + "0" * 29, "0" * 31 + "G"])
def test_session_ids_that_a_node_never_makes_are_404(session_id):
    assert refusal(check_session_id, session_id)[0] == 404
    assert check_session_id("a" * 32) == "a" * 32
