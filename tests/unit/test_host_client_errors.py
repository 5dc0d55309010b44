"""Errors that reach the ComfyUI client name files relative to ComfyUI's folders, as the
node lists show them, not by the server's absolute paths; the command
line keeps absolute paths (tests/unit/test_cli.py)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import tiny_package
from comfy_host import comfy_state_reset, use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
import comfy.model_management as mm  # noqa: E402
import folder_paths  # noqa: E402

from comfyui_lingbot_world.loaders.errors import CheckpointError  # noqa: E402
from comfyui_lingbot_world.nodes import NODES  # noqa: E402
from comfyui_lingbot_world.nodes.camera import LingBotWorldCamera  # noqa: E402
from comfyui_lingbot_world.nodes.host.client_errors import name_files_relatively, relative_names  # noqa: E402
from comfyui_lingbot_world.nodes.dit_loader import LingBotWorldDiTLoader  # noqa: E402
from comfyui_lingbot_world.nodes.host.model_files import NO_FILE  # noqa: E402

clean_comfy_state = pytest.fixture(autouse=True)(comfy_state_reset)


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    return tiny_package.build(tmp_path_factory.mktemp("client_paths"), "nf4")


@pytest.fixture
def comfy(tmp_path, monkeypatch, package) -> dict[str, Path]:
    """A ComfyUI layout under tmp_path, models/lingbot on a symlinked "other drive"."""
    drive = tmp_path / "other_drive" / "lingbot"
    drive.mkdir(parents=True)
    lingbot = tmp_path / "ComfyUI" / "models" / "lingbot"
    lingbot.parent.mkdir(parents=True)
    lingbot.symlink_to(drive, target_is_directory=True)
    shutil.copytree(package, drive / "pkg")
    monkeypatch.setitem(folder_paths.folder_names_and_paths, "lingbot",
                        ([str(lingbot)], set(folder_paths.supported_pt_extensions)))
    dirs = {"lingbot": lingbot, "drive": drive}
    for name in ("input", "output", "user"):
        dirs[name] = tmp_path / "ComfyUI" / name
        dirs[name].mkdir()
        monkeypatch.setattr(folder_paths, f"{name}_directory", str(dirs[name]))
    return dirs


def test_relative_names_of_each_folder(comfy):
    lingbot, drive = str(comfy["lingbot"]), str(comfy["drive"])
    assert relative_names(f"{lingbot}/pkg/high/config.json: bad") == "lingbot/pkg/high/config.json: bad"
    assert relative_names(f"{drive}/pkg/Wan2.1_VAE.pth: x") == "lingbot/pkg/Wan2.1_VAE.pth: x"  # resolved form
    assert relative_names(f"'{comfy['input']}/traj/poses.npy'") == "'input/traj/poses.npy'"
    assert relative_names(f"in {comfy['output']}") == "in output"
    assert relative_names(f"{comfy['input']}2/a.npy") == f"{comfy['input']}2/a.npy"  # another folder
    assert relative_names("/etc/hosts and 3/4") == "/etc/hosts and 3/4"


def test_every_node_is_wrapped():
    assert all(getattr(node.execute, "__wrapped__", None) is not None for node in NODES)


def test_dit_loader_error_names_config_relative_to_the_model_folder(comfy):
    config = comfy["drive"] / "pkg" / "high_noise_model_bnb_nf4" / "config.json"
    config.write_text(json.dumps({"num_layers": 10**9}))
    with pytest.raises(CheckpointError) as caught:
        LingBotWorldDiTLoader.execute("lingbot/pkg/high_noise_model_bnb_nf4", "lingbot/pkg/low_noise_model_bnb_nf4",
                                      "none")
    message = str(caught.value)
    assert message.startswith("lingbot/pkg/high_noise_model_bnb_nf4/config.json:"), message
    assert str(comfy["lingbot"].parent.parent) not in message and str(comfy["drive"]) not in message
    assert caught.value.path == "lingbot/pkg/high_noise_model_bnb_nf4/config.json"
    assert caught.traceback is not None  # the same exception, with its traceback


def test_camera_error_names_the_input_file_relatively(comfy):
    (comfy["input"] / "traj").mkdir()
    (comfy["input"] / "traj" / "poses.npy").write_bytes(b"not numpy")
    np.save(comfy["input"] / "traj" / "intrinsics.npy", np.array([500.0, 500, 416, 240]))
    with pytest.raises(ValueError) as caught:
        LingBotWorldCamera.execute("files", "pan_left", 1.0, "traj/poses.npy", "traj/intrinsics.npy", 48, 32, 9)
    assert str(caught.value).startswith("poses in input/traj/poses.npy: poses"), str(caught.value)
    assert os.sep + "ComfyUI" + os.sep not in str(caught.value)
    with pytest.raises(ValueError, match="not found in ComfyUI's input folder input$"):
        LingBotWorldCamera.execute("files", "pan_left", 1.0, "traj/none.npy", NO_FILE, 48, 32, 9)


def test_os_errors_and_interrupts(comfy):
    class Node:
        @classmethod
        def execute(cls, error):
            raise error

    name_files_relatively(Node)
    with pytest.raises(FileNotFoundError) as caught:
        Node.execute(FileNotFoundError(2, "No such file or directory", str(comfy["output"] / "a.mp4")))
    assert str(caught.value) == "[Errno 2] No such file or directory: 'output/a.mp4'"
    interrupt = mm.InterruptProcessingException()
    with pytest.raises(mm.InterruptProcessingException) as stopped:
        Node.execute(interrupt)
    assert stopped.value is interrupt
