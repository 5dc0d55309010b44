"""What a real server tells its client and writes to its log: an error names
files relative to their model or input folder, never by the server's absolute path; the
start log has no bitsandbytes "pip install kernels" advice."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

import tiny_package
from comfy_host import ROOT
from comfy_server import ComfyServer, PromptRejected

WORKFLOW = json.loads((ROOT / "workflows" / "api" / "lingbot_camera_files.json").read_text())


def _broken_config(models: Path, package: Path) -> None:
    """A copy of the package whose high-noise config.json claims 10**9 blocks, and a
    trajectory folder whose poses.npy is not numpy."""
    copy = models / "lingbot" / "broken_config"
    for expert in ("high_noise_model_bnb_nf4", "low_noise_model_bnb_nf4"):
        shutil.copytree(package / expert, copy / expert)
    (copy / "high_noise_model_bnb_nf4" / "config.json").write_text(json.dumps({"num_layers": 10**9}))
    bad = models.parent / "input" / "bad_poses"
    bad.mkdir(parents=True)
    (bad / "poses.npy").write_bytes(b"not numpy at all")
    np.save(bad / "intrinsics.npy", np.array([500.0, 500.0, 416.0, 240.0]))


@pytest.fixture(scope="module")
def comfy_models(tmp_path_factory):
    return tiny_package.comfy_models_builder(tmp_path_factory, _broken_config)


def _run(server: ComfyServer, **inputs_by_node) -> dict:
    graph = tiny_package.small_workflow(WORKFLOW, frames=5, width=48, height=32, steps=2)
    graph["2"]["inputs"]["prompt"] = f"a castle, take {uuid.uuid4().hex[:8]}"
    for node, changes in inputs_by_node.items():
        graph[node]["inputs"].update(changes)
    result = server.run(graph, timeout=120, check=False)
    assert result.status == "error", result.describe()
    return result.error


@pytest.mark.parametrize("changes, start", [
    ({"4": {"high_noise": "lingbot/broken_config/high_noise_model_bnb_nf4",
            "low_noise": "lingbot/broken_config/low_noise_model_bnb_nf4"}},
     "lingbot/broken_config/high_noise_model_bnb_nf4/config.json: field 'num_layers'"),
    ({"5": {"poses_file": "bad_poses/poses.npy", "intrinsics_file": "bad_poses/intrinsics.npy"}},
     "poses in input/bad_poses/poses.npy: poses"),
], ids=["model-folder", "input-folder"])
def test_errors_name_files_relative_to_their_folder(comfy_server: ComfyServer, changes, start):
    error = _run(comfy_server, **changes)
    message = error["exception_message"]
    assert message.startswith(start), message
    assert str(comfy_server.base_dir) not in message and os.path.realpath(comfy_server.base_dir) not in message


def test_start_log_has_no_bitsandbytes_kernels_advice(comfy_server: ComfyServer):
    raw = subprocess.run([sys.executable, "-c", "import logging; logging.basicConfig(); import bitsandbytes"],
                         capture_output=True, text=True, timeout=120)
    if "pip install kernels" not in raw.stderr:
        pytest.skip("bitsandbytes gives this CPU no advice to silence (it has no AVX512-BF16)")
    log = comfy_server.log_text()
    assert "LingBotWorld" in log or comfy_server.pack_node_types()  # the pack was imported
    assert "pip install kernels" not in log, comfy_server.log_tail()


def _feeds(graph: dict, node: str) -> set[str]:
    """``node`` and every node downstream of it."""
    found, grown = {node}, True
    while grown:
        grown = False
        for key, entry in graph.items():
            if key not in found and any(isinstance(v, list) and len(v) == 2 and str(v[0]) in found
                                        for v in entry["inputs"].values()):
                found.add(key)
                grown = True
    return found


def _upstream(graph: dict, outputs: set[str]) -> dict:
    """The part of ``graph`` that ``outputs`` need."""
    keep, todo = set(), list(outputs)
    while todo:
        key = todo.pop()
        if key not in keep:
            keep.add(key)
            todo += [str(v[0]) for v in graph[key]["inputs"].values() if isinstance(v, list) and len(v) == 2]
    return {key: graph[key] for key in keep}


@pytest.mark.parametrize("value, shown", [("no-such-choice", "no-such-choice"), (None, "null")],
                         ids=["unknown", "json-null"])
def test_unknown_combo_values_are_refused_at_validation_naming_the_input(comfy_server: ComfyServer, value, shown):
    """Every combo of every pack node in the shipped API workflows (files, and the fixed
    ones: sampler, device, source, preset, ...), required or optional, given a value it does
    not offer: HTTP 400 before anything runs, naming the node and the input, as ComfyUI does
    for its own combos. Without the pack's check the 0.3.x hosts queue such a prompt and it
    fails at run time; a JSON null passed every check (a linked combo is None there too)."""
    info = comfy_server.object_info()
    pack = set(comfy_server.pack_node_types())
    checked, accepted = set(), []
    for path in sorted((ROOT / "workflows" / "api").glob("*.json")):
        graph = tiny_package.small_workflow(json.loads(path.read_text()))
        for node, entry in graph.items():
            kind = entry["class_type"]
            if kind not in pack:
                continue
            spec = {**info[kind]["input"].get("required", {}), **info[kind]["input"].get("optional", {})}
            combos = [name for name, s in spec.items() if s[0] == "COMBO" or isinstance(s[0], list)]
            outputs = {k for k in _feeds(graph, node) if info[graph[k]["class_type"]].get("output_node")}
            for name in combos:
                if (kind, name) in checked:
                    continue
                checked.add((kind, name))
                bad = _upstream(graph, outputs)
                bad[node] = {**entry, "inputs": {**entry["inputs"], name: value}}
                try:
                    prompt_id = comfy_server.queue(bad)
                except PromptRejected as rejected:
                    errors = rejected.node_errors.get(node, {}).get("errors", [])
                    assert rejected.status == 400 and any(
                        e["extra_info"].get("input_name") == name and (shown in e["details"] or (
                            value is None and "'None' not in" in e["details"]))  # a host's own combo check
                        for e in errors), (kind, name, rejected.response)
                else:
                    accepted.append(f"{kind}.{name}")
                    comfy_server.interrupt(prompt_id)
                    comfy_server.wait(prompt_id, timeout=120)
    assert not accepted, f"queued with an unknown value instead of refused: {accepted}"
    assert ("LingBotWorldSampler", "sampler") in checked and ("LingBotWorldCamera", "source") in checked
    assert ("LingBotWorldTextEncode", "device") in checked and ("LingBotWorldLongVideo", "sampler") in checked
