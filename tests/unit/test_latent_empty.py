"""A LATENT with an empty axis is refused where it enters, naming the input, instead of raw
torch errors inside the VAE decoder."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tiny_package
from comfy_host import comfy_state_reset, use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
from comfyui_lingbot_world.nodes.vae import LingBotWorldVAEDecode  # noqa: E402
from comfyui_lingbot_world.pipeline.decode import decode  # noqa: E402
from comfyui_lingbot_world.pipeline.latent import from_comfy_latent  # noqa: E402

EMPTY = [(16, 0, 4, 6), (16, 2, 0, 6), (16, 2, 4, 0)]
IDS = ["no-frames", "no-rows", "no-columns"]

clean_comfy_state = pytest.fixture(autouse=True)(comfy_state_reset)


@pytest.fixture(scope="module")
def vae_file(tmp_path_factory) -> Path:
    return tiny_package.build(tmp_path_factory.mktemp("empty_latent"), "nf4") / "Wan2.1_VAE.pth"


@pytest.mark.parametrize("shape", EMPTY, ids=IDS)
def test_decoder_refuses_an_empty_latent(vae_file, shape):
    with pytest.raises(ValueError, match=r"latent: latent has shape .* an empty latent"):
        decode(vae_file, torch.zeros(shape), "cpu")


@pytest.mark.parametrize("shape", EMPTY, ids=IDS)
def test_conversion_from_a_comfy_latent_refuses_an_empty_one(shape):
    with pytest.raises(ValueError, match=r"^samples: latent has shape"):
        from_comfy_latent(torch.zeros(shape), "samples")


@pytest.mark.parametrize("shape", EMPTY, ids=IDS)
def test_decode_node_names_samples_for_an_empty_latent(vae_file, monkeypatch, shape):
    from comfyui_lingbot_world.nodes import vae as vae_node

    monkeypatch.setattr(vae_node, "vae_source", lambda vae, vae_model: (vae_file, vae_file.stat().st_size))
    with pytest.raises(ValueError, match=r"^samples: latent has shape .* an empty latent"):
        LingBotWorldVAEDecode.execute({"samples": torch.zeros((1, *shape))}, "lingbot/pkg/Wan2.1_VAE.pth", 0, "cpu")
