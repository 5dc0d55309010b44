"""bench/play_session.py end to end on a tiny package (CPU): both modes driven through the
session's input state, and the keys bench/RESULTS.md needs."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import tiny_package

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import play_session  # noqa: E402

MODE_KEYS = {"key_to_frame_s", "fps", "chunk_s", "decode_s", "peak_vram_allocated_gb", "chunks", "frames", "reason",
             "warm_up_s", "first_chunk_s"}


def test_sixty_seconds_are_eighty_chunks():
    assert play_session.session_chunks(60, 16) == 80 and play_session.session_chunks(2, 16) == 2


def test_play_bench_records_a_turn_based_and_a_continuous_session(tmp_path):
    package = tiny_package.build(tmp_path, "nf4")
    out = tmp_path / "play.json"
    code = play_session.main(["--package", str(package), "--device", "cpu", "--size", "32x48", "--seconds", "2",
                              "--change-s", "0.05", "--kv-dtype", "int8", "--out", str(out)])
    assert code == 0
    record = json.loads(out.read_text())
    assert {"peak_rss_anon_gb", "kv_window", "kv_sink", "kv_dtype", "cap_gb", "chunks"} <= set(record)
    assert record["kv_dtype"] == "int8" and record["chunks"] == 2
    for mode in ("turn", "continuous"):
        result = record["modes"][mode]
        assert MODE_KEYS <= set(result), MODE_KEYS - set(result)
        assert result["reason"] == "budget" and result["chunks"] == 2 and result["frames"] == 21
        assert result["fps"] > 0 and len(result["chunk_s"]["all"]) == 2 and result["video_bytes"] > 0
        assert result["warm_up_s"] is None and result["first_chunk_s"] == result["chunk_s"]["all"][0]  # auto: GPU only
    turn = record["modes"]["turn"]["key_to_frame_s"]
    assert len(turn["all"]) == 2 and 0 < turn["median"] <= turn["p90"]  # every turn-based chunk was asked for


def test_play_bench_runs_sequentially_with_the_memory_plan(tmp_path):
    package = tiny_package.build(tmp_path, "nf4")
    out = tmp_path / "play_seq.json"
    code = play_session.main(["--package", str(package), "--device", "cpu", "--size", "32x48", "--seconds", "2",
                              "--modes", "continuous", "--pipeline", "sequential", "--memory", "auto",
                              "--vram-cap-gb", "12", "--steps", "2", "--warm-up", "on", "--out", str(out)])
    assert code == 0
    record = json.loads(out.read_text())
    assert record["pipeline"] == "sequential" and record["memory_plan"]["fits"] and record["warm_up"] == "on"
    assert (record["steps"], record["ranks"]) == (2, 1)
    assert record["modes"]["continuous"]["chunks"] == 2 and record["modes"]["continuous"]["warm_up_s"] > 0
