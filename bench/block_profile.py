"""Where one DiT block's time goes at full geometry: wall time, kernel floor and a per-kernel
breakdown from the torch profiler, for one A14B block (NF4 like the shipped package) at
the CFG batch of two.

    python bench/block_profile.py --tokens 32760 --out block.json [--chunks 8192,0]

No checkpoint is needed: the block gets random weights and is quantized by bitsandbytes on
the GPU. The variants (token chunk sizes, bf16 weights) run in one process so they see the
same GPU state.
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
from pathlib import Path

import torch

import _pack  # noqa: F401  (bench/_pack.py: the checkout as comfyui_lingbot_world, before any pack import)
from comfyui_lingbot_world.tools.synthetic.experts import quantize_linears_  # noqa: E402
from comfyui_lingbot_world.tools.synthetic.dit import fill_synthetic_  # noqa: E402
from comfyui_lingbot_world.wan.config import A14B  # noqa: E402
from comfyui_lingbot_world.wan.model import DiTBlock, build_rope  # noqa: E402
from kernel_floor import block_floor_ms  # noqa: E402

# Kernel-name fragments -> the category a kernel is counted under (first match wins).
CATEGORIES = (
    ("attention", ("flash", "fmha", "attention", "sdpa", "cudnn")),
    ("nf4_dequantize", ("dequantize", "kdequant")),
    ("gemm", ("gemm", "nvjet", "cutlass", "sm90_xmma", "ampere", "cublas")),
    ("fused_triton", ("triton", "_rms_rope_kernel", "_layer_norm_kernel", "_gate_camera_kernel")),
    ("copy", ("copy", "memcpy")),
    ("elementwise", ("elementwise", "vectorized", "reduce")),
)


def category(name: str) -> str:
    low = name.lower()
    for label, parts in CATEGORIES:
        if any(p in low for p in parts):
            return label
    return "other"


def make_block(nf4: bool, seed: int = 0) -> DiTBlock:
    """Block 0 of a synthetic A14B expert (the checkpoint tool's values), bf16 or NF4."""
    with torch.device("cuda"):
        block = DiTBlock(A14B)
    fill_synthetic_(block, A14B, seed, prefix="blocks.0.")
    block = block.to(torch.bfloat16)
    if nf4:
        quantize_linears_(block)
    return block.eval()


def inputs(tokens: int, batch: int, grid: tuple[int, int, int]):
    dev, dim = torch.device("cuda"), A14B.dim
    g = torch.Generator(device=dev).manual_seed(1)
    x = torch.randn(batch, tokens, dim, device=dev, generator=g)
    e0 = torch.randn(batch, 6, dim, device=dev, generator=g) * 0.1
    context = torch.randn(batch, A14B.text_len, dim, device=dev, dtype=torch.bfloat16, generator=g)
    camera = torch.randn(1, tokens, dim, device=dev, dtype=torch.bfloat16, generator=g)
    rope = build_rope(grid, A14B.head_dim, dev)
    return x, e0, rope, context, camera


def time_forward(block: DiTBlock, args, repeats: int) -> float:
    x0 = args[0]
    times = []
    for i in range(repeats + 2):
        x = x0.clone()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        block(x, *args[1:])
        end.record()
        torch.cuda.synchronize()
        if i >= 2:
            times.append(start.elapsed_time(end))
        del x
    return statistics.median(times)


def profile_forward(block: DiTBlock, args) -> dict:
    from torch.profiler import ProfilerActivity, profile
    x = args[0].clone()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        block(x, *args[1:])
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    first, last = None, None
    for ev in prof.events():
        if ev.device_type.name != "CUDA":
            continue
        dur = ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
        kernels[ev.name][0] += dur / 1000
        kernels[ev.name][1] += 1
        start = ev.time_range.start
        stop = ev.time_range.end
        first = start if first is None else min(first, start)
        last = stop if last is None else max(last, stop)
    by_category: dict[str, float] = collections.defaultdict(float)
    for name, (ms, _) in kernels.items():
        by_category[category(name)] += ms
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:40]
    busy = sum(v[0] for v in kernels.values())
    span = (last - first) / 1000 if first is not None else 0.0
    return {
        "kernel_ms_total": round(busy, 2),
        "gpu_span_ms": round(span, 2),
        "by_category_ms": {k: round(v, 2) for k, v in sorted(by_category.items(), key=lambda kv: -kv[1])},
        "top_kernels": [{"name": n[:160], "ms": round(v[0], 3), "calls": v[1]} for n, v in top],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--grid", default="21,30,52", help="latent token grid F,H,W (480x832x81: 21,30,52)")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--chunks", default="8192,16384,0", help="token chunk sizes to time (0: whole sequence)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bf16", action="store_true", help="also time the block with bf16 weights")
    parser.add_argument("--out", required=True)
    opts = parser.parse_args()
    grid = tuple(int(v) for v in opts.grid.split(","))
    tokens = grid[0] * grid[1] * grid[2]
    record: dict = {"grid": grid, "tokens": tokens, "batch": opts.batch, "gpu": torch.cuda.get_device_name(0),
                    "torch": torch.__version__}
    floor = block_floor_ms(tokens, A14B.dim, A14B.ffn_dim, A14B.num_heads, A14B.text_len)
    record["floor_per_sample_ms"] = {k: round(v, 3) for k, v in floor.items()}
    # With batched CFG the camera layers run once for both samples.
    record["floor_batch_ms"] = round(opts.batch * (floor["block_ms"] - floor["camera_ms"]) + floor["camera_ms"], 3)
    args = inputs(tokens, opts.batch, grid)
    variants = [("nf4", True)] + ([("bf16", False)] if opts.bf16 else [])
    for label, nf4 in variants:
        block = make_block(nf4)
        for chunk in (int(c) for c in opts.chunks.split(",")):
            block.token_chunk = chunk or None
            warm = args[0].clone()
            block(warm, *args[1:])  # compile and autotune outside the measured peak
            del warm
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            ms = time_forward(block, args, opts.repeats)
            key = f"{label}_chunk{chunk}"
            record[key] = {"block_ms": round(ms, 2), "x_floor": round(ms / record["floor_batch_ms"], 3),
                           "activation_peak_gib": round((torch.cuda.max_memory_allocated() - base) / 2**30, 3)}
            record[key]["allocated_before_gib"] = round(base / 2**30, 3)
            print(key, record[key], flush=True)
            if chunk == int(opts.chunks.split(",")[0]):
                record[key]["profile"] = profile_forward(block, args)
                prof = record[key]["profile"]
                print(json.dumps({k: prof[k] for k in ("kernel_ms_total", "gpu_span_ms", "by_category_ms")}), flush=True)
                for item in prof["top_kernels"][:25]:
                    print(f'  {item["ms"]:8.2f} ms {item["calls"]:4d}x {item["name"][:110]}', flush=True)
            Path(opts.out).write_text(json.dumps(record, indent=1))
        del block
        torch.cuda.empty_cache()
    print("floor", record["floor_batch_ms"], record["floor_per_sample_ms"], flush=True)
    Path(opts.out).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
