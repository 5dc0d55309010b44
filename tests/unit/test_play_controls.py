"""A Play session's input state (pipeline/play/controls.py): turn-based presses and Steps,
continuous play with pause and continue, the rate limit and the bounded Step queue (what
is refused changes nothing), and the time of the input each chunk answers."""
from __future__ import annotations

import pytest

from comfyui_lingbot_world.pipeline.play.controls import PlayControls
from comfyui_lingbot_world.pipeline.play.protocol import MAX_PENDING_STEPS, RATE_BURST, PlayRequestError


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def keys(text: str) -> frozenset[str]:
    return frozenset(text)


def test_turn_mode_a_new_key_starts_one_chunk_with_the_keys_held_then():
    clock = Clock()
    controls = PlayControls("turn", clock=clock)
    assert controls.take_request() is None and controls.state() == "waiting"
    clock.now = 101.0
    controls.set_keys(keys("w"))
    clock.now = 101.5
    controls.set_keys(keys("wj"))  # still pressed before the chunk starts: one chunk, both keys
    request = controls.take_request()
    assert request.keys == keys("wj") and request.asked_at == 101.0 and request.why == "press"
    assert controls.state() == "running" and controls.take_request() is None  # exactly one chunk
    controls.set_keys(keys("wjl"))  # pressed while the chunk runs: a change of keys, not a press
    controls.chunk_done()
    assert controls.take_request() is None and controls.state() == "waiting"
    controls.set_keys(keys("w"))  # only releases: no chunk
    assert controls.take_request() is None
    controls.set_keys(keys("wd"))
    assert controls.take_request().keys == keys("wd")


def test_steps_queue_up_to_a_bound_and_run_with_the_current_keys():
    controls = PlayControls("turn", clock=Clock())
    controls.set_keys(keys("s"))
    controls.take_request()
    controls.chunk_done()
    for _ in range(MAX_PENDING_STEPS):
        controls.act("step")
    with pytest.raises(PlayRequestError, match="Steps are already waiting") as refused:
        controls.act("step")
    assert refused.value.status == 429
    taken = [controls.take_request() for _ in range(MAX_PENDING_STEPS + 1)]
    assert [r.why for r in taken[:-1]] == ["step"] * MAX_PENDING_STEPS and taken[-1] is None
    assert all(r.keys == keys("s") for r in taken[:-1])


def test_continuous_mode_runs_until_paused_and_continue_resumes():
    clock = Clock()
    controls = PlayControls("continuous", clock=clock)
    first = controls.take_request()
    assert first.why == "continuous" and first.asked_at is None and first.keys == frozenset()
    controls.chunk_done()
    clock.now = 103.0
    controls.set_keys(keys("a"))
    second = controls.take_request()
    assert second.keys == keys("a") and second.asked_at == 103.0  # the input this chunk answers
    controls.chunk_done()
    assert controls.take_request().asked_at is None  # nobody asked for this one
    controls.chunk_done()
    controls.act("pause")
    assert controls.state() == "paused" and controls.take_request() is None
    controls.set_keys(keys("ai"))  # paused: a press runs one chunk, as in turn mode
    assert controls.take_request().why == "press"
    controls.chunk_done()
    controls.act("continue")
    assert controls.state() == "running" and controls.take_request().why == "continuous"


def test_stop_ends_requests():
    controls = PlayControls("continuous", clock=Clock())
    controls.act("stop")
    assert controls.stop_requested and controls.take_request() is None


def test_a_flood_is_refused_with_429_and_changes_nothing():
    clock = Clock()
    controls = PlayControls("turn", clock=clock)
    for i in range(RATE_BURST):
        controls.set_keys(keys("w" if i % 2 else ""))
    held, last = controls.keys, controls.last_input
    with pytest.raises(PlayRequestError, match="too many messages") as refused:
        controls.set_keys(keys("wasd"))
    assert refused.value.status == 429 and controls.keys == held and controls.last_input == last
    assert controls.refused == 1
    clock.now += 1.0  # 40 more a second
    for _ in range(40):
        controls.act("pause")
    with pytest.raises(PlayRequestError):
        controls.act("pause")


def test_unknown_mode_and_action_are_refused():
    with pytest.raises(ValueError, match="mode: 'fast' is not one of turn, continuous"):
        PlayControls("fast")
    with pytest.raises(PlayRequestError, match="not one of"):
        PlayControls().act("jump")
