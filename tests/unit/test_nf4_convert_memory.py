"""Converting a bf16 expert to NF4 takes anonymous memory bounded by its largest layer, not
by the model (docs/conventions.md#memory).

Two synthetic bf16 experts of the same width, 1 and 5 blocks (~60 MB and ~260 MB), are
converted on the CPU in fresh Python processes while a thread samples ``RssAnon`` from
/proc/self/status every 5 ms; the peak minus the value just before is what the conversion
cost. The shards' memory-mapped pages count under RssFile (the kernel can drop and re-read
them), the written file under the page cache: neither is the process's own memory.

On the CPU, bitsandbytes' quantizer holds float32 copies of the layer it quantizes (7x the
layer's bf16 bytes at the peak, here and for A14B's largest layer: +2.2 GB for its 315 MB
time_projection, measured by hand), so the bound is a multiple of the largest layer.
The children fix glibc's mmap threshold (MALLOC_MMAP_THRESHOLD_): by default glibc raises
it after each large free and keeps freed buffers up to 32 MB in its heap, tens of MB of
noise that would hide the comparison between the two sizes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from comfyui_lingbot_world.tools.synthetic.dit import write_synthetic_bf16_expert
from comfyui_lingbot_world.wan.config import DiTConfig

ROOT = Path(__file__).resolve().parents[2]
WIDTH = dict(dim=1024, ffn_dim=4096, num_heads=8)

_CHILD = r"""
import json, sys, threading, time
sys.path.insert(0, sys.argv[1])
from _standalone import import_pack
import_pack()
import torch
from torch import nn
from comfyui_lingbot_world.loaders.nf4 import quantize_linear
from comfyui_lingbot_world.loaders.nf4_convert import convert_to_nf4, plan_conversion

def rss_anon():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024

plan = plan_conversion(sys.argv[2])
quantize_linear(nn.Linear(256, 256).to(torch.bfloat16))  # bitsandbytes' first call sets itself up
peak, done = [0], threading.Event()
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], rss_anon())
        time.sleep(0.005)
before = peak[0] = rss_anon()
sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
start = time.perf_counter()
convert_to_nf4(plan, sys.argv[3], "cpu")
seconds = time.perf_counter() - start
done.set(); sampler.join()
largest = max(e.nbytes() for e in plan.entries if e.name.endswith(".weight") and e.dtype == torch.uint8) * 4
print(json.dumps({"growth": max(peak[0], rss_anon()) - before, "largest_bf16": largest,
                  "source": plan.source_bytes, "seconds": seconds}))
"""


def _convert(folder: Path, out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["MALLOC_MMAP_THRESHOLD_"] = str(1 << 20)
    done = subprocess.run([sys.executable, "-c", _CHILD, str(ROOT), str(folder), str(out)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RssAnon from /proc (Linux)")
def test_conversion_memory_is_bounded_by_the_largest_layer_not_the_model(tmp_path):
    results = {}
    for blocks in (1, 5):
        folder = write_synthetic_bf16_expert(tmp_path / f"bf16_{blocks}", DiTConfig(**WIDTH, num_layers=blocks),
                                             distinct_blocks=1, max_shard_bytes=64 << 20)
        results[blocks] = _convert(folder, tmp_path / f"nf4_{blocks}")
    small, large = results[1], results[5]
    largest = large["largest_bf16"]
    print("\n" + "\n".join(
        f"{blocks} block(s): source {r['source'] / 1e6:.0f} MB, RssAnon +{r['growth'] / 1e6:.1f} MB peak "
        f"({r['growth'] / largest:.1f}x the largest layer's {largest / 1e6:.1f} MB), {r['seconds']:.1f} s"
        for blocks, r in results.items()))
    assert large["source"] > 2.5 * small["source"]
    for r in (small, large):
        assert r["growth"] < 10 * largest, r
        assert r["growth"] < large["source"] / 2, r
    # Four more blocks (~200 MB more to read and quantize) cost no more memory than one layer.
    assert large["growth"] - small["growth"] < largest, results
