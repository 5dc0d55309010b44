"""nodes/vae.py: LingBot-World Wan VAE Encode and Decode inside the ComfyUI host (CPU): a VAE
file or a core VAE, tiles, precision, and the checks of their inputs."""
from __future__ import annotations

import pytest
import torch

from comfy_host import comfy_state_reset, use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
import comfy.utils  # noqa: E402

from node_runs import FRAMES, H, PKG, W, encode_start, options, start_image  # noqa: E402
from comfyui_lingbot_world.loaders.errors import CheckpointError  # noqa: E402
from comfyui_lingbot_world.nodes.host import model_files  # noqa: E402
from comfyui_lingbot_world.nodes.vae import LingBotWorldVAEDecode, LingBotWorldVAEEncode  # noqa: E402
from comfyui_lingbot_world.pipeline.image import I2VCondition  # noqa: E402
from comfyui_lingbot_world.pipeline.latent import to_comfy_latent  # noqa: E402


clean_comfy_state = pytest.fixture(autouse=True)(comfy_state_reset)


def test_vae_nodes_round_trip(installed):
    i2v = encode_start()
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
    by_file = encode_start()
    by_core = LingBotWorldVAEEncode.execute(start_image(), model_files.NO_FILE, W, H, FRAMES, "auto", vae_model=core)[0]
    torch.testing.assert_close(by_core.y, by_file.y)
    latent = {"samples": to_comfy_latent(by_file.y[4:])[None]}
    frames = LingBotWorldVAEDecode.execute(latent, f"{PKG}/Wan2.1_VAE.pth", 0, "cpu")[0]
    torch.testing.assert_close(LingBotWorldVAEDecode.execute(latent, model_files.NO_FILE, 0, "cpu", vae_model=core)[0],
                               frames)
    with pytest.raises(ValueError, match=r"vae: choose .* vae_model"):
        LingBotWorldVAEDecode.execute(latent, model_files.NO_FILE, 0, "cpu")
    with pytest.raises(CheckpointError, match="the connected VAE"):
        LingBotWorldVAEEncode.execute(start_image(), model_files.NO_FILE, W, H, FRAMES, "auto",
                                      vae_model=_CoreVAE({"decoder.conv1.weight": torch.zeros(1)}))
    with pytest.raises(ValueError, match="vae_model: expected a VAE"):
        LingBotWorldVAEDecode.execute(latent, model_files.NO_FILE, 0, "cpu", vae_model="not a vae")
    vae_combo = LingBotWorldVAEDecode.INPUT_TYPES()["required"]["vae"]
    assert options(vae_combo)[-1] == model_files.NO_FILE and vae_combo[1]["default"] == f"{PKG}/Wan2.1_VAE.pth"


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
