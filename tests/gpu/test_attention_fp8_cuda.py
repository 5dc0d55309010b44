"""FlashAttention 3 on Hopper, bf16 and fp8 (``flash`` / ``flash_fp8`` rows of
``attention.ATTENTION_BACKENDS``): the per-head fp8 quantizer's Triton pass against its
definition bit for bit, each kernel against PyTorch SDPA on the same operands, and a CUDA
graph replay of the fp8 path against its eager call. Skipped without an sm90 GPU and
FlashAttention 3 (``pip install fa3-fwd``). The CPU twins: tests/unit/test_attention.py."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from comfyui_lingbot_world.wan.runtime import attention as attn
from comfyui_lingbot_world.wan.runtime import triton_kernels, weights8

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def _hopper() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    capability = torch.cuda.get_device_capability()
    if not attn.ATTENTION_BACKENDS["flash_fp8"].runs_on("cuda", capability):
        pytest.skip(f"FlashAttention 3's fp8 kernels need compute capability 9.0, this card is {capability}")
    if attn._fa3() is None:
        pytest.skip("FlashAttention 3 is not installed (pip install fa3-fwd)")


def _operands(lq: int, lk: int, heads: int, seed: int = 0, top: float = 6.0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device=CUDA).manual_seed(seed)
    # heads of different magnitudes: one scale per head is what the quantizer must get right
    size = torch.linspace(0.2, top, heads, device=CUDA)[None, None, :, None]
    return tuple((torch.randn(1, n, heads, 128, generator=g, device=CUDA) * size).bfloat16() for n in (lq, lk, lk))


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_triton_pass_is_the_definition_bit_for_bit(dtype: torch.dtype) -> None:
    _hopper()
    x = _operands(777, 1, 6)[0].to(dtype)
    x[0, 5, 2, 7] = 0  # exact zeros and a head of zeros (the tiny scale)
    x[:, :, 4] = 0
    want_values, want_scales = weights8.quantize_heads_pytorch(x)
    got_values, got_scales = weights8.quantize_heads(x)
    assert torch.equal(got_scales, want_scales)
    assert torch.equal(got_values.view(torch.uint8), want_values.view(torch.uint8))
    wider = torch.zeros(1, 777, 8, 128, device=CUDA, dtype=dtype)[:, :, :6]  # heads of a wider tensor: kernels
    wider.copy_(x)
    assert torch.equal(triton_kernels.head_amax(wider), x.abs().amax(dim=(1, 3)).float())
    assert torch.equal(weights8.quantize_heads(wider)[0].view(torch.uint8), want_values.view(torch.uint8))
    head_major = x.transpose(1, 2).contiguous().transpose(1, 2)  # tokens not contiguous: the definition runs
    with pytest.raises(ValueError, match="contiguous"):
        triton_kernels.scale_heads_fp8(head_major, want_scales, weights8.FP8_MAX)
    assert torch.equal(weights8.quantize_heads(head_major)[0].view(torch.uint8), want_values.view(torch.uint8))


def test_fa3_bf16_matches_sdpa() -> None:
    _hopper()
    q, k, v = _operands(1500, 4100, 8)
    got = attn.ATTENTION_BACKENDS["flash"].load()(q, k, v)
    assert got.dtype == torch.bfloat16
    assert _rel(got, _sdpa(q.float(), k.float(), v.float())) < 1e-2


def test_fp8_attention_is_sdpa_of_its_rounded_operands() -> None:
    """The kernel's own error (its fp8 P·V product, the softmax) is small against the rounding
    of q, k and v, which is what the quantizer decides."""
    _hopper()
    # scores of a few units (q·k / sqrt(128) with unit-size q and k), as in a trained model: with
    # bigger ones the softmax turns one-hot and magnifies the rounding of q and k
    q, k, v = _operands(1500, 4100, 8, top=1.5)
    with attn.attention_backend("flash_fp8"):
        assert attn.backend_name(CUDA) == "flash_fp8"
        got = attn.attention(q, k, v)
    assert got.dtype == torch.bfloat16 and got.shape == q.shape
    rounded = []
    for t in (q, k, v):
        values, scales = weights8.quantize_heads(t)
        rounded.append(values.float() * scales[:, None, :, None])
    exact = _sdpa(q.float(), k.float(), v.float())
    of_rounded = _sdpa(*rounded)
    kernel_error, total_error = _rel(got, of_rounded), _rel(got, exact)
    assert kernel_error < 0.03, kernel_error
    assert total_error < 0.1, total_error  # random operands: the bench's figure at the model's shapes is 0.053


def test_fp8_attention_replays_as_a_cuda_graph_bit_for_bit() -> None:
    _hopper()
    q, k, v = _operands(1500, 4100, 8, seed=1)
    kernel = attn.ATTENTION_BACKENDS["flash_fp8"].load()
    eager = kernel(q, k, v)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture (autotuning, workspaces)
        kernel(q, k, v)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = kernel(q, k, v)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


def test_flash_fp8_is_refused_off_hopper_by_name(monkeypatch) -> None:
    _hopper()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 9))
    attn.reset_backend_choice()
    try:
        q = torch.randn(1, 8, 2, 128, device=CUDA, dtype=torch.bfloat16)
        with attn.attention_backend("flash_fp8"), pytest.raises(ValueError, match=r"9\.0.*8\.9"):
            attn.attention(q, q, q)
    finally:
        attn.reset_backend_choice()
