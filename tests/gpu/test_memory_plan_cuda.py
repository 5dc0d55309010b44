"""The memory plan's estimate of a Fast run held against the run measured on the GPU.

``bench/memory_fit.py`` runs a Fast session of the real A14B shapes (synthetic fp8 weights,
480×832, window 9 / sink 3, CUDA graphs) for each cache dtype and camera-terms setting, and
records the allocator's peak beside ``fast_run_bytes`` + the kept terms + the graphs' pool:
what ``plan_fast_memory`` counts when it decides the kv dtype and the blocks kept on the GPU.
An estimate far below the peak runs out of memory on a card the plan said fits; far above,
it swaps blocks that fit. Within 10 % either way is the plan's promise (README, "Memory")."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import tiny_package

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import memory_fit  # noqa: E402

pytestmark = pytest.mark.gpu

TOLERANCE = 0.10
NEEDED_GIB = 40  # the fp8 transformer (17.3 GiB), a bf16 cache (16.5 GiB), terms and graphs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fast_run_estimate_is_within_ten_percent_of_the_measured_peak(tmp_path):
    free, _ = torch.cuda.mem_get_info()
    if free < NEEDED_GIB * 2**30:
        pytest.skip(f"needs {NEEDED_GIB} GiB free on the GPU, {free / 2**30:.0f} GiB are")
    package = tiny_package.build(tmp_path, "nf4")  # a VAE file for the start frame's condition
    out = tmp_path / "fit.json"
    assert memory_fit.main(["--synthetic", "a14b", "--weights", "fp8", "--vae", str(package / "Wan2.1_VAE.pth"),
                            "--kv-dtypes", "bf16,int8", "--terms", "0,40", "--cuda-graphs", "--chunks", "5",
                            "--out", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    ratios = {name: run["whole"]["estimate_over_peak"] for name, run in runs.items()}
    assert set(ratios) == {"bf16_terms0", "bf16_terms40", "int8_terms0", "int8_terms40"}
    far = {name: ratio for name, ratio in ratios.items() if abs(ratio - 1.0) > TOLERANCE}
    assert not far, f"the plan's estimate over the measured peak, off by more than {TOLERANCE:.0%}: {far} (all: {ratios})"
