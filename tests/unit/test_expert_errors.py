"""Themed (hostile inputs, expert folders): every way an expert folder can be wrong gives a
CheckpointError naming the file and the problem (loaders/layout.py, dit_weights.py, nf4.py,
bf16.py, package.py). Index, by section: the folder itself (missing, a file, empty,
unrelated files, the other layout); damaged files (truncated safetensors, shards and
model.pt, corrupt headers, a shard the index names but lacks); keys and shapes (missing,
unexpected, config.json against the weights); quantization_meta.json; an incomplete
package. Experts of two geometries: test_node_dit_loader.py."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from comfyui_lingbot_world.loaders.bf16 import load_bf16_expert
from comfyui_lingbot_world.loaders.errors import CheckpointError
from comfyui_lingbot_world.loaders.layout import detect_expert_layout, read_config
from comfyui_lingbot_world.loaders.nf4 import load_nf4_expert
from comfyui_lingbot_world.tools.synthetic.experts import save_bf16_expert, save_nf4_expert
from comfyui_lingbot_world.loaders.package import find_package
from comfyui_lingbot_world.tools.synthetic.dit import make_synthetic_expert
from comfyui_lingbot_world.wan.config import TINY

SHARD_GLOB = "diffusion_pytorch_model-*.safetensors"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("experts")
    model = make_synthetic_expert(TINY, seed=3)
    save_nf4_expert(model, root / "nf4")
    save_bf16_expert(model, root / "bf16", max_shard_bytes=200_000)
    return {"nf4": root / "nf4", "bf16": root / "bf16"}


@pytest.fixture
def nf4(pristine, tmp_path: Path) -> Path:
    return Path(shutil.copytree(pristine["nf4"], tmp_path / "nf4_expert"))


@pytest.fixture
def bf16(pristine, tmp_path: Path) -> Path:
    return Path(shutil.copytree(pristine["bf16"], tmp_path / "bf16_expert"))


def fails(call, *needles: object) -> str:
    """Run ``call``; it must raise CheckpointError whose message holds every needle."""
    with pytest.raises(CheckpointError) as info:
        call()
    message = str(info.value)
    for needle in needles:
        assert str(needle) in message, f"{needle!r} not in: {message}"
    return message


def edit_json(path: Path, **changes: object) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def rewrite_tensors(path: Path, edit) -> None:
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, str(path))


# --- the folder itself ---------------------------------------------------------------------

def test_missing_folder(tmp_path: Path) -> None:
    fails(lambda: load_nf4_expert(tmp_path / "nope", "cpu"), tmp_path / "nope", "does not exist")
    fails(lambda: load_bf16_expert(tmp_path / "nope", "cpu"), tmp_path / "nope", "does not exist")


def test_file_instead_of_folder(nf4: Path) -> None:
    weights = nf4 / "model.safetensors"
    fails(lambda: load_nf4_expert(weights, "cpu"), weights, "is a file", f"({nf4})")


def test_empty_folder(tmp_path: Path) -> None:
    fails(lambda: detect_expert_layout(tmp_path), tmp_path, "is not an expert folder", "empty")


def test_unrelated_files_are_listed(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hi")
    (tmp_path / "model.safetensors").write_bytes(b"")
    fails(lambda: load_nf4_expert(tmp_path, "cpu"), tmp_path, "notes.txt", "quantization_meta.json is missing")


def test_wrong_layout_for_the_loader(nf4: Path, bf16: Path) -> None:
    fails(lambda: load_nf4_expert(bf16, "cpu"), bf16, "holds a bf16 expert", "load_bf16_expert")
    fails(lambda: load_bf16_expert(nf4, "cpu"), nf4, "holds a nf4 expert", "load_nf4_expert")


# --- damaged files -------------------------------------------------------------------------

def test_truncated_safetensors(nf4: Path) -> None:
    weights = nf4 / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 4096])
    fails(lambda: load_nf4_expert(nf4, "cpu"), weights, "truncated or corrupt")


def test_corrupt_header_length(nf4: Path) -> None:
    weights = nf4 / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[:8] = b"\xff" * 8
    weights.write_bytes(bytes(data))
    fails(lambda: load_nf4_expert(nf4, "cpu"), weights, "header too large", "truncated or corrupt")


def test_corrupt_header_json(nf4: Path) -> None:
    weights = nf4 / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:16] = b"garbage!"
    weights.write_bytes(bytes(data))
    fails(lambda: load_nf4_expert(nf4, "cpu"), weights, "invalid JSON in header")


def test_truncated_shard(bf16: Path) -> None:
    shard = sorted(bf16.glob(SHARD_GLOB))[-1]
    shard.write_bytes(shard.read_bytes()[:-100])
    fails(lambda: load_bf16_expert(bf16, "cpu"), shard, "truncated or corrupt")


def test_truncated_legacy_model_pt(nf4: Path) -> None:
    torch.save(load_file(nf4 / "model.safetensors"), nf4 / "model.pt")
    (nf4 / "model.safetensors").unlink()
    legacy = nf4 / "model.pt"
    legacy.write_bytes(legacy.read_bytes()[:5000])
    fails(lambda: load_nf4_expert(nf4, "cpu"), legacy, "truncated or corrupt")


def test_missing_shard_named_by_the_index(bf16: Path) -> None:
    shard = sorted(bf16.glob(SHARD_GLOB))[0]
    shard.unlink()
    fails(lambda: load_bf16_expert(bf16, "cpu"), bf16 / "diffusion_pytorch_model.safetensors.index.json",
          "not in the folder", shard.name)


# --- keys and shapes -----------------------------------------------------------------------

def test_missing_key(nf4: Path) -> None:
    weights = nf4 / "model.safetensors"
    rewrite_tensors(weights, lambda t: t.pop("blocks.1.norm3.bias"))
    fails(lambda: load_nf4_expert(nf4, "cpu"), weights, "1 missing key(s): blocks.1.norm3.bias")


def test_missing_quant_state_key(nf4: Path) -> None:
    weights = nf4 / "model.safetensors"
    rewrite_tensors(weights, lambda t: t.pop("blocks.0.ffn.2.weight.quant_state.bitsandbytes__nf4"))
    fails(lambda: load_nf4_expert(nf4, "cpu"), weights, "missing key(s): blocks.0.ffn.2.weight.quant_state")


def test_unexpected_key(bf16: Path) -> None:
    shard = sorted(bf16.glob(SHARD_GLOB))[0]
    rewrite_tensors(shard, lambda t: t.update({"blocks.0.extra.weight": torch.zeros(3, dtype=torch.bfloat16)}))
    index = bf16 / "diffusion_pytorch_model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["blocks.0.extra.weight"] = shard.name
    index.write_text(json.dumps(data))
    fails(lambda: load_bf16_expert(bf16, "cpu"), index, "1 unexpected key(s): blocks.0.extra.weight")


def test_index_names_a_key_its_shard_lacks(bf16: Path) -> None:
    index = bf16 / "diffusion_pytorch_model.safetensors.index.json"
    data = json.loads(index.read_text())
    key, shard = next(iter(data["weight_map"].items()))
    other = next(name for name in data["weight_map"].values() if name != shard)
    data["weight_map"][key] = other
    index.write_text(json.dumps(data))
    fails(lambda: load_bf16_expert(bf16, "cpu"), other, f"does not hold tensor {key!r}")


def test_shape_mismatch_of_one_tensor(nf4: Path) -> None:
    weights = nf4 / "model.safetensors"
    rewrite_tensors(weights, lambda t: t.update({"blocks.1.norm3.weight": torch.ones(32, dtype=torch.bfloat16)}))
    fails(lambda: load_nf4_expert(nf4, "cpu"), weights, nf4 / "config.json", "blocks.1.norm3", "length 32", "dim=64")


def test_shape_mismatch_in_bf16_shard(bf16: Path) -> None:
    index = bf16 / "diffusion_pytorch_model.safetensors.index.json"
    shard = bf16 / json.loads(index.read_text())["weight_map"]["blocks.0.ffn.0.weight"]
    rewrite_tensors(shard, lambda t: t.update({"blocks.0.ffn.0.weight": torch.zeros(96, 64, dtype=torch.bfloat16)}))
    fails(lambda: load_bf16_expert(bf16, "cpu"), shard, bf16 / "config.json", "blocks.0.ffn.0", "ffn_dim=128",
          "out_features 96")


def test_config_dim_does_not_match_weights(nf4: Path) -> None:
    edit_json(nf4 / "config.json", dim=128)
    fails(lambda: load_nf4_expert(nf4, "cpu"), nf4 / "config.json", nf4 / "model.safetensors", "says dim=128",
          "patch_embedding with out_channels 64")
    edit_json(nf4 / "config.json", dim=64, text_dim=48)
    fails(lambda: load_nf4_expert(nf4, "cpu"), "says text_dim=48", "text_embedding.0 with in_features 32")


def test_config_num_layers_does_not_match_weights(nf4: Path, bf16: Path) -> None:
    edit_json(nf4 / "config.json", num_layers=3)
    fails(lambda: load_nf4_expert(nf4, "cpu"), nf4 / "config.json", "num_layers=3", "2 transformer block(s)")
    edit_json(bf16 / "config.json", num_layers=1)
    fails(lambda: load_bf16_expert(bf16, "cpu"), bf16 / "config.json", "num_layers=1", "2 transformer block(s)")


def test_unreadable_or_invalid_config(nf4: Path) -> None:
    config = nf4 / "config.json"
    config.write_text('{"dim": 64,')
    fails(lambda: read_config(nf4), config, "not valid JSON")
    config.write_text(json.dumps({"dim": "sixty-four"}))
    fails(lambda: read_config(nf4), config, "'dim'", "positive integer")
    config.write_text(json.dumps({**TINY.to_dict(), "num_heads": 3}))
    fails(lambda: load_nf4_expert(nf4, "cpu"), config, "not divisible by num_heads=3")
    config.write_text(json.dumps({**TINY.to_dict(), "model_type": "t2v"}))
    fails(lambda: read_config(nf4), config, "'model_type'", "i2v")
    config.unlink()
    fails(lambda: load_nf4_expert(nf4, "cpu"), config, "not found")


# --- quantization_meta.json ----------------------------------------------------------------

def test_wrong_quantization_format(nf4: Path) -> None:
    meta = nf4 / "quantization_meta.json"
    edit_json(meta, format="bnb_fp4")
    fails(lambda: load_nf4_expert(nf4, "cpu"), meta, "'format'", "'bnb_fp4'", "'bnb_nf4'")


def test_quantization_meta_fields(nf4: Path) -> None:
    meta = nf4 / "quantization_meta.json"
    edit_json(meta, blocksize=100)
    fails(lambda: load_nf4_expert(nf4, "cpu"), meta, "'blocksize'", "100")
    edit_json(meta, blocksize=128)  # valid, but not what the layers use
    fails(lambda: load_nf4_expert(nf4, "cpu"), meta, "blocksize=128", "blocksize 64")
    edit_json(meta, blocksize=64, double_quant=False)
    fails(lambda: load_nf4_expert(nf4, "cpu"), meta, "double_quant=false", "with double quantization")
    edit_json(meta, double_quant="yes")
    fails(lambda: load_nf4_expert(nf4, "cpu"), meta, "'double_quant'", "'yes'")
    data = json.loads(meta.read_text())
    del data["format"]
    meta.write_text(json.dumps(data))
    fails(lambda: load_nf4_expert(nf4, "cpu"), meta, "'format' is missing")
    meta.write_text("[]")
    fails(lambda: load_nf4_expert(nf4, "cpu"), meta, "expected an object")


def test_corrupt_quant_state_blob(nf4: Path) -> None:
    weights = nf4 / "model.safetensors"
    key = "blocks.0.self_attn.q.weight.quant_state.bitsandbytes__nf4"
    rewrite_tensors(weights, lambda t: t.update({key: torch.tensor(list(b"{not json"), dtype=torch.uint8)}))
    fails(lambda: load_nf4_expert(nf4, "cpu"), weights, key, "not readable")


def test_packed_weight_too_small_for_its_quant_state(nf4: Path) -> None:
    weights = nf4 / "model.safetensors"
    key = "blocks.0.self_attn.q.weight"
    rewrite_tensors(weights, lambda t: t.update({key: t[key][:100].clone()}))
    fails(lambda: load_nf4_expert(nf4, "cpu"), weights, "does not match its own quant state", key)


# --- package -------------------------------------------------------------------------------

def test_incomplete_package(tmp_path: Path, pristine) -> None:
    shutil.copytree(pristine["nf4"], tmp_path / "high_noise_model_bnb_nf4")
    (tmp_path / "tokenizer").mkdir()
    message = fails(lambda: find_package(tmp_path), tmp_path, "low-noise expert", "models_t5_umt5-xxl-enc-bf16.pth",
                    "Wan2.1_VAE.pth", "tokenizer/")
    assert "high-noise" not in message
    fails(lambda: find_package(tmp_path / "absent"), tmp_path / "absent", "does not exist")
