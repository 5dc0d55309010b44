"""nodes/host/model_files.py: the model combos (experts, T5 and VAE files told apart by their
tensor names, tokenizers), combo values back to paths, the lingbot model folder, and names
that may not leave ComfyUI's input folder."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from comfy_host import use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
import folder_paths  # noqa: E402

from node_runs import options  # noqa: E402
from comfyui_lingbot_world.nodes.dit_loader import LingBotWorldDiTLoader  # noqa: E402
from comfyui_lingbot_world.nodes.host import model_files  # noqa: E402


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
    assert options(dit["high_noise"]) == options(dit["low_noise"]) == model_files.list_expert_folders()
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


def test_a_fresh_dit_loader_picks_base_cam_beside_an_act_package_listed_first(comfy_dirs, package, act_packages):
    """Issue 27: with lingbot-world-base-act-nf4 beside lingbot-world-base-cam-nf4 (Act first
    alphabetically) a fresh DiT Loader took Act, and its preset camera failed at the sampler.
    Base-Cam is picked, and the tooltip says which folder and checkpoint it picked."""
    (comfy_dirs["lingbot"] / "lingbot-world-base-act-nf4").symlink_to(act_packages["nf4"], target_is_directory=True)
    (comfy_dirs["lingbot"] / "lingbot-world-base-cam-nf4").symlink_to(package, target_is_directory=True)
    experts = model_files.list_expert_folders()
    assert experts[0].startswith("lingbot/lingbot-world-base-act-nf4/")
    assert model_files.expert_control(experts[0]) == "act"
    dit = LingBotWorldDiTLoader.INPUT_TYPES()["required"]
    high, low = dit["high_noise"][1]["default"], dit["low_noise"][1]["default"]
    assert (high, low) == ("lingbot/lingbot-world-base-cam-nf4/high_noise_model_bnb_nf4",
                           "lingbot/lingbot-world-base-cam-nf4/low_noise_model_bnb_nf4")
    assert f"A fresh node picks {high}: Base-Cam" in dit["high_noise"][1]["tooltip"]
    # Only Act installed: Act is picked (and the tooltip says so), not nothing.
    (comfy_dirs["lingbot"] / "lingbot-world-base-cam-nf4").unlink()
    dit = LingBotWorldDiTLoader.INPUT_TYPES()["required"]
    assert dit["high_noise"][1]["default"] == "lingbot/lingbot-world-base-act-nf4/high_noise_model_bnb_nf4"
    assert ": Act." in dit["high_noise"][1]["tooltip"]
    assert model_files.expert_control("lingbot/nowhere/high_noise_model") is None


@pytest.mark.parametrize("mirror", ["a_mirror", "zz_mirror"])
def test_a_folder_of_links_to_the_package_never_hides_its_names(installed, mirror):
    """A second folder whose subfolders link to the installed package's folders hid the
    package from every list (each real folder is listed once, and the alphabet picked the
    link's name): every shipped workflow was refused as 'not offered'. The package keeps its
    own names; only folders reached through links alone are listed under a link's name."""
    package = installed["package"]
    links = installed["lingbot"] / mirror
    links.mkdir()
    for expert in ("high_noise_model_bnb_nf4", "low_noise_model_bnb_nf4"):
        (links / expert).symlink_to(installed["lingbot"] / "pkg" / expert, target_is_directory=True)
    (links / "whole").symlink_to(package, target_is_directory=True)
    (links / "deeper").mkdir()
    (links / "deeper" / "tokenizer").symlink_to(package / "tokenizer", target_is_directory=True)
    assert model_files.list_expert_folders() == ["lingbot/pkg/high_noise_model_bnb_nf4",
                                                 "lingbot/pkg/low_noise_model_bnb_nf4"]
    assert model_files.list_tokenizer_folders() == ["lingbot/pkg/tokenizer"]
    assert [f for f in model_files.list_t5_files() if f.startswith("lingbot/")] == [
        "lingbot/pkg/models_t5_umt5-xxl-enc-bf16.pth"]
    assert model_files.list_vae_files() == ["lingbot/pkg/Wan2.1_VAE.pth"]
    dit = LingBotWorldDiTLoader.INPUT_TYPES()["required"]
    assert (dit["high_noise"][1]["default"], dit["low_noise"][1]["default"]) == (
        "lingbot/pkg/high_noise_model_bnb_nf4", "lingbot/pkg/low_noise_model_bnb_nf4")
    assert LingBotWorldDiTLoader.validate_inputs(high_noise="lingbot/pkg/high_noise_model_bnb_nf4",
                                                 low_noise="lingbot/pkg/low_noise_model_bnb_nf4") is True


def test_a_folder_reached_only_through_a_link_is_listed_under_it(comfy_dirs, package):
    """Model folders are often links to another drive: those stay listed, under the link's name,
    and a link back into the tree is walked once."""
    (comfy_dirs["lingbot"] / "drive").symlink_to(package, target_is_directory=True)
    (comfy_dirs["lingbot"] / "loop").symlink_to(comfy_dirs["lingbot"], target_is_directory=True)
    assert model_files.list_expert_folders() == ["lingbot/drive/high_noise_model_bnb_nf4",
                                                 "lingbot/drive/low_noise_model_bnb_nf4"]


def test_fresh_t5_tokenizer_and_vae_pickers_take_the_dit_loaders_package(comfy_dirs, package, act_packages):
    """With Base-Cam and Act installed (Act first alphabetically) the DiT Loader picked
    Base-Cam but T5 Encode and every vae picker took Act's files: one rule now, the package
    of the DiT Loader's default."""
    from comfyui_lingbot_world import nodes as pack_nodes

    (comfy_dirs["lingbot"] / "lingbot-world-base-act-nf4").symlink_to(act_packages["nf4"], target_is_directory=True)
    (comfy_dirs["lingbot"] / "lingbot-world-base-cam-nf4").symlink_to(package, target_is_directory=True)
    cam = "lingbot/lingbot-world-base-cam-nf4/"
    assert model_files.list_vae_files()[0].startswith("lingbot/lingbot-world-base-act-nf4/")  # what the rule overrides
    assert model_files.default_package() == cam[:-1]
    t5 = pack_nodes.NODE_CLASS_MAPPINGS["LingBotWorldTextEncode"].INPUT_TYPES()["required"]
    assert t5["t5_file"][1]["default"] == cam + "models_t5_umt5-xxl-enc-bf16.pth"
    assert t5["tokenizer"][1]["default"] == cam + "tokenizer"
    pickers = {name: cls.INPUT_TYPES()["required"]["vae"][1]["default"]
               for name, cls in pack_nodes.NODE_CLASS_MAPPINGS.items()
               if "vae" in cls.INPUT_TYPES()["required"] and name.startswith("LingBotWorld")}
    assert len(pickers) >= 5 and set(pickers.values()) == {cam + "Wan2.1_VAE.pth"}, pickers
