"""bench/memory_fit.py end to end on the tiny shapes (CPU): every part and run it measures on
a GPU is recorded beside the memory plan's estimate (on the CPU the allocator reads 0)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import tiny_package

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import memory_fit  # noqa: E402


def test_memory_fit_records_each_part_beside_its_estimate(tmp_path):
    package = tiny_package.build(tmp_path, "nf4")
    out = tmp_path / "fit.json"
    assert memory_fit.main(["--synthetic", "tiny", "--weights", "bf16", "--vae", str(package / "Wan2.1_VAE.pth"),
                            "--size", "32x48", "--device", "cpu", "--kv-dtypes", "bf16,int8", "--terms", "0",
                            "--chunks", "2", "--prefetch", "2", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert (record["gpu"], record["ranks"], record["synthetic"]) == ("cpu", 1, "tiny")
    assert {"weights", "vae_weights", "vae_encoder", "wan_decoder_chunk", "vae_stream_budget"} <= set(record["parts"])
    assert record["parts"]["vae_encoder"]["estimate_gib"] > 0  # the plan's figure, beside a measured 0 on the CPU
    assert set(record["runs"]) == {"bf16_terms0", "int8_terms0"}
    for run in record["runs"].values():
        assert len(run["chunks"]) == 2 and run["cache_nbytes_gib"] is not None
        assert run["whole"]["estimate_gib"] > 0 and run["activation_estimate_gib"] > 0
    assert not out.with_name(out.name + ".tmp").exists()  # written beside, renamed into place
