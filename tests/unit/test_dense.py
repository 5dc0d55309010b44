"""Dense weights reused across token chunks: same numbers as calling the layer."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from comfyui_lingbot_world.wan.runtime.dense import dense


def _layer(dtype=torch.float32, bias=True):
    torch.manual_seed(0)
    return nn.Linear(48, 80, bias=bias).to(dtype)


@pytest.mark.parametrize("bias", [True, False])
def test_out_buffer_gets_the_layer_output(bias):
    layer = _layer(bias=bias)
    x = torch.randn(3, 10, 48)
    buffer = torch.full((40, 80), float("nan"))
    d = dense(layer)
    assert d.weight.data_ptr() == layer.weight.data_ptr()  # a plain layer is not copied
    d(x[1], out=buffer[7:17])
    torch.testing.assert_close(buffer[7:17], layer(x[1]))
    assert torch.isnan(buffer[:7]).all() and torch.isnan(buffer[17:]).all()
    torch.testing.assert_close(d(x), layer(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gelu_epilogue_is_the_tanh_gelu(dtype):
    layer = _layer(dtype)
    x = torch.randn(2, 9, 48, dtype=dtype)
    got = dense(layer)(x, gelu=True)
    expected = F.gelu(layer(x), approximate="tanh")
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="gelu and out"):
        dense(layer)(x, out=torch.empty(2, 9, 80, dtype=dtype), gelu=True)


def test_input_is_cast_to_the_weight_dtype():
    layer = _layer(torch.bfloat16)
    x = torch.randn(5, 48)
    assert dense(layer)(x).dtype == torch.bfloat16


def test_nf4_layer_is_dequantized_once_like_its_forward():
    bnb = pytest.importorskip("bitsandbytes")
    layer = _layer()
    q = bnb.nn.Linear4bit(48, 80, bias=True, compute_dtype=torch.bfloat16, quant_type="nf4")
    q.weight = bnb.nn.Params4bit(layer.weight.detach().clone(), requires_grad=False, quant_type="nf4")
    q.bias = nn.Parameter(layer.bias.detach().clone(), requires_grad=False)
    q = q.to("cpu")
    x = torch.randn(6, 48, dtype=torch.bfloat16)
    d = dense(q)
    assert d.dtype == torch.bfloat16 and d.weight.shape == (80, 48)
    with torch.no_grad():
        torch.testing.assert_close(d(x), q(x), rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
def test_cuda_gelu_epilogue_is_the_tanh_gelu():
    """On CUDA the GELU runs in the matmul's epilogue; it must be the tanh form the model uses."""
    layer = _layer(torch.float32).cuda()  # float32: the two GELU forms differ by up to ~5e-4
    x = torch.randn(512, 48, device="cuda") * 3
    with torch.no_grad():
        got = dense(layer)(x, gelu=True)
        linear = layer(x)
    assert (got - F.gelu(linear, approximate="tanh")).abs().max() < 5e-5
    assert (got - F.gelu(linear)).abs().max() > 1e-4


def test_nf4_weight_repacked_by_a_cpu_forward_still_dequantizes():
    """bitsandbytes repacks a 4-bit weight on its first CPU forward (where AVX512-BF16 is
    available); dense() must read either layout."""
    bnb = pytest.importorskip("bitsandbytes")
    torch.manual_seed(0)
    layer = nn.Linear(128, 64)
    q = bnb.nn.Linear4bit(128, 64, bias=True, compute_dtype=torch.bfloat16, quant_type="nf4")
    q.weight = bnb.nn.Params4bit(layer.weight.detach().clone(), requires_grad=False, quant_type="nf4")
    q.bias = nn.Parameter(layer.bias.detach().clone(), requires_grad=False)
    q = q.to("cpu").eval()
    before = dense(q).weight.clone()
    with torch.no_grad():
        q(torch.randn(3, 128, dtype=torch.bfloat16))  # may repack the weight in place
    torch.testing.assert_close(dense(q).weight, before)
