"""Import this checkout as a Python package outside ComfyUI.

ComfyUI imports the pack under its folder name (which may contain hyphens). Tests and the
command-line tools need a stable, importable name instead; this registers the checkout
as ``comfyui_lingbot_world`` without installing anything.
"""
from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

PACKAGE = "comfyui_lingbot_world"
ROOT = Path(__file__).resolve().parent


def import_pack() -> types.ModuleType:
    """Return the pack as the package ``comfyui_lingbot_world`` (idempotent)."""
    if PACKAGE in sys.modules:
        return sys.modules[PACKAGE]
    spec = importlib.util.spec_from_file_location(
        PACKAGE, ROOT / "__init__.py", submodule_search_locations=[str(ROOT)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module
    spec.loader.exec_module(module)
    return module
