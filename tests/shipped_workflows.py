"""The workflows the pack ships: API graphs (workflows/api) and the UI templates beside them."""
from __future__ import annotations

# API graph name -> UI template name. The Templates dialog shows a custom node's template
# file name as the card's title and (with - and _ as spaces) as its description, so the
# templates are named for people.
TEMPLATES = {
    "lingbot_camera_files": "LingBot-World camera path from files",
    "lingbot_camera_preset": "LingBot-World camera preset",
    "lingbot_no_camera": "LingBot-World image to video without camera",
    "lingbot_fast": "LingBot-World fast mode camera preset",
    "lingbot_long_walk": "LingBot-World long walk",
    "lingbot_fast_clip": "LingBot-World Fast clip",
    "lingbot_fast_walk": "LingBot-World Fast one-minute walk",
    "lingbot_act2cam": "LingBot-World act2cam (official settings)",
    "lingbot_play": "LingBot-World Play",
}
# The LingBot-World Fast graphs (their frames fill whole 12-frame chunks: 9, 21, ...).
FAST_WORKFLOWS = ("lingbot_fast_clip", "lingbot_fast_walk")
# A live session: it waits for keys, so it is not run like the others (tests/integration/test_play_server.py
# runs its API graph; the browser test of the Play panel runs the template).
LIVE_TEMPLATES = ("lingbot_play",)
