"""The one way a bench script imports the pack: ``import _pack`` first, then
``comfyui_lingbot_world.…``.

Python puts bench/ on sys.path when a script in it runs (``python bench/x.py``); this module
adds the checkout above it and registers it as the package ``comfyui_lingbot_world``
(``_standalone.import_pack``), as the tests and the command-line tools do.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _standalone import import_pack  # noqa: E402

import_pack()
