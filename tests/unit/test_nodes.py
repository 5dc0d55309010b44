"""The ComfyUI node layer, imported inside the real ComfyUI host (on the CPU).

Covers the node schemas (which the shipped workflows depend on), file listing and path
safety, each node on tiny synthetic models, interrupts, and the shipped workflows.
"""
from __future__ import annotations

import gc
import json
import weakref
from pathlib import Path

import numpy as np
from PIL import Image
import pytest
import torch
from safetensors.torch import save_file

from comfy_host import run_async, comfy_state_reset, use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
import comfy.model_management as mm  # noqa: E402
import comfy.latent_formats  # noqa: E402
import comfy.utils  # noqa: E402
import folder_paths  # noqa: E402
import latent_preview  # noqa: E402
from comfy_api.latest import ComfyExtension, io  # noqa: E402

import tiny_package  # noqa: E402
from shipped_workflows import TEMPLATES  # noqa: E402
from comfyui_lingbot_world import nodes as pack_nodes  # noqa: E402
from comfyui_lingbot_world.loaders.errors import CheckpointError  # noqa: E402
from comfyui_lingbot_world.nodes.host import model_files  # noqa: E402
from comfyui_lingbot_world.nodes.camera import LingBotWorldCamera  # noqa: E402
from comfyui_lingbot_world.nodes.host.devices import pick_device  # noqa: E402
from comfyui_lingbot_world.nodes.dit_loader import LingBotWorldDiTLoader  # noqa: E402
from comfyui_lingbot_world.nodes.host.expert_patcher import DiTExperts  # noqa: E402
from comfyui_lingbot_world.nodes.sampler import LingBotWorldSampler  # noqa: E402
from comfyui_lingbot_world.nodes.text_encode import LingBotWorldTextEncode, embedding_cache_dir  # noqa: E402
from comfyui_lingbot_world.nodes.vae import LingBotWorldVAEDecode, LingBotWorldVAEEncode  # noqa: E402
from comfyui_lingbot_world.pipeline.camera import CameraCondition  # noqa: E402
from comfyui_lingbot_world.pipeline.image import I2VCondition  # noqa: E402
from comfyui_lingbot_world.pipeline.latent import from_comfy_latent, to_comfy_latent  # noqa: E402
from comfyui_lingbot_world.pipeline.text import TextEmbeddings  # noqa: E402
from comfyui_lingbot_world.pipeline.text_conditioning import text_from_conditioning  # noqa: E402
from comfyui_lingbot_world.wan.camera_presets import CAMERA_PRESETS, preset_trajectory  # noqa: E402
from comfyui_lingbot_world.wan.negative_prompt import DEFAULT_NEGATIVE_PROMPT  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
H, W, FRAMES = 32, 48, 5
PKG = "lingbot/pkg"

# The input order of every node: the UI format stores widget values in this order.
EXPECTED_INPUTS = {
    "LingBotWorldTextEncode": (["t5_file", "tokenizer", "prompt", "negative_prompt", "device"], []),
    "LingBotWorldDiTLoader": (["high_noise", "low_noise", "bf16_quantize", "block_swap"], ["devices"]),
    # New inputs appended after the original eight, optional: older workflows keep their
    # widget values and older API prompts (without them) still validate.
    "LingBotWorldCamera": (["source", "preset", "speed", "poses_file", "intrinsics_file", "width", "height", "frames"],
                           ["actions", "pose_export", "normalize_scale", "window", "overlap"]),
    "LingBotWorldVAEEncode": (["image", "vae", "width", "height", "frames", "device"], ["vae_model", "precision"]),
    "LingBotWorldSampler": (["dit", "i2v", "steps", "shift", "cfg_high", "cfg_low", "boundary", "seed", "sampler"],
                            ["text", "camera", "positive", "negative", "cache_threshold", "cfg_truncate",
                             "attention", "preset"]),
    "LingBotWorldVAEDecode": (["samples", "vae", "tile", "device"], ["vae_model", "precision"]),
    "LingBotWorldLoraLoader": (["dit", "lora_high_noise", "strength_high", "lora_low_noise", "strength_low"], []),
    "LingBotWorldLongVideo": (["dit", "image", "vae", "width", "height", "frames", "window", "overlap",
                               "scale_quantile", "steps", "shift", "cfg_high", "cfg_low", "boundary", "seed",
                               "sampler", "decode_tile", "keep_experts", "fps", "filename_prefix"],
                              ["text", "camera_path", "vae_model", "positive", "negative"]),
}
EXPECTED_OUTPUTS = {
    "LingBotWorldTextEncode": ("LINGBOT_TEXT",),
    "LingBotWorldDiTLoader": ("LINGBOT_DIT",),
    "LingBotWorldCamera": ("LINGBOT_CAMERA", "IMAGE", "LINGBOT_CAMERA_PATH"),
    "LingBotWorldVAEEncode": ("LINGBOT_I2V",),
    "LingBotWorldSampler": ("LATENT",),
    "LingBotWorldVAEDecode": ("IMAGE",),
    "LingBotWorldLoraLoader": ("LINGBOT_DIT",),
    "LingBotWorldLongVideo": ("VIDEO",),
}


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    return tiny_package.build(tmp_path_factory.mktemp("lingbot_pkg"), "nf4")


@pytest.fixture
def comfy_dirs(tmp_path, monkeypatch) -> dict[str, Path]:
    """Fresh model, input and user folders for ComfyUI's folder_paths."""
    dirs = {kind: tmp_path / "models" / kind for kind in ("lingbot", "text_encoders", "vae", "diffusion_models")}
    for kind, path in dirs.items():
        path.mkdir(parents=True)
        monkeypatch.setitem(folder_paths.folder_names_and_paths, kind,
                            ([str(path)], set(folder_paths.supported_pt_extensions)))
    dirs["input"] = tmp_path / "input"
    dirs["user"] = tmp_path / "user"
    for key in ("input", "user"):
        dirs[key].mkdir()
    monkeypatch.setattr(folder_paths, "input_directory", str(dirs["input"]))
    monkeypatch.setattr(folder_paths, "user_directory", str(dirs["user"]))
    return dirs


@pytest.fixture
def installed(comfy_dirs, package) -> dict[str, Path]:
    """The tiny package installed as models/lingbot/pkg, plus trajectory files in input/."""
    (comfy_dirs["lingbot"] / "pkg").symlink_to(package, target_is_directory=True)
    traj = comfy_dirs["input"] / "traj"
    traj.mkdir()
    poses, intrinsics = preset_trajectory("orbit_left", 9)
    np.save(traj / "poses.npy", poses)
    np.save(traj / "intrinsics.npy", intrinsics)
    return comfy_dirs


clean_comfy_state = pytest.fixture(autouse=True)(comfy_state_reset)


def _image(h=40, w=60) -> torch.Tensor:
    rng = np.random.default_rng(0)
    return torch.from_numpy(rng.random((1, h, w, 3), dtype=np.float32))


def _text(installed) -> TextEmbeddings:
    return LingBotWorldTextEncode.execute(f"{PKG}/models_t5_umt5-xxl-enc-bf16.pth", f"{PKG}/tokenizer",
                                      "a castle in the clouds", "blurry", "auto")[0]


def _i2v(frames=FRAMES) -> I2VCondition:
    return LingBotWorldVAEEncode.execute(_image(), f"{PKG}/Wan2.1_VAE.pth", W, H, frames, "auto")[0]


def _dit() -> DiTExperts:
    return LingBotWorldDiTLoader.execute(f"{PKG}/high_noise_model_bnb_nf4", f"{PKG}/low_noise_model_bnb_nf4", "none")[0]


def _sample(dit, text, i2v, camera=None, steps=3, seed=1, **conditioning):
    return LingBotWorldSampler.execute(dit, i2v, steps, 5.0, 5.0, 4.0, 0.9, seed, "unipc", text=text, camera=camera,
                                       **conditioning)[0]


def _options(spec) -> list:
    """A combo's choices, in the V1 form ([...], {...}) or V3's ("COMBO", {"options": [...]})."""
    return spec[0] if isinstance(spec[0], list) else spec[1]["options"]


# --------------------------------------------------------------------------- schemas


def test_mappings_register_every_node_with_display_names():
    assert set(pack_nodes.NODE_CLASS_MAPPINGS) == set(EXPECTED_INPUTS)
    assert set(pack_nodes.NODE_DISPLAY_NAME_MAPPINGS) == set(EXPECTED_INPUTS)
    for name, cls in pack_nodes.NODE_CLASS_MAPPINGS.items():
        assert issubclass(cls, io.ComfyNode)
        schema = cls.GET_SCHEMA()
        assert schema.node_id == name and name.startswith("LingBotWorld")
        assert schema.display_name == pack_nodes.NODE_DISPLAY_NAME_MAPPINGS[name]
        assert schema.display_name.startswith("LingBot-World ")
        assert schema.category == "LingBot-World"
        assert schema.description.strip()


def test_comfy_entrypoint_lists_the_same_nodes():
    extension = run_async(pack_nodes.comfy_entrypoint())
    assert isinstance(extension, ComfyExtension)
    assert run_async(extension.get_node_list()) == list(pack_nodes.NODE_CLASS_MAPPINGS.values())


@pytest.mark.parametrize("name", sorted(EXPECTED_INPUTS))
def test_input_and_return_types(name, comfy_dirs):
    cls = pack_nodes.NODE_CLASS_MAPPINGS[name]
    schema = cls.INPUT_TYPES()
    required, optional = EXPECTED_INPUTS[name]
    assert list(schema["required"]) == required
    assert list(schema.get("optional", {})) == optional
    for spec in [*schema["required"].values(), *schema.get("optional", {}).values()]:
        assert spec[1]["tooltip"].strip()
    outputs = cls.GET_SCHEMA().outputs
    assert tuple(o.get_io_type() for o in outputs) == EXPECTED_OUTPUTS[name]
    assert all(o.display_name and o.tooltip.strip() for o in outputs)


def test_widget_defaults():
    text = LingBotWorldTextEncode.INPUT_TYPES()["required"]
    assert text["negative_prompt"][1]["default"] == DEFAULT_NEGATIVE_PROMPT
    assert _options(text["device"]) == ["auto", "gpu", "cpu"]
    sampler = LingBotWorldSampler.INPUT_TYPES()["required"]
    defaults = {k: sampler[k][1]["default"] for k in ("steps", "shift", "cfg_high", "cfg_low", "boundary", "sampler")}
    assert defaults == {"steps": 40, "shift": 10.0, "cfg_high": 5.0, "cfg_low": 5.0, "boundary": 0.947, "sampler": "unipc"}
    assert sampler["seed"][1]["control_after_generate"] is True
    assert _options(sampler["sampler"]) == ["unipc", "euler"]
    optional = LingBotWorldSampler.INPUT_TYPES()["optional"]
    assert [optional[k][0] for k in ("text", "camera", "positive", "negative")] == [
        "LINGBOT_TEXT", "LINGBOT_CAMERA", "CONDITIONING", "CONDITIONING"]
    for node in (LingBotWorldVAEEncode, LingBotWorldVAEDecode):
        assert node.INPUT_TYPES()["optional"]["vae_model"][0] == "VAE"
    camera = LingBotWorldCamera.INPUT_TYPES()["required"]
    assert _options(camera["preset"]) == list(CAMERA_PRESETS)
    for node in (camera, LingBotWorldVAEEncode.INPUT_TYPES()["required"]):
        assert (node["width"][1]["default"], node["height"][1]["default"], node["frames"][1]["default"]) == (832, 480, 81)
        assert node["width"][1]["step"] == node["height"][1]["step"] == 16
        assert node["frames"][1]["step"] == 4


# --------------------------------------------------------------------------- files


def _fake_expert(folder: Path, layout: str) -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    if layout == "nf4":
        (folder / "quantization_meta.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(b"0")
    else:
        (folder / "diffusion_pytorch_model.safetensors.index.json").write_text("{}")
        (folder / "diffusion_pytorch_model-00001-of-00001.safetensors").write_bytes(b"0")


def test_model_combos_list_files_folders_and_experts(comfy_dirs):
    root = comfy_dirs["lingbot"] / "pack"
    _fake_expert(root / "high_noise_model_bnb_nf4", "nf4")
    _fake_expert(root / "low_noise_model_bnb_nf4", "nf4")
    _fake_expert(comfy_dirs["diffusion_models"] / "official" / "high_noise_model", "bf16")
    (root / "not_an_expert").mkdir()
    (root / "not_an_expert" / "config.json").write_text("{}")
    for name in ("models_t5_umt5-xxl-enc-bf16.pth", "Wan2.1_VAE.pth", "notes.txt"):
        (root / name).write_bytes(b"0")
    (root / "tokenizer").mkdir()
    (root / "tokenizer" / "tokenizer.json").write_text("{}")
    (comfy_dirs["text_encoders"] / "umt5_xxl_fp8.safetensors").write_bytes(b"0")
    (comfy_dirs["vae"] / "wan_2.1_vae.safetensors").write_bytes(b"0")
    (comfy_dirs["lingbot"] / ".hidden").mkdir()
    (comfy_dirs["lingbot"] / ".hidden" / "t5.pth").write_bytes(b"0")

    assert model_files.list_expert_folders() == [
        "diffusion_models/official/high_noise_model",
        "lingbot/pack/high_noise_model_bnb_nf4",
        "lingbot/pack/low_noise_model_bnb_nf4",
    ]
    # Files whose names say nothing, told apart by their tensor names (header / pickle index only).
    save_file({"decoder.conv1.weight": torch.zeros(1), "encoder.conv1.weight": torch.zeros(1)},
              str(root / "weights_a.safetensors"))
    save_file({"shared.weight": torch.zeros(1), "encoder.block.0.layer.0.SelfAttention.q.weight": torch.zeros(1)},
              str(comfy_dirs["text_encoders"] / "weights_b.safetensors"))
    torch.save({"token_embedding.weight": torch.zeros(1), "blocks.0.attn.q.weight": torch.zeros(1)},
               root / "weights_c.pth")
    (root / "weights_d.pth").write_bytes(b"0")  # unreadable, no hint in the name: offered in both

    assert model_files.list_expert_folders() == [
        "diffusion_models/official/high_noise_model",
        "lingbot/pack/high_noise_model_bnb_nf4",
        "lingbot/pack/low_noise_model_bnb_nf4",
    ]
    # Likely matches first (t5 / vae in the name); expert weights and the other model are never offered.
    assert model_files.list_t5_files() == [
        "lingbot/pack/models_t5_umt5-xxl-enc-bf16.pth", "text_encoders/umt5_xxl_fp8.safetensors",
        "lingbot/pack/weights_c.pth", "lingbot/pack/weights_d.pth", "text_encoders/weights_b.safetensors",
    ]
    assert model_files.list_vae_files() == [
        "lingbot/pack/Wan2.1_VAE.pth", "vae/wan_2.1_vae.safetensors",
        "lingbot/pack/weights_a.safetensors", "lingbot/pack/weights_d.pth",
    ]
    assert model_files.list_tokenizer_folders() == ["lingbot/pack/tokenizer"]
    dit = LingBotWorldDiTLoader.INPUT_TYPES()["required"]
    assert _options(dit["high_noise"]) == _options(dit["low_noise"]) == model_files.list_expert_folders()
    # A fresh node gets the high/low pair of one package, not the same folder twice.
    assert dit["high_noise"][1]["default"] == "lingbot/pack/high_noise_model_bnb_nf4"
    assert dit["low_noise"][1]["default"] == "lingbot/pack/low_noise_model_bnb_nf4"


def test_default_expert_pair():
    pair = model_files.default_expert_pair
    assert pair([]) == (None, None)
    assert pair(["a/x"]) == ("a/x", "a/x")
    assert pair(["a/high_noise_model", "b/high_noise_model", "b/low_noise_model"]) == (
        "b/high_noise_model", "b/low_noise_model")
    assert pair(["a/high_noise_model", "c/low_noise_q"]) == ("a/high_noise_model", "c/low_noise_q")
    assert pair(["lingbot/High_Noise_Model", "lingbot/low_noise_model"]) == (
        "lingbot/High_Noise_Model", "lingbot/low_noise_model")


def test_file_combos_are_validated_by_the_pack(installed):
    assert LingBotWorldVAEEncode.validate_inputs(vae=f"{PKG}/Wan2.1_VAE.pth") is True
    assert LingBotWorldVAEDecode.validate_inputs(vae=model_files.NO_FILE) is True
    problem = LingBotWorldVAEDecode.validate_inputs(vae="vae/missing.pth")
    assert isinstance(problem, str) and problem.startswith("vae: 'vae/missing.pth' is not offered")
    assert LingBotWorldDiTLoader.validate_inputs(high_noise=f"{PKG}/high_noise_model_bnb_nf4",
                                                 low_noise=f"{PKG}/low_noise_model_bnb_nf4") is True
    assert "low_noise" in LingBotWorldDiTLoader.validate_inputs(high_noise=f"{PKG}/high_noise_model_bnb_nf4",
                                                                low_noise=f"{PKG}/tokenizer")
    assert LingBotWorldTextEncode.validate_inputs(t5_file=f"{PKG}/Wan2.1_VAE.pth", tokenizer=f"{PKG}/tokenizer") \
        .startswith("t5_file:")  # the VAE is not offered as a T5 file
    assert LingBotWorldCamera.validate_inputs(poses_file="traj/poses.npy", intrinsics_file=model_files.NO_FILE) is True


def test_resolve_model_path(comfy_dirs):
    (comfy_dirs["vae"] / "sub").mkdir()
    target = comfy_dirs["vae"] / "sub" / "wan.pth"
    target.write_bytes(b"0")
    assert model_files.resolve_model_path("vae/sub/wan.pth", model_files.VAE_KINDS, "vae", want_dir=False) == target
    for bad, words in (("vae/../vae/sub/wan.pth", "'..'"), ("checkpoints/wan.pth", "not in a"),
                       ("vae/sub/missing.pth", "not found"), ("vae/sub", "not found"), ("", "no file")):
        with pytest.raises(ValueError, match="vae: .*") as err:
            model_files.resolve_model_path(bad, model_files.VAE_KINDS, "vae", want_dir=False)
        assert words in str(err.value)


def test_register_model_folder_adds_lingbot_kind(monkeypatch, tmp_path):
    monkeypatch.delitem(folder_paths.folder_names_and_paths, "lingbot", raising=False)
    monkeypatch.setattr(folder_paths, "models_dir", str(tmp_path))
    default = model_files.register_model_folder()
    paths, extensions = folder_paths.folder_names_and_paths["lingbot"]
    assert paths[0] == str(tmp_path / "lingbot") == str(default)
    assert {".pth", ".safetensors"} <= set(extensions)
    model_files.register_model_folder()
    assert folder_paths.folder_names_and_paths["lingbot"][0].count(str(default)) == 1


def test_input_npy_files_cannot_escape_the_input_folder(comfy_dirs, tmp_path):
    (comfy_dirs["input"] / "a" / "b").mkdir(parents=True)
    np.save(comfy_dirs["input"] / "a" / "b" / "poses.npy", np.eye(4)[None])
    np.save(comfy_dirs["input"] / "top.npy", np.zeros(3))
    outside = tmp_path / "outside.npy"
    np.save(outside, np.zeros(3))
    (comfy_dirs["input"] / "link.npy").symlink_to(outside)
    assert model_files.list_input_files(".npy") == ["a/b/poses.npy", "link.npy", "top.npy"]
    assert model_files.resolve_input_file("a/b/poses.npy", "poses_file", ".npy") == (
        comfy_dirs["input"] / "a" / "b" / "poses.npy").resolve()
    for name in ("../outside.npy", str(outside), "link.npy", "a/../../outside.npy"):
        with pytest.raises(ValueError, match="poses_file: .*outside ComfyUI's input folder"):
            model_files.resolve_input_file(name, "poses_file", ".npy")
    with pytest.raises(ValueError, match="poses_file: choose"):
        model_files.resolve_input_file(model_files.NO_FILE, "poses_file", ".npy")
    with pytest.raises(ValueError, match="not found"):
        model_files.resolve_input_file("a/missing.npy", "poses_file", ".npy")


def test_pick_device_on_a_cpu_host():
    assert pick_device("auto") == torch.device("cpu")
    assert pick_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="device=gpu"):
        pick_device("gpu")


# --------------------------------------------------------------------------- camera


def test_camera_preset_outputs_plucker_and_preview(comfy_dirs):
    camera, preview, _ = LingBotWorldCamera.execute("preset", "pan_left", 1.0, model_files.NO_FILE, model_files.NO_FILE, W, H, 9)
    assert isinstance(camera, CameraCondition)
    assert tuple(camera.plucker.shape) == (1, 384, 3, H // 8, W // 8)
    assert (camera.frames, camera.height, camera.width) == (9, H, W)
    assert preview.dtype == torch.float32 and tuple(preview.shape) == (1, 512, 512, 3)
    assert 0.0 <= float(preview.min()) and float(preview.max()) <= 1.0 and float(preview.std()) > 0


def test_camera_from_input_files(installed):
    node = LingBotWorldCamera
    camera, preview, _ = node.execute("files", "static", 1.0, "traj/poses.npy", "traj/intrinsics.npy", W, H, 9)
    assert tuple(camera.plucker.shape) == (1, 384, 3, H // 8, W // 8)
    reference, _, _ = node.execute("preset", "orbit_left", 1.0, model_files.NO_FILE, model_files.NO_FILE, W, H, 9)
    torch.testing.assert_close(camera.plucker, reference.plucker)
    with pytest.raises(ValueError, match="intrinsics_file: choose"):
        node.execute("files", "static", 1.0, "traj/poses.npy", model_files.NO_FILE, W, H, 9)
    with pytest.raises(ValueError, match="13"):  # 9 poses cannot drive 13 frames
        node.execute("files", "static", 1.0, "traj/poses.npy", "traj/intrinsics.npy", W, H, 13)


def test_camera_is_changed_follows_file_contents(installed):
    before = LingBotWorldCamera.fingerprint_inputs(source="files", poses_file="traj/poses.npy", intrinsics_file="traj/intrinsics.npy")
    assert LingBotWorldCamera.fingerprint_inputs(source="files", poses_file="traj/poses.npy",
                                    intrinsics_file="traj/intrinsics.npy") == before
    poses, _ = preset_trajectory("dolly_in", 13)
    np.save(installed["input"] / "traj" / "poses.npy", poses)
    assert LingBotWorldCamera.fingerprint_inputs(source="files", poses_file="traj/poses.npy",
                                    intrinsics_file="traj/intrinsics.npy") != before


# --------------------------------------------------------------------------- models


def test_text_node_encodes_caches_and_validates(installed):
    text = _text(installed)
    assert isinstance(text, TextEmbeddings) and not text.from_cache
    assert text.positive.dim() == 2 and text.negative.dim() == 2
    cache = embedding_cache_dir()
    assert cache.is_relative_to(installed["user"]) and any(cache.iterdir())
    again = _text(installed)
    assert again.from_cache
    torch.testing.assert_close(again.positive, text.positive)
    with pytest.raises(ValueError, match="prompt: character 2 is a lone surrogate"):
        LingBotWorldTextEncode.execute(f"{PKG}/models_t5_umt5-xxl-enc-bf16.pth", f"{PKG}/tokenizer", "ab\ud800", "", "auto")
    with pytest.raises(ValueError, match="tokenizer: folder"):
        LingBotWorldTextEncode.execute(f"{PKG}/models_t5_umt5-xxl-enc-bf16.pth", f"{PKG}/nope", "x", "", "auto")


def test_vae_nodes_round_trip(installed):
    i2v = _i2v()
    assert isinstance(i2v, I2VCondition)
    assert tuple(i2v.y.shape) == (20, 2, H // 8, W // 8)
    latent = {"samples": to_comfy_latent(i2v.y[4:])[None]}  # a LATENT holds the raw VAE latent
    ticks = []
    comfy.utils.set_progress_bar_global_hook(lambda value, total, preview, node_id=None: ticks.append((value, total)))
    frames = LingBotWorldVAEDecode.execute(latent, f"{PKG}/Wan2.1_VAE.pth", 0, "auto")[0]
    assert tuple(frames.shape) == (FRAMES, H, W, 3) and frames.dtype == torch.float32
    assert 0.0 <= float(frames.min()) and float(frames.max()) <= 1.0
    assert ticks and ticks[-1][0] == ticks[-1][1]
    tiled = LingBotWorldVAEDecode.execute(latent, f"{PKG}/Wan2.1_VAE.pth", 4, "cpu")[0]
    assert tiled.shape == frames.shape
    with pytest.raises(ValueError, match="samples: expected a Wan 2.1 latent"):
        LingBotWorldVAEDecode.execute({"samples": torch.zeros(1, 4, 8, 8)}, f"{PKG}/Wan2.1_VAE.pth", 0, "auto")
    with pytest.raises(ValueError, match="image: expected"):
        LingBotWorldVAEEncode.execute(torch.zeros(8, 8, 3), f"{PKG}/Wan2.1_VAE.pth", W, H, FRAMES, "auto")


class _CoreVAE:
    """Stands in for comfy.sd.VAE: the VAE nodes only call get_sd() on it."""

    def __init__(self, tensors: dict) -> None:
        self.tensors = tensors

    def get_sd(self) -> dict:
        return self.tensors


def test_vae_nodes_take_a_core_vae_instead_of_the_file(installed, package):
    core = _CoreVAE(torch.load(package / "Wan2.1_VAE.pth", map_location="cpu", weights_only=True))
    by_file = _i2v()
    by_core = LingBotWorldVAEEncode.execute(_image(), model_files.NO_FILE, W, H, FRAMES, "auto", vae_model=core)[0]
    torch.testing.assert_close(by_core.y, by_file.y)
    latent = {"samples": to_comfy_latent(by_file.y[4:])[None]}
    frames = LingBotWorldVAEDecode.execute(latent, f"{PKG}/Wan2.1_VAE.pth", 0, "cpu")[0]
    torch.testing.assert_close(LingBotWorldVAEDecode.execute(latent, model_files.NO_FILE, 0, "cpu", vae_model=core)[0],
                               frames)
    with pytest.raises(ValueError, match=r"vae: choose .* vae_model"):
        LingBotWorldVAEDecode.execute(latent, model_files.NO_FILE, 0, "cpu")
    with pytest.raises(CheckpointError, match="the connected VAE"):
        LingBotWorldVAEEncode.execute(_image(), model_files.NO_FILE, W, H, FRAMES, "auto",
                                      vae_model=_CoreVAE({"decoder.conv1.weight": torch.zeros(1)}))
    with pytest.raises(ValueError, match="vae_model: expected a VAE"):
        LingBotWorldVAEDecode.execute(latent, model_files.NO_FILE, 0, "cpu", vae_model="not a vae")
    vae_combo = LingBotWorldVAEDecode.INPUT_TYPES()["required"]["vae"]
    assert _options(vae_combo)[-1] == model_files.NO_FILE and vae_combo[1]["default"] == f"{PKG}/Wan2.1_VAE.pth"


def test_comfy_latent_convention_is_the_hosts_wan21():
    wan21 = comfy.latent_formats.Wan21()
    normalized = torch.randn(1, 16, 3, 4, 5)
    raw = to_comfy_latent(normalized)
    torch.testing.assert_close(raw, wan21.process_out(normalized.clone()))
    torch.testing.assert_close(from_comfy_latent(raw), normalized, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(wan21.process_in(raw.clone()), normalized, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(to_comfy_latent(normalized[0]), raw[0])  # unbatched [16, F, h, w] too
    with pytest.raises(ValueError, match="expected"):
        to_comfy_latent(torch.zeros(1, 4, 2, 8, 8))


def test_dit_loader_loads_nothing_and_checks_folders(installed):
    dit = _dit()
    assert isinstance(dit, DiTExperts)
    for patcher in (dit.high, dit.low):
        assert patcher.expert is None and patcher.loaded_size() == 0 and patcher.model_size() > 0
    assert dit.get_ram_usage() == 0
    with pytest.raises(CheckpointError, match="not an expert folder"):
        LingBotWorldDiTLoader.execute(f"{PKG}/tokenizer", f"{PKG}/low_noise_model_bnb_nf4", "none")
    with pytest.raises(ValueError, match="low_noise: folder"):
        LingBotWorldDiTLoader.execute(f"{PKG}/high_noise_model_bnb_nf4", f"{PKG}/missing", "none")


def test_dit_loader_block_swap_input(installed):
    spec = LingBotWorldDiTLoader.INPUT_TYPES()["required"]["block_swap"]
    assert spec[0] == "INT" and (spec[1]["default"], spec[1]["min"], spec[1]["max"]) == (0, 0, 40)
    high, low = f"{PKG}/high_noise_model_bnb_nf4", f"{PKG}/low_noise_model_bnb_nf4"
    swapped = LingBotWorldDiTLoader.execute(high, low, "none", 1)[0]
    assert swapped.high.model.options.blocks_on_gpu == 1 and swapped.low.model.options.blocks_on_gpu == 1
    assert LingBotWorldDiTLoader.execute(high, low, "none", 0)[0].high.model.options.blocks_on_gpu is None  # 0 = off
    for bad in (-1, 41, 2.0):
        with pytest.raises(ValueError, match="block_swap"):
            LingBotWorldDiTLoader.execute(high, low, "none", bad)
    # A CPU host ignores block swap: same sizes, and sampling gives the same latent.
    plain = _dit()
    assert swapped.high.model_size() == plain.high.model_size()
    text, i2v = _text(installed), _i2v()
    assert torch.equal(_sample(swapped, text, i2v, steps=2)["samples"], _sample(plain, text, i2v, steps=2)["samples"])


def test_dit_loader_devices_option(installed, monkeypatch):
    spec = LingBotWorldDiTLoader.INPUT_TYPES()["optional"]["devices"]
    assert _options(spec) == ["single", "expert_per_gpu", "cfg_split"] and spec[1]["default"] == "single"
    high, low = f"{PKG}/high_noise_model_bnb_nf4", f"{PKG}/low_noise_model_bnb_nf4"
    plain = LingBotWorldDiTLoader.execute(high, low, "none", 0, "single")[0]
    assert plain.placement is None and plain.copies == {}  # today's value, unchanged
    with pytest.raises(ValueError, match="devices=cfg_split needs 2 CUDA GPUs.*computes on cpu"):
        LingBotWorldDiTLoader.execute(high, low, "none", 0, "cfg_split")
    with pytest.raises(ValueError, match="devices: 'many' is not one of"):
        LingBotWorldDiTLoader.execute(high, low, "none", 0, "many")
    # A host with one GPU, then with two (sizes only: nothing is loaded by the loader).
    monkeypatch.setattr(mm, "get_torch_device", lambda: torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"devices=expert_per_gpu needs 2 CUDA GPUs, but torch.cuda.device_count\(\) is 1"):
        LingBotWorldDiTLoader.execute(high, low, "none", 0, "expert_per_gpu")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    split = LingBotWorldDiTLoader.execute(high, low, "none", 0, "expert_per_gpu")[0]
    assert split.high.load_device == torch.device("cuda", 0) and split.low.load_device == torch.device("cuda", 1)
    assert split.placement.mode == "expert_per_gpu" and split.get_ram_usage() == 0


def test_sampler_runs_both_experts_and_leaves_none_resident(installed, monkeypatch):
    text, i2v, dit = _text(installed), _i2v(), _dit()
    loads = []
    real_load = mm.load_models_gpu

    def recording_load(models, *args, **kwargs):
        real_load(models, *args, **kwargs)
        assert kwargs.get("force_full_load") is True
        assert not (dit.high.is_resident() and dit.low.is_resident()), "both experts resident at once"
        loads.append([m.model.name for m in models])

    monkeypatch.setattr(mm, "load_models_gpu", recording_load)
    camera, _, _ = LingBotWorldCamera.execute("preset", "dolly_in", 1.0, model_files.NO_FILE, model_files.NO_FILE, W, H, FRAMES)
    ticks = []
    comfy.utils.set_progress_bar_global_hook(lambda value, total, preview, node_id=None: ticks.append((value, total)))
    out = _sample(dit, text, i2v, camera, steps=3)
    latent = out["samples"]
    assert tuple(latent.shape) == (1, 16, 2, H // 8, W // 8) and latent.dtype == torch.float32
    assert torch.isfinite(latent).all()
    # Every step on 0.3.x; newer hosts throttle plain progress but keep the first and last.
    assert ticks[0] == (1, 3) and ticks[-1] == (3, 3) and ticks == sorted(set(ticks))
    assert loads == [["high"], ["low"]]  # boundary 0.9 with shift 4: step 1 high, steps 2-3 low
    assert dit.high.expert is None and dit.low.expert is None
    assert not any(m is dit.high or m is dit.low for m in mm.loaded_models())
    # The same seed gives the same latent; the camera changes it.
    torch.testing.assert_close(_sample(dit, text, i2v, camera, steps=3)["samples"], latent)
    without = _sample(dit, text, i2v, None, steps=3)["samples"]
    assert not torch.allclose(without, latent)


def _conditioning(embedding: torch.Tensor, pad_to: int = 512, mask: bool = False) -> list:
    """What core CLIP Text Encode gives for a umT5 prompt: [[emb [1, 512, dim], extras]], zero-padded."""
    padded = torch.zeros(1, max(pad_to, len(embedding)), embedding.shape[-1])
    padded[0, : len(embedding)] = embedding
    extras = {"pooled_output": None}
    if mask:
        extras["attention_mask"] = (torch.arange(padded.shape[1]) < len(embedding)).long()[None]
    return [[padded, extras]]


def test_text_from_conditioning_trims_the_padding():
    pos, neg = torch.randn(7, 32), torch.randn(3, 32)
    for mask in (False, True):
        text = text_from_conditioning(_conditioning(pos, mask=mask), _conditioning(neg, mask=mask))
        assert torch.equal(text.positive, pos) and torch.equal(text.negative, neg)
    unpadded = text_from_conditioning(_conditioning(pos, pad_to=0), _conditioning(neg, pad_to=0))
    assert torch.equal(unpadded.positive, pos)
    with pytest.raises(ValueError, match="negative: connect"):
        text_from_conditioning(_conditioning(pos), None)
    with pytest.raises(ValueError, match="positive: holds 2 conditionings"):
        text_from_conditioning(_conditioning(pos) * 2, _conditioning(neg))
    with pytest.raises(ValueError, match="negative: expected a CONDITIONING"):
        text_from_conditioning(_conditioning(pos), "blurry")


def test_sampler_takes_core_conditioning_instead_of_text(installed):
    text, i2v, dit = _text(installed), _i2v(), _dit()
    core = {"positive": _conditioning(text.positive), "negative": _conditioning(text.negative, mask=True)}
    by_text = _sample(dit, text, i2v, steps=2)["samples"]
    torch.testing.assert_close(_sample(dit, None, i2v, steps=2, **core)["samples"], by_text)
    with pytest.raises(ValueError, match="both connected"):
        _sample(dit, text, i2v, steps=2, **core)
    with pytest.raises(ValueError, match="no prompt"):
        _sample(dit, None, i2v, steps=2)
    with pytest.raises(ValueError, match="negative: connect"):
        _sample(dit, None, i2v, steps=2, positive=core["positive"])
    with pytest.raises(ValueError, match="positive: connect"):
        _sample(dit, None, i2v, steps=2, negative=core["negative"])
    with pytest.raises(ValueError, match="features per token but the DiT takes 32"):
        _sample(dit, None, i2v, steps=2, positive=_conditioning(torch.randn(4, 4096)),
                negative=_conditioning(torch.randn(4, 4096)))
    assert dit.high.expert is None and dit.low.expert is None


def test_sampler_sends_a_latent_preview_every_step(installed, monkeypatch):
    from comfy.cli_args import LatentPreviewMethod

    monkeypatch.setattr(latent_preview.args, "preview_method", LatentPreviewMethod.Latent2RGB)
    text, i2v, dit = _text(installed), _i2v(), _dit()
    previews = []
    comfy.utils.set_progress_bar_global_hook(
        lambda value, total, preview, node_id=None: previews.append((value, total, preview)))
    _sample(dit, text, i2v, steps=3)
    assert [(v, t) for v, t, _ in previews] == [(1, 3), (2, 3), (3, 3)]
    for _, _, preview in previews:
        kind, image, max_size = preview
        assert kind == "JPEG" and image.size == (W // 8, H // 8) and max_size > 0
    monkeypatch.setattr(latent_preview.args, "preview_method", LatentPreviewMethod.NoPreviews)
    previews.clear()
    _sample(dit, text, i2v, steps=2)
    assert [p for _, _, p in previews] == [None, None]


def test_sampler_rejects_a_camera_of_another_size(installed):
    text, i2v, dit = _text(installed), _i2v(), _dit()
    camera, _, _ = LingBotWorldCamera.execute("preset", "static", 1.0, model_files.NO_FILE, model_files.NO_FILE, 64, H, FRAMES)
    with pytest.raises(ValueError, match=r"camera is for 5 frames at 64x32 .* 5 frames at 48x32"):
        _sample(dit, text, i2v, camera)
    assert dit.high.expert is None


def test_sampler_interrupt_propagates_and_drops_the_expert(installed):
    text, i2v, dit = _text(installed), _i2v(), _dit()
    calls = []

    def hook(value, total, preview, node_id=None):
        calls.append(value)
        mm.interrupt_current_processing(True)  # the user presses Cancel after step 1

    comfy.utils.set_progress_bar_global_hook(hook)
    with pytest.raises(mm.InterruptProcessingException):
        _sample(dit, text, i2v, steps=4)
    assert calls == [1]
    assert dit.high.expert is None and dit.low.expert is None
    assert not mm.processing_interrupted()  # consumed by the raise, as ComfyUI expects


def test_dit_handle_dropped_with_the_cache_frees_everything(installed):
    dit = _dit()
    mm.load_models_gpu([dit.high], force_full_load=True)
    assert dit.get_ram_usage() == dit.high.model_size()  # resident in RAM on a CPU host
    ref = weakref.ref(next(dit.high.expert.parameters()))
    del dit
    gc.collect()
    mm.cleanup_models_gc()
    assert ref() is None
    assert all(m is not None for m in mm.loaded_models())


# --------------------------------------------------------------------------- workflows

WORKFLOWS = ("lingbot_camera_files", "lingbot_camera_preset", "lingbot_fast", "lingbot_no_camera")  # one pass
# Widget values the frontend stores right after an input's own value.
EXTRA_WIDGETS = {("LingBotWorldSampler", "seed"): 1, ("LingBotWorldLongVideo", "seed"): 1, ("LoadImage", "image"): 1}


def _widget_names(class_type: str) -> list[str] | None:
    cls = pack_nodes.NODE_CLASS_MAPPINGS.get(class_type)
    if cls is None:
        return None
    schema = cls.INPUT_TYPES()
    names = []
    for section in ("required", "optional"):
        for name, spec in schema.get(section, {}).items():
            kind = spec[0]
            if isinstance(kind, list) or kind in ("COMBO", "INT", "FLOAT", "STRING", "BOOLEAN"):
                names.append(name)
    return names


def cls_optional(class_type: str) -> set[str]:
    return set(pack_nodes.NODE_CLASS_MAPPINGS[class_type].INPUT_TYPES().get("optional", {}))


@pytest.mark.parametrize("name", WORKFLOWS)
def test_api_workflow_matches_node_schemas(name, comfy_dirs):
    graph = json.loads((REPO / "workflows" / "api" / f"{name}.json").read_text(encoding="utf-8"))
    classes = [node["class_type"] for node in graph.values()]
    assert classes.count("LingBotWorldSampler") == 1 and "SaveVideo" in classes and "CreateVideo" in classes
    assert ("LingBotWorldCamera" in classes) == (name != "lingbot_no_camera")
    if name == "lingbot_fast":
        fast = next(n for n in graph.values() if n["class_type"] == "LingBotWorldSampler")["inputs"]
        assert {k: fast[k] for k in ("cache_threshold", "cfg_truncate", "attention", "preset")} == \
            {"cache_threshold": 0.05, "cfg_truncate": 0.2, "attention": "auto", "preset": "none"}
    for node_id, node in graph.items():
        cls = pack_nodes.NODE_CLASS_MAPPINGS.get(node["class_type"])
        if cls is None:
            continue
        schema = cls.INPUT_TYPES()
        assert set(schema["required"]) <= set(node["inputs"]), node_id
        assert set(node["inputs"]) <= set(schema["required"]) | set(schema.get("optional", {})), node_id
        for key, value in node["inputs"].items():
            if isinstance(value, list):
                assert value[0] in graph, f"{node_id}.{key} links to a missing node"
    fps = [n["inputs"]["fps"] for n in graph.values() if n["class_type"] == "CreateVideo"]
    assert fps == [16.0]
    sampler = next(n for n in graph.values() if n["class_type"] == "LingBotWorldSampler")
    encode = next(n for n in graph.values() if n["class_type"] == "LingBotWorldVAEEncode")
    for camera in (n for n in graph.values() if n["class_type"] == "LingBotWorldCamera"):
        assert [camera["inputs"][k] for k in ("width", "height", "frames")] == \
            [encode["inputs"][k] for k in ("width", "height", "frames")]
        assert sampler["inputs"]["camera"][0] in graph


def test_long_walk_api_workflow_matches_node_schemas(comfy_dirs):
    graph = json.loads((REPO / "workflows" / "api" / "lingbot_long_walk.json").read_text(encoding="utf-8"))
    for node_id, node in graph.items():
        cls = pack_nodes.NODE_CLASS_MAPPINGS.get(node["class_type"])
        if cls is None:
            continue
        schema = cls.INPUT_TYPES()
        assert set(schema["required"]) <= set(node["inputs"]) <= set(schema["required"]) | set(schema.get("optional", {}))
    camera = next(n for n in graph.values() if n["class_type"] == "LingBotWorldCamera")["inputs"]
    long = next(n for n in graph.values() if n["class_type"] == "LingBotWorldLongVideo")["inputs"]
    assert camera["source"] == "actions" and camera["frames"] == long["frames"] == 961
    assert [camera[k] for k in ("width", "height", "window", "overlap")] == [long[k] for k in ("width", "height", "window", "overlap")]
    assert (long["window"], long["overlap"], long["steps"]) == (81, 1, 40)
    assert long["camera_path"] == [next(k for k, n in graph.items() if n["class_type"] == "LingBotWorldCamera"), 2]
    assert "LingBotWorldSampler" not in {n["class_type"] for n in graph.values()}


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_ui_workflow_is_the_api_workflow(name, comfy_dirs):
    """Widget values follow INPUT_TYPES order, links follow the API graph, a thumbnail exists."""
    ui = json.loads((REPO / "example_workflows" / f"{TEMPLATES[name]}.json").read_text(encoding="utf-8"))
    api = json.loads((REPO / "workflows" / "api" / f"{name}.json").read_text(encoding="utf-8"))
    assert (REPO / "example_workflows" / f"{TEMPLATES[name]}.jpg").is_file()
    # Opens at a zoom where the frontend draws node bodies (it simplifies them below ~0.6).
    assert 0.6 <= ui["extra"]["ds"]["scale"] <= 1.5
    assert ui["version"] == 0.4
    links = {link[0]: link for link in ui["links"]}
    nodes = {str(n["id"]): n for n in ui["nodes"] if n["type"] != "MarkdownNote"}
    assert set(nodes) == set(api)
    for node_id, node in nodes.items():
        expected = api[node_id]
        assert node["type"] == expected["class_type"]
        for slot in node["inputs"]:
            source = expected["inputs"].get(slot["name"])
            if slot["link"] is None:
                assert source is None
                continue
            _, origin, origin_slot, target, target_slot, _ = links[slot["link"]]
            assert [str(origin), origin_slot] == source and str(target) == node_id
            assert node["inputs"][target_slot] is slot
        names = _widget_names(node["type"])
        if names is None:
            continue
        values = list(node["widgets_values"])
        optional = cls_optional(node["type"])
        for input_name in names:
            if not values and input_name in optional and input_name not in expected["inputs"]:
                continue  # a widget added after the graph was saved: the frontend and the node use its default
            assert values.pop(0) == expected["inputs"][input_name], f"{node_id}.{input_name}"
            for _ in range(EXTRA_WIDGETS.get((node["type"], input_name), 0)):
                values.pop(0)
        assert values == []
    seed_widgets = next(n for n in nodes.values()
                        if n["type"] in ("LingBotWorldSampler", "LingBotWorldLongVideo"))["widgets_values"]
    assert seed_widgets[seed_widgets.index(42) + 1] == "fixed"


def test_templates_are_the_workflows_with_distinct_thumbnails():
    folder = REPO / "example_workflows"
    assert sorted(p.stem for p in folder.glob("*.json")) == sorted(TEMPLATES.values())
    assert sorted(p.stem for p in (REPO / "workflows" / "api").glob("*.json")) == sorted(TEMPLATES)
    thumbs = {name: np.asarray(Image.open(folder / f"{title}.jpg").convert("L"), dtype=np.float32)
              for name, title in TEMPLATES.items()}
    for first, second in [(a, b) for a in thumbs for b in thumbs if a < b]:
        # The camera graphs differ only in a few widgets, the note's heading and the path
        # drawing: at least 0.2% of the pixels must differ clearly (the first thumbnails,
        # which differed in one widget, had 0.12%).
        changed = (np.abs(thumbs[first] - thumbs[second]) > 30).mean()
        assert changed > 0.002, f"{first} and {second} have the same thumbnail ({changed:.4%} differs)"


def test_vae_precision_input(installed):
    """fp32 (the reference's precision) by default; bf16 on request; anything else named."""
    image = torch.rand(1, 40, 56, 3)
    exact = LingBotWorldVAEEncode.execute(image, f"{PKG}/Wan2.1_VAE.pth", 48, 32, 5, "cpu")[0]
    same = LingBotWorldVAEEncode.execute(image, f"{PKG}/Wan2.1_VAE.pth", 48, 32, 5, "cpu", precision="fp32")[0]
    assert torch.equal(exact.y, same.y)
    low = LingBotWorldVAEEncode.execute(image, f"{PKG}/Wan2.1_VAE.pth", 48, 32, 5, "cpu", precision="bf16")[0]
    assert not torch.equal(exact.y, low.y)
    torch.testing.assert_close(low.y, exact.y, rtol=0.1, atol=0.1)
    with pytest.raises(ValueError, match="precision: 'fp16' is not one of fp32, bf16"):
        LingBotWorldVAEEncode.execute(image, f"{PKG}/Wan2.1_VAE.pth", 48, 32, 5, "cpu", precision="fp16")


def test_comfy_disable_pinned_memory_turns_staging_off(monkeypatch):
    from comfy.cli_args import args

    from comfyui_lingbot_world.loaders import pinned_upload
    from comfyui_lingbot_world.nodes.host.host_settings import follow_host_settings

    monkeypatch.setattr(args, "disable_pinned_memory", True)
    try:
        follow_host_settings()
        assert pinned_upload._allowed is False
        monkeypatch.setattr(args, "disable_pinned_memory", False)
        follow_host_settings()
        assert pinned_upload._allowed is True
    finally:
        pinned_upload.allow_pinned_staging(True)
