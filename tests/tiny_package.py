"""Build tiny synthetic LingBot-World packages (both layouts) once per test session."""
from __future__ import annotations

from pathlib import Path

from comfyui_lingbot_world.tools import make_checkpoint


def build(root: Path, layout: str, seed: int = 0, model: str = "base") -> Path:
    """A tiny package of ``layout`` (nf4, bf16) and ``model`` (base: Base-Cam, act: Act) under
    ``root``, written once."""
    out = root / (f"tiny_{layout}" if model == "base" else f"tiny_{model}_{layout}")
    if not (out / "tokenizer").is_dir():
        code = make_checkpoint.main(["--preset", "tiny", "--layout", layout, "--out", str(out), "--seed", str(seed),
                                     "--model", model, "--overwrite"])  # what an interrupted build left
        assert code == 0, f"make_checkpoint failed for layout {layout}, model {model}"
    return out


def build_fast(root: Path, seed: int = 0) -> Path:
    """The tiny LingBot-World Fast transformer in both layouts, as make_checkpoint writes them:
    ``lingbot_world_fast/`` (bf16, the official folder) and ``lingbot_world_fast_bnb_nf4/``."""
    out = root / "tiny_fast"
    for layout, folder in (("bf16", "lingbot_world_fast"), ("nf4", "lingbot_world_fast_bnb_nf4")):
        if not (out / folder / "config.json").is_file():
            code = make_checkpoint.main(["--model", "fast", "--preset", "tiny", "--layout", layout, "--out", str(out),
                                         "--seed", str(seed), "--parts", "transformer", "--overwrite"])
            assert code == 0, f"make_checkpoint --model fast failed for layout {layout}"
    return out


# Names the shipped workflows use (see workflows/README.md).
COMFY_PACKAGE_NAME = "lingbot-world-base-cam-nf4"
FAST_FOLDER = "lingbot_world_fast"  # the official Fast download's folder name (bf16)
ACT_PACKAGE_NAME = "lingbot-world-base-act-nf4"  # where tests install the tiny Act package
START_IMAGE = "lingbot_world_start.jpg"
TRAJECTORY_FOLDER = "lingbot_world"
TRAJECTORY_POSES = 81  # workflows/api/lingbot_camera_files.json runs 81 frames on it


def package_with_fast(cache_root: Path) -> Path:
    """The tiny NF4 package with the tiny Fast transformer (bf16) as its lingbot_world_fast/,
    where the official README puts it: a folder of links to the cached builds (made once; the
    builds themselves stay as they are for the tests that use them)."""
    out = cache_root / "tiny_nf4_with_fast"
    entries = [*build(cache_root, "nf4").iterdir(), build_fast(cache_root) / FAST_FOLDER]
    out.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        if not (out / entry.name).is_symlink():
            (out / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    return out


def install_for_comfy(models_dir: Path, input_dir: Path, cache_root: Path) -> Path:
    """Make a ComfyUI base folder ready for the shipped workflows, with a tiny NF4 package.

    The package is built once under ``cache_root`` and linked into models/lingbot/, with the
    tiny Fast transformer (bf16) as its lingbot_world_fast/; the start image and an 81-pose
    trajectory (the camera-files template's own frame count) go into input/.
    """
    import numpy as np
    from PIL import Image

    from comfyui_lingbot_world.wan.camera_presets import preset_trajectory

    package = package_with_fast(cache_root)
    target = models_dir / "lingbot" / COMFY_PACKAGE_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        target.symlink_to(package, target_is_directory=True)
    input_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (72, 108, 3), dtype=np.uint8)).save(input_dir / START_IMAGE)
    poses, intrinsics = preset_trajectory("orbit_left", TRAJECTORY_POSES, 1.0)
    (input_dir / TRAJECTORY_FOLDER).mkdir(exist_ok=True)
    np.save(input_dir / TRAJECTORY_FOLDER / "poses.npy", poses.astype(np.float32))
    np.save(input_dir / TRAJECTORY_FOLDER / "intrinsics.npy", intrinsics.astype(np.float32))
    return target


TINY_VIDEO_VAE = "lighttaew2_1.safetensors"  # a name core's Load VAE lists from models/vae_approx


def write_tiny_video_vae(models_dir: Path, comfy_root: Path) -> Path:
    """models/vae_approx/lighttaew2_1.safetensors: ComfyUI's tiny video VAE (TAEHV, 16 latent
    channels) with seeded random weights, written by the host's own class in a child process
    (the caller need not import ComfyUI): what Play's live_decoder takes from core's Load VAE,
    at its real speed (not its pictures)."""
    import subprocess
    import sys

    path = models_dir / "vae_approx" / TINY_VIDEO_VAE
    path.parent.mkdir(parents=True, exist_ok=True)
    code = ("import sys, torch; sys.path.append(sys.argv[1]); from comfy.cli_args import args; args.cpu = True\n"
            "from comfy.taesd.taehv import TAEHV; from safetensors.torch import save_file\n"
            "g = torch.Generator().manual_seed(6)\n"
            "save_file({k: torch.randn(v.shape, generator=g) * 0.02 for k, v in TAEHV(16).state_dict().items()}, "
            "sys.argv[2])")
    subprocess.run([sys.executable, "-c", code, str(comfy_root), str(path)], check=True, timeout=300)
    return path


def small_workflow(graph: dict, frames: int = 5, width: int = 48, height: int = 32, steps: int = 3,
                   window: int | None = None) -> dict:
    """A shipped API workflow shrunk so that it runs in seconds on a CPU (a deep copy).

    ``window``: the long-video window (Camera and Long Video nodes); None keeps the graph's.
    The Fast graphs take ``frames`` that fill whole chunks (9, 21, ...); ``steps`` is the Base
    samplers' (the Fast nodes keep the graph's own ``steps``, 4). An action string longer than the shrunk video is cut to
    fit, as a user who shortens the video must (the Camera node refuses a string longer than
    the video)."""
    import copy

    from comfyui_lingbot_world.wan.camera_actions import cut_actions

    graph = copy.deepcopy(graph)
    for node in graph.values():
        inputs = node["inputs"]
        if node["class_type"] in ("LingBotWorldVAEEncode", "LingBotWorldCamera", "LingBotWorldLongVideo",
                                  "LingBotWorldFastLongVideo"):
            inputs.update(width=width, height=height, frames=frames)
        if (node["class_type"] == "LingBotWorldCamera" and inputs.get("source") == "actions"
                and isinstance(inputs.get("actions"), str)):  # a link (the Play Log's keys) is cut by its source
            inputs["actions"] = cut_actions(inputs["actions"], frames)
        if window is not None and node["class_type"] in ("LingBotWorldCamera", "LingBotWorldLongVideo"):
            inputs["window"] = window
        if node["class_type"] in ("LingBotWorldSampler", "LingBotWorldLongVideo"):
            inputs["steps"] = steps
    return graph


def comfy_models_builder(tmp_path_factory, extra=None):
    """The ``comfy_models`` callable of the server fixtures: the tiny package and inputs,
    then ``extra(models_dir, package)`` for what a test module adds."""
    cache = tmp_path_factory.getbasetemp() / "tiny-packages"

    def build(models: Path) -> None:
        # input/ is a sibling of models/ in the server's base folder.
        package = install_for_comfy(models, models.parent / "input", cache)
        if extra is not None:
            extra(models, package)

    return build
