"""The int8 Fast KV cache on CUDA: the Triton dequantization of the committed frames
(``triton_kernels.dequantize_int8``, what every layer's pass runs) against its PyTorch
definition bit for bit, at a Fast chunk's layer shape and through the cache itself. The CPU
twin (float16, Triton's interpreter): tests/unit/test_kv_cache.py."""
from __future__ import annotations

import pytest
import torch

from comfyui_lingbot_world.wan.runtime import switches, triton_kernels
from comfyui_lingbot_world.wan.runtime.kv_cache import (CachePolicy, KVCache, dequantize_int8,
                                                         dequantize_int8_pytorch, quantize_int8)

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def _cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_triton_dequantize_is_the_definition_bit_for_bit(dtype: torch.dtype) -> None:
    _cuda()
    g = torch.Generator(device=CUDA).manual_seed(0)
    # six committed 480x832 frames of one layer (9,360 tokens, 40 heads of 128), tokens of
    # very different sizes, a token of zeros
    x = torch.randn(9360, 40, 128, generator=g, device=CUDA) * torch.logspace(-3, 2, 9360, device=CUDA)[:, None, None]
    x[17] = 0
    q, scale = quantize_int8(x)
    want = dequantize_int8_pytorch(q, scale, torch.empty(x.shape, dtype=dtype, device=CUDA))
    got = triton_kernels.dequantize_int8(q, scale, torch.full(x.shape, float("nan"), dtype=dtype, device=CUDA))
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert torch.equal(dequantize_int8(q, scale, torch.empty_like(got)).view(torch.int16), want.view(torch.int16))


def test_an_int8_cache_attends_the_same_bits_with_and_without_the_kernel(monkeypatch) -> None:
    _cuda()
    policy = CachePolicy(window=9, sink=3, dtype="int8")
    heads, head_dim, frame_tokens, layers = 4, 64, 96, 2
    g = torch.Generator(device=CUDA).manual_seed(1)
    attended = {}
    for flag in ("1", "0"):
        monkeypatch.setenv(switches.FUSED.name, flag)
        cache = KVCache(policy, layers=layers, heads=heads, head_dim=head_dim, frame_tokens=frame_tokens,
                        dtype=torch.bfloat16, device=CUDA)
        g.manual_seed(1)
        seen = []
        for _chunk in range(4):  # commits fill and then roll the window
            for commit in (False, True):
                cache.begin_pass(commit)
                for index in range(layers):
                    layer = cache.layer(index)
                    k, v = layer.new_kv()
                    k.copy_(torch.randn(k.shape, generator=g, device=CUDA))
                    v.copy_(torch.randn(v.shape, generator=g, device=CUDA))
                    seen.extend(t.clone() for t in layer.attended())
                    if commit:
                        layer.stored()
                cache.end_pass()
        attended[flag] = seen
        cache.close()
    assert len(attended["1"]) == len(attended["0"]) > 0
    assert all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(attended["1"], attended["0"]))


def test_the_kept_fp8_cast_is_the_definition_bit_for_bit() -> None:
    """``requantize_heads_fp8`` (what a bf16 cache runs to keep flash_fp8's operands) at a
    Fast layer's shape: 9 frames of 1,560 tokens, 40 heads of 128, six committed frames whose
    cast is kept for some heads and stale for others, three fresh frames."""
    _cuda()
    from comfyui_lingbot_world.wan.runtime.weights8 import FP8_MAX, requantize_heads, requantize_heads_pytorch

    g = torch.Generator(device=CUDA).manual_seed(2)
    rows, fresh = 9 * 1560, 6 * 1560
    x = (torch.randn(rows, 40, 128, generator=g, device=CUDA) * torch.logspace(-2, 1, 40, device=CUDA)[None, :, None]
         ).to(torch.bfloat16)
    scales = x.float().abs().amax(dim=(0, 2)) / FP8_MAX
    kept = scales.clone()
    kept[::3] = -1.0  # every third head's cast is stale
    old = torch.randn(rows, 40, 128, generator=g, device=CUDA).to(torch.float8_e4m3fn)
    cast = (x.float() / scales[None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    old[:fresh] = cast[:fresh]  # the invariant: the kept rows hold the cast with their scale
    old[:fresh, ::3] = torch.randn(fresh, 14, 128, generator=g, device=CUDA).to(torch.float8_e4m3fn)
    want = requantize_heads_pytorch(x, old.clone(), scales, kept, fresh)
    got = triton_kernels.requantize_heads_fp8(x, old.clone(), scales, kept, fresh, FP8_MAX)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(want.view(torch.uint8), cast.view(torch.uint8))  # every row is the cast again
    assert torch.equal(requantize_heads(x, old.clone(), scales, kept, fresh).view(torch.uint8), want.view(torch.uint8))
