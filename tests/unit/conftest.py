"""Fixtures shared by the unit tests: the tiny synthetic packages, and (for the node tests,
which put the ComfyUI host on sys.path when they are imported) fresh ComfyUI folders."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tiny_package

# ComfyUI model folder kinds the pack reads (loras: the LoRA Loader's own models/loras).
MODEL_KINDS = ("lingbot", "text_encoders", "vae", "diffusion_models", "loras")


@pytest.fixture(scope="session")
def packages(tmp_path_factory) -> dict[str, Path]:
    """Tiny synthetic LingBot-World packages of both layouts: {"nf4": A, "bf16": B}. Built
    once per session; tests that damage a file copy it first."""
    root = tmp_path_factory.getbasetemp() / "tiny-packages"
    return {layout: tiny_package.build(root, layout) for layout in ("nf4", "bf16")}


@pytest.fixture(scope="session")
def act_packages(tmp_path_factory) -> dict[str, Path]:
    """Tiny synthetic LingBot-World Act packages of both layouts (7-channel control layer)."""
    root = tmp_path_factory.getbasetemp() / "tiny-packages"
    return {layout: tiny_package.build(root, layout, model="act") for layout in ("nf4", "bf16")}


@pytest.fixture(scope="session")
def package(packages) -> Path:
    """The tiny NF4 (layout A) package."""
    return packages["nf4"]


@pytest.fixture(scope="session")
def fast_package(tmp_path_factory) -> Path:
    """The tiny Fast transformer: lingbot_world_fast/ (bf16) and lingbot_world_fast_bnb_nf4/."""
    return tiny_package.build_fast(tmp_path_factory.getbasetemp() / "tiny-packages")


@pytest.fixture
def comfy_dirs(tmp_path, monkeypatch) -> dict[str, Path]:
    """Empty model folders of every kind the pack reads, and input, output and user folders,
    as ComfyUI's folder_paths sees them (node tests only)."""
    import folder_paths

    dirs = {kind: tmp_path / "models" / kind for kind in MODEL_KINDS}
    for kind, path in dirs.items():
        path.mkdir(parents=True)
        monkeypatch.setitem(folder_paths.folder_names_and_paths, kind,
                            ([str(path)], set(folder_paths.supported_pt_extensions)))
    for key in ("input", "output", "user"):
        dirs[key] = tmp_path / key
        dirs[key].mkdir()
        monkeypatch.setattr(folder_paths, f"{key}_directory", str(dirs[key]))
    return dirs


@pytest.fixture
def installed(comfy_dirs, package) -> dict[str, Path]:
    """``comfy_dirs`` with the tiny package installed as models/lingbot/pkg."""
    (comfy_dirs["lingbot"] / "pkg").symlink_to(package, target_is_directory=True)
    comfy_dirs["package"] = package
    return comfy_dirs


@pytest.fixture
def fast_installed(installed, fast_package) -> dict[str, Path]:
    """``installed`` plus the tiny Fast transformer as models/lingbot/fast/lingbot_world_fast
    (bf16) and models/lingbot/fast/lingbot_world_fast_bnb_nf4."""
    (installed["lingbot"] / "fast").symlink_to(fast_package, target_is_directory=True)
    installed["fast"] = fast_package
    return installed


@pytest.fixture
def installed_act(installed, act_packages) -> dict[str, Path]:
    """``installed`` plus the tiny Act package (NF4) as models/lingbot/act."""
    (installed["lingbot"] / "act").symlink_to(act_packages["nf4"], target_is_directory=True)
    installed["act_package"] = act_packages["nf4"]
    return installed


@pytest.fixture
def trajectory(installed) -> Path:
    """input/traj/poses.npy and intrinsics.npy: a 9-pose orbit."""
    from comfyui_lingbot_world.wan.camera_presets import preset_trajectory

    traj = installed["input"] / "traj"
    traj.mkdir()
    poses, intrinsics = preset_trajectory("orbit_left", 9)
    np.save(traj / "poses.npy", poses)
    np.save(traj / "intrinsics.npy", intrinsics)
    return traj
