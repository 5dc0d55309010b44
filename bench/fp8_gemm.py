"""fp8 GEMM variants at a Fast chunk's shapes: which ``torch._scaled_mm`` form is fastest, and
what each costs in accuracy against the float32 product of the same 8-bit operands.

Variants (e4m3 operands, bf16 out): row-wise scales (per token × per channel, what
``wan/runtime/weights8.py`` runs) with and without ``use_fast_accum``; per-tensor scales
with and without it; bf16 ``F.linear`` beside them; the activation's per-token quantization
timed alone. Shapes: the 5120² linears and the FFN's two at 4,680 tokens (one GPU) and at
the shards of 2 and 4 ranks. CUDA events, median of repeats (``kernel_floor._time_ms``).

    python bench/fp8_gemm.py --out fp8_gemm.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from kernel_floor import _time_ms  # noqa: E402  (also registers the pack)
from comfyui_lingbot_world.wan.runtime.weights8 import quantize_activation, quantize_rows  # noqa: E402


def variants(x: torch.Tensor, w: torch.Tensor) -> dict[str, tuple]:
    """name -> (callable, its product as float32 for the error)."""
    wq, ws = quantize_rows(w, "fp8")
    xq, xs = quantize_activation(x, "fp8")
    x_max = (x.float().abs().amax() / 448.0).reshape(())
    xq_t = (x.float() / x_max).to(torch.float8_e4m3fn)
    w_max = ws.max().reshape(())
    wq_t = (w.float() / w_max).to(torch.float8_e4m3fn)
    out = {"bf16": lambda: F.linear(x, w)}
    for fast in (False, True):
        tag = "_fast" if fast else ""
        out[f"rowwise{tag}"] = lambda fast=fast: torch._scaled_mm(xq, wq.t(), scale_a=xs[:, None], scale_b=ws[None, :],
                                                                  out_dtype=torch.bfloat16, use_fast_accum=fast)
        out[f"tensor{tag}"] = lambda fast=fast: torch._scaled_mm(xq_t, wq_t.t(), scale_a=x_max, scale_b=w_max,
                                                                 out_dtype=torch.bfloat16, use_fast_accum=fast)
    out["rowwise_quantize_activation"] = lambda: quantize_activation(x, "fp8")
    exact_row = (xq.float() * xs[:, None]) @ (wq.float() * ws[:, None]).t()
    exact_tensor = (xq_t.float() * x_max) @ (wq_t.float() * w_max).t()
    reference = F.linear(x.float(), w.float())
    return {name: (fn, exact_row if name.startswith("rowwise") else exact_tensor if name.startswith("tensor")
                   else reference) for name, fn in out.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--tokens", type=int, action="append", help="default 4680, 2340, 1170")
    args = p.parse_args(argv)
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    record = {"gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__, "command": " ".join(sys.argv),
              "shapes": []}
    for tokens in args.tokens or [4680, 2340, 1170]:
        for name, (k, n) in {"square": (5120, 5120), "ffn_up": (5120, 13824), "ffn_down": (13824, 5120)}.items():
            x = torch.randn(tokens, k, device=dev, dtype=torch.bfloat16, generator=gen)
            x *= torch.logspace(-1, 1, tokens, device=dev, dtype=torch.bfloat16)[:, None]  # tokens of different size
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16, generator=gen) * 0.02
            row = {"tokens": tokens, "layer": name, "k": k, "n": n}
            for variant, (fn, exact) in variants(x, w).items():
                row[f"{variant}_ms"] = _time_ms(fn, repeats=20, warmup=5)
                if not variant.endswith("activation"):
                    got = fn().float()
                    row[f"{variant}_rel_to_exact"] = float((got - exact).norm() / exact.norm())
            record["shapes"].append(row)
            print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
    Path(args.out).write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
