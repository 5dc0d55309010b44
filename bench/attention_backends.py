"""Which attention kernel is fastest at LingBot-World's shapes on this GPU.

PyTorch's scaled_dot_product_attention picks among its backends (flash, cuDNN, memory-
efficient) by a fixed priority; this times each one forced (``torch.nn.attention.sdpa_kernel``)
plus the default choice and the pack's optional kernels when installed, at the shapes the
model runs: a Fast chunk's 4,680 queries against its 9-frame window (14,040 keys), the
same split over two and four GPUs (heads / ranks, Ulysses), and the exact path's 32,760
tokens at 480x832x81. bf16, 40 heads of 128, CUDA events, median of repeats.

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
from comfyui_lingbot_world.wan.runtime.attention import ATTENTION_BACKENDS  # noqa: E402
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
        row: dict = {"query_tokens": lq, "key_tokens": lk, "heads": heads}
        candidates = {"sdpa_default": lambda: F.scaled_dot_product_attention(q, k, v)}
        for label, backend in FORCED.items():
            candidates[f"sdpa_{label}"] = (lambda b=backend: _forced(b, q, k, v))
        for label in ("flash", "sage"):
            kernel = ATTENTION_BACKENDS[label].load()
            if kernel is not None:  # [B, L, H, D] layout
                qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
                candidates[label] = (lambda kern=kernel, a=qt, b=kt, c=vt: kern(a, b, c))
        for label, fn in candidates.items():
            try:
                out = fn()
                out = out.transpose(1, 2) if out.shape[1] != heads else out
                ms = time_ms(fn)
                row[label] = {"ms": ms, "tflops": flops / ms / 1e9,
                              "max_abs_vs_default": float((out.float() - reference).abs().max())}
            except Exception as exc:  # noqa: BLE001 - a backend that cannot run these inputs is a result
                row[label] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}
        timed = {k: v["ms"] for k, v in row.items() if isinstance(v, dict) and "ms" in v}
        row["fastest"] = min(timed, key=timed.get)
        record["shapes"][name] = row
        print(name, {k: round(v, 3) for k, v in timed.items()}, flush=True)
        del q, k, v, reference
    Path(args.out).write_text(json.dumps(record, indent=2))
    return 0


def _forced(backend: SDPBackend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v)


if __name__ == "__main__":
    sys.exit(main())
