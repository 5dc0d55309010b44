"""The ComfyUI host starts with the pack installed and its HTTP/websocket API works.

These tests check the test harness and the host, with core nodes only, so that a failure
in a node test can be told apart from a broken harness.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from comfy_host import PACK_NAME, ROOT
from comfy_server import ComfyServer, PromptRejected, pack_import_report, require_host

RED = 0xFF0000


def solid_image_prompt(width: int, height: int, color: int, prefix: str) -> dict:
    return {
        "1": {"class_type": "EmptyImage",
              "inputs": {"width": width, "height": height, "batch_size": 1, "color": color}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": prefix}},
    }


def test_only_the_pack_is_installed_as_a_symlink(comfy_server: ComfyServer) -> None:
    entries = [p.name for p in comfy_server.custom_nodes_dir.iterdir() if p.name != "__pycache__"]
    assert entries == [PACK_NAME]
    link = comfy_server.custom_nodes_dir / PACK_NAME
    assert link.is_symlink() and link.resolve() == ROOT.resolve()


def test_pack_imports_and_registers_nodes(comfy_server: ComfyServer) -> None:
    report = pack_import_report(comfy_server.log_text())
    assert not report["failed"], f"the pack failed to import:\n{comfy_server.log_tail(120)}"
    assert report["loaded"], f"no import line for the pack in the log:\n{comfy_server.log_tail()}"
    assert comfy_server.pack_node_types(), "the pack imported but registered no node"


def test_object_info_describes_core_nodes(comfy_server: ComfyServer) -> None:
    info = comfy_server.object_info()
    assert {"EmptyImage", "SaveImage", "LoadImage"} <= info.keys()
    empty = comfy_server.object_info("EmptyImage")
    assert empty["input"]["required"]["width"][0] == "INT"
    assert empty["output"] == ["IMAGE"]


def test_core_prompt_runs_to_success(comfy_server: ComfyServer) -> None:
    result = comfy_server.run(solid_image_prompt(48, 32, RED, "smoke"), timeout=60)

    kinds = [kind for kind, _ in result.events]
    assert kinds[0] == "execution_start" and "execution_success" in kinds
    assert set(result.executed_nodes) == {"1", "2"}
    files = comfy_server.output_files(result)
    assert len(files) == 1 and files[0].parent == comfy_server.output_dir
    pixels = np.asarray(Image.open(files[0]).convert("RGB"))
    assert pixels.shape == (32, 48, 3)
    assert (pixels == [255, 0, 0]).all()


def test_uploaded_image_reaches_load_image(comfy_server: ComfyServer, tmp_path: Path) -> None:
    source = tmp_path / "gradient.png"
    gradient = np.tile(np.arange(0, 256, 16, dtype=np.uint8), (8, 1))
    Image.fromarray(np.stack([gradient] * 3, axis=-1)).save(source)

    name = comfy_server.upload_image(source, subfolder="smoke")
    assert (comfy_server.input_dir / "smoke" / "gradient.png").is_file()
    result = comfy_server.run({
        "1": {"class_type": "LoadImage", "inputs": {"image": name}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "upload"}},
    }, timeout=60)
    (saved,) = comfy_server.output_files(result)
    assert np.array_equal(np.asarray(Image.open(saved).convert("L")), gradient)


def test_unknown_node_type_is_rejected_and_server_keeps_serving(comfy_server: ComfyServer) -> None:
    with pytest.raises(PromptRejected) as rejected:
        comfy_server.queue({"1": {"class_type": "NoSuchNodeAnywhere", "inputs": {}}})
    assert rejected.value.status == 400
    assert "NoSuchNodeAnywhere" in rejected.value.error["message"]

    with pytest.raises(PromptRejected) as invalid:
        comfy_server.queue(solid_image_prompt(0, 32, RED, "bad"))  # width below its minimum
    errors = invalid.value.node_errors["1"]["errors"]
    assert any(e["type"] == "value_smaller_than_min" for e in errors)

    assert comfy_server.alive
    assert comfy_server.run(solid_image_prompt(8, 8, 0x00FF00, "after"), timeout=60).ok


def test_free_and_interrupt_endpoints(comfy_server: ComfyServer) -> None:
    comfy_server.interrupt()  # nothing runs: must be a harmless no-op
    comfy_server.free(unload_models=True, free_memory=True)
    memory = comfy_server.rss()
    assert memory["rss"] > 50 * 2**20 and 0 < memory["rss_anon"] <= memory["rss"]
    # A repeated prompt comes from the cache; free_memory drops it, so the nodes run again.
    prompt = solid_image_prompt(8, 8, 0x0000FF, "free")
    assert set(comfy_server.run(prompt, timeout=60).executed_nodes) == {"1", "2"}
    assert comfy_server.run(prompt, timeout=60).executed_nodes == []
    comfy_server.free()
    assert set(comfy_server.run(prompt, timeout=60).executed_nodes) == {"1", "2"}


def test_quick_test_for_ci_imports_the_pack(tmp_path: Path) -> None:
    server = ComfyServer(tmp_path / "quick", host_root=require_host(), name="quick-test")
    done = server.quick_test()
    output = done.stdout + done.stderr
    server.log_path.write_text(output)
    assert done.returncode == 0, output[-4000:]
    report = pack_import_report(output)
    assert not report["failed"], "\n".join(report["failed"]) + "\n" + output[-4000:]
    assert report["loaded"], output[-4000:]


def test_import_report_tells_the_host_s_failures_from_the_pack_s() -> None:
    """The clone at ComfyUI/custom_nodes/comfyui-lingbot-world (the README's place): the test
    host lives below it, so its own failures name a path holding custom_nodes/<pack>; they
    are the host's. The pack's own lines (its folder, as ComfyUI prints it) still count."""
    clone = f"/home/u/ComfyUI/custom_nodes/{PACK_NAME}"
    server = f"/tmp/pytest-1/quick/custom_nodes/{PACK_NAME}"
    host_failure = (f"Cannot import {clone}/.cache/comfyui-host/comfy_extras/nodes_upscale_model.py module for "
                    "custom nodes: No module named 'spandrel'")
    log = "\n".join([
        host_failure,
        f"   0.0 seconds (IMPORT FAILED): {clone}/.cache/comfyui-host/comfy_extras/nodes_audio.py",
        "Import times for custom nodes:",
        f"   0.4 seconds: {server}",
    ])
    report = pack_import_report(log)
    assert report == {"loaded": [f"   0.4 seconds: {server}"], "failed": []}
    failing = "\n".join([host_failure, f"Cannot import {server} module for custom nodes: boom",
                         f"   0.1 seconds (IMPORT FAILED): {server}"])
    report = pack_import_report(failing)
    assert report["failed"] == [f"Cannot import {server} module for custom nodes: boom",
                                f"   0.1 seconds (IMPORT FAILED): {server}"]
    assert report["loaded"] == []
    windows = pack_import_report(f"   0.4 seconds: C:\\ComfyUI\\custom_nodes\\{PACK_NAME}")
    assert windows["loaded"] and not windows["failed"]
