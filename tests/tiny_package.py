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
                                     "--model", model])
        assert code == 0, f"make_checkpoint failed for layout {layout}, model {model}"
    return out


# Names the shipped workflows use (see workflows/README.md).
COMFY_PACKAGE_NAME = "lingbot-world-base-cam-nf4"
ACT_PACKAGE_NAME = "lingbot-world-base-act-nf4"  # where tests install the tiny Act package
START_IMAGE = "lingbot_world_start.jpg"
TRAJECTORY_FOLDER = "lingbot_world"


def install_for_comfy(models_dir: Path, input_dir: Path, cache_root: Path) -> Path:
    """Make a ComfyUI base folder ready for the shipped workflows, with a tiny NF4 package.

    The package is built once under ``cache_root`` and linked into models/lingbot/; the start
    image and a 41-pose trajectory go into input/.
    """
    import numpy as np
    from PIL import Image

    from comfyui_lingbot_world.wan.camera_presets import preset_trajectory

    package = build(cache_root, "nf4")
    target = models_dir / "lingbot" / COMFY_PACKAGE_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        target.symlink_to(package, target_is_directory=True)
    input_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (72, 108, 3), dtype=np.uint8)).save(input_dir / START_IMAGE)
    poses, intrinsics = preset_trajectory("orbit_left", 41, 1.0)
    (input_dir / TRAJECTORY_FOLDER).mkdir(exist_ok=True)
    np.save(input_dir / TRAJECTORY_FOLDER / "poses.npy", poses.astype(np.float32))
    np.save(input_dir / TRAJECTORY_FOLDER / "intrinsics.npy", intrinsics.astype(np.float32))
    return target


def small_workflow(graph: dict, frames: int = 5, width: int = 48, height: int = 32, steps: int = 3,
                   window: int | None = None) -> dict:
    """A shipped API workflow shrunk so that it runs in seconds on a CPU (a deep copy).

    ``window``: the long-video window (Camera and Long Video nodes); None keeps the graph's.
    An action string longer than the shrunk video is cut to fit, as a user who shortens the
    video must (the Camera node refuses a string longer than the video)."""
    import copy

    from comfyui_lingbot_world.wan.camera_actions import cut_actions

    graph = copy.deepcopy(graph)
    for node in graph.values():
        inputs = node["inputs"]
        if node["class_type"] in ("LingBotWorldVAEEncode", "LingBotWorldCamera", "LingBotWorldLongVideo"):
            inputs.update(width=width, height=height, frames=frames)
        if node["class_type"] == "LingBotWorldCamera" and inputs.get("source") == "actions":
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
