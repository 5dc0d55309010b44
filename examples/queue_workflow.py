#!/usr/bin/env python3
"""Queue a LingBot-World workflow on a running ComfyUI and save the video it makes.

    pip install requests websocket-client
    python examples/queue_workflow.py --server 127.0.0.1:8188 \\
        --workflow workflows/api/lingbot_camera_preset.json --image my_photo.jpg \\
        --prompt "a slow flight over a misty valley" --out flight.mp4

Steps: upload the start image (POST /upload/image), load an API-format workflow and set
the prompt, image and any of seed / steps / frames / size / camera preset on the nodes that
take them (found by node type, so edited graphs work too), queue it (POST /prompt), print
the progress that ComfyUI sends over its websocket, then look the saved video up in
GET /history/<prompt_id> and download it with GET /view.

Exit status: 0 with the video written, 1 when the run failed or was cancelled, 2 when
ComfyUI refused the prompt (its validation errors are printed).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

import requests
import websocket  # websocket-client

VIDEO_SUFFIXES = (".mp4", ".webm", ".mov", ".mkv", ".gif")
SIZE_NODES = ("LingBotWorldVAEEncode", "LingBotWorldCamera")  # their width/height/frames must agree


class RunFailed(Exception):
    """The prompt was refused, failed or was cancelled; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def server_urls(server: str) -> tuple[str, str]:
    """'127.0.0.1:8188' or 'http(s)://host:port' -> (HTTP base URL, websocket URL)."""
    base = server.rstrip("/")
    if "://" not in base:
        base = "http://" + base
    ws = "ws" + base[len("http"):] if base.startswith("http") else base
    return base, ws + "/ws"


def nodes_of(graph: dict, class_type: str) -> list[dict]:
    return [node for node in graph.values() if node.get("class_type") == class_type]


def set_inputs(graph: dict, class_types: tuple[str, ...], **values) -> int:
    """Set the given inputs (None = leave as is) on every node of those types; returns
    how many nodes were changed."""
    values = {k: v for k, v in values.items() if v is not None}
    changed = 0
    for class_type in class_types:
        for node in nodes_of(graph, class_type):
            node["inputs"].update(values)
            changed += 1
    return changed


def upload_image(http: requests.Session, base: str, path: Path) -> str:
    """Upload into ComfyUI's input folder; returns the name LoadImage expects."""
    with path.open("rb") as handle:
        reply = http.post(f"{base}/upload/image", files={"image": (path.name, handle)},
                          data={"overwrite": "true", "type": "input"}, timeout=120)
    reply.raise_for_status()
    data = reply.json()
    return f"{data['subfolder']}/{data['name']}" if data.get("subfolder") else data["name"]


def customize(graph: dict, args: argparse.Namespace, image_name: str | None) -> None:
    if image_name is not None and not set_inputs(graph, ("LoadImage",), image=image_name):
        raise RunFailed("the workflow has no LoadImage node to take --image", 2)
    if (args.prompt is not None or args.negative_prompt is not None) and not set_inputs(
            graph, ("LingBotWorldTextEncode",), prompt=args.prompt, negative_prompt=args.negative_prompt):
        raise RunFailed("the workflow has no LingBotWorldTextEncode node to take --prompt", 2)
    set_inputs(graph, ("LingBotWorldSampler",), seed=args.seed, steps=args.steps)
    set_inputs(graph, SIZE_NODES, width=args.width, height=args.height, frames=args.frames)
    if args.preset is not None:
        if not set_inputs(graph, ("LingBotWorldCamera",), source="preset", preset=args.preset):
            raise RunFailed("--preset needs a workflow with a LingBotWorldCamera node", 2)


def queue(http: requests.Session, base: str, graph: dict, client_id: str) -> str:
    reply = http.post(f"{base}/prompt", json={"prompt": graph, "client_id": client_id}, timeout=60)
    try:
        data = reply.json()
    except ValueError:
        raise RunFailed(f"POST /prompt answered {reply.status_code}: {reply.text[:500]}")
    if reply.status_code == 400:
        raise RunFailed("ComfyUI refused the workflow:\n" + describe_refusal(data), 2)
    reply.raise_for_status()
    if data.get("node_errors"):
        # ComfyUI queues the outputs that did validate (here: maybe only a camera preview)
        # and drops the rest. Without the video that is not worth running: take it back out
        # of the queue (a no-op if it already started; it is a small part then).
        http.post(f"{base}/queue", json={"delete": [data["prompt_id"]]}, timeout=60)
        raise RunFailed("ComfyUI refused part of the workflow:\n" + describe_refusal(data), 2)
    return data["prompt_id"]


def describe_refusal(data: dict) -> str:
    lines = []
    error = data.get("error")
    if isinstance(error, dict) and error.get("message"):
        lines.append(f"  {error['message']}: {error.get('details', '')}".rstrip(": "))
    for node_id, node in (data.get("node_errors") or {}).items():
        for err in node.get("errors", []):
            name = (err.get("extra_info") or {}).get("input_name", "")
            lines.append(f"  node {node_id} ({node.get('class_type')}) input {name}: "
                         f"{err.get('message')} - {err.get('details')}")
    return "\n".join(lines) or json.dumps(data)[:1000]


def follow(ws: websocket.WebSocket, prompt_id: str, graph: dict, timeout: float) -> None:
    """Print progress until the prompt ends; raise RunFailed unless it succeeded."""
    deadline = time.monotonic() + timeout
    while True:
        if time.monotonic() > deadline:
            raise RunFailed(f"no result after {timeout:.0f}s (the prompt may still be running)")
        try:
            message = ws.recv()
        except websocket.WebSocketTimeoutException:
            continue
        if isinstance(message, bytes):
            continue  # preview images
        event = json.loads(message)
        kind, data = event.get("type"), event.get("data") or {}
        if data.get("prompt_id") not in (None, prompt_id):
            continue  # someone else's prompt
        if kind == "executing" and data.get("node") is not None:
            class_type = graph.get(str(data["node"]), {}).get("class_type", "?")
            print(f"running node {data['node']} ({class_type})", flush=True)
        elif kind == "progress":
            print(f"  node {data.get('node')}: {data.get('value')}/{data.get('max')}", flush=True)
        elif kind == "execution_success" or (kind == "executing" and data.get("node") is None
                                            and data.get("prompt_id") == prompt_id):
            return
        elif kind == "execution_error":
            raise RunFailed(f"node {data.get('node_id')} ({data.get('node_type')}) failed: "
                            f"{data.get('exception_type')}: {data.get('exception_message')}")
        elif kind == "execution_interrupted":
            raise RunFailed(f"cancelled in node {data.get('node_id')} ({data.get('node_type')})")


# ComfyUI sends execution_success before the prompt's entry lands in /history (newer hosts
# write it from another thread): ask again for a little while before giving up.
HISTORY_WAIT = 10.0
HISTORY_POLL = 0.25


def _videos_in(outputs: dict) -> list[dict]:
    found = []
    for node_output in outputs.values():
        for items in node_output.values():
            for item in items if isinstance(items, list) else []:
                if isinstance(item, dict) and str(item.get("filename", "")).lower().endswith(VIDEO_SUFFIXES):
                    found.append(item)
    return found


def saved_videos(http: requests.Session, base: str, prompt_id: str, wait: float = HISTORY_WAIT) -> list[dict]:
    """File entries ({filename, subfolder, type}) of the videos the prompt saved."""
    deadline = time.monotonic() + wait
    while True:
        reply = http.get(f"{base}/history/{prompt_id}", timeout=60)
        reply.raise_for_status()
        found = _videos_in(reply.json().get(prompt_id, {}).get("outputs", {}))
        if found or time.monotonic() >= deadline:
            return found
        time.sleep(HISTORY_POLL)


def download(http: requests.Session, base: str, item: dict, out: Path) -> Path:
    params = {"filename": item["filename"], "subfolder": item.get("subfolder", ""),
              "type": item.get("type", "output")}
    with http.get(f"{base}/view", params=params, stream=True, timeout=120) as reply:
        reply.raise_for_status()
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("wb") as handle:
            for chunk in reply.iter_content(chunk_size=1 << 20):
                handle.write(chunk)
    return out


def run(args: argparse.Namespace) -> Path:
    base, ws_url = server_urls(args.server)
    graph = json.loads(Path(args.workflow).read_text(encoding="utf-8"))
    if not isinstance(graph, dict) or not all(isinstance(n, dict) and "class_type" in n for n in graph.values()):
        raise RunFailed(f"{args.workflow} is not an API-format workflow (use workflows/api/*.json, "
                        "or 'Export (API)' in ComfyUI)", 2)
    client_id = uuid.uuid4().hex
    with requests.Session() as http:
        image_name = upload_image(http, base, Path(args.image)) if args.image else None
        customize(graph, args, image_name)
        # Listen before queueing, so that no message of a quick run is missed.
        ws = websocket.create_connection(f"{ws_url}?clientId={client_id}", timeout=5)
        try:
            prompt_id = queue(http, base, graph, client_id)
            print(f"queued prompt {prompt_id}", flush=True)
            follow(ws, prompt_id, graph, args.timeout)
        finally:
            ws.close()
        videos = saved_videos(http, base, prompt_id)
        if not videos:
            raise RunFailed("the run finished but saved no video (does the workflow end in Save Video?)")
        out = download(http, base, videos[0], Path(args.out))
    print(f"saved {out} ({out.stat().st_size} bytes; on the server: {videos[0]['filename']})")
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default="127.0.0.1:8188", help="ComfyUI address (host:port or URL)")
    parser.add_argument("--workflow", required=True, help="API-format workflow JSON")
    parser.add_argument("--image", help="start image to upload (default: the one the workflow names)")
    parser.add_argument("--prompt", help="what the video shows")
    parser.add_argument("--negative-prompt", help="what to avoid (default: the workflow's)")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--frames", type=int, help="4n+1, e.g. 81 (5 s at 16 fps)")
    parser.add_argument("--width", type=int, help="multiple of 16, e.g. 832")
    parser.add_argument("--height", type=int, help="multiple of 16, e.g. 480")
    parser.add_argument("--preset", help="camera preset for graphs with a camera: static, pan_left, pan_right, "
                        "tilt_up, tilt_down, dolly_in, dolly_out, orbit_left, orbit_right")
    parser.add_argument("--out", required=True, help="where to write the video")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to wait for the run")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        run(args)
    except RunFailed as failure:
        print(f"error: {failure}", file=sys.stderr)
        return failure.code
    except (requests.ConnectionError, ConnectionRefusedError) as exc:
        print(f"error: cannot reach ComfyUI at {args.server}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
