"""bench/nonfinite_cost.py and bench/vae_precision.py run end to end on the CPU with their
tiny presets (the GPU numbers come from the same code with the real sizes).
bench/time_to_video.py: test_bench_time_to_video.py."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))  # as when a script in bench/ runs: its `import _pack` finds bench/_pack.py


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_nonfinite_cost_runs_tiny_on_cpu(tmp_path):
    out = tmp_path / "nonfinite.json"
    assert _load("nonfinite_cost").main(["--preset", "tiny", "--device", "cpu", "--repeats", "20", "--steps", "3",
                                         "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["latent_shape"] == [16, 2, 4, 6]
    assert result["check_ms_median"] > 0 and result["step_ms_with"] > 0 and result["step_ms_without"] > 0


def test_vae_precision_runs_tiny_on_cpu(tmp_path):
    out = tmp_path / "vae.json"
    assert _load("vae_precision").main(["--preset", "tiny", "--device", "cpu", "--out", str(out)]) == 0
    cases = json.loads(out.read_text())["cases"]
    assert [c["case"] for c in cases] == ["tiny", "tiny_tiled"]
    for case in cases:
        assert case["fp32"]["encode_s"] > 0 and case["bf16"]["decode_s"] > 0
        assert case["fp32"]["weights_gib"] == 2 * case["bf16"]["weights_gib"]
        assert 0 < case["decode_bf16_vs_fp32"]["max_abs"] < 0.5  # bf16 differs, but not wildly
