"""loaders/dit_weights.py, the checks every DiT expert loader runs on the file headers before a
weight is read: the block count against config.json, each stored shape against the model of
config.json (the error names the config field behind the wrong size), the control type told
by the camera layer's shape, a config the model refuses. The loaders' messages on real broken
packages: test_expert_errors.py; the control type through them: test_expert_config.py."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from comfyui_lingbot_world.loaders.dit_weights import (
    build_on_meta,
    check_block_count,
    check_shapes,
    config_with_control,
    fields_behind,
    float_dtype,
)
from comfyui_lingbot_world.loaders.errors import CheckpointError
from comfyui_lingbot_world.loaders.state_dict import expected_tensors
from comfyui_lingbot_world.wan.config import CONTROL_WEIGHT, TINY, TINY_ACT

CONFIG, WEIGHTS = Path("expert/config.json"), Path("expert/model.safetensors")


def _keys(blocks) -> list[str]:
    return ["patch_embedding.weight", *(f"blocks.{i}.self_attn.q.weight" for i in blocks)]


def _stored() -> dict[str, tuple[int, ...]]:
    """TINY's tensors as a file of that model stores them (key -> shape)."""
    return {key: tuple(t.shape) for key, t in expected_tensors(build_on_meta(TINY, CONFIG)).items()}


def test_the_block_count_must_be_config_jsons():
    check_block_count(CONFIG, TINY, WEIGHTS, _keys(range(TINY.num_layers)))
    with pytest.raises(CheckpointError, match=r"^expert/config.json: says num_layers=2 but expert/model.safetensors "
                                              r"holds 3 transformer block\(s\) \(blocks\.0 \.\.\. blocks\.2\); "):
        check_block_count(CONFIG, TINY, WEIGHTS, _keys(range(3)))
    with pytest.raises(CheckpointError, match=r"holds 0 transformer block\(s\) \(no blocks at all\)"):
        check_block_count(CONFIG, TINY, WEIGHTS, _keys(()))
    with pytest.raises(CheckpointError, match=r"^expert/model.safetensors: "):  # a gap: the file's fault
        check_block_count(CONFIG, TINY, WEIGHTS, _keys((0, 2)))


def test_the_config_field_behind_each_axis_is_found():
    assert fields_behind(TINY, "blocks.0.ffn.0.weight", 0) == ["ffn_dim"]
    assert fields_behind(TINY, "blocks.0.ffn.0.weight", 1) == ["dim"]
    assert fields_behind(TINY, "patch_embedding.weight", 1) == ["in_dim"]


def test_a_shape_mismatch_names_the_layer_weight_and_its_config_field_before_a_bias():
    model, stored = build_on_meta(TINY, CONFIG), _stored()
    check_shapes(CONFIG, TINY, model, stored, lambda key: WEIGHTS)  # the model's own shapes pass
    stored["blocks.0.ffn.0.bias"] = (TINY.ffn_dim + 2,)  # listed first: the weight is still reported
    stored["blocks.1.ffn.0.weight"] = (TINY.ffn_dim + 2, TINY.dim)
    with pytest.raises(CheckpointError) as error:
        check_shapes(CONFIG, TINY, model, stored, lambda key: Path(f"shard-of-{key.split('.')[1]}.safetensors"))
    assert str(error.value) == (
        f"expert/config.json: says ffn_dim={TINY.ffn_dim} but shard-of-1.safetensors stores blocks.1.ffn.0 with "
        f"out_features {TINY.ffn_dim + 2} (shape ({TINY.ffn_dim + 2}, {TINY.dim}), expected ({TINY.ffn_dim}, "
        f"{TINY.dim})) (1 more tensor(s) disagree); config.json and the weights do not belong together")


def test_a_shape_of_another_rank_is_reported_as_shapes():
    stored = {**_stored(), "blocks.0.modulation": (6, TINY.dim)}
    with pytest.raises(CheckpointError, match=r"stores blocks\.0\.modulation with shape \(6, 64\), the model of "
                                              r"config.json needs \(1, 6, 64\)"):
        check_shapes(CONFIG, TINY, build_on_meta(TINY, CONFIG), stored, lambda key: WEIGHTS)


def test_the_control_type_is_told_by_the_camera_layers_shape():
    act_shape = expected_tensors(build_on_meta(TINY_ACT, CONFIG))[CONTROL_WEIGHT].shape
    assert config_with_control(TINY, tuple(act_shape), WEIGHTS) == TINY_ACT
    assert config_with_control(TINY_ACT, _stored()[CONTROL_WEIGHT], WEIGHTS) == TINY
    assert config_with_control(TINY, None, WEIGHTS) is TINY  # no such tensor: its key check reports it
    with pytest.raises(CheckpointError, match=r"^expert/model.safetensors: "):
        config_with_control(TINY, (TINY.dim, 7), WEIGHTS)


def test_a_config_the_model_refuses_names_config_json():
    with pytest.raises(CheckpointError, match=r"^expert/config.json: config: window_size=\(4, 4\) is not supported"):
        build_on_meta(dataclasses.replace(TINY, window_size=(4, 4)), CONFIG)


def test_floats_load_in_the_asked_dtype_and_the_rest_as_stored():
    to_bf16 = float_dtype(torch.bfloat16)
    assert to_bf16("w", torch.zeros(1)) == torch.bfloat16
    assert to_bf16("absmax", torch.zeros(1, dtype=torch.uint8)) is None
