"""Driving ``devices=sequence_parallel`` in a real ComfyUI server over HTTP: the Fast clip
template and the Play workflow with the Fast DiT Loader set to sequence parallel, the worker
processes as ``GET /lingbot/status`` and the OS see them, a worker killed, and the GPUs'
used memory as ``nvidia-smi`` reads it. Shared by tests/integration/test_sequence_parallel_server.py
(two gloo ranks on the CPU) and tests/gpu/test_server_two_gpus.py (two GPUs, NCCL)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent / "integration"))
import tiny_package  # noqa: E402
from comfy_host import ROOT  # noqa: E402
from comfy_server import ComfyServer, RunResult, video_info, wait_for  # noqa: E402
from shipped_workflows import TEMPLATES, template_prompt  # noqa: E402

WIDTH, HEIGHT = 48, 32
FAST_LOADER = "LingBotWorldFastDiTLoader"
PLAY_NODE = "6"  # in workflows/api/lingbot_play.json
PLAY_ROUTE = "/lingbot/play"


# --------------------------------------------------------------------------- prompts

def _sequence_parallel(graph: dict) -> dict:
    """Every Fast DiT Loader of ``graph`` on the sequence-parallel mode, the bf16 folder loaded as
    stored (no bitsandbytes needed)."""
    loaders = [node for node in graph.values() if node["class_type"] == FAST_LOADER]
    assert loaders, "the graph has no Fast DiT Loader"
    for node in loaders:
        node["inputs"].update(devices="sequence_parallel", bf16_quantize="none")
    return graph


def fast_clip_prompt(object_info: dict, frames: int = 9, seed: int = 42) -> dict:
    """The Fast clip template (example_workflows/) as the page queues it, shrunk to WIDTH x HEIGHT
    and ``frames``, on the sequence-parallel mode."""
    ui = json.loads((ROOT / "example_workflows" / f"{TEMPLATES['lingbot_fast_clip']}.json").read_text(encoding="utf-8"))
    graph = tiny_package.small_workflow(template_prompt(ui, object_info), frames=frames, width=WIDTH, height=HEIGHT)
    for node in graph.values():
        if node["class_type"] == "LingBotWorldFastSampler":
            node["inputs"]["seed"] = seed  # a new seed: never a cached repeat of an earlier run
    return _sequence_parallel(graph)


def play_prompt(mode: str, chunk_budget: int, idle_timeout: int = 60) -> dict:
    """workflows/api/lingbot_play.json (equal to the Play template: tests/unit/test_shipped_workflows.py)
    at WIDTH x HEIGHT with a fresh prompt, on the sequence-parallel mode."""
    graph = json.loads((ROOT / "workflows" / "api" / "lingbot_play.json").read_text())
    graph[PLAY_NODE]["inputs"].update(width=WIDTH, height=HEIGHT, mode=mode, chunk_budget=chunk_budget,
                                      idle_timeout=idle_timeout)
    graph["2"]["inputs"]["prompt"] = f"a walk through a pine forest, take {uuid.uuid4().hex[:8]}"
    return _sequence_parallel({k: {"class_type": n["class_type"], "inputs": n["inputs"]} for k, n in graph.items()})


def videos(server: ComfyServer, result: RunResult) -> list[Path]:
    return [f for f in server.output_files(result) if f.suffix == ".mp4"]


def check_video(server: ComfyServer, result: RunResult, frames: int | None = None) -> None:
    (video,) = videos(server, result)
    info = video_info(video)
    assert (info.width, info.height) == (WIDTH, HEIGHT), info
    assert info.frames > 0 and (frames is None or info.frames == frames), info


def error_message(result: RunResult) -> str:
    error = result.error or {}
    return f"{error.get('exception_type')}: {error.get('exception_message')}"


# --------------------------------------------------------------------------- Play over HTTP

def play_events(server: ComfyServer, kind: str, session_id: str | None = None) -> list[dict]:
    return [data for event, data in server._events.all_events if event == f"lingbot.play.{kind}"
            and (session_id is None or data.get("session_id") == session_id)]


def start_play(server: ComfyServer, mode: str, chunk_budget: int) -> tuple[str, str]:
    """Queue a Play prompt; (prompt_id, session_id) once its session has started."""
    before = {d["session_id"] for d in play_events(server, "started")}
    prompt_id = server.queue(play_prompt(mode, chunk_budget))
    started = wait_for(lambda: [d for d in play_events(server, "started") if d["session_id"] not in before],
                       "the Play session to start", server, timeout=300)
    return prompt_id, started[0]["session_id"]


def press(server: ComfyServer, session_id: str, keys: str) -> requests.Response:
    """The page's two key posts of a press in turn mode: all released, then ``keys`` held."""
    reply = None
    for held in ("", keys):
        body = json.dumps({"client_id": server._events.client_id, "keys": held}).encode()
        reply = requests.post(f"{server.url}{PLAY_ROUTE}/{session_id}/keys", data=body,
                              headers={"Content-Type": "application/json"}, timeout=30)
        assert reply.status_code == 200, reply.text
    return reply


# --------------------------------------------------------------------------- the worker processes

def workers(server: ComfyServer) -> dict | None:
    """``workers`` of ``GET /lingbot/status``: None until a run first started them."""
    return server.get("/lingbot/status").json()["workers"]


def worker_pids(server: ComfyServer) -> list[int]:
    state = workers(server)
    return list(state["pids"]) if state and state["running"] else []


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (the workers, multiprocessing's resource tracker)."""
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def alive(pids: list[int]) -> list[int]:
    import psutil

    living = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                living.append(pid)
        except psutil.NoSuchProcess:
            pass
    return living


def wait_gone(pids: list[int], timeout: float = 30.0) -> list[int]:
    """The processes of ``pids`` still alive after up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive(pids)


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


# --------------------------------------------------------------------------- GPU memory

def gpu_used_mib() -> list[int]:
    """Used memory of every GPU in MiB as the driver reports it (all processes), by nvidia-smi's
    index; with no nvidia-smi, ``torch.cuda.mem_get_info`` in a separate process (whose own CUDA
    context is then counted each time alike)."""
    smi = shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run([smi, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        rows = sorted(tuple(int(v) for v in line.split(",")) for line in out.strip().splitlines())
        return [used for _, used in rows]
    code = ("import torch\n"
            "print(*[(lambda f, t: (t - f) >> 20)(*torch.cuda.mem_get_info(i)) "
            "for i in range(torch.cuda.device_count())])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    return [int(v) for v in out.split()]


def settled_gpu_used_mib(target: list[int] | None = None, tolerance_mib: list[int] | None = None,
                         timeout: float = 30.0) -> list[int]:
    """``gpu_used_mib`` read until every GPU is within its tolerance of ``target`` (memory goes
    back asynchronously: a process exiting, ComfyUI's worker thread acting on /free) or
    ``timeout`` passes; the last reading."""
    deadline = time.monotonic() + timeout
    while True:
        used = gpu_used_mib()
        if target is None or all(u <= t + tol for u, t, tol in zip(used, target, tolerance_mib)):
            return used
        if time.monotonic() > deadline:
            return used
        time.sleep(0.5)


def steady_gpu_used_mib(timeout: float = 15.0) -> list[int]:
    """``gpu_used_mib`` once two readings half a second apart agree (a process that just
    exited, an allocator that just emptied its cache, may still be on its way), or after ``timeout``."""
    deadline = time.monotonic() + timeout
    last = gpu_used_mib()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = gpu_used_mib()
        if now == last:
            return now
        last = now
    return last


def gpu_processes() -> dict[int, list[int]] | None:
    """pid -> the GPUs (nvidia-smi index) on which it holds memory; None where the driver lists
    no process at all (no nvidia-smi, or a container whose processes it cannot see)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    query = subprocess.run([smi, "--query-gpu=index,pci.bus_id", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=60, check=True).stdout
    index = {bus.strip().lower(): int(i) for i, bus in (line.split(",") for line in query.strip().splitlines())}
    apps = subprocess.run([smi, "--query-compute-apps=pid,gpu_bus_id", "--format=csv,noheader"],
                          capture_output=True, text=True, timeout=60).stdout
    held: dict[int, list[int]] = {}
    for line in apps.strip().splitlines():
        pid, bus = (v.strip() for v in line.split(",")[:2])
        if pid.isdigit():
            held.setdefault(int(pid), []).append(index.get(bus.lower(), -1))
    return held or None
