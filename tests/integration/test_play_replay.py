"""Acceptance (issue 27): a LingBot-World Play session replays from its action log ALONE, in a
real ComfyUI server (tiny Fast transformer, CPU, 48x32): a session of 2 steps a chunk steered
over HTTP is stopped, then the shipped 'Play replay' graph (the UI template as the page queues it, and
workflows/api/lingbot_play_replay.json) runs with nothing but the log file's name: the Play
Log node gives the prompt, the start image, the keys, the seed and the settings (steps
included) to the Fast clip nodes, and the Fast Sampler's latent equals the session's, bit for bit (both saved by
core Save Latent). The replay's .mp4 has the session's frame count."""
from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

import tiny_package
from comfy_host import ROOT
from comfy_server import ComfyServer, video_info
from shipped_workflows import REPLAY_TEMPLATES, TEMPLATES, template_prompt
from test_play_server import PLAY, play_events, play_graph, press, stop, wait_for

REPLAY = "lingbot_play_replay"
LOG = "LingBotWorld/play_00001_.json"  # the first session's log: the name the template ships


@pytest.fixture(scope="module")
def comfy_models(tmp_path_factory: pytest.TempPathFactory):
    return tiny_package.comfy_models_builder(tmp_path_factory)


def with_saved_latent(graph: dict, source: list, prefix: str) -> dict:
    """``graph`` plus a core Save Latent of ``source`` (a [node, slot] link)."""
    return {**graph, "99": {"class_type": "SaveLatent", "inputs": {"samples": source, "filename_prefix": prefix}}}


def saved_latent(server: ComfyServer, result) -> "torch.Tensor":  # noqa: F821
    (item,) = result.outputs["99"]["latents"]
    return load_file(str(server.output_dir / item["subfolder"] / item["filename"]))["latent_tensor"]


@pytest.fixture(scope="module")
def session(comfy_server: ComfyServer) -> dict:
    """A turn-based session of three chunks of 2 steps (keys w, wj, then l), stopped: its log and latent."""
    before = {d["session_id"] for d in play_events(comfy_server, kind="started")}
    prompt_id = comfy_server.queue(with_saved_latent(play_graph(seed=9, steps=2), [PLAY, 2], "latents/session"))
    started = wait_for(lambda: [d for d in play_events(comfy_server, kind="started") if d["session_id"] not in before],
                       "the session to start", comfy_server)
    session_id = started[0]["session_id"]
    for keys in ("w", "wj", "l"):
        press(comfy_server, session_id, keys)
    result = stop(comfy_server, session_id, prompt_id)
    assert result.ok, result.describe()
    log_file = comfy_server.output_dir / LOG
    log = json.loads(log_file.read_text())
    assert (log["actions"], log["steps"]) == ("w-8,wj-12,l-12", 2)
    return {"latent": saved_latent(comfy_server, result), "log": log_file}


def replay(server: ComfyServer, graph: dict, what: str):
    """Run a replay graph with its Fast Sampler's latent saved: (latent, the .mp4's frames)."""
    result = server.run(with_saved_latent(graph, ["6", 0], "latents/replay"), timeout=300, check=False)
    assert result.ok, f"{what}: {result.describe()}\n{server.log_tail()}"
    (video,) = [f for f in server.output_files(result) if f.suffix == ".mp4"]
    return saved_latent(server, result), video_info(video)


@pytest.mark.parametrize("source", ["template", "api"])
def test_a_session_replays_from_its_log_file_alone_bit_for_bit(comfy_server: ComfyServer, session: dict,
                                                               source: str):
    """Nothing is copied by hand: the graph names the log file; the prompt, start image, keys,
    seed and settings come from it."""
    if source == "template":
        ui = json.loads((ROOT / "example_workflows" / f"{TEMPLATES[REPLAY]}.json").read_text(encoding="utf-8"))
        graph = template_prompt(ui, comfy_server.object_info())
    else:
        graph = json.loads((ROOT / "workflows" / "api" / f"{REPLAY}.json").read_text(encoding="utf-8"))
    assert graph["1"]["inputs"]["log"] == LOG
    latent, video = replay(comfy_server, graph, f"{source} {REPLAY}")
    log = json.loads(session["log"].read_text())
    assert latent.shape == session["latent"].shape == (1, 16, 9, log["height"] // 8, log["width"] // 8)
    assert latent.dtype == session["latent"].dtype
    assert (latent == session["latent"]).all(), (latent - session["latent"]).abs().max()
    assert (video.frames, video.width, video.height) == (log["frames"], log["width"], log["height"]) == (33, 48, 32)


def test_a_replay_whose_start_image_changed_is_refused_naming_the_file(comfy_server: ComfyServer, session: dict):
    graph = json.loads((ROOT / "workflows" / "api" / f"{REPLAY}.json").read_text(encoding="utf-8"))
    image = comfy_server.input_dir / json.loads(session["log"].read_text())["start_image"]["file"]
    original = image.read_bytes()
    try:
        image.write_bytes(original + b"\0")  # same picture, another file
        result = comfy_server.run(graph, timeout=120, check=False)
        assert not result.ok
        assert f"the start image '{image.name}' has changed since the session" in result.describe()
    finally:
        image.write_bytes(original)


def test_the_replay_template_is_in_the_shipped_tables() -> None:
    assert REPLAY in TEMPLATES and REPLAY in REPLAY_TEMPLATES
    api = json.loads((ROOT / "workflows" / "api" / f"{REPLAY}.json").read_text(encoding="utf-8"))
    assert api["1"] == {"class_type": "LingBotWorldPlayLog", "inputs": {"log": LOG},
                        "_meta": {"title": "LingBot-World Play Log"}}
