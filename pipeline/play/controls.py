"""The input side of a Play session: what the page asked for, shared between the server's
request handlers (any thread) and the session's loop (ComfyUI's worker thread).

The page sends the keys it holds and control actions (docs/play_protocol.md). Everything is
folded into a small state under one lock as it arrives, so nothing queues up without
bound: the keys held now, at most one pending key press (turn-based mode), at most
``MAX_PENDING_STEPS`` pending Steps, the paused flag, a stop flag, and the arrival time of
the earliest input no chunk has answered yet (for the key-to-frame latency). A token
bucket limits the messages a session accepts (``RATE_PER_S``, burst ``RATE_BURST``); what
is over it is refused with 429 and changes nothing.

Modes: ``turn`` — a chunk starts on a newly pressed key (unless a chunk is running: the
press is then only a change of held keys) or a Step; ``continuous`` — chunks back to back,
each with the keys held when it starts, until paused. ``pause`` switches to waiting (then
a press or a Step runs one chunk, as in turn mode); ``continue`` switches to continuous.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

from .protocol import ACTIONS, MAX_PENDING_STEPS, MODES, RATE_BURST, RATE_PER_S, PlayRequestError


@dataclass(frozen=True)
class ChunkRequest:
    """A chunk the page asked for: the keys held when it starts, and when the input that
    asked for it arrived (None: nobody asked, e.g. the next chunk of continuous play)."""

    keys: frozenset[str]
    asked_at: float | None
    why: str  # "press", "step", "continuous"


class TokenBucket:
    """``rate`` tokens a second up to ``burst``; ``take()`` is False when none is left."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float]) -> None:
        self.rate, self.burst, self.clock = float(rate), float(burst), clock
        self.tokens = float(burst)
        self.stamp = clock()

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


class PlayControls:
    """Thread-safe input state of one session (see the module docstring)."""

    def __init__(self, mode: str = "turn", rate: float = RATE_PER_S, burst: int = RATE_BURST,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if mode not in MODES:
            raise ValueError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
        self.clock = clock
        self._lock = threading.Condition()
        self._bucket = TokenBucket(rate, burst, clock)
        self.continuous = mode == "continuous"
        self.paused = False  # continuous play paused by the page (it then waits as in turn mode)
        self.keys: frozenset[str] = frozenset()
        self.running = False  # a chunk is being made (set by the session loop)
        self.stop_requested = False
        self.last_input = clock()
        self.refused = 0  # messages refused by the rate limit or a full queue
        self._press_at: float | None = None  # a pending turn-based press
        self._steps: list[float] = []  # pending Steps, their arrival times
        self._unanswered_since: float | None = None  # earliest input no chunk has answered

    # ---------------------------------------------------------------- the page's side
    def _admit(self) -> float:
        if not self._bucket.take():
            self.refused += 1
            raise PlayRequestError(429, f"too many messages: at most {RATE_PER_S:g} a second (bursts of "
                                   f"{RATE_BURST}); this one was dropped, the session goes on")
        now = self.clock()
        self.last_input = now
        return now

    def set_keys(self, keys: frozenset[str]) -> None:
        """The keys the page holds now (a newly pressed key is a press in turn mode)."""
        with self._lock:
            now = self._admit()
            pressed = keys - self.keys
            self.keys = frozenset(keys)
            if self._unanswered_since is None:
                self._unanswered_since = now
            if pressed and not self.continuous and not self.running and self._press_at is None:
                self._press_at = now
            self._lock.notify_all()

    def act(self, action: str) -> None:
        """A control action: step, pause, continue or stop."""
        if action not in ACTIONS:
            raise PlayRequestError(400, f"action: {action!r} is not one of {', '.join(ACTIONS)}")
        with self._lock:
            now = self._admit()
            if action == "step":
                if len(self._steps) >= MAX_PENDING_STEPS:
                    self.refused += 1
                    raise PlayRequestError(429, f"{MAX_PENDING_STEPS} Steps are already waiting; this one was "
                                           "dropped")
                self._steps.append(now)
            elif action == "pause":
                self.paused, self.continuous = True, False
            elif action == "continue":
                self.paused, self.continuous = False, True
            else:
                self.stop_requested = True
            self._lock.notify_all()

    def stop(self) -> None:
        """Stop from the server's side (not rate limited)."""
        with self._lock:
            self.stop_requested = True
            self._lock.notify_all()

    # ---------------------------------------------------------------- the session's side
    def take_request(self) -> ChunkRequest | None:
        """The chunk to start now, if the page asked for one (and mark its inputs answered)."""
        with self._lock:
            if self.stop_requested:
                return None
            if self._steps:
                asked, why = self._steps.pop(0), "step"
            elif self.continuous:
                asked, why = self._unanswered_since, "continuous"
            elif self._press_at is not None:
                asked, why = self._press_at, "press"
            else:
                return None
            self._press_at = None
            self._unanswered_since = None
            self.running = True
            return ChunkRequest(self.keys, asked, why)

    def chunk_done(self) -> None:
        with self._lock:
            self.running = False

    def wait(self, timeout: float) -> None:
        """Sleep until an input arrives or ``timeout`` seconds pass."""
        with self._lock:
            self._lock.wait(timeout)

    def state(self) -> str:
        """What the session is doing, as the protocol names it (before it ends)."""
        with self._lock:
            if self.running or self.continuous:
                return "running"
            return "paused" if self.paused else "waiting"
