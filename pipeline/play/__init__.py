"""LingBot-World Play: a Fast session driven live by the keys a page holds.

* ``session``: ``PlaySession`` (the loop: keys → camera → Fast chunk → decode → file and
  page), ``PlaySettings``, ``PlayResult``.
* ``controls``: ``PlayControls``, the session's input state fed by the server's routes
  (rate limited, bounded), and the turn-based / continuous rules.
* ``chunk_camera``: ``PlayCamera``, the keys of each chunk → its Plücker rays under the Play law
  (``wan/play_camera.py``), and the action log.
* ``protocol``: the event names, limits and the strict readers of the page's messages
  (docs/play_protocol.md).
* ``registry``: ``SESSIONS``, the running session and the last ended one.
* ``frames``: decoded frames as base64 JPEG strings for the page.
"""
from .controls import ChunkRequest, PlayControls
from .protocol import PlayRequestError
from .registry import SESSIONS
from .session import PlayResult, PlaySession, PlaySettings

__all__ = ["ChunkRequest", "PlayControls", "PlayRequestError", "PlayResult", "PlaySession", "PlaySettings",
           "SESSIONS"]
