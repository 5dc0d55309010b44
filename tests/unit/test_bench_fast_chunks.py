"""bench/fast_chunks.py end to end on a tiny package (CPU): the keys bench/RESULTS.md needs."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import tiny_package

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import fast_chunks  # noqa: E402

KEYS = {"chunk_s", "time_to_first_chunk_s", "fps", "peak_vram_allocated_gb", "peak_rss_anon_gb", "kv_policy",
        "kv_dtype", "frames", "cap_gb", "cache_bytes", "clip81", "time_to_first_frames_s", "decode_chunk_s"}


def test_fast_bench_records_a_stream_and_the_81_frame_clip(tmp_path, monkeypatch):
    import tempfile

    package = tiny_package.build(tmp_path, "nf4")
    scratch = tmp_path / "temp"  # the temporary folder the bench sees: it must leave it as it was
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    out = tmp_path / "fast.json"
    code = fast_chunks.main(["--package", str(package), "--device", "cpu", "--size", "32x48", "--frames", "21",
                             "--kv-dtype", "int8", "--stream-decode", "--out", str(out)])
    assert code == 0
    record = json.loads(out.read_text())
    assert KEYS <= set(record), KEYS - set(record)
    assert record["kv_policy"] == "window9_sink3" and record["kv_dtype"] == "int8" and record["frames"] == 21
    assert record["steps"] == 4
    assert record["chunks"] == 2 and len(record["chunk_s"]["per_chunk"]) == 2 and record["fps"] > 0
    assert record["cache_bytes"] > 0 and record["y_encoded_latent_frames"] == 6
    clip = record["clip81"]
    assert clip["video_shape"] == [3, 81, 32, 48] and clip["video_finite"]
    assert set(clip["phases"]) == {"text_s", "vae_encode_s", "sampling_s", "decode_s"}
    assert list(scratch.iterdir()) == []  # neither text cache is left behind


def test_fast_bench_runs_the_long_video_path_overlapped_with_the_memory_plan(tmp_path):
    """--pipeline overlap: stream_fast_video with the decode beside the next chunk; --memory
    auto: the settings the nodes would take on a card of the cap (recorded)."""
    package = tiny_package.build(tmp_path, "nf4")
    out = tmp_path / "fast_overlap.json"
    code = fast_chunks.main(["--package", str(package), "--device", "cpu", "--size", "32x48", "--frames", "33",
                             "--pipeline", "overlap", "--memory", "auto", "--vram-cap-gb", "16", "--no-clip",
                             "--steps", "2", "--out", str(out)])
    assert code == 0
    record = json.loads(out.read_text())
    assert record["pipeline"] == "overlap" and record["frames_written"] == 33 and record["chunks"] == 3
    assert (record["steps"], record["ranks"], record["gpu"]) == (2, 1, "cpu")
    assert len(record["chunk_s"]["per_chunk"]) == 2 and record["fps"] > 0 and record["time_to_first_frames_s"] > 0
    plan = record["memory_plan"]
    assert plan["fits"] and plan["kv_dtype"] == "bf16" and plan["blocks_on_gpu"] is None  # a tiny model fits
