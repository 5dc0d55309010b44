"""The kernel floor of one DiT forward: one block's matmuls and attention timed alone.

Dense bf16 matmuls (bitsandbytes' NF4 kernels run within ~2 % of them at these sizes) and
PyTorch SDPA, each timed with CUDA events (median of repeats), summed per block and
multiplied by the block count. Elementwise work (norms, modulation, RoPE) is left out on
purpose: the floor is what no implementation can go below.

``weights="fp8"`` / ``"int8"`` times the block's linears as the 8-bit kinds run them
(``wan/runtime/weights8.py``: the activation's per-token quantization included, then
``torch._scaled_mm`` / ``torch._int_mm``); ``gemm_ms`` times one such product alone.
"""
from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

import _pack  # noqa: F401  (registers the checkout as comfyui_lingbot_world)
from comfyui_lingbot_world.wan.runtime.dense import GEMM_KINDS  # noqa: E402
from comfyui_lingbot_world.wan.runtime.weights8 import quantize_rows  # noqa: E402
from comfyui_lingbot_world.wan.geometry import MAX_TOKENS  # noqa: E402


def _time_ms(fn, repeats: int = 10, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def linear_fn(x: torch.Tensor, weight: torch.Tensor, weights: str = "bf16"):
    """A callable computing x @ weightᵀ as kind ``weights`` runs it (bf16: F.linear; fp8 /
    int8: the weight quantized once per channel here, the activation quantized per token
    inside each call, as the model's forward does)."""
    if weights == "bf16":
        return lambda: F.linear(x, weight)
    values, scales = quantize_rows(weight, weights)
    product = GEMM_KINDS[weights].product
    return lambda: product(x, values, scales, None)


def gemm_ms(tokens: int, out_features: int, in_features: int, weights: str = "bf16") -> float:
    """Median ms of one [tokens, in] x [out, in]ᵀ product of kind ``weights`` on CUDA."""
    dev, dt = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(tokens, in_features, device=dev, dtype=dt, generator=gen)
    w = torch.randn(out_features, in_features, device=dev, dtype=dt, generator=gen) * 0.01
    return _time_ms(linear_fn(x, w, weights), repeats=20, warmup=5)


def block_floor_ms(tokens: int, dim: int, ffn_dim: int, heads: int, text_len: int = MAX_TOKENS,
                   camera: bool = True, key_tokens: int | None = None, cross_kv: bool = True,
                   weights: str = "bf16") -> dict[str, float]:
    """One block's floor at ``tokens`` query tokens. ``key_tokens``: self-attention keys when
    they are not the queries (a causal chunk attending to its KV cache); ``cross_kv``: False
    when the text keys and values are cached (LingBot-World Fast), so their matmuls are not
    part of a forward; ``weights``: the kind the linears run in (bf16, fp8, int8)."""
    dev, dt = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(tokens, dim, device=dev, dtype=dt, generator=gen)
    h = torch.randn(tokens, ffn_dim, device=dev, dtype=dt, generator=gen)
    ctx = torch.randn(text_len, dim, device=dev, dtype=dt, generator=gen)
    w_dd = torch.randn(dim, dim, device=dev, dtype=dt, generator=gen) * 0.01
    w_up = torch.randn(ffn_dim, dim, device=dev, dtype=dt, generator=gen) * 0.01
    w_down = torch.randn(dim, ffn_dim, device=dev, dtype=dt, generator=gen) * 0.01
    hd = dim // heads
    q = torch.randn(1, heads, tokens, hd, device=dev, dtype=dt, generator=gen)
    kc = torch.randn(1, heads, text_len, hd, device=dev, dtype=dt, generator=gen)
    ks = q if key_tokens is None else torch.randn(1, heads, key_tokens, hd, device=dev, dtype=dt, generator=gen)
    square = _time_ms(linear_fn(x, w_dd, weights))
    ctx_square = _time_ms(linear_fn(ctx, w_dd, weights))
    parts = {
        "self_qkvo_ms": 4 * square,
        "cross_qo_ms": 2 * square,
        "cross_kv_ms": 2 * ctx_square if cross_kv else 0.0,
        "ffn_ms": _time_ms(linear_fn(x, w_up, weights)) + _time_ms(linear_fn(h, w_down, weights)),
        "self_attention_ms": _time_ms(lambda: F.scaled_dot_product_attention(q, ks, ks)),
        "cross_attention_ms": _time_ms(lambda: F.scaled_dot_product_attention(q, kc, kc)),
        "camera_ms": 4 * square if camera else 0.0,
    }
    parts["block_ms"] = sum(parts.values())
    return parts  # the test tensors are freed on return
