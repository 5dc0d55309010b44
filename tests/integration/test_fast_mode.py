"""Fast mode in a real ComfyUI server: the shipped fast workflow computes fewer forwards
than the exact one, and the LoRA Loader runs a LoRA from models/loras (a malformed file
fails with its file and key named, and the server goes on).

The forwards are read from the sampler's log line in the server's log.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import tiny_package
from comfy_host import ROOT
from comfy_server import ComfyServer, video_info
from synthetic_lora import write_kohya_lora

SAMPLER, DIT_LOADER, SAVE_VIDEO = "6", "4", "9"
LORA = "20"
STEPS = 12
BAD_KEY = "lora_unet_blocks_1_self_attn_q.lora_up.weight"
STATS = re.compile(r"LingBot sampler: (\d+) of (\d+) forwards computed over (\d+) steps \((\d+) skipped by the "
                   r"step cache, (\d+) dropped by CFG truncation")


@pytest.fixture(scope="module")
def comfy_models(tmp_path_factory: pytest.TempPathFactory):
    def loras(models: Path, package: Path) -> None:
        folder = models / "loras" / "lingbot_test"
        write_kohya_lora(folder / "tiny_high.safetensors", package / "high_noise_model_bnb_nf4")
        write_kohya_lora(folder / "tiny_low.safetensors", package / "low_noise_model_bnb_nf4", seed=1)
        write_kohya_lora(folder / "broken.safetensors", package / "high_noise_model_bnb_nf4", wrong_shape_key=BAD_KEY)

    return tiny_package.comfy_models_builder(tmp_path_factory, loras)


def load_api(name: str) -> dict:
    return json.loads((ROOT / "workflows" / "api" / f"{name}.json").read_text())


def forwards_logged(server: ComfyServer, runs_before: int) -> tuple[int, ...]:
    """(computed, exact, steps, skipped, truncated) of the one sampler run since ``runs_before``."""
    found = STATS.findall(server.log_text())
    assert len(found) == runs_before + 1, server.log_tail()
    return tuple(int(v) for v in found[-1])


def runs_logged(server: ComfyServer) -> int:
    return len(STATS.findall(server.log_text()))


def video_of(server: ComfyServer, result) -> Path:
    (video,) = [f for f in server.output_files(result) if f.suffix == ".mp4"]
    return video


def with_lora(graph: dict, high: str, low: str, strength: float = 1.0) -> dict:
    """The graph with a LoRA Loader between the DiT Loader and the sampler."""
    graph = json.loads(json.dumps(graph))
    graph[LORA] = {"class_type": "LingBotWorldLoraLoader",
                   "inputs": {"dit": [DIT_LOADER, 0], "lora_high_noise": high, "strength_high": strength,
                              "lora_low_noise": low, "strength_low": strength}}
    graph[SAMPLER]["inputs"]["dit"] = [LORA, 0]
    return graph


def test_fast_workflow_computes_fewer_forwards_than_exact(comfy_server: ComfyServer) -> None:
    fast = tiny_package.small_workflow(load_api("lingbot_step_cache"), steps=STEPS)
    assert {k: fast[SAMPLER]["inputs"][k] for k in ("cache_threshold", "cfg_truncate", "attention")} == \
        {"cache_threshold": 0.05, "cfg_truncate": 0.2, "attention": "auto"}
    exact = json.loads(json.dumps(fast))
    for key in ("cache_threshold", "cfg_truncate", "attention", "preset"):
        del exact[SAMPLER]["inputs"][key]  # an API graph from before fast mode: the exact sampler

    before = runs_logged(comfy_server)
    result = comfy_server.run(exact, timeout=240)
    assert forwards_logged(comfy_server, before) == (2 * STEPS, 2 * STEPS, STEPS, 0, 0)
    exact_video = video_info(video_of(comfy_server, result))

    before = runs_logged(comfy_server)
    result = comfy_server.run(fast, timeout=240)
    computed, total, steps, skipped, truncated = forwards_logged(comfy_server, before)
    assert (total, steps, truncated) == (2 * STEPS, STEPS, 2)  # floor(0.2 * 12) steps without the negative pass
    assert computed == total - skipped - truncated and computed < total
    video = video_info(video_of(comfy_server, result))
    assert (video.frames, video.width, video.height) == (exact_video.frames, exact_video.width, exact_video.height)
    assert (video.frames, video.width, video.height) == (5, 48, 32)


def test_lora_loader_runs_a_lora_from_models_loras(comfy_server: ComfyServer) -> None:
    info = comfy_server.object_info("LingBotWorldLoraLoader")
    options = info["input"]["required"]["lora_high_noise"]
    options = options[0] if isinstance(options[0], list) else options[1]["options"]
    assert "lingbot_test/tiny_high.safetensors" in options and options[0] == "none"

    graph = with_lora(tiny_package.small_workflow(load_api("lingbot_no_camera")),
                      "lingbot_test/tiny_high.safetensors", "lingbot_test/tiny_low.safetensors")
    result = comfy_server.run(graph, timeout=240)
    assert LORA in result.executed_nodes and SAMPLER in result.executed_nodes
    video = video_info(video_of(comfy_server, result))
    assert (video.frames, video.width, video.height) == (5, 48, 32)


def test_malformed_lora_is_an_execution_error_naming_file_and_key(comfy_server: ComfyServer) -> None:
    graph = with_lora(tiny_package.small_workflow(load_api("lingbot_no_camera")),
                      "lingbot_test/broken.safetensors", "none")
    graph[SAMPLER]["inputs"]["seed"] = 5  # not a cached repeat
    result = comfy_server.run(graph, timeout=240, check=False)
    assert result.status == "error", result.describe()
    error = result.error
    assert error["node_id"] == SAMPLER and error["node_type"] == "LingBotWorldSampler"
    assert "broken.safetensors" in error["exception_message"], error
    assert "lora_unet_blocks_1_self_attn_q" in error["exception_message"], error

    # The expert was released and the server still serves.
    state = comfy_server.get("/lingbot/status").json()
    assert state["experts_resident"] == [] and state["dit_models_alive"] == 0, state
    assert comfy_server.alive
    good = tiny_package.small_workflow(load_api("lingbot_no_camera"))
    good[SAMPLER]["inputs"]["seed"] = 6
    assert comfy_server.run(good, timeout=240).ok
