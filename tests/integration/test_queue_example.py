"""examples/queue_workflow.py against a real ComfyUI with the pack and a tiny package.

The example is run as a user would run it (a separate process, only its command line), on
the shipped camera-preset workflow shrunk through its own flags.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import tiny_package
from comfy_host import ROOT
from comfy_server import ComfyServer, video_info

EXAMPLE = ROOT / "examples" / "queue_workflow.py"
WORKFLOW = ROOT / "workflows" / "api" / "lingbot_camera_preset.json"
SMALL = ["--frames", "9", "--width", "48", "--height", "32", "--steps", "2"]


@pytest.fixture(scope="module")
def comfy_models(tmp_path_factory: pytest.TempPathFactory):
    return tiny_package.comfy_models_builder(tmp_path_factory)


@pytest.fixture(scope="module")
def photo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("photo") / "my photo.png"
    pixels = np.random.default_rng(3).integers(0, 255, (60, 90, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def run_example(server: ComfyServer, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(EXAMPLE), "--server", f"127.0.0.1:{server.port}",
               "--workflow", str(WORKFLOW), "--timeout", "120", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=ROOT)


def test_example_uploads_queues_follows_and_downloads(comfy_server: ComfyServer, photo: Path,
                                                      tmp_path: Path) -> None:
    out = tmp_path / "clips" / "flight.mp4"
    prompt = "a slow flight over a misty valley"
    done = run_example(comfy_server, "--image", str(photo), "--prompt", prompt, "--seed", "5",
                       "--preset", "orbit_right", *SMALL, "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr

    video = video_info(out)
    assert (video.frames, video.width, video.height) == (9, 48, 32), video
    # What was downloaded is byte for byte what SaveVideo wrote on the server.
    (saved,) = sorted(comfy_server.output_dir.rglob("*.mp4"))
    assert saved.read_bytes() == out.read_bytes()

    # The progress went by on the websocket, and the server ran what the flags asked for.
    assert re.search(r"node 6: 2/2", done.stdout), done.stdout
    prompt_id = re.search(r"queued prompt (\S+)", done.stdout).group(1)
    graph = comfy_server.history(prompt_id)["prompt"][2]
    assert (comfy_server.input_dir / photo.name).is_file()
    assert graph["1"]["inputs"]["image"] == photo.name
    assert graph["2"]["inputs"]["prompt"] == prompt
    assert graph["5"]["inputs"]["preset"] == "orbit_right" and graph["5"]["inputs"]["source"] == "preset"
    assert graph["6"]["inputs"]["seed"] == 5 and graph["6"]["inputs"]["steps"] == 2
    for node in ("3", "5"):
        sizes = graph[node]["inputs"]
        assert (sizes["width"], sizes["height"], sizes["frames"]) == (48, 32, 9)


def test_example_prints_validation_errors(comfy_server: ComfyServer, tmp_path: Path) -> None:
    done = run_example(comfy_server, "--steps", "0", "--frames", "5", "--width", "48", "--height", "32",
                       "--out", str(tmp_path / "never.mp4"))
    # ComfyUI would still queue the valid part (the camera path preview); the example
    # treats any validation error as a refusal.
    assert done.returncode == 2, done.stdout + done.stderr
    assert "refused" in done.stderr
    assert "node 6 (LingBotWorldSampler) input steps" in done.stderr, done.stderr
    assert not (tmp_path / "never.mp4").exists()


def test_example_reports_a_failing_node(comfy_server: ComfyServer, tmp_path: Path) -> None:
    done = run_example(comfy_server, "--width", "40", "--frames", "5", "--height", "32", "--steps", "2",
                       "--out", str(tmp_path / "never.mp4"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "failed" in done.stderr and "width" in done.stderr, done.stderr
    assert not (tmp_path / "never.mp4").exists()


class _History:
    """GET /history answers: empty until the ``ready``-th call (as v0.27 after execution_success)."""

    def __init__(self, ready: int, outputs: dict):
        self.calls, self.ready, self.outputs = 0, ready, outputs

    def get(self, url: str, timeout: float):
        self.calls += 1
        body = {"p1": {"outputs": self.outputs}} if self.calls >= self.ready else {}

        class Reply:
            def raise_for_status(self) -> None:
                pass

            def json(self) -> dict:
                return body

        return Reply()


def test_example_waits_for_history_to_hold_the_outputs() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("queue_workflow", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    video = {"filename": "LingBot-World_00001_.mp4", "subfolder": "video", "type": "output"}
    late = _History(ready=3, outputs={"9": {"images": [video], "animated": [True]}})
    assert example.saved_videos(late, "http://x", "p1", wait=5.0) == [video]
    assert late.calls == 3
    never = _History(ready=10**6, outputs={})
    assert example.saved_videos(never, "http://x", "p1", wait=0.3) == []
    assert never.calls >= 2
