"""What block swap and the int8 cache cost per Fast chunk, measured on the GPU alone:

* the pinned host -> GPU copy of one fp8 A14B block's linear weights (0.46 GB, the tensors
  as block swap moves them: one copy per weight, on a side stream), in GB/s and ms;
* one block's compute per pass is not timed here (bench/multi_gpu.py's chunk / 200);
* the int8 cache's dequantization of one layer's committed keys or values (6 frames at
  480x832: 9,360 tokens x 40 heads x 128) by the PyTorch definition and by the Triton pass
  (``triton_kernels.dequantize_int8``), and whether they agree bit for bit.

    python bench/swap_rates.py --out /tmp/swap_rates.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import _pack  # noqa: F401  (registers the checkout as comfyui_lingbot_world)
from comfyui_lingbot_world.wan.config import A14B  # noqa: E402
from comfyui_lingbot_world.wan.runtime import triton_kernels  # noqa: E402
from comfyui_lingbot_world.wan.runtime.kv_cache import dequantize_int8_pytorch, quantize_int8  # noqa: E402


def _timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        started = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - started)
    return out


def block_shapes() -> list[tuple[int, int]]:
    """The [out, in] shapes of one A14B block's linears (attention, cross-attention, FFN, camera)."""
    d, f = A14B.dim, A14B.ffn_dim
    return [(d, d)] * 8 + [(f, d), (d, f)] + [(d, d)] * 4


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args(argv)
    device = torch.device("cuda")
    hosts = [torch.empty(shape, dtype=torch.float8_e4m3fn, pin_memory=True) for shape in block_shapes()]
    nbytes = sum(h.numel() for h in hosts)
    side = torch.cuda.Stream()

    def copy_block() -> None:
        with torch.cuda.stream(side):
            copies = [h.to(device, non_blocking=True) for h in hosts]
        side.synchronize()
        del copies

    copy_block()
    copy_s = statistics.median(_timed(copy_block, args.repeats))

    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(9360, A14B.num_heads, A14B.head_dim, generator=g, device=device)
    q, scale = quantize_int8(x)
    out = torch.empty(x.shape, dtype=torch.bfloat16, device=device)
    want = dequantize_int8_pytorch(q, scale, out.clone())
    got = triton_kernels.dequantize_int8(q, scale, out)
    eager_ms = statistics.median(_timed(lambda: dequantize_int8_pytorch(q, scale, out), args.repeats)) * 1e3
    kernel_ms = statistics.median(_timed(lambda: triton_kernels.dequantize_int8(q, scale, out), args.repeats)) * 1e3
    record = {
        "gpu": torch.cuda.get_device_name(device), "torch": torch.__version__, "command": "python " + " ".join(sys.argv),
        "block_weights_gb": nbytes / 1e9, "block_copy_ms": copy_s * 1e3, "host_to_device_gb_s": nbytes / copy_s / 1e9,
        "dequant_one_tensor_eager_ms": eager_ms, "dequant_one_tensor_kernel_ms": kernel_ms,
        "dequant_bit_equal": bool(torch.equal(got.view(torch.int16), want.view(torch.int16))),
        "dequant_per_chunk_saved_s_estimate": (eager_ms - kernel_ms) * 2 * 40 * 5 / 1e3,  # k and v, 40 layers, 5 passes
    }
    print(json.dumps(record), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
