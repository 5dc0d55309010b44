"""The DiT on CUDA (Triton kernels, dense-weight matmuls, GELU epilogue) equals the same
model on the CPU (eager definitions), float32 weights, batch of two with a shared camera."""
from __future__ import annotations

import pytest
import torch

from comfyui_lingbot_world.wan.runtime import fused
from comfyui_lingbot_world.wan.config import TINY
from comfyui_lingbot_world.wan.model import LingBotDiT

pytestmark = pytest.mark.gpu


def _model() -> LingBotDiT:
    g = torch.Generator().manual_seed(0)
    model = LingBotDiT(TINY)
    model.init_weights(generator=g)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.2 * noise) if "norm" in name else p.add_(0.05 * noise)
    return model.eval()


def _spy_on_kernels(monkeypatch) -> tuple[dict[str, int], list[str]]:
    """Count the Triton kernel calls and record any call a kernel refused."""
    kernels = fused._kernels()
    calls: dict[str, int] = {}
    refused: list[str] = []
    for name in ("layer_norm", "gate_camera_", "rms_rope_"):
        original = getattr(kernels, name)

        def spy(*args, _name=name, _original=original, **kwargs):
            calls[_name] = calls.get(_name, 0) + 1
            try:
                return _original(*args, **kwargs)
            except ValueError as exc:
                refused.append(f"{_name}: {exc}")
                raise
        monkeypatch.setattr(kernels, name, spy)
    return calls, refused


@pytest.mark.parametrize("chunk", [None, 7])
def test_cuda_forward_equals_cpu(chunk, monkeypatch):
    g = torch.Generator().manual_seed(1)
    f, h, w = 3, 8, 10  # 3 x 4 x 5 = 60 tokens
    x = torch.randn(2, 16, f, h, w, generator=g)
    y = torch.randn(2, 20, f, h, w, generator=g)
    t = torch.tensor([937.25, 412.5])
    context = [torch.randn(n, TINY.text_dim, generator=g) for n in (7, 12)]
    plucker = torch.randn(1, 384, f, h, w, generator=g)
    cpu = _model()
    gpu = _model().cuda()
    for block in list(cpu.blocks) + list(gpu.blocks):
        block.token_chunk = chunk
    calls, refused = _spy_on_kernels(monkeypatch)
    with torch.no_grad():
        expected = cpu(x, t, context, y, camera=plucker)
        got = gpu(x.cuda(), t.cuda(), [c.cuda() for c in context], y.cuda(), camera=plucker.cuda())
    err = ((got.cpu() - expected).norm() / expected.norm()).item()
    assert err < 1e-4, err
    assert not fused._broken and not refused  # the Triton kernels ran, no fallback
    assert set(calls) == {"layer_norm", "gate_camera_", "rms_rope_"}
