"""Speed and output error of each attention backend on q/k/v from a real forward of the DiT.

One self-attention call of a forward at the given size is captured (block 0, first CFG
sample): the q/k/v the model really feeds its attention, after the projections, RMS norms
and RoPE. Each available backend (sdpa, flash, sage; chosen through the same per-run
``attention_backend`` switch the sampler uses) then runs on them; its output is compared
with float32 attention (PyTorch's memory-efficient kernel in float32) and timed with CUDA
events.

    python bench/attention_error.py --size 480x832 --frames 81 --out $OUT/attention_480p.json
    python bench/attention_error.py --package DIR ...   # block 0 of the package's high expert

Without --package the model is a synthetic A14B-shaped expert with one block (random
weights with the initialisation the synthetic packages use), built on the GPU in bf16.
CPU smoke test: --device cpu --config tiny --size 32x48 --frames 5 (only sdpa runs there).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

import _pack  # noqa: F401  (bench/_pack.py: the checkout as comfyui_lingbot_world, before any pack import)
from bench_pipeline import base_record, sync  # noqa: E402

from comfyui_lingbot_world.tools.synthetic.dit import make_synthetic_expert  # noqa: E402
from comfyui_lingbot_world.wan.runtime import attention as attn  # noqa: E402
from comfyui_lingbot_world.wan import model as model_mod  # noqa: E402
from comfyui_lingbot_world.wan.config import A14B, TINY  # noqa: E402
from comfyui_lingbot_world.wan import geometry  # noqa: E402


class _Captured(Exception):
    """Ends the forward once the first attention call's inputs are taken."""


def capture_qkv(model: torch.nn.Module, size: tuple[int, int], frames: int, device: torch.device,
                seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v [1, L, heads, head_dim] of block 0's self-attention in a forward at ``size``."""
    config = model.config
    g = torch.Generator().manual_seed(seed)
    f_lat, h, w = geometry.latent_shape(frames, *size)
    x = torch.randn(1, geometry.LATENT_CHANNELS, f_lat, h, w, generator=g).to(device)
    y = torch.randn(1, 20, f_lat, h, w, generator=g).to(device)
    context = torch.randn(1, 64, config.text_dim, generator=g).to(device)
    taken: list[torch.Tensor] = []
    original = model_mod.attention

    def grab(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        taken.extend(t.detach().clone() for t in (q, k, v))
        raise _Captured

    model_mod.attention = grab
    try:
        with torch.inference_mode():
            model(x, torch.tensor([900.0], device=device), context, y=y)
    except _Captured:
        pass
    finally:
        model_mod.attention = original
    if len(taken) != 3:
        raise RuntimeError("the forward made no attention call; nothing captured")
    return taken[0], taken[1], taken[2]


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """float32 attention; on CUDA the memory-efficient kernel (no L x L matrix)."""
    q32, k32, v32 = (t.float().transpose(1, 2) for t in (q, k, v))
    if q.is_cuda:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            out = F.scaled_dot_product_attention(q32, k32, v32)
    else:
        out = F.scaled_dot_product_attention(q32, k32, v32)
    return out.transpose(1, 2)


def time_backend(run, q, k, v, iters: int, warmup: int) -> float:
    """Median seconds per call."""
    for _ in range(warmup):
        run(q, k, v)
    times = []
    for _ in range(iters):
        if q.is_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run(q, k, v)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1000.0)
        else:
            started = time.perf_counter()
            run(q, k, v)
            times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def measure(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, iters: int, warmup: int) -> dict[str, dict]:
    reference = reference_attention(q, k, v)
    b, lq, heads, d = q.shape
    flops = 4.0 * b * heads * lq * k.shape[1] * d
    results: dict[str, dict] = {}
    for name in attn.BACKENDS:
        try:
            # The model calls attention in inference mode, and the captured q/k/v are inference
            # tensors: kernels that write in place (SageAttention) need the same mode.
            with attn.attention_backend(name), torch.inference_mode():
                chosen = attn.backend_name(q.device)
                out = attn.attention(q, k, v)
                seconds = time_backend(attn.attention, q, k, v, iters, warmup)
        except (RuntimeError, ValueError) as exc:
            results[name] = {"available": False, "why": str(exc)[:300]}
            continue
        diff = out.float() - reference
        results[name] = {
            "available": True, "backend": chosen, "seconds": seconds, "tflops": flops / seconds / 1e12,
            "rel_l2_err": float(diff.norm() / reference.norm()),
            "max_abs_err": float(diff.abs().max()),
            "cosine": float(F.cosine_similarity(out.float().flatten(), reference.flatten(), dim=0)),
        }
    if results.get("sdpa", {}).get("available"):
        base = results["sdpa"]["seconds"]
        for r in results.values():
            if r.get("available"):
                r["speed_vs_sdpa"] = base / r["seconds"]
    with attn.attention_backend("auto"):
        auto = attn.backend_name(q.device)
    results["auto_picks"] = {"backend": auto}
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--package", help="take block 0 of this package's high-noise expert (NF4 or bf16)")
    p.add_argument("--config", choices=("a14b", "tiny"), default="a14b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--size", default="480x832")
    p.add_argument("--frames", type=int, default=81)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--vram-cap-gb", type=float, default=None)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    size = tuple(int(v) for v in args.size.split("x"))
    if args.package:
        from comfyui_lingbot_world.loaders.package import find_package
        from comfyui_lingbot_world.pipeline.experts import load_expert

        model = load_expert(find_package(args.package).high, device)
        source = f"{args.package} (high-noise expert)"
    else:
        config = replace(A14B if args.config == "a14b" else TINY, num_layers=1)
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        model = make_synthetic_expert(config, seed=0, device=device, dtype=dtype)
        source = f"synthetic {args.config} expert, 1 block, {dtype}"
    q, k, v = capture_qkv(model, size, args.frames, device)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
        capability = torch.cuda.get_device_capability(device)
    else:
        capability = None
    sync()
    record = base_record(args) | {
        "mode": "attention-error", "size": args.size, "frames": args.frames, "model": source,
        "q_shape": list(q.shape), "qkv_dtype": str(q.dtype), "compute_capability": capability,
        "reference": "float32 SDPA (memory-efficient kernel on CUDA)",
        "backends": measure(q, k, v, args.iters, args.warmup),
    }
    for mod in ("sageattention", "flash_attn", "flash_attn_interface"):
        try:
            module = __import__(mod)
            record.setdefault("packages", {})[mod] = getattr(module, "__version__", "installed")
        except Exception:  # noqa: BLE001 - absent or broken: recorded as absent
            record.setdefault("packages", {})[mod] = None
    Path(args.out).write_text(json.dumps(record, indent=2, default=str))
    print(json.dumps(record["backends"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
