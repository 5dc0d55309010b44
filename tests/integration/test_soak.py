"""Soak: the same workflow, run after run, on one server: memory must not creep.

CPU (CI): 10 runs of the small camera-files workflow on the tiny package. GPU (marked
``gpu``, needs $LINGBOT_A14B_PACKAGE, a package of the real A14B geometry): 5 runs at a
small size with few steps. Each run changes the seed and the prompt, so ComfyUI's output
cache and the pack's prompt cache skip nothing: T5, both experts and the VAE decoder load
in every run. Memory is read at the same point of every run (when it has finished, with
ComfyUI's cache as it is after a run); the last run must be within 5 % of the first.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import tiny_package
from comfy_host import ROOT, artifacts_dir
from comfy_server import ComfyServer, require_host

WORKFLOW = json.loads((ROOT / "workflows" / "api" / "lingbot_camera_files.json").read_text())
CREEP_LIMIT = 0.05


@pytest.fixture(scope="module")
def comfy_models(tmp_path_factory: pytest.TempPathFactory):
    return tiny_package.comfy_models_builder(tmp_path_factory)


def run_number(graph: dict, index: int) -> dict:
    graph = json.loads(json.dumps(graph))
    graph["6"]["inputs"]["seed"] = 1000 + index
    graph["2"]["inputs"]["prompt"] = f"{graph['2']['inputs']['prompt']} (soak run {index})"
    return graph


def lingbot_status(server: ComfyServer) -> dict:
    reply = server.get("/lingbot/status")
    assert reply.status_code == 200, f"GET /lingbot/status answered {reply.status_code}"
    return reply.json()


def soak(server: ComfyServer, graph: dict, runs: int, timeout: float, vram=None) -> list[dict]:
    readings = []
    for index in range(runs):
        result = server.run(run_number(graph, index), timeout=timeout)
        videos = [f for f in server.output_files(result) if f.suffix == ".mp4"]
        assert len(videos) == 1, result.describe()
        status = lingbot_status(server)
        assert status["experts_resident"] == [] and status["text_encoders_alive"] == 0 \
            and status["vaes_alive"] == 0 and status["dit_models_alive"] == 0, status
        memory = server.rss()
        reading = {"run": index + 1, "seconds": round(result.elapsed, 2),
                   "rss_anon_mb": memory["rss_anon"] / 2**20, "rss_peak_mb": memory["rss_peak"] / 2**20}
        if vram is not None:
            reading["vram_used_mb"] = vram()
        readings.append(reading)
    return readings


def assert_no_creep(readings: list[dict], key: str) -> None:
    first, last = readings[0][key], readings[-1][key]
    assert last <= first * (1 + CREEP_LIMIT), (
        f"{key}: {last:.1f} MB after run {len(readings)}, {first:.1f} MB after run 1:\n"
        + "\n".join(json.dumps(r) for r in readings))


def test_ten_runs_on_the_cpu_do_not_creep(comfy_server: ComfyServer) -> None:
    graph = tiny_package.small_workflow(WORKFLOW, frames=5, width=48, height=32, steps=3)
    readings = soak(comfy_server, graph, runs=10, timeout=120)
    (artifacts_dir("soak") / "cpu.json").write_text(json.dumps(readings, indent=1))
    assert_no_creep(readings, "rss_anon_mb")
    # The peak of run 10 is the peak of run 1: no run needs more room than the one before.
    assert_no_creep(readings, "rss_peak_mb")


# --------------------------------------------------------------------------- GPU


class GpuComfyServer(ComfyServer):
    """The same server without --cpu, so ComfyUI computes on the GPU."""

    def command(self, *extra: str) -> list[str]:
        return [arg for arg in super().command(*extra) if arg != "--cpu"]


def _vram_used_mb() -> float:
    """Memory in use on GPU 0 as the driver reports it (what other processes see)."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return float(out.strip().splitlines()[0])


@pytest.mark.gpu
def test_five_a14b_runs_on_the_gpu_do_not_creep(tmp_path: Path) -> None:
    package = os.environ.get("LINGBOT_A14B_PACKAGE")
    if not package or not Path(package).is_dir():
        pytest.skip("set LINGBOT_A14B_PACKAGE to a LingBot-World package of the A14B geometry (NF4 layout)")
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi is needed to read VRAM use")
    server = GpuComfyServer(tmp_path / "gpu-soak", host_root=require_host(), name="gpu-soak", start_timeout=300)
    tiny_package.install_for_comfy(server.models_dir, server.input_dir, tmp_path / "unused")
    link = server.models_dir / "lingbot" / tiny_package.COMFY_PACKAGE_NAME
    link.unlink()
    link.symlink_to(Path(package).resolve(), target_is_directory=True)
    # 17 frames at 240x416 with 4 steps: every stage and both experts, minutes not hours.
    graph = tiny_package.small_workflow(WORKFLOW, frames=17, width=416, height=240, steps=4)
    with server:
        readings = soak(server, graph, runs=5, timeout=1800, vram=_vram_used_mb)
    (artifacts_dir("soak") / "gpu.json").write_text(json.dumps(readings, indent=1))
    assert_no_creep(readings, "rss_anon_mb")
    assert_no_creep(readings, "vram_used_mb")
