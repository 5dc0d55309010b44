"""Fixtures for tests that drive the ComfyUI frontend in headless Chromium.

``comfy_server`` here is a server that serves the frontend, one per module; override
``comfy_models`` / ``comfy_server_options`` in a module as in tests/integration.
``frontend`` is the module's page, (re)loaded for each test with the app ready; when a test fails, a screenshot
of that page is saved to test-artifacts/browser/.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from comfy_host import artifacts_dir, safe_name  # noqa: E402
from frontend import CHROMIUM_ARGS, ComfyFrontend, chromium_path, prepare_user_settings  # noqa: E402
from comfy_server import ComfyServer, require_host  # noqa: E402

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.browser)
            item.add_marker(pytest.mark.comfy)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"lingbot_report_{report.when}", report)


@pytest.fixture(scope="session")
def browser():
    """Debian's Chromium through Playwright, shared by the whole run."""
    pytest.importorskip("playwright.sync_api", reason="pip install playwright (scripts/test.sh does)")
    executable = chromium_path()
    if executable is None:
        pytest.skip("Chromium not found at /usr/bin/chromium: apt-get install chromium "
                    "(scripts/test.sh does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=str(executable), headless=True,
                                              args=CHROMIUM_ARGS)
        yield instance
        instance.close()


@pytest.fixture(scope="module")
def comfy_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                 comfy_models, comfy_server_options: dict) -> Iterator[ComfyServer]:
    """A running ComfyUI that serves the frontend, with the pack installed."""
    host = require_host()
    if importlib.util.find_spec("comfyui_frontend_package") is None:
        pytest.skip("pip install comfyui-frontend-package==1.32.9 (scripts/test.sh does)")
    name = safe_name(request.module.__name__)
    server = ComfyServer(tmp_path_factory.mktemp(name), host_root=host, name=name,
                         frontend=True, **comfy_server_options)
    prepare_user_settings(server)
    if comfy_models is not None:
        comfy_models(server.models_dir)
    with server:
        yield server


@pytest.fixture(scope="module")
def frontend_page(browser, comfy_server: ComfyServer) -> Iterator[ComfyFrontend]:
    """One browser context and page per module; ``frontend`` reloads it for each test."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        yield ComfyFrontend(context.new_page(), comfy_server)
    finally:
        context.close()


@pytest.fixture
def frontend(frontend_page: ComfyFrontend, request: pytest.FixtureRequest) -> Iterator[ComfyFrontend]:
    """The ComfyUI app freshly (re)loaded and ready; a failed test leaves a screenshot."""
    try:
        if frontend_page.page.url.startswith(frontend_page.server.url):
            frontend_page.reload()
        else:
            frontend_page.open()
        yield frontend_page
    finally:
        report = getattr(request.node, "lingbot_report_call", None)
        if report is None or report.failed:
            shot = artifacts_dir("browser") / f"{safe_name(request.node.name)}-failed.png"
            try:
                frontend_page.page.screenshot(path=str(shot))
            except Exception:  # the page may be gone; the failure itself is what matters
                pass


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """LINGBOT_REPEAT=N runs each selected test N times on the module's one server (a race
    hunted in a row: `LINGBOT_REPEAT=20 bash scripts/test.sh tests/browser/test_play_ui.py -k
    real_keys`); unset, nothing changes (no parameter, the same test ids)."""
    import os

    repeat = int(os.environ.get("LINGBOT_REPEAT", "1") or 1)
    if repeat > 1:
        metafunc.fixturenames.append("lingbot_repeat")
        metafunc.parametrize("lingbot_repeat", range(repeat), ids=lambda i: f"run{i + 1}")
