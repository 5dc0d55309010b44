"""Geometry read from a checkpoint is bounded and checked against the file's keys before a
model is built or a tensor read whole: one extra tiny tensor at
block 99,999 of a text encoder used to build 100,000 blocks (230 s, 5.4 GB)."""
from __future__ import annotations

from pathlib import Path

import pytest
import safetensors
import torch
from safetensors.torch import load_file, save_file
from torch import nn

import tiny_package
from comfyui_lingbot_world.loaders import lora as lora_loader
from comfyui_lingbot_world.loaders.errors import CheckpointError
from comfyui_lingbot_world.loaders.lora import read_lora
from comfyui_lingbot_world.loaders.nf4 import load_nf4_expert
from comfyui_lingbot_world.loaders.t5_loader import load_t5
from comfyui_lingbot_world.loaders.vae_loader import load_vae
from comfyui_lingbot_world.tools import make_checkpoint
from comfyui_lingbot_world.wan import model as dit_model
from comfyui_lingbot_world.wan import t5 as t5_model
from comfyui_lingbot_world.wan import vae as vae_model
from comfyui_lingbot_world.wan.checkpoint_keys import count_blocks


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    return tiny_package.build(tmp_path_factory.mktemp("bounds"), "nf4")


@pytest.fixture(scope="module")
def comfy_t5(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bounds_comfy_t5")
    assert make_checkpoint.main(["--preset", "tiny", "--layout", "nf4", "--out", str(out), "--parts", "comfy_t5"]) == 0
    return next(out.glob("umt5_xxl_*.safetensors"))


@pytest.fixture
def builds(monkeypatch) -> list[str]:
    """Names of the blocks constructed while the test runs (encoder, VAE or DiT blocks)."""
    built: list[str] = []
    for owner, cls in ((t5_model, "T5Block"), (vae_model, "ResidualBlock"), (dit_model, "LingBotDiT")):
        original = getattr(owner, cls).__init__

        def spy(self, *args, _original=original, _name=cls, **kwargs):
            built.append(_name)
            _original(self, *args, **kwargs)

        monkeypatch.setattr(getattr(owner, cls), "__init__", spy)
    return built


# --------------------------------------------------------------------------- the key rule


def test_count_blocks_rules():
    keys = [f"blocks.{i}.w" for i in range(3)] + ["head.w"]
    assert count_blocks(keys, "blocks.", 8, ("w",)) == 3
    with pytest.raises(ValueError, match="gap"):
        count_blocks(keys + ["blocks.9.w"], "blocks.", 64)
    with pytest.raises(ValueError, match="at most 8 blocks"):
        count_blocks(keys + ["blocks.99999.w"], "blocks.", 8)
    with pytest.raises(ValueError, match="at most 8 blocks"):
        count_blocks(keys + ["blocks." + "9" * 5000 + ".w"], "blocks.", 8)  # beyond int()'s digit limit
    with pytest.raises(ValueError, match=r"blocks.1 does not match the model; 1 missing key\(s\): blocks.1.v"):
        count_blocks(keys + ["blocks.0.v", "blocks.2.v"], "blocks.", 8, ("w", "v"))


# --------------------------------------------------------------------------- 1. text encoder


def test_umt5_pth_with_a_tensor_at_block_99999_is_refused_before_building(package, tmp_path, builds):
    state = torch.load(package / "models_t5_umt5-xxl-enc-bf16.pth", weights_only=True)
    state["blocks.99999.norm1.weight"] = torch.ones(1)
    torch.save(state, tmp_path / "t5.pth")
    with pytest.raises(CheckpointError, match=r"t5.pth: .*blocks.99999.norm1.weight.* at most 64 blocks"):
        load_t5(tmp_path / "t5.pth", "cpu")
    assert builds == []


def test_umt5_pth_with_more_complete_blocks_than_the_bound_is_refused(package, tmp_path, builds):
    state = torch.load(package / "models_t5_umt5-xxl-enc-bf16.pth", weights_only=True)
    block0 = {k[len("blocks.0."):]: v for k, v in state.items() if k.startswith("blocks.0.")}
    for index in range(2, 70):  # blocks 0..69, every one complete
        state.update({f"blocks.{index}.{leaf}": v for leaf, v in block0.items()})
    torch.save(state, tmp_path / "deep.pth")
    with pytest.raises(CheckpointError, match=r"deep.pth: .*blocks.64.* at most 64 blocks"):
        load_t5(tmp_path / "deep.pth", "cpu")
    assert builds == []


def test_comfy_umt5_safetensors_with_a_tensor_at_block_999999_is_refused_before_building(comfy_t5, tmp_path, builds):
    state = load_file(str(comfy_t5))
    state["encoder.block.999999.layer.0.layer_norm.weight"] = torch.ones(1, dtype=torch.bfloat16)
    save_file(state, str(tmp_path / "umt5_xxl_fp16.safetensors"))
    with pytest.raises(CheckpointError, match=r"umt5_xxl_fp16.safetensors: .*encoder.block.999999.* at most 64"):
        load_t5(tmp_path / "umt5_xxl_fp16.safetensors", "cpu")
    assert builds == []


def test_umt5_geometry_beyond_its_limits_is_refused():
    with pytest.raises(ValueError, match="dim=100000 is more than 16384"):
        t5_model.T5Geometry(vocab_size=512, dim=100000, dim_attn=100000, dim_ffn=64, num_heads=100000,
                            num_layers=2, num_buckets=32)


# --------------------------------------------------------------------------- VAE and DiT


@pytest.mark.parametrize("key", ["encoder.downsamples.99999.residual.2.weight", "decoder.upsamples.99999.x.weight"])
def test_vae_with_a_far_block_is_refused_before_building(package, tmp_path, builds, key):
    state = torch.load(package / "Wan2.1_VAE.pth", weights_only=True)
    state[key] = torch.ones(1)
    torch.save(state, tmp_path / "vae.pth")
    with pytest.raises(CheckpointError, match=r"vae.pth: .*99999"):
        load_vae(tmp_path / "vae.pth", "cpu")
    assert builds == []


def test_dit_expert_with_a_block_gap_is_refused_before_building(package, tmp_path, builds):
    folder = tmp_path / "high_noise_model_bnb_nf4"
    folder.mkdir()
    for f in (package / "high_noise_model_bnb_nf4").iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    state = load_file(str(folder / "model.safetensors"))
    state["blocks.5.norm3.weight"] = torch.ones(1)  # blocks 0, 1 and 5
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match="gap"):
        load_nf4_expert(folder, "cpu")
    assert builds == []


# --------------------------------------------------------------------------- 8, 9. LoRA


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(16, 24)


class _Expert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_Block(), _Block()])


def _lora(path: Path, down: torch.Tensor, up: torch.Tensor, alpha: float | None = 4.0) -> Path:
    state = {"diffusion_model.blocks.0.q.lora_A.weight": down, "diffusion_model.blocks.0.q.lora_B.weight": up}
    if alpha is not None:
        state["diffusion_model.blocks.0.q.alpha"] = torch.tensor(alpha)
    save_file(state, str(path))
    return path


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """Keys whose tensor data read_lora reads (get_tensor), while the test runs."""
    seen: list[str] = []
    real_open = safetensors.safe_open

    class Spy:
        def __init__(self, *args, **kwargs):
            self._handle = real_open(*args, **kwargs)

        def __enter__(self):
            self._handle.__enter__()
            return self

        def __exit__(self, *exc):
            return self._handle.__exit__(*exc)

        def get_tensor(self, key):
            seen.append(key)
            return self._handle.get_tensor(key)

        def __getattr__(self, name):
            return getattr(self._handle, name)

    monkeypatch.setattr(lora_loader, "safe_open", Spy)
    return seen


def test_lora_tensor_of_the_wrong_shape_is_refused_unread(tmp_path, reads):
    path = _lora(tmp_path / "wide.safetensors", torch.zeros(4, 16), torch.zeros(24 * 1000, 4))
    with pytest.raises(CheckpointError, match=r"wide.safetensors: key 'diffusion_model.blocks.0.q': .*do not fit"):
        read_lora(path, _Expert())
    assert reads == []


def test_lora_of_a_rank_beyond_the_layer_is_refused_unread(tmp_path, reads):
    path = _lora(tmp_path / "deep.safetensors", torch.zeros(17, 16), torch.zeros(24, 17))
    with pytest.raises(CheckpointError, match=r"has rank 17, more than layer blocks.0.q can use .*at most 16"):
        read_lora(path, _Expert())
    assert reads == []


@pytest.mark.parametrize("alpha", [4.0, None], ids=["with-alpha", "without-alpha"])
def test_rank_zero_lora_is_refused_clearly(tmp_path, alpha):
    path = _lora(tmp_path / "empty.safetensors", torch.zeros(0, 16), torch.zeros(24, 0), alpha)
    with pytest.raises(CheckpointError, match=r"empty.safetensors: key 'diffusion_model.blocks.0.q' has rank 0"):
        read_lora(path, _Expert())


def test_a_good_lora_is_still_read(tmp_path, reads):
    path = _lora(tmp_path / "good.safetensors", torch.ones(2, 16), torch.ones(24, 2))
    adapters = read_lora(path, _Expert(), strength=0.5).adapters["blocks.0.q"]
    assert adapters[0].scale == pytest.approx(4.0 / 2 * 0.5)
    assert len(reads) == 3
