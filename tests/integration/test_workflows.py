"""Acceptance: the shipped workflows run in a real ComfyUI server, end to end over HTTP.

One server per module, with the pack installed and a tiny synthetic NF4 package where the
shipped workflows expect the real one (tests/tiny_package.py). Every API workflow in
workflows/api/ is queued (shrunk to a few frames of 48x32), followed over the websocket to
success, and its SaveVideo file is opened with PyAV; so are the API prompts as they were
shipped before (tests/data/legacy_workflows/api/), which users have saved. Then the failure paths a user meets:
a prompt that fails validation, a node that raises, Cancel during sampling; and what the
pack leaves in memory, seen through its own GET /lingbot/status route.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import tiny_package
from comfy_host import ROOT
from comfy_server import ComfyServer, PromptRejected, video_info
from node_contract import CONTRACT, differences
from shipped_workflows import FAST_WORKFLOWS, LIVE_TEMPLATES, REPLAY_TEMPLATES

API_WORKFLOWS = sorted((ROOT / "workflows" / "api").glob("*.json"))
# The one-pass graphs (sampler, decode, Save Video); the long walk and the LingBot-World
# Fast graphs (frames in whole chunks) have their own test files, the Play session (live:
# it waits for keys) test_play_server.py, and its replay test_play_replay.py.
ELSEWHERE = FAST_WORKFLOWS + LIVE_TEMPLATES + REPLAY_TEMPLATES
ONE_PASS_WORKFLOWS = [p for p in API_WORKFLOWS if p.stem not in ELSEWHERE and p.stem != "lingbot_long_walk"]
LEGACY_API_WORKFLOWS = sorted(p for p in (ROOT / "tests" / "data" / "legacy_workflows" / "api").glob("*.json")
                              if p.stem not in ELSEWHERE)
WIDTH, HEIGHT = 48, 32
SAMPLER, VAE_ENCODE, SAVE_VIDEO = "6", "3", "9"  # node ids of the shipped graphs
STATUS = "/lingbot/status"


@pytest.fixture(scope="module")
def comfy_server_options() -> dict:
    # Latent previews on, as most users have them: the sampler sends one per step.
    return {"extra_args": ["--preview-method", "latent2rgb"]}


@pytest.fixture(scope="module")
def comfy_models(tmp_path_factory: pytest.TempPathFactory):
    return tiny_package.comfy_models_builder(tmp_path_factory)


def load_api(name: str) -> dict:
    return json.loads((ROOT / "workflows" / "api" / f"{name}.json").read_text())


def status(server: ComfyServer) -> dict:
    reply = server.get(STATUS)
    assert reply.status_code == 200, reply.text
    return reply.json()


def experts_in_manager(state: dict) -> list[dict]:
    return [entry for entry in state["loaded_models"] if entry["expert"] is not None]


def embedding_cache_entries(server: ComfyServer) -> int:
    """Prompts encoded by T5 so far (each encode writes one cache file per new text)."""
    return sum(1 for _ in server.user_dir.rglob("text_embeddings/*.safetensors"))


# ------------------------------------------------------------------------------ schemas


def test_object_info_lists_every_pack_node_with_its_inputs(comfy_server: ComfyServer) -> None:
    """What the server tells the frontend keeps tests/node_contract.py."""
    assert comfy_server.pack_node_types() == sorted(CONTRACT)
    info = comfy_server.object_info()
    for node_type, contract in CONTRACT.items():
        schema = info[node_type]
        assert schema["input_order"]["required"] == [i.name for i in contract.required], node_type
        assert schema["input_order"].get("optional", []) == [i.name for i in contract.optional], node_type
        outputs = list(zip(schema["output_name"], schema["output"]))
        assert differences(node_type, schema["category"], schema["input"]["required"],
                           schema["input"].get("optional", {}), outputs) == []
        assert schema["display_name"].startswith("LingBot"), node_type

    # The combos list the files the shipped workflows name (the tiny package stands in; a Play
    # session's log exists once a session ran: test_play_replay.py).
    for path in API_WORKFLOWS:
        for node_id, node in json.loads(path.read_text()).items():
            schema = info[node["class_type"]]["input"]
            for name, value in node["inputs"].items():
                spec = schema.get("required", {}).get(name) or schema.get("optional", {}).get(name)
                assert spec is not None, f"{path.name} node {node_id}: unknown input {name}"
                options = spec[0] if isinstance(spec[0], list) else spec[1].get("options") if spec[0] == "COMBO" else None
                if options is not None and node["class_type"] not in ("LoadImage", "LingBotWorldPlayLog") \
                        and not isinstance(value, list):  # a link: its value comes from another node
                    assert value in options, f"{path.name} node {node_id}: {name}={value!r} not offered"


def test_status_route_answers_before_any_run(comfy_server: ComfyServer) -> None:
    state = status(comfy_server)
    assert state["device"] == "cpu"
    assert state["loaded_models"] == [] and state["experts_resident"] == []
    assert (state["dit_models_alive"], state["text_encoders_alive"], state["vaes_alive"]) == (0, 0, 0)
    # ComfyUI also serves every route under /api, as the frontend calls them.
    assert comfy_server.get("/api" + STATUS).json().keys() == state.keys()


# ------------------------------------------------------------------------------ workflows


@pytest.mark.parametrize("frames", [5, 9])
@pytest.mark.parametrize("workflow", ONE_PASS_WORKFLOWS, ids=lambda p: p.stem)
def test_shipped_workflow_saves_a_video(comfy_server: ComfyServer, workflow: Path, frames: int) -> None:
    graph = tiny_package.small_workflow(json.loads(workflow.read_text()), frames=frames,
                                        width=WIDTH, height=HEIGHT, steps=3)
    previews_before = comfy_server._events._binary_frames
    result = comfy_server.run(graph, timeout=180)
    # One latent preview per sampler step reached the websocket (binary frames).
    assert comfy_server._events._binary_frames - previews_before >= 3

    kinds = [kind for kind, _ in result.events]
    assert kinds[0] == "execution_start" and "execution_success" in kinds, kinds
    sampler_progress = [p for p in result.progress if p["node"] == SAMPLER]
    assert sampler_progress and sampler_progress[-1]["value"] == sampler_progress[-1]["max"] == 3

    videos = [f for f in comfy_server.output_files(result) if f.suffix in (".mp4", ".webm", ".mov")]
    assert len(videos) == 1, comfy_server.output_files(result)
    assert SAVE_VIDEO in result.outputs and videos[0].is_file()
    video = video_info(videos[0])
    assert (video.frames, video.width, video.height) == (frames, WIDTH, HEIGHT), video
    assert video.fps == 16

    has_camera = any(n["class_type"] == "LingBotWorldCamera" for n in graph.values())
    previews = [f for f in comfy_server.output_files(result) if f.suffix == ".png"]
    assert len(previews) == (1 if has_camera else 0), previews  # the camera path drawing


@pytest.mark.parametrize("workflow", LEGACY_API_WORKFLOWS, ids=lambda p: p.stem)
def test_an_api_prompt_saved_before_still_runs(comfy_server: ComfyServer, workflow: Path) -> None:
    """Queued as saved (only shrunk like every graph here): it validates, runs, saves a video."""
    # every one-pass graph shipped has its saved copy (the Fast graphs' and Play's: their own test files)
    assert len(LEGACY_API_WORKFLOWS) == len([p for p in API_WORKFLOWS
                                             if p.stem not in ELSEWHERE])
    graph = tiny_package.small_workflow(json.loads(workflow.read_text()), frames=5, width=WIDTH, height=HEIGHT,
                                        steps=2)
    comfy_server.free()  # drop cached outputs: the same graph may have run above
    result = comfy_server.run(graph, timeout=180)
    assert "execution_success" in [kind for kind, _ in result.events], result.describe()
    videos = [f for f in comfy_server.output_files(result) if f.suffix == ".mp4"]
    assert len(videos) == 1, comfy_server.output_files(result)
    video = video_info(videos[0])
    assert (video.frames, video.width, video.height) == (5, WIDTH, HEIGHT), video


# ------------------------------------------------------------------------------ failures


def test_invalid_inputs_are_rejected_with_the_input_named(comfy_server: ComfyServer) -> None:
    # The graph without a camera has one output node. (ComfyUI accepts a graph in which
    # SOME outputs validate and runs just those: the camera graphs' path preview would.)
    graph = tiny_package.small_workflow(load_api("lingbot_no_camera"))

    missing_file = json.loads(json.dumps(graph))
    missing_file[VAE_ENCODE]["inputs"]["vae"] = "lingbot/no-such-package/Wan2.1_VAE.pth"
    with pytest.raises(PromptRejected) as rejected:
        comfy_server.queue(missing_file)
    assert rejected.value.status == 400
    errors = rejected.value.node_errors[VAE_ENCODE]["errors"]
    # The pack checks its file combos itself (validate_inputs): 0.3.x hosts skip V3 combos. A
    # refusing validate_inputs marks every input it takes: on those hosts it also takes the
    # fixed combos (device and precision here; nodes/host/combo_check.py), so each error names
    # the vae; and input_types, which it takes to tell links apart (combo_check.py), is listed too.
    names = [(e["type"], e["extra_info"]["input_name"]) for e in errors]
    assert names[0] == ("custom_validation_failed", "vae") and {name for _, name in names} <= {
        "vae", "device", "precision", "input_types"} and {kind for kind, _ in names} == {"custom_validation_failed"}, \
        names
    assert all("vae: 'lingbot/no-such-package/Wan2.1_VAE.pth' is not offered" in e["details"] for e in errors)
    assert rejected.value.node_errors[VAE_ENCODE]["class_type"] == "LingBotWorldVAEEncode"

    too_few_steps = json.loads(json.dumps(graph))
    too_few_steps[SAMPLER]["inputs"]["steps"] = 0
    with pytest.raises(PromptRejected) as rejected:
        comfy_server.queue(too_few_steps)
    errors = rejected.value.node_errors[SAMPLER]["errors"]
    assert [(e["type"], e["extra_info"]["input_name"]) for e in errors] == [("value_smaller_than_min", "steps")]

    assert comfy_server.alive
    assert comfy_server.run(graph, timeout=120).ok


def test_runtime_error_names_the_input_and_the_server_goes_on(comfy_server: ComfyServer) -> None:
    # ComfyUI checks an INT's min and max but not its step: 40 passes validation, and the
    # node itself must refuse it with a message that says which input is wrong.
    graph = tiny_package.small_workflow(load_api("lingbot_no_camera"), width=40)
    result = comfy_server.run(graph, timeout=120, check=False)

    assert result.status == "error", result.describe()
    error = result.error
    assert error["node_id"] == VAE_ENCODE and error["node_type"] == "LingBotWorldVAEEncode"
    assert error["exception_type"].endswith("ValueError")
    assert "width" in error["exception_message"] and "16" in error["exception_message"], error
    assert comfy_server.alive

    good = tiny_package.small_workflow(load_api("lingbot_no_camera"), frames=5)
    good[SAMPLER]["inputs"]["seed"] = 7  # not a cached repeat of an earlier prompt
    assert comfy_server.run(good, timeout=120).ok


def test_cancel_during_sampling_interrupts_and_the_next_prompt_runs(comfy_server: ComfyServer) -> None:
    # Long enough on a CPU (200 steps at 96x64x17) that Cancel lands in the sampler.
    long_graph = tiny_package.small_workflow(load_api("lingbot_camera_preset"), frames=17, width=96,
                                             height=64, steps=200)
    prompt_id = comfy_server.queue(long_graph)
    first = comfy_server.wait_event(prompt_id, "progress", node=SAMPLER, timeout=120)
    assert first["max"] == 200

    # While an expert samples: it is ComfyUI's loaded model (a ModelPatcher subclass),
    # alone, and neither T5 nor the VAE is held anywhere.
    during = status(comfy_server)
    comfy_server.interrupt()
    (entry,) = during["loaded_models"]
    assert entry["class"] == "ExpertPatcher" and entry["model_patcher"] is True, entry
    assert entry["model"] == "ExpertSlot" and entry["expert"] in ("high", "low"), entry
    assert entry["size_bytes"] > 0 and entry["loaded_bytes"] == entry["size_bytes"], entry
    assert [e["expert"] for e in during["experts_resident"]] == [entry["expert"]]
    assert during["dit_models_alive"] == 1
    assert (during["text_encoders_alive"], during["vaes_alive"]) == (0, 0), during

    result = comfy_server.wait(prompt_id, timeout=120)
    assert result.status == "interrupted", result.describe()
    interrupted = next(d for kind, d in result.events if kind == "execution_interrupted")
    assert interrupted["node_id"] == SAMPLER and interrupted["node_type"] == "LingBotWorldSampler"
    assert max(p["value"] for p in result.progress if p["node"] == SAMPLER) < 200
    assert not any(kind == "execution_success" for kind, _ in result.events)

    after = status(comfy_server)  # the sampler's cleanup ran on the interrupt too
    assert experts_in_manager(after) == [] and after["experts_resident"] == []
    assert after["dit_models_alive"] == 0

    graph = tiny_package.small_workflow(load_api("lingbot_camera_preset"))
    graph[SAMPLER]["inputs"]["seed"] = 11
    result = comfy_server.run(graph, timeout=120)
    (video,) = [f for f in comfy_server.output_files(result) if f.suffix == ".mp4"]
    assert video_info(video).frames == 5


# ------------------------------------------------------------------------------ memory


def run_fresh(server: ComfyServer, round_: int) -> None:
    """One full run that loads everything: a new prompt text (so T5 really loads; the
    embedding cache has not seen it) and a new seed."""
    graph = tiny_package.small_workflow(load_api("lingbot_camera_files"))
    graph["2"]["inputs"]["prompt"] = f"memory round {round_}: a slow flight over a misty valley"
    graph[SAMPLER]["inputs"]["seed"] = 1000 + round_
    encoded_before = embedding_cache_entries(server)
    result = server.run(graph, timeout=180)
    assert {"2", VAE_ENCODE, SAMPLER, "7"} <= set(result.executed_nodes)
    assert embedding_cache_entries(server) > encoded_before, "T5 did not encode the new prompt"


def test_memory_after_runs_and_free(comfy_server: ComfyServer) -> None:
    comfy_server.free()  # drop cached node outputs: every node of round 0 runs
    rss_after_free = []
    for round_ in range(3):
        run_fresh(comfy_server, round_)
        after_run = status(comfy_server)
        # The sampler hands both experts back to ComfyUI's manager when it is done, so no
        # expert is left resident; T5 and the VAE were freed by their own nodes.
        assert experts_in_manager(after_run) == [] and after_run["experts_resident"] == []
        assert after_run["dit_models_alive"] == 0
        assert after_run["text_encoders_alive"] == 0, after_run
        assert after_run["vaes_alive"] == 0, after_run

        comfy_server.free(unload_models=True, free_memory=True, settle=1.0)
        after_free = status(comfy_server)
        assert experts_in_manager(after_free) == [] and after_free["experts_resident"] == []
        assert (after_free["dit_models_alive"], after_free["text_encoders_alive"],
                after_free["vaes_alive"]) == (0, 0, 0)
        rss_after_free.append(comfy_server.rss()["rss_anon"])

    # Round 0 warms caches (allocator arenas, codec state); later rounds must not grow.
    growth = rss_after_free[2] - rss_after_free[0]
    assert growth < 48 * 2**20, f"server heap grew {growth / 2**20:.1f} MiB over two run/free rounds: " \
                                f"{[round(r / 2**20, 1) for r in rss_after_free]} MiB"
