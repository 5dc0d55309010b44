"""Drive the real ComfyUI frontend (comfyui-frontend-package) in headless Chromium.

Playwright's Python package talks to Debian's Chromium at /usr/bin/chromium; Playwright's
own browser download is never used (it cannot be fetched here). Every operation goes
through the frontend's own JavaScript objects (``window.app``, ``window.LiteGraph``), the
same code a person's clicks end up in.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from comfy_server import ComfyServer, ComfyServerError, PromptRejected  # noqa: E402

CHROMIUM_ARGS = [
    "--no-sandbox",  # we run as root
    "--disable-gpu",
    "--disable-dev-shm-usage",
    # No network beyond loopback here: stop Chromium from trying (and stalling on it).
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
# Settings for a fresh user folder, so that no first-run dialog covers the canvas.
QUIET_SETTINGS = {
    "Comfy.TutorialCompleted": True,
    "Comfy.Workflow.ShowMissingNodesWarning": False,
    "Comfy.Workflow.ShowMissingModelsWarning": False,
}

_JS_READY = """() => !!(window.app && window.app.graph && window.app.canvas && window.LiteGraph
    && Object.keys(window.LiteGraph.registered_node_types || {}).length > 0)"""

# Types used in the current graph, subgraph contents included; subgraph instances are typed
# by the subgraph's id, which is not a registered node type.
_JS_NODE_TYPES = """() => {
    const graphs = [window.app.graph];
    const subgraphs = window.app.graph.subgraphs;
    if (subgraphs && subgraphs.values) graphs.push(...subgraphs.values());
    const subgraphIds = new Set(graphs.slice(1).map(g => g.id));
    const types = [];
    for (const g of graphs)
        for (const n of (g.nodes || g._nodes || []))
            if (!subgraphIds.has(n.type)) types.push(n.type);
    return types;
}"""


def chromium_path() -> Path | None:
    """Debian's Chromium ($LINGBOT_CHROMIUM overrides), or None when not installed."""
    configured = os.environ.get("LINGBOT_CHROMIUM")
    if configured:
        return Path(configured) if Path(configured).is_file() else None
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    for candidate in (Path("/usr/bin/chromium"), Path(found) if found else None):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def prepare_user_settings(server: ComfyServer, settings: dict[str, Any] | None = None) -> Path:
    """Write the default user's frontend settings before the page first loads."""
    path = server.user_dir / "default" / "comfy.settings.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    current = json.loads(path.read_text()) if path.exists() else {}
    current.update(QUIET_SETTINGS if settings is None else settings)
    path.write_text(json.dumps(current, indent=1))
    return path


class ComfyFrontend:
    """One browser page showing the ComfyUI served by ``server``."""

    def __init__(self, page, server: ComfyServer):
        self.page = page
        self.server = server
        self.console: list[str] = []
        self.page_errors: list[str] = []
        page.on("console", lambda msg: self.console.append(f"{msg.type}: {msg.text}"))
        page.on("pageerror", lambda err: self.page_errors.append(str(err)))

    def open(self, timeout: float = 90.0) -> "ComfyFrontend":
        """Load the page and wait until the app has its graph and the node definitions."""
        self.page.goto(self.server.url + "/", wait_until="domcontentloaded", timeout=timeout * 1000)
        self.wait_ready(timeout)
        return self

    def reload(self, timeout: float = 90.0) -> "ComfyFrontend":
        """Reload the page as a fresh app (the default graph, not the last test's one,
        which the frontend keeps in browser storage) and wait until it is ready."""
        self.page.evaluate("() => { localStorage.clear(); sessionStorage.clear(); }")
        self.console.clear()
        self.page_errors.clear()
        self.page.reload(wait_until="domcontentloaded", timeout=timeout * 1000)
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 90.0) -> None:
        try:
            self.page.wait_for_function(_JS_READY, timeout=timeout * 1000)
        except Exception as exc:  # Playwright's TimeoutError: add what the page said
            raise ComfyServerError(
                f"ComfyUI frontend not ready after {timeout}s: {exc}\n"
                f"page errors: {self.page_errors[-10:]}\nconsole: {self.console[-20:]}") from exc

    def registered_node_types(self) -> list[str]:
        return self.page.evaluate("() => Object.keys(window.LiteGraph.registered_node_types)")

    def load_workflow(self, workflow: dict) -> None:
        """Load a UI-format workflow through ``app.loadGraphData`` (dialogs suppressed)."""
        self.page.evaluate(
            """async (wf) => {
                await window.app.loadGraphData(wf, true, true, null,
                    {showMissingNodesDialog: false, showMissingModelsDialog: false});
            }""", workflow)
        # Let the canvas draw the new graph before anyone screenshots it.
        self.page.evaluate("() => window.app.canvas.setDirty(true, true)")

    def node_types(self) -> list[str]:
        """The type of every node in the current graph."""
        return self.page.evaluate(_JS_NODE_TYPES)

    def missing_node_types(self) -> list[str]:
        """Types in the current graph that the frontend has no definition for."""
        registered = set(self.registered_node_types())
        return sorted({t for t in self.node_types() if t not in registered})

    def workflow(self) -> dict:
        """The current graph in UI format (what "Save" would write)."""
        return self.page.evaluate("() => window.app.graph.serialize()")

    def graph_to_prompt(self) -> dict:
        """The current graph converted by the frontend to the API format (``output``)."""
        return self.page.evaluate("async () => (await window.app.graphToPrompt()).output")

    def queue_current(self, timeout: float = 30.0) -> str:
        """Queue the current graph as the Queue button does; returns the prompt_id.

        Raises ``PromptRejected`` with the server's JSON when validation fails.
        """
        def is_prompt_post(response) -> bool:
            return (response.request.method == "POST"
                    and response.url.split("?")[0].rstrip("/").endswith("/prompt"))

        with self.page.expect_response(is_prompt_post, timeout=timeout * 1000) as caught:
            self.page.evaluate("() => { window.app.queuePrompt(0, 1); }")
        response = caught.value
        data = response.json()
        if response.status == 400:
            raise PromptRejected(response.status, data)
        if not response.ok:
            raise ComfyServerError(f"POST /prompt from the page answered {response.status}: {data}")
        return data["prompt_id"]

    def screenshot(self, path: Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(path))
        return path
