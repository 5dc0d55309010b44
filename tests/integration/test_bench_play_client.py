"""bench/play_client.py end to end on the CPU: it starts the test host with the tiny Fast package
(make_checkpoint --model fast) linked into its models folder, queues the shipped Play template
with the flags' steps over HTTP, plays a short continuous session through the Play routes as
the only page, and records the client's and the session's own figures as real numbers (the
figures themselves come from the GPU machine: bash bench/run_device.sh play_client)."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from comfy_host import ROOT
from comfy_server import require_host
from comfyui_lingbot_world.tools import make_checkpoint

sys.path.insert(0, str(ROOT / "bench"))
import play_client  # noqa: E402


def number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@pytest.fixture(scope="module")
def fast_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A whole tiny LingBot-World Fast package: T5, VAE, tokenizer, lingbot_world_fast_bnb_nf4/."""
    out = tmp_path_factory.mktemp("packages") / "tiny_fast_package"
    assert make_checkpoint.main(["--model", "fast", "--preset", "tiny", "--layout", "nf4", "--out", str(out)]) == 0
    return out


def test_the_client_bench_records_a_session_at_the_client(fast_package: Path, tmp_path: Path) -> None:
    require_host()
    out = tmp_path / "play_client.json"
    code = play_client.main(["--package", str(fast_package), "--device", "cpu", "--size", "32x48", "--sessions",
                             "continuous", "--seconds", "3", "--change-s", "0.3", "--steps", "2", "--out", str(out)])
    assert code == 0
    record = json.loads(out.read_text())
    assert (record["gpu"], record["ranks"], record["steps"]) == ("cpu", 1, 2)
    (session,) = record["sessions"]
    # the server ran what the flags asked: the session's own action log says so
    assert session["log"]["steps"] == 2 and session["log"]["kv_dtype"] in ("bf16", "int8")
    assert (session["reason"], session["result"], session["chunks"], session["frames"]) == \
        ("budget", "execution_success", 4, 45)
    for key in ("client_fps_session", "client_fps_steady", "first_chunk_s", "socket_bytes_per_s", "cold_start_s",
                "in_process_fps_session", "in_process_fps_steady", "server_start_s", "page_cache_read_s"):
        assert number(record[key]) and record[key] > 0, (key, record[key])
    for key in ("run_to_started_s", "run_to_first_frame_s", "client_first_frame_s", "client_over_server_fps"):
        assert number(session[key]) and session[key] > 0, (key, session[key])
    for figures in (session["client_key_to_frame_s"], session["server"]["key_to_frame_s"], session["transit_s"],
                    session["chunk_s"]):
        assert number(figures["median"]) and number(figures["p90"]) and figures["median"] >= 0, figures
    # the client sees what the session sent, later: the socket's delay, and no more frames per second
    assert session["transit_s"]["median"] >= 0 and session["client_over_server_fps"] <= 1.0 + 1e-6
    assert session["client_key_to_frame_s"]["median"] >= session["server"]["key_to_frame_s"]["median"]
    assert record["cold_start_s"] == session["run_to_first_frame_s"] > session["run_to_started_s"]
    # the server's word on each Play run: where a chunk's time went (what found the allocator's cost)
    assert any(line.startswith("LingBot Play: 4 chunks (budget); the transformer") for line in record["server_log"]), \
        record["server_log"]
