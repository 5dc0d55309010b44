"""``python . quantize --format fp8``: an official bf16 release written once as fp8 experts
(layout C, loaders/fp8.py), read back by the layout table as quantize-on-load gives them."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from PIL import Image

from comfyui_lingbot_world.loaders.layout import detect_expert_layout
from comfyui_lingbot_world.loaders.package import find_package
from comfyui_lingbot_world.pipeline.experts import load_expert
from comfyui_lingbot_world.tools import cli, generate, quantize
from comfyui_lingbot_world.wan.runtime.weights8 import Linear8bit

SHARED = ["Wan2.1_VAE.pth", "models_t5_umt5-xxl-enc-bf16.pth", "tokenizer"]


@pytest.fixture
def release(packages, tmp_path) -> Path:
    return Path(shutil.copytree(packages["bf16"], tmp_path / "lingbot-world-base-cam"))


def test_release_becomes_the_fp8_package(release, tmp_path, capsys) -> None:
    shutil.copytree(release / "high_noise_model", release / "lingbot_world_fast")
    config = json.loads((release / "lingbot_world_fast" / "config.json").read_text())
    (release / "lingbot_world_fast" / "config.json").write_text(
        json.dumps({**config, "_class_name": "WanModelFast", "local_attn_size": -1, "sink_size": 0}))
    out = tmp_path / "lingbot-world-base-cam-fp8"
    code = cli.run("quantize", quantize.main, ["--src", str(release), "--out", str(out), "--format", "fp8"])
    text = capsys.readouterr().out
    assert code == 0, text
    names = ["high_noise_model_fp8", "low_noise_model_fp8", "lingbot_world_fast_fp8"]
    assert sorted(p.name for p in out.iterdir()) == sorted(names + SHARED)
    for name in names:
        folder = out / name
        assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model_fp8.safetensors"]
        assert detect_expert_layout(folder) == "fp8"
        source = release / name.removesuffix("_fp8")
        assert (folder / "config.json").read_bytes() == (source / "config.json").read_bytes()
        packaged, on_load = load_expert(folder, "cpu"), load_expert(source, "cpu", quantize="fp8")
        layers = [(a, b) for a, b in zip(packaged.modules(), on_load.modules()) if isinstance(a, Linear8bit)]
        assert layers and all(torch.equal(a.weight.view(torch.uint8), b.weight.view(torch.uint8))
                              and torch.equal(a.weight_scale, b.weight_scale) for a, b in layers)
    assert "FP8 in high_noise_model_fp8/" in text and "tensors," in text
    assert not list(out.glob(".*")), "temporary folders left behind"


def test_the_fp8_package_runs_through_generate(release, tmp_path, capsys) -> None:
    """A new user's three commands: make_checkpoint --layout bf16 (the ``packages`` fixture),
    quantize --format fp8, then generate on the fp8 package (its folders named by LAYOUTS'
    folder_suffix; fp8 products run on the CPU, dense.GEMM_KINDS)."""
    out = tmp_path / "fp8-package"
    assert cli.run("quantize", quantize.main, ["--src", str(release), "--out", str(out), "--format", "fp8"]) == 0
    image = tmp_path / "start.png"
    Image.new("RGB", (64, 48), (40, 90, 160)).save(image)
    video = tmp_path / "v.mp4"
    code = cli.run("generate", generate.main, ["--package", str(out), "--image", str(image), "--prompt", "a walk",
                                                "--out", str(video), "--size", "32x32", "--frames", "5",
                                                "--steps", "2", "--device", "cpu"])
    said = capsys.readouterr()
    assert code == 0, said.err
    assert f"wrote {video} (5 frames, 32x32, 1 window(s))" in said.out and video.stat().st_size > 0
    assert [p.name for p in (find_package(out).high, find_package(out).low)] == ["high_noise_model_fp8",
                                                                              "low_noise_model_fp8"]


def test_help_names_the_formats(capsys) -> None:
    with pytest.raises(SystemExit):
        quantize.parse_args(["--help"])
    assert "--format" in capsys.readouterr().out
