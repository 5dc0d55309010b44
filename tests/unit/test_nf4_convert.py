"""loaders/nf4_convert.py: a bf16 expert folder converted to an NF4 folder, streaming, holds
bit for bit the tensors that quantizing while loading gives, and loads as an NF4 expert.
(The memory it takes: test_nf4_convert_memory.py.)"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from bitsandbytes.utils import unpack_tensor_to_dict
from safetensors import safe_open

from comfyui_lingbot_world.loaders.bf16 import load_bf16_expert, write_bf16_files
from comfyui_lingbot_world.tools.synthetic.experts import save_bf16_expert
from comfyui_lingbot_world.loaders.errors import CheckpointError
from comfyui_lingbot_world.loaders.nf4 import load_nf4_expert, nf4_tensors, read_quantization_meta
from comfyui_lingbot_world.loaders.nf4_convert import Progress, convert_to_nf4, plan_conversion
from comfyui_lingbot_world.tools.synthetic.dit import make_synthetic_expert, write_synthetic_bf16_expert
from comfyui_lingbot_world.wan.config import CONTROL_WEIGHT, TINY, TINY_ACT


def _file_tensors(folder: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        return {key: handle.get_tensor(key) for key in handle.keys()}


def assert_same_tensors(found: dict[str, torch.Tensor], wanted: dict[str, torch.Tensor]) -> None:
    """Same names, dtypes, shapes and bytes."""
    assert sorted(found) == sorted(wanted)
    for key, value in wanted.items():
        other = found[key]
        assert (other.dtype, tuple(other.shape)) == (value.dtype, tuple(value.shape)), key
        assert torch.equal(other.reshape(-1).view(torch.uint8), value.reshape(-1).view(torch.uint8)), key


def test_equals_quantize_on_load_bit_for_bit_and_loads_as_nf4(packages, tmp_path):
    source = packages["bf16"] / "high_noise_model"
    plan = plan_conversion(source)
    assert plan.model_name == "Base-Cam"
    seen: list[Progress] = []
    out = convert_to_nf4(plan, tmp_path / "nf4", "cpu", seen.append)

    on_load = load_bf16_expert(source, "cpu", quantize="nf4")
    wanted = {k: v for k, v in nf4_tensors(on_load)}
    assert_same_tensors(_file_tensors(out), wanted)
    # The NF4 loader reads it, and what it holds serializes to the same tensors again.
    assert_same_tensors(dict(nf4_tensors(load_nf4_expert(out, "cpu"))), wanted)

    assert (out / "config.json").read_bytes() == (source / "config.json").read_bytes()
    meta = read_quantization_meta(out)
    assert (meta.blocksize, meta.double_quant, meta.compute_dtype) == (64, True, torch.bfloat16)
    assert meta.extra["source"] == "high_noise_model" and meta.extra["control"] == "Base-Cam"
    # Progress: every source tensor once, the last report complete.
    assert [p.tensors_done for p in seen] == list(range(1, seen[-1].tensors_total + 1))
    assert seen[-1].read_bytes == seen[-1].read_total == plan.source_bytes
    assert seen[-1].written_bytes < (out / "model.safetensors").stat().st_size <= plan.output_bytes


def test_sharded_source_equals_quantize_on_load(tmp_path):
    """Several shards and their index, as the official release has them."""
    source = write_synthetic_bf16_expert(tmp_path / "low_noise_model", TINY, seed=5, max_shard_bytes=100_000)
    assert len(list(source.glob("diffusion_pytorch_model-*-of-*.safetensors"))) > 3
    out = convert_to_nf4(plan_conversion(source), tmp_path / "nf4")
    assert_same_tensors(_file_tensors(out), dict(nf4_tensors(load_bf16_expert(source, "cpu", quantize="nf4"))))


def test_act_expert_is_told_by_its_camera_layer_and_converted(tmp_path):
    model = make_synthetic_expert(TINY_ACT, seed=3)
    source = save_bf16_expert(model, tmp_path / "high_noise_model")
    assert "control_type" not in json.loads((source / "config.json").read_text())
    plan = plan_conversion(source)
    assert plan.model_name == "Act" and plan.config.control_type == "act"
    out = convert_to_nf4(plan, tmp_path / "nf4")
    # The same bf16 weights quantized in memory by the writer of the NF4 package.
    assert_same_tensors(_file_tensors(out), dict(nf4_tensors(model)))
    state = unpack_tensor_to_dict(_file_tensors(out)[f"{CONTROL_WEIGHT}.quant_state.bitsandbytes__nf4"])
    assert state["shape"] == [TINY.dim, 1792]  # 7 channels x 8x8 pixels x patch 1x2x2


def test_a_camera_layer_of_no_known_model_is_refused_before_any_weight_is_read(tmp_path):
    model = make_synthetic_expert(TINY)
    tensors = dict(model.state_dict())
    tensors[CONTROL_WEIGHT] = torch.zeros(TINY.dim, 1600, dtype=torch.bfloat16)
    folder = write_bf16_files(tmp_path / "odd", TINY, tensors.items())
    with pytest.raises(CheckpointError, match="1600 input features.*not a LingBot-World camera/action checkpoint"):
        plan_conversion(folder)


def test_a_truncated_shard_is_named(packages, tmp_path):
    import shutil
    folder = tmp_path / "high_noise_model"
    shutil.copytree(packages["bf16"] / "high_noise_model", folder)
    shard = next(folder.glob("*-00001-of-*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match=shard.name):
        plan_conversion(folder)


@pytest.mark.gpu
def test_cuda_conversion_equals_cuda_quantize_on_load(packages, tmp_path):
    source = packages["bf16"] / "high_noise_model"
    out = convert_to_nf4(plan_conversion(source), tmp_path / "nf4", "cuda")
    wanted = dict(nf4_tensors(load_bf16_expert(source, "cuda", quantize="nf4")))
    assert_same_tensors(_file_tensors(out), wanted)
