"""Shared pieces of the LingBot-World Fast tests: a tiny float32 transformer with random
weights (non-trivial norms and biases), its conditioning, and a camera path."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from comfyui_lingbot_world.loaders.fp8 import convert_to_fp8
from comfyui_lingbot_world.tools.synthetic.dit import write_synthetic_bf16_expert

from comfyui_lingbot_world.wan.camera import camera_tensor
from comfyui_lingbot_world.wan.camera_presets import preset_trajectory
from comfyui_lingbot_world.wan.config import TINY, DiTConfig
from comfyui_lingbot_world.wan.model import LingBotDiT
from comfyui_lingbot_world.wan.runtime.cuda_graphs import ForwardGraphs, _Captured
from comfyui_lingbot_world.wan.vae import VAE_TINY, WanVAE

HEIGHT, WIDTH = 32, 48  # latent 4 x 6, 6 tokens a latent frame with the (1, 2, 2) patch
LAT_H, LAT_W = HEIGHT // 8, WIDTH // 8
# The GPU tests' Fast transformer: small, but with every dimension a multiple of 16, so the
# 8-bit kernels run (no fallback).
SHAPED = DiTConfig(dim=256, ffn_dim=512, freq_dim=256, text_dim=64, num_heads=2, num_layers=4)


def shaped_bf16_and_fp8(root: Path, seed: int) -> dict[str, Path]:
    """A synthetic bf16 Fast folder of ``SHAPED`` in ``root`` and its fp8 conversion (on CUDA)."""
    bf16 = write_synthetic_bf16_expert(root / "lingbot_world_fast", SHAPED, seed=seed)
    return {"bf16": bf16, "fp8": convert_to_fp8(bf16, root / "lingbot_world_fast_fp8", "cuda")}


def tiny_fast_model(seed: int = 0, cfg: DiTConfig = TINY) -> LingBotDiT:
    g = torch.Generator().manual_seed(seed)
    model = LingBotDiT(cfg)
    model.init_weights(generator=g)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.2 * noise) if "norm" in name else p.add_(0.05 * noise)
    return model.eval()


def tiny_vae(seed: int = 0) -> WanVAE:
    with torch.device("meta"):
        vae = WanVAE(VAE_TINY)
    vae.init_weights(torch.Generator().manual_seed(seed))
    return vae.eval()


def prompt(seed: int = 3, tokens: int = 7, cfg: DiTConfig = TINY) -> torch.Tensor:
    return torch.randn(tokens, cfg.text_dim, generator=torch.Generator().manual_seed(seed))


def image(seed: int = 4) -> torch.Tensor:
    """A first frame [3, HEIGHT, WIDTH] in [-1, 1]."""
    return torch.rand(3, HEIGHT, WIDTH, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def camera_path(frames: int) -> tuple[np.ndarray, np.ndarray]:
    return preset_trajectory("orbit_left", frames, 2.0)


def whole_camera(frames: int) -> torch.Tensor:
    poses, intrinsics = camera_path(frames)
    return camera_tensor(poses, intrinsics, frames, HEIGHT, WIDTH, dtype=torch.float32)


def video_frames(latent_frames: int) -> int:
    return (latent_frames - 1) * 4 + 1


# Module fixtures shared by the Fast engine's test modules (imported there by name).
@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One torch thread for the module: the tiny models' results are then the same on any
    machine, and two cores are not fought over."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model() -> LingBotDiT:
    return tiny_fast_model()


@pytest.fixture(scope="module")
def vae() -> WanVAE:
    return tiny_vae()


class CpuGraphs(ForwardGraphs):
    """``ForwardGraphs`` with a stand-in for CUDA graph capture on the CPU: a "capture" keeps
    the body and its static inputs, a "replay" runs the body on them. A session's graph
    bookkeeping (keys, warm-ups, captures, replays, the kept tables and camera terms read at
    fixed addresses, inputs copied into the static ones) then runs as on CUDA; the kernels
    themselves are captured only there (tests/gpu/test_cuda_graphs_cuda.py)."""

    def __init__(self, device, warmup: int = 1) -> None:
        super().__init__(device, warmup)
        self.disabled = None

    def _capture(self, key, inputs, body) -> _Captured:
        entry = _Captured(None, {name: value.detach().clone() for name, value in inputs.items()}, None)
        entry.graph = _Replay(body, entry)
        self._graphs[key] = entry
        self.captures += 1
        return entry


class _Replay:
    def __init__(self, body, entry: _Captured) -> None:
        self.body, self.entry = body, entry

    def replay(self) -> None:
        self.entry.output = self.body(self.entry.inputs)


def cpu_graphs(monkeypatch) -> None:
    """Caches made with ``graphs=True`` get ``CpuGraphs`` (for this test)."""
    from comfyui_lingbot_world.wan import model as model_module

    monkeypatch.setattr(model_module, "graphs_off_reason", lambda device: None)
    monkeypatch.setattr(model_module, "ForwardGraphs", CpuGraphs)
