"""The Play sessions the server knows: the one running (ComfyUI runs one prompt at a time)
and the last one that ended (so the page can still read how it ended)."""
from __future__ import annotations

import threading
from typing import Protocol

from .controls import PlayControls


class Session(Protocol):
    session_id: str
    controller: str | None
    controls: PlayControls
    ended: bool
    end_reason: str | None

    def state(self) -> str: ...

    def status(self) -> dict: ...


class SessionRegistry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: Session | None = None
        self._last: Session | None = None

    def begin(self, session: Session) -> None:
        with self._lock:
            if self._running is not None and not self._running.ended:
                raise RuntimeError(f"a Play session is already running ({self._running.session_id}); "
                                   "stop it before starting another")
            self._running = session

    def end(self, session: Session) -> None:
        with self._lock:
            if self._running is session:
                self._running = None
            self._last = session

    def get(self, session_id: str) -> Session | None:
        """The running session or the last ended one with this id; None otherwise."""
        with self._lock:
            for session in (self._running, self._last):
                if session is not None and session.session_id == session_id:
                    return session
        return None

    def running(self) -> list[str]:
        with self._lock:
            return [self._running.session_id] if self._running is not None else []


SESSIONS = SessionRegistry()
