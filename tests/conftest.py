"""Shared test setup: import the checkout as ``comfyui_lingbot_world``."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from _standalone import import_pack  # noqa: E402

import_pack()

# Example data from the reference repository; present in CI, absent on users' machines.
EXAMPLES = Path(os.environ.get("LINGBOT_EXAMPLES", ROOT.parent / "shared" / "lingbot_examples"))


@pytest.fixture
def examples_dir() -> Path:
    if not EXAMPLES.is_dir():
        pytest.skip(f"example data not found at {EXAMPLES}")
    return EXAMPLES


@pytest.fixture(scope="module")
def comfy_models():
    """Override in a module of integration/ or browser/: a callable that fills the server's
    models/ folder before it starts (``tiny_package.comfy_models_builder``). None: nothing."""
    return None


@pytest.fixture(scope="module")
def comfy_server_options() -> dict:
    """Override in a module of integration/ or browser/: extra ``ComfyServer`` keyword
    arguments (``extra_args``, ``env``)."""
    return {}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs CUDA; skipped without it")
    config.addinivalue_line("markers", "comfy: starts a real ComfyUI server")
    config.addinivalue_line("markers", "browser: drives the ComfyUI frontend in headless Chromium")


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
