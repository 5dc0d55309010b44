"""nodes/fast_dit_loader.py: LingBot-World Fast DiT Loader inside the ComfyUI host (CPU): it
loads nothing, lists the Fast folder first, says what the files are (model_info), refuses a
Base expert by its files, says which model it assumes where they cannot tell (its patcher: test_host_fast_model.py)."""
from __future__ import annotations

import pytest
import torch

from comfy_host import comfy_state_reset, use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported

from node_runs import FAST, FAST_NF4, HIGH, LOW, PKG, load_fast, options  # noqa: E402
from comfyui_lingbot_world.loaders.errors import CheckpointError  # noqa: E402
from comfyui_lingbot_world.nodes.fast_dit_loader import LingBotWorldFastDiTLoader  # noqa: E402
from comfyui_lingbot_world.nodes.host.fast_model import FastDiT  # noqa: E402
from comfyui_lingbot_world.tools.synthetic.dit import write_synthetic_bf16_expert  # noqa: E402
from comfyui_lingbot_world.wan.config import TINY  # noqa: E402

clean_comfy_state = pytest.fixture(autouse=True)(comfy_state_reset)


def test_the_fast_folder_is_listed_first_and_is_the_default(fast_installed):
    spec = LingBotWorldFastDiTLoader.INPUT_TYPES()["required"]
    listed = options(spec["fast_model"])
    assert listed[:2] == [FAST, FAST_NF4] and {HIGH, LOW} <= set(listed)
    assert spec["fast_model"][1]["default"] == FAST
    assert LingBotWorldFastDiTLoader.validate_inputs(fast_model=FAST) is True
    assert LingBotWorldFastDiTLoader.validate_inputs(fast_model="lingbot/none").startswith("fast_model:")


def test_the_loader_loads_nothing_and_says_what_the_files_are(fast_installed):
    for folder, quantize, how in ((FAST, "nf4", "bf16 folders quantized to NF4 while loading"),
                                  (FAST_NF4, "none", "loaded as stored")):
        fast, info = load_fast(folder, quantize, 0)
        assert isinstance(fast, FastDiT) and fast.identity.kind == "fast" and fast.config == TINY
        assert fast.patcher.expert is None and fast.patcher.model_size() > 0 and fast.get_ram_usage() == 0
        assert fast.patcher.model.options.quantize == (None if quantize == "none" else "nf4")
        assert info.startswith(f"{folder.rsplit('/', 1)[1]}: LingBot-World Fast (config.json: _class_name "
                               "'WanModelFast', has local_attn_size and sink_size)")
        assert info.endswith(f"{how}; runs on the CPU, every block in RAM")  # this host has no GPU
    swapped, info = load_fast(FAST, "none", 1)
    assert swapped.patcher.model.options.blocks_on_gpu == 1
    assert info.endswith("runs on the CPU, every block in RAM, block_swap 1 ignored (it needs a GPU)")
    for bad in (-1, 41, 2.0):
        with pytest.raises(ValueError, match="block_swap"):
            load_fast(FAST, "none", bad)
    with pytest.raises(ValueError, match="bf16_quantize: 'int4' is not one of none, nf4"):
        load_fast(FAST, "int4")
    with pytest.raises(ValueError, match="fast_model: folder 'lingbot/fast/missing' not found"):
        load_fast("lingbot/fast/missing")
    with pytest.raises(CheckpointError, match="not an expert folder"):
        load_fast(f"{PKG}/tokenizer")


def test_model_info_says_where_the_blocks_are_on_a_gpu(fast_installed, monkeypatch):
    import comfy.model_management as mm

    monkeypatch.setattr(mm, "get_torch_device", lambda: torch.device("cuda", 0))
    assert load_fast(FAST_NF4, "none", 0)[1].endswith("loaded as stored; every block on the GPU")
    assert load_fast(FAST_NF4, "none", 1)[1].endswith("loaded as stored; 1 blocks on the GPU")


def test_a_base_expert_given_to_the_fast_loader_is_refused_by_its_files(fast_installed):
    for expert in (HIGH, LOW):
        with pytest.raises(CheckpointError, match=r"fast_model: holds a LingBot-World Base expert, not LingBot-World "
                           r"Fast \(config.json: _class_name 'WanModel', no local_attn_size or sink_size\); load "
                           r"this folder with the LingBot-World NF4 DiT Loader"):
            load_fast(expert)


def test_where_the_files_cannot_tell_it_loads_as_fast_and_says_so(fast_installed, caplog):
    mystery = fast_installed["lingbot"] / "mystery"
    write_synthetic_bf16_expert(mystery, TINY, seed=9)
    config = mystery / "config.json"
    config.write_text(config.read_text().replace('"_class_name": "WanModel",', ""))
    with caplog.at_level("WARNING"):
        fast, info = load_fast("lingbot/mystery")
    assert fast.identity.kind == "unknown"
    said = (f"fast_model: the files of {mystery} do not say which model they hold (config.json: no _class_name, "
            "local_attn_size or sink_size; the folder name 'mystery' says nothing either); loading them as "
            "LingBot-World Fast")
    assert info.startswith(said) and said in caplog.text
