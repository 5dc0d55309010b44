"""The fused elementwise chains: compiled (Inductor) and eager give the same numbers."""
from __future__ import annotations

import pytest
import torch

from comfyui_lingbot_world.wan import fused
from comfyui_lingbot_world.wan.model import RMSNorm, apply_rope, build_rope


def _inputs(device: str, length: int = 37, dim: int = 64, heads: int = 4):
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(2, length, dim, generator=g).to(device)
    shift, scale = (torch.randn(2, dim, generator=g).to(device) * 0.1 for _ in range(2))
    weight = (1 + 0.1 * torch.randn(dim, generator=g)).to(device)
    cos, sin = build_rope((1, 1, length), dim // heads, torch.device(device))
    return x, shift, scale, weight, cos, sin


def test_rms_rope_matches_the_model_path():
    """The fused chain equals RMSNorm followed by the model's own RoPE routine."""
    x, _, _, weight, cos, sin = _inputs("cpu")
    norm = RMSNorm(64, 1e-6)
    norm.weight = torch.nn.Parameter(weight)
    expected = apply_rope(norm(x).unflatten(-1, (4, 16)), (cos, sin))
    got = fused.rms_rope(x, weight, cos, sin, 1e-6, 4)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def test_ln_modulate_matches_definition():
    x, shift, scale, _, _, _ = _inputs("cpu")
    normed = torch.nn.functional.layer_norm(x, (64,), eps=1e-6)
    expected = normed * (1 + scale[:, None]) + shift[:, None]
    torch.testing.assert_close(fused.ln_modulate(x, shift, scale, 1e-6, torch.float32), expected)


def test_cpu_tensors_run_eagerly(monkeypatch):
    def refuse(fn):
        raise AssertionError("CPU tensors must not be compiled")

    monkeypatch.setattr(fused, "_compiled", refuse)
    x, shift, scale, _, _, _ = _inputs("cpu")
    fused.run(fused.ln_modulate, x, shift, scale, 1e-6, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("length", [37, 8192])
def test_compiled_equals_eager_on_cuda(length):
    x, shift, scale, weight, cos, sin = _inputs("cuda", length=length)
    cases = [
        (fused.ln_modulate, (x, shift, scale, 1e-6, torch.bfloat16)),
        (fused.ln_affine, (x, weight, shift[0], 1e-6, torch.bfloat16)),
        (fused.rms_rope, (x.bfloat16(), weight, cos, sin, 1e-6, 4)),
        (fused.rms_heads, (x.bfloat16(), weight, 1e-6, 4)),
    ]
    for fn, args in cases:
        compiled = torch.compile(fn, dynamic=True, fullgraph=True)
        torch.testing.assert_close(compiled(*args).float(), fn(*args).float(), rtol=1e-2, atol=1e-2)
