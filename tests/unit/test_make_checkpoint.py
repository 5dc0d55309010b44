"""tools/make_checkpoint: tiny synthetic packages in both layouts, readable by the pack's loaders."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from comfyui_lingbot_world.loaders.bf16 import load_bf16_expert
from comfyui_lingbot_world.loaders.layout import detect_expert_layout, read_config
from comfyui_lingbot_world.loaders.nf4 import load_nf4_expert
from comfyui_lingbot_world.loaders.package import find_package
from comfyui_lingbot_world.loaders.t5_loader import load_t5
from comfyui_lingbot_world.loaders.vae_loader import load_vae
from comfyui_lingbot_world.tools.cli import UsageError
from comfyui_lingbot_world.tools.make_checkpoint import main
from comfyui_lingbot_world.wan.config import TINY, TINY_ACT
from comfyui_lingbot_world.wan.tokenizer import UMT5Tokenizer

ROOT = Path(__file__).resolve().parents[2]
NF4_LAYER = {
    "weight", "weight.absmax", "weight.quant_map", "weight.nested_absmax", "weight.nested_quant_map",
    "weight.quant_state.bitsandbytes__nf4", "bias",
}


def test_tiny_nf4_package(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--preset", "tiny", "--layout", "nf4", "--out", str(tmp_path), "--seed", "4"]) == 0
    summary = capsys.readouterr().out
    assert "high_noise_model_bnb_nf4/model.safetensors" in summary and "total" in summary

    paths = find_package(tmp_path)
    assert paths.high == tmp_path / "high_noise_model_bnb_nf4" and paths.low == tmp_path / "low_noise_model_bnb_nf4"
    for folder in (paths.high, paths.low):
        assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors", "quantization_meta.json"]
        assert detect_expert_layout(folder) == "nf4" and read_config(folder) == TINY
        meta = json.loads((folder / "quantization_meta.json").read_text())
        assert (meta["format"], meta["blocksize"], meta["double_quant"], meta["compute_dtype"]) == ("bnb_nf4", 64, True, "bfloat16")
        with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
            keys = set(f.keys())
        assert {k[len("blocks.1.cross_attn.v."):] for k in keys if k.startswith("blocks.1.cross_attn.v.")} == NF4_LAYER
        assert {"patch_embedding.weight", "blocks.0.modulation", "head.modulation", "blocks.1.norm3.bias"} <= keys

    high, low = load_nf4_expert(paths.high, "cpu"), load_nf4_expert(paths.low, "cpu")
    # The two experts are made with different seeds.
    assert not torch.equal(high.blocks[0].modulation, low.blocks[0].modulation)
    assert not torch.equal(high.blocks[0].ffn[0].weight.data, low.blocks[0].ffn[0].weight.data)

    assert load_t5(paths.t5, "cpu") is not None
    assert load_vae(paths.vae, "cpu") is not None
    ids, mask = UMT5Tokenizer(paths.tokenizer)(["a camera flies over the sea"], max_len=16)
    assert ids.shape == (1, 16) and int(mask.sum()) > 1


def test_tiny_bf16_package(tmp_path: Path) -> None:
    assert main(["--preset", "tiny", "--layout", "bf16", "--out", str(tmp_path)]) == 0
    paths = find_package(tmp_path)
    assert paths.high == tmp_path / "high_noise_model" and paths.low == tmp_path / "low_noise_model"
    for folder in (paths.high, paths.low):
        index = json.loads((folder / "diffusion_pytorch_model.safetensors.index.json").read_text())
        shards = set(index["weight_map"].values())
        assert shards and all((folder / name).is_file() for name in shards)
        assert all(name.startswith("diffusion_pytorch_model-") for name in shards)
        assert "blocks.0.cam_scale_layer.weight" in index["weight_map"] and index["metadata"]["total_size"] > 0
        assert detect_expert_layout(folder) == "bf16"
    high, low = load_bf16_expert(paths.high, "cpu"), load_bf16_expert(paths.low, "cpu")
    assert not torch.equal(high.head.head.weight, low.head.head.weight)
    assert (tmp_path / "models_t5_umt5-xxl-enc-bf16.pth").is_file() and (tmp_path / "Wan2.1_VAE.pth").is_file()
    assert (tmp_path / "tokenizer" / "tokenizer.json").is_file()


def test_parts_subset_and_bad_arguments(tmp_path: Path) -> None:
    assert main(["--preset", "tiny", "--layout", "nf4", "--out", str(tmp_path), "--parts", "vae,tokenizer"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Wan2.1_VAE.pth", "tokenizer"]
    # A mistake is a one-line UsageError naming the flag (tools/cli.py prints it, exit 2).
    with pytest.raises(UsageError, match="--parts: unknown part"):
        main(["--preset", "tiny", "--layout", "nf4", "--out", str(tmp_path), "--parts", "experts,unet"])
    with pytest.raises(UsageError, match="--preset: invalid choice"):
        main(["--preset", "huge", "--layout", "nf4", "--out", str(tmp_path)])


@pytest.mark.parametrize("layout", ["nf4", "bf16"])
def test_model_act_writes_the_act_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture, layout: str) -> None:
    """--model act: config.json as Base-Cam's, the control layer 7 channels wide ([64, 1792] at tiny)."""
    assert main(["--model", "act", "--preset", "tiny", "--layout", layout, "--out", str(tmp_path),
                 "--parts", "experts"]) == 0
    assert "tiny act package" in capsys.readouterr().out
    for folder in sorted(p for p in tmp_path.iterdir() if p.is_dir()):
        assert read_config(folder) == TINY  # config.json cannot tell: it is Base-Cam's
        model = (load_nf4_expert if layout == "nf4" else load_bf16_expert)(folder, "cpu")
        assert model.config == TINY_ACT and model.patch_embedding_wancamctrl.in_features == 1792
    with pytest.raises(UsageError, match="--model: invalid choice"):
        main(["--model", "cam", "--preset", "tiny", "--layout", layout, "--out", str(tmp_path)])


def test_runs_from_a_plain_checkout(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT), "make_checkpoint", "--preset", "tiny", "--layout", "nf4",
         "--out", str(tmp_path), "--parts", "experts"],
        capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "low_noise_model_bnb_nf4/model.safetensors" in result.stdout
    assert detect_expert_layout(tmp_path / "low_noise_model_bnb_nf4") == "nf4"


# --------------------------------------------------------------------------- --model fast


def test_tiny_fast_transformer_in_both_layouts(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The Fast transformer where the official README puts it (lingbot_world_fast/, bf16) or
    as the package tool's NF4 folder, with the official config.json: the pack tells it from a
    Base expert and loads it; its weights are not the experts'."""
    from comfyui_lingbot_world.loaders.model_kind import fast_config_fields, identify_model
    from comfyui_lingbot_world.pipeline.experts import load_expert

    assert main(["--model", "fast", "--preset", "tiny", "--layout", "bf16", "--out", str(tmp_path)]) == 0
    assert "lingbot_world_fast/config.json" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Wan2.1_VAE.pth", "lingbot_world_fast",
                                                          "models_t5_umt5-xxl-enc-bf16.pth", "tokenizer"]
    assert main(["--model", "fast", "--preset", "tiny", "--layout", "nf4", "--out", str(tmp_path),
                 "--parts", "transformer"]) == 0
    assert main(["--preset", "tiny", "--layout", "nf4", "--out", str(tmp_path), "--parts", "experts"]) == 0
    bf16, nf4 = tmp_path / "lingbot_world_fast", tmp_path / "lingbot_world_fast_bnb_nf4"
    assert detect_expert_layout(bf16) == "bf16" and detect_expert_layout(nf4) == "nf4"
    for folder in (bf16, nf4):
        assert json.loads((folder / "config.json").read_text()) == fast_config_fields(TINY)
        assert read_config(folder) == TINY and identify_model(folder).kind == "fast"
    fast = load_expert(bf16, "cpu")
    assert torch.equal(fast.blocks[0].modulation, load_expert(nf4, "cpu").blocks[0].modulation)  # same seed
    assert not torch.equal(fast.blocks[0].modulation, load_expert(find_package(tmp_path).high, "cpu").blocks[0].modulation)
    assert identify_model(find_package(tmp_path).high).kind == "base"
    # The experts are not a Fast part, nor the transformer a Base one.
    with pytest.raises(UsageError, match="--parts: unknown part.*experts for --model fast"):
        main(["--model", "fast", "--preset", "tiny", "--layout", "nf4", "--out", str(tmp_path), "--parts", "experts"])
    with pytest.raises(UsageError, match="--parts: unknown part.*transformer for --model base"):
        main(["--preset", "tiny", "--layout", "nf4", "--out", str(tmp_path), "--parts", "transformer"])
    with pytest.raises(UsageError, match="--model: invalid choice"):
        main(["--model", "turbo", "--preset", "tiny", "--layout", "nf4", "--out", str(tmp_path)])


# --------------------------------------------------------------------------- before and while writing


def _no_model_is_made(monkeypatch) -> None:
    from comfyui_lingbot_world.tools import make_checkpoint

    def refuse(*args, **kwargs):
        raise AssertionError("a part would have been written")

    for writer in ("write_synthetic_nf4_expert", "write_synthetic_bf16_expert", "write_t5_checkpoint",
                   "write_vae_checkpoint", "write_tokenizer"):
        monkeypatch.setattr(make_checkpoint, writer, refuse)


def test_a14b_without_room_on_the_disk_is_refused_before_anything_is_written(tmp_path: Path, monkeypatch) -> None:
    import shutil

    _no_model_is_made(monkeypatch)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**12, 10**12 - 10**10, 10**10))
    out = tmp_path / "a14b"
    with pytest.raises(UsageError, match=rf"--out: needs up to 31.1 GB and {tmp_path} has 10.0 GB free; make room or "
                                         "choose another --out"):
        main(["--preset", "a14b", "--layout", "nf4", "--out", str(out)])
    assert not out.exists()


def test_a_read_only_out_is_named_before_and_while_writing(tmp_path: Path, monkeypatch, capsys) -> None:
    import errno
    import os

    from comfyui_lingbot_world.tools import cli, make_checkpoint

    real_access = os.access
    monkeypatch.setattr(cli.os, "access", lambda p, mode: False if Path(p) == tmp_path else real_access(p, mode))
    with pytest.raises(UsageError, match=rf"--out: folder {tmp_path} is not writable; choose another --out"):
        main(["--preset", "tiny", "--layout", "nf4", "--out", str(tmp_path / "pkg")])
    monkeypatch.setattr(cli.os, "access", real_access)

    def read_only(path, *args, **kwargs):  # the disk turned read-only after the checks
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(make_checkpoint, "write_vae_checkpoint", read_only)
    assert main(["--preset", "tiny", "--layout", "nf4", "--out", str(tmp_path / "pkg"), "--parts", "vae"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"make_checkpoint: error: --out: writing into {tmp_path / 'pkg'} "
                                               "failed ([Errno 30] Read-only file system"), err
    assert list((tmp_path / "pkg").iterdir()) == []  # no half part left


def test_each_part_says_when_it_starts_how_far_it_got_and_when_it_is_done(tmp_path: Path, monkeypatch, capsys) -> None:
    from comfyui_lingbot_world.tools import make_checkpoint

    monkeypatch.setattr(make_checkpoint, "PROGRESS_SECONDS", 0.0)
    real = make_checkpoint.write_synthetic_bf16_expert
    said_before_writing = []

    def writer(*args, **kwargs):
        said_before_writing.append(capsys.readouterr().out)
        return real(*args, **kwargs)

    monkeypatch.setattr(make_checkpoint, "write_synthetic_bf16_expert", writer)
    assert main(["--preset", "tiny", "--layout", "bf16", "--out", str(tmp_path), "--parts", "experts,vae"]) == 0
    out = "".join(said_before_writing) + capsys.readouterr().out
    assert said_before_writing[0] == "high_noise_model: writing, up to 1.6 MB, made on cpu\n"
    lines = out.splitlines()
    assert "  high_noise_model: 1/10 parts made, about 0m00s left" in lines
    assert "Wan2.1_VAE.pth: writing, up to 4.7 MB" in lines
    for name in ("high_noise_model", "low_noise_model", "Wan2.1_VAE.pth"):
        assert any(line.startswith(f"{name}: done in ") for line in lines), name


@pytest.mark.parametrize("inside", ["high_noise_model", "high_noise_model/more"])
def test_an_out_inside_an_expert_folder_is_refused_naming_both(packages, tmp_path: Path, inside: str) -> None:
    """--out inside a release's expert folder wrote a package into its files."""
    import shutil

    release = Path(shutil.copytree(packages["bf16"], tmp_path / "lingbot-world-base-cam"))
    before = sorted(p.name for p in (release / "high_noise_model").iterdir())
    out = release / inside
    with pytest.raises(UsageError, match=f"--out: {out} is (inside )?the expert folder {release / 'high_noise_model'}"):
        main(["--preset", "tiny", "--layout", "nf4", "--out", str(out), "--parts", "vae,tokenizer"])
    assert sorted(p.name for p in (release / "high_noise_model").iterdir()) == before
