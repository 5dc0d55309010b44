"""Loading an NF4 expert must not copy it into anonymous memory (docs/conventions.md#memory).

A ~1.1 GB synthetic NF4 expert is written once per session; a fresh Python process (so that
nothing of this process counts) then loads it onto the CPU with ``load_nf4_expert`` while a
background thread samples ``RssAnon`` from /proc/self/status every 10 ms. The peak minus the
value just before loading is what the load cost in anonymous memory. File-backed pages of the
safetensors memory map show up under RssFile instead: the kernel can drop and re-read those,
so they are not what the OOM killer counts.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from comfyui_lingbot_world.tools.synthetic.dit import write_synthetic_nf4_expert
from comfyui_lingbot_world.wan.config import DiTConfig

ROOT = Path(__file__).resolve().parents[2]

# 26 blocks of dim 2048 / ffn 8192: ~2.2 G parameters, ~1.15 GB as NF4.
MEMORY_CONFIG = DiTConfig(dim=2048, ffn_dim=8192, num_heads=16, num_layers=26)

_CHILD = r"""
import json, sys, threading, time
sys.path.insert(0, sys.argv[1])
from _standalone import import_pack
import_pack()
import torch
from comfyui_lingbot_world.loaders.nf4 import load_nf4_expert

def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)

peak = [0]
done = threading.Event()
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], status("RssAnon"))
        time.sleep(0.01)

before = status("RssAnon")
file_before = status("RssFile")
peak[0] = before
sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
start = time.perf_counter()
model = load_nf4_expert(sys.argv[2], "cpu")
seconds = time.perf_counter() - start
done.set(); sampler.join()
load_peak = max(peak[0], status("RssAnon"))
# Read every packed weight byte (max() allocates nothing the size of a weight): the weights
# are still views of the file, so this adds file-backed pages, not anonymous ones.
with torch.no_grad():
    for p in model.parameters():
        if p.dtype == torch.uint8:
            p.max()
print(json.dumps({"before": before, "peak": load_peak, "after_touch": status("RssAnon"),
                  "file_before": file_before, "file_after_touch": status("RssFile"), "seconds": seconds}))
"""


@pytest.fixture(scope="session")
def big_nf4_expert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    folder = tmp_path_factory.mktemp("nf4_memory") / "expert"
    start = time.perf_counter()
    # One distinct block, repeated: writing stays fast, the file keeps its full size.
    write_synthetic_nf4_expert(folder, MEMORY_CONFIG, seed=0, device="cpu", distinct_blocks=1)
    return folder, time.perf_counter() - start


def test_nf4_cpu_load_adds_little_anonymous_memory(big_nf4_expert: tuple[Path, float]) -> None:
    folder, write_seconds = big_nf4_expert
    size = (folder / "model.safetensors").stat().st_size
    assert size >= 1024**3, f"test file is only {size / 1e9:.2f} GB"
    assert write_seconds < 120, f"writing the synthetic expert took {write_seconds:.0f} s"

    result = subprocess.run([sys.executable, "-c", _CHILD, str(ROOT), str(folder)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    numbers = json.loads(result.stdout.strip().splitlines()[-1])
    increase = numbers["peak"] - numbers["before"]
    print(f"\nfile {size / 1e9:.3f} GB written in {write_seconds:.1f} s; load {numbers['seconds']:.2f} s; "
          f"RssAnon +{increase / 1e6:.1f} MB peak ({increase / size:.1%} of the file), "
          f"+{(numbers['after_touch'] - numbers['before']) / 1e6:.1f} MB after touching every weight; "
          f"RssFile {numbers['file_before'] / 1e6:.0f} -> {numbers['file_after_touch'] / 1e6:.0f} MB")
    assert increase < 0.25 * size, numbers
    # The weights stay views of the memory map even once every byte has been read.
    assert numbers["after_touch"] - numbers["before"] < 0.25 * size, numbers
