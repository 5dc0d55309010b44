"""Which attention kernel is fastest at LingBot-World's shapes on this GPU.

PyTorch's scaled_dot_product_attention picks among its backends (flash, cuDNN, memory-
efficient) by a fixed priority; this times each one forced (``torch.nn.attention.sdpa_kernel``)
plus the default choice and the pack's optional kernels when installed, at the shapes the
model runs: a Fast chunk's 4,680 queries against its 9-frame window (14,040 keys), the
same split over two and four GPUs (heads / ranks, Ulysses), and the exact path's 32,760
tokens at 480x832x81. bf16, 40 heads of 128, CUDA events, median of repeats.

With FlashAttention 3 installed (``fa3-fwd``) it also times ``flash_fp8`` whole (q, k, v
quantized per head, then the fp8 kernel), the fp8 kernel alone on operands quantized
beforehand, and the quantization alone; every candidate's relative error is taken against
float32 SDPA of the same bf16 operands (``rel_vs_float32``).

    python bench/attention_backends.py --out attention_backends.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import _pack  # noqa: F401  (registers the checkout as comfyui_lingbot_world)
from comfyui_lingbot_world.wan.runtime import attention as attn  # noqa: E402
from comfyui_lingbot_world.wan.runtime.attention import ATTENTION_BACKENDS  # noqa: E402
from comfyui_lingbot_world.wan.runtime.weights8 import quantize_heads  # noqa: E402
from kernel_floor import _time_ms as time_ms  # noqa: E402  (CUDA events, median of repeats)

SHAPES = {  # name: (query tokens, key tokens, heads)
    "fast_chunk_1gpu": (4680, 14040, 40),
    "fast_chunk_2gpu": (4680, 14040, 20),
    "fast_chunk_4gpu": (4680, 14040, 10),
    "exact_480p_1gpu": (32760, 32760, 40),
}
FORCED = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
          "efficient": SDPBackend.EFFICIENT_ATTENTION}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    device = torch.device("cuda")
    record: dict = {"gpu": torch.cuda.get_device_name(device), "torch": torch.__version__,
                    "cudnn": torch.backends.cudnn.version(), "shapes": {}}
    g = torch.Generator(device=device).manual_seed(0)
    for name, (lq, lk, heads) in SHAPES.items():
        q = torch.randn(1, heads, lq, 128, generator=g, device=device, dtype=torch.bfloat16)
        k = torch.randn(1, heads, lk, 128, generator=g, device=device, dtype=torch.bfloat16)
        v = torch.randn(1, heads, lk, 128, generator=g, device=device, dtype=torch.bfloat16)
        flops = 4 * lq * lk * 128 * heads
        reference = F.scaled_dot_product_attention(q, k, v).float()
        exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
        row: dict = {"query_tokens": lq, "key_tokens": lk, "heads": heads}
        candidates = {"sdpa_default": lambda: F.scaled_dot_product_attention(q, k, v)}
        for label, backend in FORCED.items():
            candidates[f"sdpa_{label}"] = (lambda b=backend: _forced(b, q, k, v))
        qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # [B, L, H, D]
        for label in ("flash", "flash_fp8", "sage"):
            if not ATTENTION_BACKENDS[label].runs_on("cuda", torch.cuda.get_device_capability(device)):
                continue
            kernel = ATTENTION_BACKENDS[label].load()
            if kernel is not None:
                candidates[label] = (lambda kern=kernel: kern(qt, kt, vt))
        quantize_ms = None
        if "flash_fp8" in candidates:
            fa3 = attn._fa3()
            quantized = [quantize_heads(t) for t in (qt, kt, vt)]
            (q8, qs), (k8, ks), (v8, vs) = quantized
            candidates["flash_fp8_kernel_only"] = lambda: attn._first(
                fa3(q8, k8, v8, q_descale=qs, k_descale=ks, v_descale=vs))
            quantize_ms = {"q": time_ms(lambda: quantize_heads(qt)), "k": time_ms(lambda: quantize_heads(kt)),
                           "v": time_ms(lambda: quantize_heads(vt))}
            row["quantize_heads_ms"] = quantize_ms
        for label, fn in candidates.items():
            try:
                out = fn()
                out = out.transpose(1, 2) if out.shape[1] != heads else out
                ms = time_ms(fn)
                row[label] = {"ms": ms, "tflops": flops / ms / 1e9,
                              "max_abs_vs_default": float((out.float() - reference).abs().max()),
                              "rel_vs_float32": float((out.float() - exact).norm() / exact.norm())}
            except Exception as exc:  # noqa: BLE001 - a backend that cannot run these inputs is a result
                row[label] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}
        timed = {k: v["ms"] for k, v in row.items() if isinstance(v, dict) and "ms" in v}
        row["fastest"] = min(timed, key=timed.get)
        record["shapes"][name] = row
        print(name, {k: round(v, 3) for k, v in timed.items()}, flush=True)
        del q, k, v, qt, kt, vt, reference, exact
    Path(args.out).write_text(json.dumps(record, indent=2))
    return 0


def _forced(backend: SDPBackend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v)


if __name__ == "__main__":
    sys.exit(main())
