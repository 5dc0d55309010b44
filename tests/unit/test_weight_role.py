"""loaders/weight_role.py: a T5 or VAE weights file told apart by the tensor names in its
header (official .pth, ComfyUI's .safetensors), whatever the file is called; the name only
where the header cannot be read; a file replaced under the same name judged again. What the
node combos offer from it: test_host_model_files.py."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from comfyui_lingbot_world.loaders.weight_role import weight_role
from comfyui_lingbot_world.tools.synthetic.t5 import write_comfy_t5, write_t5_checkpoint
from comfyui_lingbot_world.tools.synthetic.vae import write_vae_checkpoint
from comfyui_lingbot_world.wan.t5 import T5_TINY
from comfyui_lingbot_world.wan.vae import VAE_TINY


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("roles")
    return {
        "vae_pth": write_vae_checkpoint(root / "Wan2.1_VAE.pth", VAE_TINY),
        "vae_safetensors": write_vae_checkpoint(root / "wan_2.1_vae.safetensors", VAE_TINY),
        "t5_pth": write_t5_checkpoint(root / "models_t5_umt5-xxl-enc-bf16.pth", T5_TINY),
        "t5_safetensors": write_comfy_t5(root / "umt5_xxl_bf16.safetensors", T5_TINY),
        # the names say the other model: the header decides
        "vae_named_t5": write_vae_checkpoint(root / "t5_encoder.pth", VAE_TINY),
        "t5_named_vae": write_t5_checkpoint(root / "vae_t5.pth", T5_TINY),
    }


@pytest.mark.parametrize("name, role", [("vae_pth", "vae"), ("vae_safetensors", "vae"), ("t5_pth", "t5"),
                                        ("t5_safetensors", "t5"), ("vae_named_t5", "vae"), ("t5_named_vae", "t5")])
def test_the_tensor_names_decide(files, name, role):
    assert weight_role(files[name]) == role


def test_an_unreadable_header_falls_back_on_the_name(tmp_path):
    for name, role in (("my_vae.safetensors", "vae"), ("umt5.pth", "t5"), ("model.safetensors", None)):
        (tmp_path / name).write_bytes(b"\x00not a header")
        assert weight_role(tmp_path / name) == role, name
    other = tmp_path / "other.safetensors"  # readable, of neither model
    save_file({"blocks.0.self_attn.q.weight": torch.zeros(2, 2)}, str(other))
    assert weight_role(other) is None
    assert weight_role(tmp_path / "gone.pth") is None


def test_a_file_replaced_under_the_same_name_is_judged_again(files, tmp_path):
    path = tmp_path / "model.pth"
    write_vae_checkpoint(path, VAE_TINY)
    assert weight_role(path) == "vae"
    write_t5_checkpoint(path, T5_TINY)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a new version even within the clock's step
    assert weight_role(path) == "t5"
