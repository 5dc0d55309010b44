"""Themed (hostile inputs): bad inputs and faults at the node and pipeline level, a clear
error and nothing left loaded.

Cases already covered elsewhere (not repeated here):
- image modes L, LA, P, RGBA, I;16, CMYK, ... -> RGB: test_conditioning.py::test_every_mode_converts,
  test_image.py::test_image_stage_accepts_every_mode;
- frames not 4n+1, sizes not multiples of 16: test_conditioning.py::test_frame_count_checks,
  ::test_size_checks;
- poses of the wrong shape, NaN/inf, not rotations, zero/negative focal lengths, count
  mismatches: test_camera.py::test_validation_names_the_field; fewer poses than frames:
  test_node_camera.py::test_camera_from_input_files;
- empty prompts (encoded, as the reference does), lone surrogates:
  test_text.py::test_empty_prompt_is_encoded_and_empty_negative_is_the_default; missing tokenizer:
  test_t5.py::test_tokenizer_errors_name_folder_and_files; tokenizer truncation:
  test_t5.py::test_tokenizer_truncates_with_warning;
- missing / wrong-layout expert folders, truncated safetensors, corrupt headers, config.json
  against the weights: test_expert_errors.py; truncated or foreign T5 / VAE files:
  test_t5.py::test_loader_error_*, test_vae.py::test_loader_*.

Here: what those checks look like from the nodes (the error names the node input or the
file), a huge and a tiny start image, the 512-token limit through the text stage, a corrupt
expert met in the middle of sampling, and a CUDA out-of-memory error during sampling
(simulated on the CPU).
"""
from __future__ import annotations

import gc
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from comfy_host import comfy_state_reset, use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
import comfy.model_management as mm  # noqa: E402
import folder_paths  # noqa: E402

from comfyui_lingbot_world.loaders.errors import CheckpointError  # noqa: E402
from comfyui_lingbot_world.loaders.package import find_package  # noqa: E402
from comfyui_lingbot_world.nodes.camera import LingBotWorldCamera  # noqa: E402
from comfyui_lingbot_world.nodes.dit_loader import LingBotWorldDiTLoader  # noqa: E402
from comfyui_lingbot_world.nodes.host.model_files import NO_FILE  # noqa: E402
from comfyui_lingbot_world.nodes.sampler import LingBotWorldSampler  # noqa: E402
from comfyui_lingbot_world.nodes.vae import LingBotWorldVAEEncode  # noqa: E402
from comfyui_lingbot_world.pipeline import image as image_stage  # noqa: E402
from comfyui_lingbot_world.pipeline import text as text_stage  # noqa: E402
from comfyui_lingbot_world.pipeline.experts import DiskExperts  # noqa: E402
from comfyui_lingbot_world.pipeline.sampling import OOM_HINT, SamplingParams, sample  # noqa: E402
from comfyui_lingbot_world.wan.camera import CameraError  # noqa: E402
from comfyui_lingbot_world.wan.camera_presets import preset_trajectory  # noqa: E402
from comfyui_lingbot_world.wan.conditioning import image_to_tensor  # noqa: E402
from comfyui_lingbot_world.wan.model import LingBotDiT  # noqa: E402
from comfyui_lingbot_world.wan.tokenizer import PromptTruncatedWarning  # noqa: E402

H, W, FRAMES = 32, 48, 5
PKG = "lingbot/pkg"
HIGH, LOW = f"{PKG}/high_noise_model_bnb_nf4", f"{PKG}/low_noise_model_bnb_nf4"


@pytest.fixture
def comfy_dirs(tmp_path, monkeypatch, package) -> dict[str, Path]:
    """models/lingbot/pkg (the tiny package), an input folder and a user folder."""
    lingbot = tmp_path / "models" / "lingbot"
    lingbot.mkdir(parents=True)
    (lingbot / "pkg").symlink_to(package, target_is_directory=True)
    monkeypatch.setitem(folder_paths.folder_names_and_paths, "lingbot",
                        ([str(lingbot)], set(folder_paths.supported_pt_extensions)))
    dirs = {"lingbot": lingbot, "input": tmp_path / "input", "user": tmp_path / "user"}
    for key in ("input", "user"):
        dirs[key].mkdir()
    monkeypatch.setattr(folder_paths, "input_directory", str(dirs["input"]))
    monkeypatch.setattr(folder_paths, "user_directory", str(dirs["user"]))
    return dirs


clean_comfy_state = pytest.fixture(autouse=True)(comfy_state_reset)


def dit_models_holding_weights() -> int:
    """Live LingBotDiT objects that still hold a real tensor (what a leak would be)."""
    gc.collect()
    count = 0
    for obj in gc.get_objects():
        if type(obj) is LingBotDiT and any(p is not None for p in obj.parameters()):
            count += 1
    return count


def assert_nothing_loaded(dit) -> None:
    assert dit.high.expert is None and dit.low.expert is None
    assert not any(m is dit.high or m is dit.low for m in mm.loaded_models())
    assert dit_models_holding_weights() == 0


# Node calls by keyword, with the defaults of inputs this test does not vary: nodes may gain
# inputs (block swapping, ...) without breaking these tests.


def _defaults(node_class) -> dict:
    schema = node_class.INPUT_TYPES()
    return {name: spec[1]["default"] for name, spec in schema["required"].items()
            if len(spec) > 1 and isinstance(spec[1], dict) and "default" in spec[1]}


def camera_node(**inputs):
    values = {**_defaults(LingBotWorldCamera), "poses_file": NO_FILE, "intrinsics_file": NO_FILE, **inputs}
    return LingBotWorldCamera.execute(**values)


def dit_loader(high: str, low: str):
    return LingBotWorldDiTLoader.execute(**{**_defaults(LingBotWorldDiTLoader), "high_noise": high, "low_noise": low})[0]


# --------------------------------------------------------------------------- node messages


def _camera_files(folder: Path, poses: np.ndarray, intrinsics: np.ndarray) -> None:
    folder.mkdir(exist_ok=True)
    np.save(folder / "poses.npy", poses)
    np.save(folder / "intrinsics.npy", intrinsics)


def _good(n: int = 9) -> tuple[np.ndarray, np.ndarray]:
    return preset_trajectory("orbit_left", n)


def _nan_pose():
    poses, k = _good()
    poses[3, 1, 3] = np.nan
    return poses, k


def _inf_focal():
    poses, k = _good()
    k[2, 1] = np.inf
    return poses, k


def _scaled_rotation():
    poses, k = _good()
    poses[4, :3, :3] *= 2.0  # a scale, not a rotation
    return poses, k


def _zero_focal():
    poses, k = _good()
    k[:, 0] = 0.0
    return poses, k


def _negative_focal():
    poses, k = _good()
    k[:, 1] = -400.0
    return poses, k


def _fewer_intrinsics():
    poses, k = _good()
    return poses, k[:5]


def _wrong_shape():
    poses, k = _good()
    return poses[:, :3, :], k


@pytest.mark.parametrize("make, frames, words", [
    (_nan_pose, FRAMES, ["poses in", "pose 3 holds NaN or inf"]),
    (_inf_focal, FRAMES, ["intrinsics in", "row 2 holds NaN or inf"]),
    (_scaled_rotation, FRAMES, ["poses in", "pose 4"]),
    (_zero_focal, FRAMES, ["intrinsics in", "fx=0"]),
    (_negative_focal, FRAMES, ["intrinsics in", "fy=-400"]),
    (_fewer_intrinsics, FRAMES, ["intrinsics in", "5 rows for 9 poses"]),
    (_wrong_shape, FRAMES, ["poses in", "[N, 4, 4]"]),
    (_good, 13, ["9 poses cover only 9 frames", "13 were asked", "frames <= 9"]),
], ids=["nan", "inf", "not_rotation", "zero_focal", "negative_focal", "count_mismatch", "shape", "too_few"])
def test_camera_node_names_the_field_and_the_files(comfy_dirs, make, frames, words) -> None:
    _camera_files(comfy_dirs["input"] / "bad", *make())
    with pytest.raises(CameraError) as info:
        camera_node(source="files", poses_file="bad/poses.npy", intrinsics_file="bad/intrinsics.npy",
                    width=W, height=H, frames=frames)
    message = str(info.value)
    assert "poses.npy" in message, message
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("width, height, frames, words", [
    (W, H, 6, ["frame count must be 4n+1", "got 6", "nearest below: 5"]),
    (W, H, 0, ["frame", "got 0"]),
    (40, H, FRAMES, ["width must be a multiple of 16", "got 40"]),
    (W, 20, FRAMES, ["height must be a multiple of 16", "got 20"]),
])
def test_size_and_frames_are_named_by_camera_and_vae_nodes(comfy_dirs, width, height, frames, words) -> None:
    image = torch.rand(1, 40, 60, 3)
    calls = {
        "camera": lambda: camera_node(source="preset", preset="pan_left", width=width, height=height, frames=frames),
        "vae": lambda: LingBotWorldVAEEncode.execute(image=image, vae=f"{PKG}/Wan2.1_VAE.pth", width=width,
                                                 height=height, frames=frames, device="cpu"),
    }
    for node, call in calls.items():
        with pytest.raises(ValueError) as info:
            call()
        for word in words:
            assert word in str(info.value), f"{node}: {info.value}"


# --------------------------------------------------------------------------- start images


def _vm_hwm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux 4.0+)


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_8000px_image_is_shrunk_without_gigabytes_of_copies() -> None:
    """A ComfyUI IMAGE of 8000x8000 (768 MB as float32) becomes the condition frame with a
    bounded working set: the uint8 copy and a reduced picture, not several float copies
    (before the fix: 2.4 GB above the input, 9 s here)."""
    side = 8000
    # Horizontal ramp 0..1 in red, vertical ramp in green, constant blue: easy to check.
    ramp = torch.linspace(0.0, 1.0, side)
    image = torch.empty(side, side, 3)
    image[..., 0] = ramp[None, :]
    image[..., 1] = ramp[:, None]
    image[..., 2] = 0.25
    gc.collect()
    _reset_peak()
    before = _rss_bytes()
    pixels = image_to_tensor(image_stage.as_pil(image), 480, 832)
    extra = _vm_hwm_bytes() - before
    assert tuple(pixels.shape) == (3, 480, 832) and torch.isfinite(pixels).all()
    assert extra < 600 * 2**20, f"peak {extra / 2**20:.0f} MB above the 768 MB input"
    # The picture survived the shrink: the ramps are still ramps (in [-1, 1]).
    expected_red = torch.linspace(-1.0, 1.0, 832)
    expected_green = torch.linspace(-1.0, 1.0, 480)
    assert (pixels[0, 240] - expected_red).abs().max() < 0.02
    assert (pixels[1, :, 416] - expected_green).abs().max() < 0.02
    assert (pixels[2] - (-0.5)).abs().max() < 0.01


def test_huge_palette_image_is_converted_before_it_is_shrunk() -> None:
    # Averaging palette indices would give colours that are in no palette entry.
    rgb = np.zeros((4200, 4200, 3), dtype=np.uint8)
    rgb[:, ::2] = (255, 0, 0)
    rgb[:, 1::2] = (0, 0, 255)
    picture = Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE, colors=2)
    pixels = image_to_tensor(picture, 256, 256)
    # Red and blue columns average to purple everywhere; green never appears.
    assert pixels[1].max() < -0.99
    assert (pixels[0] - pixels[2]).abs().max() < 0.05 and pixels[0].mean() > -0.1


def test_16px_start_image_is_upscaled(package) -> None:
    files = find_package(package)
    tiny = Image.fromarray(np.random.default_rng(1).integers(0, 255, (16, 16, 3), dtype=np.uint8))
    condition = image_stage.encode_image(files.vae, tiny, FRAMES, H, W, "cpu")
    assert tuple(condition.y.shape) == (20, 2, H // 8, W // 8) and torch.isfinite(condition.y).all()


# --------------------------------------------------------------------------- prompts


def test_prompt_over_512_tokens_is_truncated_with_a_warning(package, tmp_path) -> None:
    files = find_package(package)
    long_prompt = "a castle on a hill above the sea " * 80
    with pytest.warns(PromptTruncatedWarning, match="more than the text encoder's 512"):
        text = text_stage.encode_text(files.t5, files.tokenizer, long_prompt, "", "cpu", cache_dir=tmp_path)
    assert text.positive.shape[0] == 512
    assert torch.isfinite(text.positive).all()


# --------------------------------------------------------------------------- sampling faults


@pytest.fixture(scope="module")
def inputs(package):
    """Prompt embeddings and the image condition for the sampler tests (made once)."""
    files = find_package(package)
    text = text_stage.encode_text(files.t5, files.tokenizer, "a castle", "blurry", "cpu")
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 60, 3), dtype=np.uint8))
    return text, image_stage.encode_image(files.vae, image, FRAMES, H, W, "cpu")


def _sample(dit, text, i2v, seed: int = 1):
    values = {**_defaults(LingBotWorldSampler), "dit": dit, "text": text, "i2v": i2v, "steps": 3, "shift": 5.0,
              "cfg_high": 5.0, "cfg_low": 4.0, "boundary": 0.9, "seed": seed, "sampler": "unipc"}
    return LingBotWorldSampler.execute(**values)[0]["samples"]


def test_corrupt_expert_met_while_sampling_leaves_nothing_loaded(comfy_dirs, package, inputs) -> None:
    broken = comfy_dirs["lingbot"] / "broken"
    shutil.copytree(package / "high_noise_model_bnb_nf4", broken)
    weights = broken / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 2])
    text, i2v = inputs
    # The loader node reads config.json and the headers (Base-Cam or Act): a truncated file
    # is refused there, naming it as the list does.
    with pytest.raises(CheckpointError, match=r"^lingbot/broken/model.safetensors: .*truncated"):
        dit_loader("lingbot/broken", LOW)
    # A file cut after the loader ran (a copy still being written) fails at sampling.
    weights.write_bytes(whole)
    dit = dit_loader("lingbot/broken", LOW)
    weights.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(CheckpointError) as info:
        _sample(dit, text, i2v)
    message = str(info.value)
    del info  # its traceback would keep the half-built expert alive
    # the client reads the file as the node lists name it, not the server's path
    assert message.startswith("lingbot/broken/model.safetensors:") and "truncated" in message, message
    assert str(weights.parent) not in message
    assert_nothing_loaded(dit)
    good = dit_loader(HIGH, LOW)
    assert torch.isfinite(_sample(good, text, i2v)).all()
    assert_nothing_loaded(good)


def _fake_oom(*args, **kwargs):
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.50 GiB (simulated)")


def test_cuda_oom_in_sampling_names_the_fix_and_releases_the_experts(comfy_dirs, inputs, monkeypatch) -> None:
    text, i2v = inputs
    dit = dit_loader(HIGH, LOW)
    with monkeypatch.context() as patch:
        patch.setattr(LingBotDiT, "forward", _fake_oom)
        with pytest.raises(torch.cuda.OutOfMemoryError) as info:
            _sample(dit, text, i2v)
    message = str(info.value)
    del info
    assert OOM_HINT in message and "block swap" in message, message
    assert f"{FRAMES} frames at {W}x{H}" in message and "Tried to allocate 9.50 GiB" in message, message
    # ComfyUI recognises the re-raised error as an OOM (it unloads everything on those).
    assert issubclass(mm.OOM_EXCEPTION, torch.cuda.OutOfMemoryError) or mm.OOM_EXCEPTION is torch.cuda.OutOfMemoryError
    assert_nothing_loaded(dit)
    assert torch.isfinite(_sample(dit, text, i2v)).all()  # the next run works
    assert_nothing_loaded(dit)


def test_cuda_oom_outside_comfyui_releases_the_disk_expert(package, inputs, monkeypatch) -> None:
    files = find_package(package)
    text, i2v = inputs
    experts = DiskExperts(files.high, files.low, "cpu")
    monkeypatch.setattr(LingBotDiT, "forward", _fake_oom)
    with pytest.raises(torch.cuda.OutOfMemoryError, match="reduce width/height/frames"):
        sample(experts, text, i2v, None, SamplingParams(steps=2, shift=4.0))
    assert experts._resident == {}
    assert dit_models_holding_weights() == 0
