"""The fused elementwise chains: the Triton kernels and the eager definitions give the same numbers."""
from __future__ import annotations

import pytest
import torch

from comfyui_lingbot_world.wan.runtime import fused
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
    got = torch.stack([fused.rms_rope_(sample.clone(), weight, cos, sin, 0, 1e-6, 16) for sample in x])
    got = got.unflatten(-1, (4, 16))
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def test_ln_modulate_matches_definition():
    x, shift, scale, _, _, _ = _inputs("cpu")
    normed = torch.nn.functional.layer_norm(x, (64,), eps=1e-6)
    expected = normed * (1 + scale[:, None]) + shift[:, None]
    torch.testing.assert_close(fused.ln_modulate(x, shift, scale, 1e-6, torch.float32), expected)


def test_cpu_tensors_run_eagerly(monkeypatch):
    def refuse():
        raise AssertionError("CPU tensors must not reach the Triton kernels")

    monkeypatch.setattr(fused, "_kernels", refuse)
    x, shift, scale, _, _, _ = _inputs("cpu")
    fused.run(fused.ln_modulate, x, shift, scale, 1e-6, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("length, dim", [(37, 64), (8192, 64), (300, 5120)])
def test_cuda_layer_norm_kernels_equal_eager(length, dim):
    x, shift, scale, weight, _, _ = _inputs("cuda", length=length, dim=dim, heads=dim // 16)
    for dtype in (torch.float32, torch.bfloat16):
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        for fn, args in ((fused.ln_modulate, (x, shift, scale, 1e-6, dtype)),
                         (fused.ln_affine, (x, weight, shift[0], 1e-6, dtype))):
            got = fused.run(fn, *args)
            assert got.dtype == dtype
            torch.testing.assert_close(got.float(), fn(*args).float(), rtol=tol, atol=tol)
    assert not fused._broken


@pytest.mark.parametrize("norm, rope", [(True, True), (True, False), (False, True)])
def test_in_place_rms_rope_matches_out_of_place(norm, rope):
    """rms_rope_ (one sample's rows, a slice of the full RoPE table) equals the definition."""
    x, _, _, weight, cos, sin = _inputs("cpu")
    rows = x[0, 5:20].clone()
    got = fused.rms_rope_(rows.clone(), weight if norm else None, cos if rope else None, sin if rope else None,
                          5, 1e-6, 16)
    h = rows[None].float()
    if norm:
        h = fused._rms(h, weight, 1e-6)
    expected = apply_rope(h.unflatten(-1, (4, 16)), (cos[5:20], sin[5:20])) if rope else h
    torch.testing.assert_close(got, expected.reshape(15, 64), rtol=1e-6, atol=1e-6)


def test_fused_residual_chains_match_definitions():
    x, shift, scale, _, _, _ = _inputs("cpu")
    g = torch.Generator().manual_seed(3)
    y = torch.randn(x.shape, generator=g).bfloat16()
    cam_scale, cam_shift = (torch.randn(1, *x.shape[1:], generator=g).bfloat16() * 0.1 for _ in range(2))
    gate = torch.randn(2, 64, generator=g)
    got = fused.gate_camera_(x.clone(), y, gate, cam_scale, cam_shift)
    expected = (x + y.float() * gate[:, None]) * (1 + cam_scale).float() + cam_shift.float()
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)

    stream = x.clone()
    h = fused.add_ln_modulate_(stream, y, shift, scale, 1e-6, torch.float32)
    torch.testing.assert_close(stream, x + y.float())
    torch.testing.assert_close(h, fused.ln_modulate(x + y.float(), shift, scale, 1e-6, torch.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("dim, heads, rows", [(64, 4, 37), (5120, 40, 4100)])
@pytest.mark.parametrize("norm, rope", [(True, True), (True, False), (False, True)])
def test_triton_rms_rope_equals_eager(dim, heads, rows, norm, rope):
    from comfyui_lingbot_world.wan.runtime import triton_kernels

    g = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(rows + 9, dim, generator=g).bfloat16().cuda()
    weight = (1 + 0.1 * torch.randn(dim, generator=g)).cuda()
    cos, sin = build_rope((1, 1, rows + 9), dim // heads, torch.device("cuda"))
    args = (weight if norm else None, cos if rope else None, sin if rope else None, 9, 1e-6, dim // heads)
    got = triton_kernels.rms_rope_(x[9:].clone(), *args)
    expected = fused.rms_rope_(x[9:].clone(), *args)  # the eager definition
    torch.testing.assert_close(got.float(), expected.float(), rtol=1e-2, atol=1e-2)
    assert (got.float() - expected.float()).abs().mean() < 1e-3


@pytest.mark.gpu
def test_cuda_in_place_chains_round_like_eager():
    """The residual chains' kernels write into their input and round like eager bf16."""
    x, shift, scale, _, _, _ = _inputs("cuda", length=4096)
    g = torch.Generator(device="cpu").manual_seed(3)
    y = torch.randn(x.shape, generator=g).bfloat16().cuda()
    cam_scale, cam_shift = (torch.randn(1, *x.shape[1:], generator=g).bfloat16().cuda() for _ in range(2))
    gate = torch.randn(2, 64, generator=g).cuda()
    view = x.clone()[:, 100:3000]
    expected = fused.gate_camera_(view.clone(), y[:, 100:3000], gate, cam_scale[:, 100:3000], cam_shift[:, 100:3000])
    fused.run(fused.gate_camera_, view, y[:, 100:3000], gate, cam_scale[:, 100:3000], cam_shift[:, 100:3000])
    torch.testing.assert_close(view, expected, rtol=1e-6, atol=1e-5)

    stream, eager_stream = x.clone(), x.clone()
    h = fused.run(fused.add_ln_modulate_, stream, y, shift, scale, 1e-6, torch.bfloat16)
    expected_h = fused.add_ln_modulate_(eager_stream, y, shift, scale, 1e-6, torch.bfloat16)
    torch.testing.assert_close(stream, eager_stream)
    torch.testing.assert_close(h.float(), expected_h.float(), rtol=1e-2, atol=1e-2)
    assert not fused._broken
