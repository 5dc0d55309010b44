"""bench/multi_gpu.py runs end to end on the CPU (gloo, tiny geometry), as the lead runs it
on 2 and 4 GPUs: the sequence-parallel mode (a subprocess, as on the GPU machine: rank 0 is
the script's process, the workers are spawned) and the placements with --tiny."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "multi_gpu.py"


def _run(*args: str) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_sequence_parallel_mode_runs_tiny_on_cpu(tmp_path):
    out = tmp_path / "sp.json"
    _run("--mode", "sp", "--tiny", "--ranks", "2", "--exact-video", "2", "--out", str(out))
    one, two = json.loads(out.read_text())
    assert one["ranks"] == 1 and two["ranks"] == 2 and one["steps"] == two["fast"]["steps"] == 4
    assert one["fast"]["chunk_s"] > 0 and one["exact"]["s_per_step"] > 0
    assert two["link"]["gbps"] > 0  # gloo on the CPU: a slow link, so each loader's slow-link pick
    assert two["link"]["auto_picks"] == {"base": "cfg_split", "fast": "decode_on_second_gpu"}
    assert two["fast"]["max_rel_vs_1gpu"] < 1e-5 and two["exact"]["max_rel_vs_1gpu"] < 1e-5
    assert len(two["fast"]["chunk_seconds"]) == 3 and two["fast"]["speedup_vs_1gpu"] > 0
    assert two["env"]["NCCL_NVLS_ENABLE"] == "0" and two["env"]["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    # --exact-video: a whole video through the sampler across the expert switch, on the group
    video = two["exact_video"]
    assert video["steps"] == len(video["step_seconds"]) == 2 and video["video_finite"]
    assert video["video_s"] >= video["sampling_s"] > 0 and "exact_video" not in one


def test_placements_mode_runs_tiny_on_cpu(tmp_path):
    out = tmp_path / "placements.json"
    _run("--tiny", "--out", str(out))
    records = json.loads(out.read_text())
    assert [r["devices"] for r in records] == ["single", "expert_per_gpu", "cfg_split"]
    assert {r["steps"] for r in records} == {4}  # --tiny: 4 steps of the exact sampler
    assert all(r["video_finite"] for r in records)
    assert records[1]["latent_equal_to_single"] and records[1]["warm_run_reloaded"] is False


def test_sequence_parallel_mode_with_8bit_weights(tmp_path):
    """--weights fp8: every linear of the synthetic model held in fp8 on every rank (the
    loaders' convert_linear), the one-rank figure in the same kind."""
    out = tmp_path / "sp_fp8.json"
    _run("--mode", "sp", "--tiny", "--ranks", "2", "--weights", "fp8", "--skip-exact", "--steps", "2", "--out",
         str(out))
    one, two = json.loads(out.read_text())
    assert one["weights"] == two["weights"] == "fp8"
    assert one["steps"] == two["steps"] == two["fast"]["steps"] == 2  # --steps: each Fast chunk's denoising steps
    assert two["fast"]["max_rel_vs_1gpu"] < 1e-5 and "exact" not in two
    assert one["linear_kinds"] == two["linear_kinds"] == ["fp8"]  # every linear converted
