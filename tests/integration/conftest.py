"""Fixtures that start the real ComfyUI host with this pack installed.

One server per test module (``comfy_server``). A module that needs files in the server's
models folder overrides ``comfy_models`` (its default, None, is in tests/conftest.py) to
return a callable; it runs BEFORE the server starts, with the server's models/ folder:

    @pytest.fixture(scope="module")
    def comfy_models():
        def build(models: Path) -> None:
            make_tiny_package(models / "lingbot" / "tiny")
        return build

``comfy_server_options`` (module scope, a dict of ``ComfyServer`` keyword arguments such as
``extra_args`` or ``env``) can be overridden the same way. Tests that need a server of their
own use ``comfy_server_factory``.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from comfy_host import safe_name  # noqa: E402
from comfy_server import ComfyServer, require_host  # noqa: E402

ModelsBuilder = Callable[[Path], None]
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    # Everything in this folder starts ComfyUI: let `-m "not comfy"` leave it out.
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.comfy)


@pytest.fixture(scope="module")
def comfy_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                 comfy_models: ModelsBuilder | None, comfy_server_options: dict) -> Iterator[ComfyServer]:
    """A running ComfyUI with the pack, shared by the tests of one module."""
    host = require_host()
    name = safe_name(request.module.__name__)
    server = ComfyServer(tmp_path_factory.mktemp(name), host_root=host, name=name,
                         **comfy_server_options)
    if comfy_models is not None:
        comfy_models(server.models_dir)
    with server:
        yield server


@pytest.fixture
def comfy_server_factory(request: pytest.FixtureRequest,
                         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., ComfyServer]]:
    """``start(models=None, **options) -> ComfyServer``: a started server for this test only,
    stopped when the test ends."""
    started: list[ComfyServer] = []

    def start(models: ModelsBuilder | None = None, **options) -> ComfyServer:
        host = require_host()
        name = safe_name(f"{request.node.name}-{len(started)}")
        server = ComfyServer(tmp_path_factory.mktemp(name), host_root=host, name=name, **options)
        if models is not None:
            models(server.models_dir)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()
