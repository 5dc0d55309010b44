"""loaders/model_kind.py: LingBot-World Fast or a Base expert, told by config.json and the
folder's name (the weights are alike); refusals name the input and the evidence; the Fast
config.json the synthetic tool writes is the official file's."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from comfyui_lingbot_world.loaders.errors import CheckpointError
from comfyui_lingbot_world.loaders.layout import read_config
from comfyui_lingbot_world.loaders.model_kind import (assumed_message, describe, fast_config_fields, identify_model,
                                                      require_model)
from comfyui_lingbot_world.wan.config import A14B, TINY

# The fields of the official Fast config.json (upstream WanModelFast's register_to_config,
# less its ignore_for_config), at A14B.
OFFICIAL_FAST = {"_class_name": "WanModelFast", "model_type": "i2v", "control_type": "cam", "text_len": 512,
                 "in_dim": 36, "dim": 5120, "ffn_dim": 13824, "freq_dim": 256, "out_dim": 16, "num_heads": 40,
                 "num_layers": 40, "local_attn_size": -1, "sink_size": 0, "eps": 1e-06}
# A Base expert's config.json as the official Base-Cam release has it.
OFFICIAL_BASE = {"_class_name": "WanModel", "_diffusers_version": "0.33.1", "dim": 5120, "eps": 1e-06,
                 "ffn_dim": 13824, "freq_dim": 256, "in_dim": 36, "model_type": "i2v", "num_heads": 40,
                 "num_layers": 40, "out_dim": 16, "text_len": 512}


def folder(tmp_path: Path, name: str, config: dict) -> Path:
    path = tmp_path / name
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_the_official_configs_say_which_model_whatever_the_folder_is_called(tmp_path):
    fast = identify_model(folder(tmp_path, "anything", OFFICIAL_FAST))
    assert fast.kind == "fast" and not fast.diffusers_layout
    assert fast.evidence == "config.json: _class_name 'WanModelFast', has local_attn_size and sink_size"
    base = identify_model(folder(tmp_path, "whatever", OFFICIAL_BASE))
    assert base.kind == "base" and base.evidence == "config.json: _class_name 'WanModel', no local_attn_size or sink_size"
    # Either field alone is the Fast class's.
    only_sink = {k: v for k, v in OFFICIAL_BASE.items() if k != "_class_name"} | {"sink_size": 0}
    assert identify_model(folder(tmp_path, "x", only_sink)).kind == "fast"
    # A renamed folder does not change the weights: config.json decides, and the evidence says so.
    renamed = identify_model(folder(tmp_path, "high_noise_model", OFFICIAL_FAST))
    assert renamed.kind == "fast" and "the folder name 'high_noise_model' suggests the other model" in renamed.evidence
    assert identify_model(folder(tmp_path, "lingbot_world_fast", OFFICIAL_BASE)).kind == "base"


@pytest.mark.parametrize("name, kind", [
    ("lingbot_world_fast", "fast"), ("lingbot_world_fast_bnb_nf4", "fast"), ("LingBot_World_Fast_copy", "fast"),
    ("high_noise_model", "base"), ("low_noise_model_bnb_nf4", "base"), ("my_model", "unknown"),
])
def test_without_words_in_config_json_the_folder_name_tells(tmp_path, name, kind):
    silent = {k: v for k, v in OFFICIAL_BASE.items() if k != "_class_name"}
    identity = identify_model(folder(tmp_path, name, silent))
    assert identity.kind == kind
    assert f"the folder name {name!r}" in identity.evidence
    assert "no _class_name, local_attn_size or sink_size" in identity.evidence


def test_require_model_refuses_the_other_model_naming_the_input_and_the_evidence(tmp_path):
    fast, base = folder(tmp_path, "f", OFFICIAL_FAST), folder(tmp_path, "b", OFFICIAL_BASE)
    assert require_model(fast, "fast", "fast_model").kind == "fast"
    assert require_model(base, "base", "high_noise").kind == "base"
    with pytest.raises(CheckpointError) as info:
        require_model(base, "fast", "fast_model")
    assert str(info.value) == (f"{base}: fast_model: holds a LingBot-World Base expert, not LingBot-World Fast "
                               "(config.json: _class_name 'WanModel', no local_attn_size or sink_size); load this "
                               "folder with the LingBot-World NF4 DiT Loader (also bf16)")
    with pytest.raises(CheckpointError, match="low_noise: holds LingBot-World Fast, not a LingBot-World Base expert"):
        require_model(fast, "base", "low_noise")
    unknown = folder(tmp_path, "mystery", {"dim": 64})
    identity = require_model(unknown, "fast", "fast_model")  # passes: the node says what it assumes
    assert identity.kind == "unknown"
    assert assumed_message(identity, "fast", "fast_model") == (
        f"fast_model: the files of {unknown} do not say which model they hold (config.json: no _class_name, "
        "local_attn_size or sink_size; the folder name 'mystery' says nothing either); loading them as "
        "LingBot-World Fast")
    assert describe(identity).startswith("mystery: not told by its files")


def test_a_diffusers_layout_copy_is_refused_by_both_loaders(tmp_path):
    """diffusers' field names mean diffusers' tensor names, which the pack does not read."""
    copy = folder(tmp_path, "transformer", {"_class_name": "CausalLingBotWorldTransformer3DModel",
                                            "in_channels": 36, "num_attention_heads": 40, "local_attn_size": -1})
    identity = identify_model(copy)
    assert identity.kind == "fast" and identity.diffusers_layout
    for wanted, field in (("fast", "fast_model"), ("base", "high_noise")):
        with pytest.raises(CheckpointError, match=rf"{field}: this is a diffusers-layout copy .*in_channels, "
                           r"num_attention_heads.* Use the official folder instead: robbyant/lingbot-world-fast"):
            require_model(copy, wanted, field)


def test_a_missing_or_broken_config_json_names_the_file(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"config.json: not found"):
        identify_model(tmp_path / "empty")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="holds a JSON list, expected an object"):
        identify_model(broken)


def test_the_fast_config_json_is_the_official_one_and_reads_back(tmp_path):
    assert fast_config_fields(A14B) == OFFICIAL_FAST
    tiny = fast_config_fields(TINY)
    # Fields the official file leaves out are written only where the geometry is not A14B's.
    assert {k: v for k, v in tiny.items() if k not in OFFICIAL_FAST} == {"text_dim": 32}
    for config, fields in ((A14B, OFFICIAL_FAST), (TINY, tiny)):
        path = folder(tmp_path / config.dim.__str__(), "m", fields)
        assert read_config(path) == config  # the loaders read the geometry back exactly
        assert identify_model(path).kind == "fast"
