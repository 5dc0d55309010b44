"""What the sampler's per-step non-finite check costs: one fused ``torch.isfinite(x).all()``
read back once per step, on the latent of a 480×832×81 video ([16, 21, 60, 104] float32).

    python bench/nonfinite_cost.py --out $OUT/nonfinite_cost.json              # GPU, 480x832x81
    python bench/nonfinite_cost.py --preset tiny --device cpu --out /tmp/x.json  # CPU smoke run

Three numbers:
- ``check_ms``: the check alone (reduction + device-to-host read), median of many;
- ``step_ms_without`` / ``step_ms_with``: a stand-in step (a chain of matmuls sized to take
  ``--step-ms`` milliseconds, then the UniPC-style latent update) run back to back without
  and with the check. The read-back makes the CPU wait for the step to finish, so this
  measures what that costs in a loop of steps, not only the kernel.
A real 480p step is ~6 s on an H100 (bench/RESULTS.md), so ``check_ms`` over 6000 ms is the
fraction of sampling time the check adds.
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

import _pack  # noqa: F401  (bench/_pack.py: the checkout as comfyui_lingbot_world, before any pack import)
from comfyui_lingbot_world.pipeline.guards import is_finite  # noqa: E402
from comfyui_lingbot_world.wan import geometry  # noqa: E402

SIZES = {"480p": (81, 480, 832), "720p": (81, 720, 1280), "tiny": (5, 32, 48)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def latent_dims(frames: int, height: int, width: int) -> tuple[int, int, int, int]:
    return (geometry.LATENT_CHANNELS, *geometry.latent_shape(frames, height, width))


def time_check(latent: torch.Tensor, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        _sync(latent.device)
        started = time.perf_counter()
        assert is_finite(latent)
        out.append((time.perf_counter() - started) * 1000)
    return out


def stand_in_step(latent: torch.Tensor, work: torch.Tensor, matmuls: int) -> torch.Tensor:
    x = work
    for _ in range(matmuls):
        x = x @ work
        x = x / x.norm()
    return latent.mul(0.99).add_(x.mean() * 1e-6)  # the update the step makes, reading the work


def time_steps(latent: torch.Tensor, work: torch.Tensor, matmuls: int, steps: int, check: bool) -> float:
    _sync(latent.device)
    started = time.perf_counter()
    for _ in range(steps):
        latent = stand_in_step(latent, work, matmuls)
        if check and not is_finite(latent):
            raise RuntimeError("non-finite latent in the benchmark")
    _sync(latent.device)
    return (time.perf_counter() - started) * 1000 / steps


def calibrate(latent: torch.Tensor, work: torch.Tensor, step_ms: float) -> int:
    """Matmuls per stand-in step so that one step takes about ``step_ms``."""
    one = time_steps(latent, work, 4, 3, check=False) / 4
    return max(1, int(step_ms / max(one, 1e-3)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(SIZES), default="480p")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-ms", type=float, default=200.0, help="duration of the stand-in step")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    shape = latent_dims(*SIZES[args.preset])
    latent = torch.randn(shape, device=device, dtype=torch.float32)
    time_check(latent, 10)  # warm-up: kernels compiled, allocator primed
    checks = time_check(latent, args.repeats)

    n = 2048 if device.type == "cuda" else 128
    work = torch.randn(n, n, device=device, dtype=torch.float32) / n**0.5
    step_ms = args.step_ms if device.type == "cuda" else min(args.step_ms, 20.0)
    matmuls = calibrate(latent, work, step_ms)
    without = [time_steps(latent, work, matmuls, args.steps, check=False) for _ in range(3)]
    with_check = [time_steps(latent, work, matmuls, args.steps, check=True) for _ in range(3)]

    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "latent_shape": list(shape),
        "latent_mb": latent.numel() * 4 / 2**20,
        "check_ms_median": statistics.median(checks),
        "check_ms_p90": sorted(checks)[int(0.9 * len(checks))],
        "stand_in_step_matmuls": matmuls,
        "step_ms_without": statistics.median(without),
        "step_ms_with": statistics.median(with_check),
    }
    result["step_overhead_ms"] = result["step_ms_with"] - result["step_ms_without"]
    result["fraction_of_a_6s_step"] = result["check_ms_median"] / 6000.0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
