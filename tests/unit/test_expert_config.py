"""loaders/expert_config.py and the control type in both expert loaders: Base-Cam or Act is
told by the shape of patch_embedding_wancamctrl.weight (in NF4 files, by its quant state,
the tensor itself being packed), never by folder names; both experts must agree."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from comfyui_lingbot_world.loaders.errors import CheckpointError
from comfyui_lingbot_world.loaders.expert_config import read_expert_config, read_expert_pair
from comfyui_lingbot_world.loaders.package import find_package
from comfyui_lingbot_world.pipeline.experts import load_expert
from comfyui_lingbot_world.wan.config import CONTROL_WEIGHT, TINY, TINY_ACT


@pytest.mark.parametrize("layout", ["nf4", "bf16"])
def test_the_control_type_comes_from_the_weights(packages, act_packages, layout) -> None:
    base, act = find_package(packages[layout]), find_package(act_packages[layout])
    assert read_expert_config(base.high) == read_expert_config(base.low) == TINY
    assert read_expert_config(act.high) == read_expert_config(act.low) == TINY_ACT
    # config.json is the same for both: only the control weight's shape differs.
    assert json.loads((base.high / "config.json").read_text()) == json.loads((act.high / "config.json").read_text())
    for files, config in ((base, TINY), (act, TINY_ACT)):
        model = load_expert(files.high, "cpu")
        assert model.config == config
        assert model.patch_embedding_wancamctrl.in_features == config.camera_in_features
    assert (TINY.camera_in_features, TINY_ACT.camera_in_features) == (1536, 1792)


def test_an_nf4_control_weight_is_read_from_its_quant_state(act_packages) -> None:
    """In an NF4 file the control layer is 4-bit: its tensor is the packed bytes [n, 1]; the
    [dim, 1792] it came from is the "shape" of its quant state."""
    high = find_package(act_packages["nf4"]).high
    with safe_open(str(high / "model.safetensors"), framework="pt") as f:
        stored = f.get_slice(CONTROL_WEIGHT).get_shape()
    assert stored == [64 * 1792 // 2, 1]
    assert read_expert_config(high).control_type == "act"


def test_folder_names_do_not_decide(packages, act_packages, tmp_path) -> None:
    act_named_base = tmp_path / "lingbot-world-base-act" / "high_noise_model_bnb_nf4"
    base_named_act = tmp_path / "lingbot-world-base-cam" / "high_noise_model"
    shutil.copytree(find_package(packages["nf4"]).high, act_named_base)
    shutil.copytree(find_package(act_packages["bf16"]).high, base_named_act)
    assert read_expert_config(act_named_base).control_type == "cam"
    assert read_expert_config(base_named_act).control_type == "act"


def test_experts_of_two_checkpoints_are_refused_naming_both(packages, act_packages) -> None:
    base, act = find_package(packages["nf4"]), find_package(act_packages["nf4"])
    with pytest.raises(CheckpointError, match=r"low_noise_model_bnb_nf4: the low-noise expert is an Act expert "
                                              r"\(.* 1792 features\) but the high-noise expert .* is a Base-Cam "
                                              r"expert \(1536\); both experts must come from the same model"):
        read_expert_pair(base.high, act.low)
    assert read_expert_pair(act.high, act.low) == TINY_ACT


def test_a_control_weight_of_another_width_is_refused_naming_the_file(act_packages, tmp_path) -> None:
    high = tmp_path / "high_noise_model"
    shutil.copytree(find_package(act_packages["bf16"]).high, high)
    (shard,) = [p for p in high.glob("*.safetensors") if CONTROL_WEIGHT in load_file(str(p))]
    tensors = load_file(str(shard))
    tensors[CONTROL_WEIGHT] = torch.zeros(64, 1000, dtype=torch.bfloat16)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    refusal = rf"{shard.name}: {CONTROL_WEIGHT} has 1000 input features; .*1536 \(Base-Cam.*1792 \(Act"
    with pytest.raises(CheckpointError, match=refusal):
        read_expert_config(high)
    with pytest.raises(CheckpointError, match=refusal):
        load_expert(high, "cpu")


def test_the_synthetic_act_package_keeps_the_base_layout(packages, act_packages) -> None:
    """make_checkpoint --model act: the same files and keys as Base-Cam, one shape differs."""
    for layout in ("nf4", "bf16"):
        base, act = Path(packages[layout]), Path(act_packages[layout])
        assert sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file()) == \
            sorted(p.relative_to(act).as_posix() for p in act.rglob("*") if p.is_file())
