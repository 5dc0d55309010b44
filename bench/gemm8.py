"""Per-layer GEMM microbenchmark: bf16 vs fp8 vs int8 at a Fast chunk's 4,680 tokens.

    python bench/gemm8.py --out $OUT/gemm8.json                 # CUDA, A14B shapes
    python bench/gemm8.py --device cpu --tokens 64 --shapes 64x96 --out /tmp/gemm8.json   # a CPU check

For each linear shape of an A14B block ([out, in]: 5120x5120 for q/k/v/o and the camera
layers, 13824x5120 the FFN's up, 5120x13824 its down) the product [tokens, in] x [out, in]ᵀ
is timed as each weight kind runs it in the model (``wan/runtime/weights8.py``): bf16
``F.linear``; fp8 and int8 with the activation quantized per token inside the timed call
(the weight is quantized once, as on load), then ``torch._scaled_mm`` / ``torch._int_mm``.
The activation quantization is also timed alone, as the product runs it
(``activation_quant_ms``: one Triton pass per row on CUDA, LINGBOT_FUSED=0 turns it off) and
as PyTorch ops (``activation_quant_pytorch_ms``). The JSON has per shape and kind the median
ms, TFLOP/s, the speed-up over bf16, and the relative deviation of the product from bf16's.
"""
from __future__ import annotations

import argparse
import datetime
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import _pack  # noqa: F401  (registers the checkout as comfyui_lingbot_world)
from comfyui_lingbot_world.wan.runtime.dense import GEMM_KINDS, runs_on  # noqa: E402
from comfyui_lingbot_world.wan.runtime.weights8 import (  # noqa: E402
    quantize_activation,
    quantize_activation_pytorch,
    quantize_rows,
)

A14B_SHAPES = ("5120x5120", "13824x5120", "5120x13824")  # [out, in]
CHUNK_TOKENS = 4680  # 3 latent frames of 30 x 52 tokens (480x832)


def time_ms(fn, device: torch.device, repeats: int, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def measure(tokens: int, out_features: int, in_features: int, kinds: list[str], device: torch.device,
            repeats: int) -> dict:
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(tokens, in_features, device=device, dtype=torch.bfloat16, generator=gen)
    w = torch.randn(out_features, in_features, device=device, dtype=torch.bfloat16, generator=gen) * 0.02
    bias = torch.randn(out_features, device=device, dtype=torch.bfloat16, generator=gen) * 0.02
    flops = 2 * tokens * out_features * in_features
    reference = F.linear(x, w, bias).float()
    rows: dict = {}
    for kind in kinds:
        if kind == "bf16":
            fn = lambda: F.linear(x, w, bias)  # noqa: E731
        else:
            values, scales = quantize_rows(w, kind)
            fn = (lambda v=values, s=scales, k=kind: GEMM_KINDS[k].product(x, v, s, bias))  # noqa: E731
        ms = time_ms(fn, device, repeats)
        got = fn().float()
        rows[kind] = {"ms": ms, "tflops": flops / ms / 1e9,
                      "rel_error_vs_bf16": float((got - reference).norm() / reference.norm())}
        if kind != "bf16":
            # As the product runs it (one Triton pass on CUDA), and as PyTorch ops (the CPU path).
            rows[kind]["activation_quant_ms"] = time_ms(lambda k=kind: quantize_activation(x, k), device, repeats)
            rows[kind]["activation_quant_pytorch_ms"] = time_ms(lambda k=kind: quantize_activation_pytorch(x, k),
                                                                device, repeats)
    for kind in kinds:
        rows[kind]["speedup_vs_bf16"] = rows["bf16"]["ms"] / rows[kind]["ms"] if "bf16" in rows else None
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="auto")
    p.add_argument("--tokens", type=int, default=CHUNK_TOKENS)
    p.add_argument("--shapes", nargs="+", default=list(A14B_SHAPES), help="[out]x[in] of each linear")
    p.add_argument("--kinds", nargs="+", default=["bf16", "fp8", "int8"])
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args(argv)
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    kinds = [k for k in args.kinds if runs_on(k, capability)]
    record: dict = {
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "capability": capability, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv), "tokens": args.tokens,
        "kinds": kinds, "skipped_kinds": [k for k in args.kinds if k not in kinds], "layers": {},
    }
    for shape in args.shapes:
        out_features, in_features = (int(v) for v in shape.lower().split("x"))
        record["layers"][shape] = measure(args.tokens, out_features, in_features, kinds, device, args.repeats)
    # One A14B block's linears: q, k, v, o, cross q and o, 4 camera layers (5120²), FFN up and down.
    counts = {"5120x5120": 10, "13824x5120": 1, "5120x13824": 1}
    if all(shape in record["layers"] for shape in counts):
        record["block_linears_ms"] = {k: sum(n * record["layers"][s][k]["ms"] for s, n in counts.items())
                                      for k in kinds}
    Path(args.out).write_text(json.dumps(record, indent=2))
    for shape, rows in record["layers"].items():
        def quant(r: dict) -> str:
            if "activation_quant_ms" not in r:
                return ""
            return f" quant {r['activation_quant_ms']:.3f} (torch {r['activation_quant_pytorch_ms']:.3f})"
        print(shape, "  ".join(f"{k} {r['ms']:.3f} ms x{r['speedup_vs_bf16'] or 0:.2f} err {r['rel_error_vs_bf16']:.4f}"
                               + quant(r) for k, r in rows.items()))
    if "block_linears_ms" in record:
        print("block linears ms:", {k: round(v, 3) for k, v in record["block_linears_ms"].items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
