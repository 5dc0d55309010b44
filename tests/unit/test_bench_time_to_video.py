"""bench/time_to_video.py end to end on a tiny package (CPU): records and deviation columns."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import time_to_video  # noqa: E402

KEYS = {"gpu", "date", "command", "size", "frames", "steps", "block_swap", "s_per_step", "expert_switch_s",
        "peak_rss_anon_gb", "peak_vram_allocated_gb", "phases", "time_to_video_s", "forwards", "accelerations",
        "latent_rel_err_vs_exact", "video_psnr_vs_exact", "skipped_forwards"}


def test_exact_and_fast_rows(tmp_path, package, monkeypatch):
    import tempfile

    scratch = tmp_path / "temp"  # the temporary folder the bench sees: it must leave it as it was
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    lora = tmp_path / "lora.safetensors"  # the tiny expert: dim 64
    save_file({"diffusion_model.blocks.0.self_attn.q.lora_down.weight": torch.randn(4, 64) * 0.1,
               "diffusion_model.blocks.0.self_attn.q.lora_up.weight": torch.randn(64, 4) * 0.1,
               "diffusion_model.blocks.0.self_attn.q.alpha": torch.tensor(4.0)}, str(lora))
    out = tmp_path / "out"
    code = time_to_video.main(["--package", str(package), "--device", "cpu", "--size", "32x48", "--frames", "5",
                               "--steps", "4", "--out-dir", str(out), "--save-reference", str(tmp_path / "ref"),
                               "--variant", "exact", "--variant", "fast=cache=0.05,warmup=1,cfg_truncate=0.5",
                               "--variant", f"light=preset=lightning_4step,lora={lora},lora_low=0.5",
                               "--variant", "bf16vae=vae=bf16"])
    assert code == 0
    records = {r["variant"]: r for r in (json.loads(f.read_text()) for f in out.glob("*.json"))}
    exact, fast = records["exact"], records["fast"]
    assert KEYS <= set(exact) and KEYS <= set(fast)
    assert exact["forwards"] == 8 and exact["latent_rel_err_vs_exact"] is None
    assert fast["forwards"] + fast["skipped_forwards"] + fast["truncated_forwards"] == 8
    assert fast["truncated_forwards"] == 2 and fast["accelerations"]["cfg_truncate"] == 0.5
    assert exact["s_per_computed_step"] > 0 and isinstance(fast["predicted_changes"], list)
    assert fast["latent_rel_err_vs_exact"] > 0 and fast["video_psnr_vs_exact"] > 0
    assert (tmp_path / "ref" / "latent.pt").is_file()
    light = records["light"]
    assert light["forwards"] == 4 and light["accelerations"]["lora"] == str(lora)
    assert light["accelerations"]["guide"] == [1.0, 1.0] and light["expert_names"] == ["high"] * 2 + ["low"] * 2
    # Only the VAE's precision differs from the exact row: the latent is the same, the video is not.
    bf16 = records["bf16vae"]
    assert bf16["accelerations"]["vae_precision"] == "bf16" and exact["accelerations"]["vae_precision"] == "fp32"
    assert bf16["forwards"] == 8 and 0 < bf16["latent_rel_err_vs_exact"] < 0.05
    assert 20 < bf16["video_psnr_vs_exact"] < float("inf")
    assert list(scratch.iterdir()) == []  # no text cache left behind per variant


def test_a_vae_precision_other_than_fp32_or_bf16_is_refused():
    import pytest

    with pytest.raises(SystemExit, match="fp16"):
        time_to_video.parse_variant("x=vae=fp16")
