"""nodes/dit_loader.py: LingBot-World NF4 DiT Loader (also bf16) inside the ComfyUI host (CPU):
nothing loads, folders and geometries are checked, block swap and devices options, and
the DiT handle frees everything when dropped; Base-Cam or Act from the weights."""
from __future__ import annotations

import dataclasses
import gc
import weakref

import pytest
import torch

from comfy_host import comfy_state_reset, use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
import comfy.model_management as mm  # noqa: E402

from node_runs import ACT_PKG, PKG, encode_prompt, encode_start, load_dit, options, run_sampler  # noqa: E402
from comfyui_lingbot_world.loaders.errors import CheckpointError  # noqa: E402
from comfyui_lingbot_world.nodes.dit_loader import LingBotWorldDiTLoader  # noqa: E402
from comfyui_lingbot_world.nodes.host.expert_patcher import DiTExperts  # noqa: E402
from comfyui_lingbot_world.tools.synthetic.dit import write_synthetic_nf4_expert  # noqa: E402
from comfyui_lingbot_world.wan.config import TINY, TINY_ACT  # noqa: E402


clean_comfy_state = pytest.fixture(autouse=True)(comfy_state_reset)


def test_dit_loader_loads_nothing_and_checks_folders(installed):
    dit = load_dit()
    assert isinstance(dit, DiTExperts)
    for patcher in (dit.high, dit.low):
        assert patcher.expert is None and patcher.loaded_size() == 0 and patcher.model_size() > 0
    assert dit.get_ram_usage() == 0
    with pytest.raises(CheckpointError, match="not an expert folder"):
        LingBotWorldDiTLoader.execute(f"{PKG}/tokenizer", f"{PKG}/low_noise_model_bnb_nf4", "none")
    with pytest.raises(ValueError, match="low_noise: folder"):
        LingBotWorldDiTLoader.execute(f"{PKG}/high_noise_model_bnb_nf4", f"{PKG}/missing", "none")


def test_dit_loader_block_swap_input(installed):
    spec = LingBotWorldDiTLoader.INPUT_TYPES()["required"]["block_swap"]
    assert spec[0] == "INT" and (spec[1]["default"], spec[1]["min"], spec[1]["max"]) == (0, 0, 40)
    high, low = f"{PKG}/high_noise_model_bnb_nf4", f"{PKG}/low_noise_model_bnb_nf4"
    swapped = LingBotWorldDiTLoader.execute(high, low, "none", 1)[0]
    assert swapped.high.model.options.blocks_on_gpu == 1 and swapped.low.model.options.blocks_on_gpu == 1
    assert LingBotWorldDiTLoader.execute(high, low, "none", 0)[0].high.model.options.blocks_on_gpu is None  # 0 = off
    for bad in (-1, 41, 2.0):
        with pytest.raises(ValueError, match="block_swap"):
            LingBotWorldDiTLoader.execute(high, low, "none", bad)
    # A CPU host ignores block swap: same sizes, and sampling gives the same latent.
    plain = load_dit()
    assert swapped.high.model_size() == plain.high.model_size()
    text, i2v = encode_prompt(), encode_start()
    assert torch.equal(run_sampler(swapped, text, i2v, steps=2)["samples"], run_sampler(plain, text, i2v, steps=2)["samples"])


def test_dit_loader_devices_option(installed, monkeypatch):
    spec = LingBotWorldDiTLoader.INPUT_TYPES()["optional"]["devices"]
    # sequence_parallel and auto after the placements: saved workflows keep their values
    assert options(spec) == ["single", "expert_per_gpu", "cfg_split", "sequence_parallel", "auto"]
    assert spec[1]["default"] == "single"
    high, low = f"{PKG}/high_noise_model_bnb_nf4", f"{PKG}/low_noise_model_bnb_nf4"
    plain = LingBotWorldDiTLoader.execute(high, low, "none", 0, "single")[0]
    assert plain.placement is None and plain.copies == {}  # today's value, unchanged
    with pytest.raises(ValueError, match="devices=cfg_split needs 2 CUDA GPUs.*computes on cpu"):
        LingBotWorldDiTLoader.execute(high, low, "none", 0, "cfg_split")
    with pytest.raises(ValueError, match="devices: 'many' is not one of"):
        LingBotWorldDiTLoader.execute(high, low, "none", 0, "many")
    # A host with one GPU, then with two (sizes only: nothing is loaded by the loader).
    monkeypatch.setattr(mm, "get_torch_device", lambda: torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"devices=expert_per_gpu needs 2 CUDA GPUs, but torch.cuda.device_count\(\) is 1"):
        LingBotWorldDiTLoader.execute(high, low, "none", 0, "expert_per_gpu")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    split = LingBotWorldDiTLoader.execute(high, low, "none", 0, "expert_per_gpu")[0]
    assert split.high.load_device == torch.device("cuda", 0) and split.low.load_device == torch.device("cuda", 1)
    assert split.placement.mode == "expert_per_gpu" and split.get_ram_usage() == 0


def test_dit_loader_sequence_parallel_and_auto(installed, monkeypatch, caplog):
    from comfyui_lingbot_world.nodes.host import gpus

    tooltip = LingBotWorldDiTLoader.INPUT_TYPES()["optional"]["devices"][1]["tooltip"]
    assert "sequence_parallel:" in tooltip and "auto: one GPU: single" in tooltip and "40 GB/s" in tooltip
    high, low = f"{PKG}/high_noise_model_bnb_nf4", f"{PKG}/low_noise_model_bnb_nf4"
    # A CPU host: sequence_parallel is a clear error before anything starts; auto runs on one device.
    with pytest.raises(ValueError, match="devices=sequence_parallel needs 2 or more CUDA GPUs.*choose devices=single"):
        LingBotWorldDiTLoader.execute(high, low, "none", 0, "sequence_parallel")
    alone = LingBotWorldDiTLoader.execute(high, low, "none", 0, "auto")[0]
    assert alone.parallel is None and alone.placement is None
    monkeypatch.setattr(mm, "get_torch_device", lambda: torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    sp = LingBotWorldDiTLoader.execute(high, low, "none", 0, "sequence_parallel")[0]
    assert sp.parallel is not None and sp.parallel.devices == [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert sp.placement is None and sp.high is sp.parallel.rank0["high"]
    measured = []

    def link(gpus, gbps):
        measured.append(list(gpus))
        return {"gbps": gbps}

    caplog.set_level("INFO")
    monkeypatch.setattr(gpus, "measured_link", lambda group: link(group, 81.6))  # 4 H200s over NVLink
    nvlink = LingBotWorldDiTLoader.execute(high, low, "none", 0, "auto")[0]
    assert nvlink.parallel is not None and nvlink.placement is None
    assert "devices auto -> sequence_parallel (all-to-all 81.6 GB/s between cuda:0, cuda:1)" in caplog.text
    monkeypatch.setattr(gpus, "measured_link", lambda group: link(group, 12.0))  # peer-to-peer off
    pcie = LingBotWorldDiTLoader.execute(high, low, "none", 0, "auto")[0]
    assert pcie.parallel is None and pcie.placement.mode == "cfg_split"
    assert "devices auto -> cfg_split (all-to-all 12.0 GB/s between cuda:0, cuda:1, under 40 GB/s)" in caplog.text
    assert measured == [[torch.device("cuda", 0), torch.device("cuda", 1)]] * 2


def test_dit_handle_dropped_with_the_cache_frees_everything(installed):
    dit = load_dit()
    mm.load_models_gpu([dit.high], force_full_load=True)
    assert dit.get_ram_usage() == dit.high.model_size()  # resident in RAM on a CPU host
    ref = weakref.ref(next(dit.high.expert.parameters()))
    del dit
    gc.collect()
    mm.cleanup_models_gc()
    assert ref() is None
    assert all(m is not None for m in mm.loaded_models())


def test_experts_of_different_shapes_are_refused_naming_the_folders(installed):
    """Both experts must come from one model: a low-noise expert of another geometry (here 3
    blocks instead of 2) fails in the loader, before anything is loaded."""
    other = installed["lingbot"] / "other" / "low_noise_model_bnb_nf4"
    write_synthetic_nf4_expert(other, dataclasses.replace(TINY, num_layers=3), seed=5)
    refusal = r"low_noise_model_bnb_nf4: low_noise has another geometry than high_noise .*num_layers=3.* both experts"
    with pytest.raises(CheckpointError, match=refusal):
        LingBotWorldDiTLoader.execute(f"{PKG}/high_noise_model_bnb_nf4", "lingbot/other/low_noise_model_bnb_nf4",
                                      "none")
    assert LingBotWorldDiTLoader.execute(f"{PKG}/high_noise_model_bnb_nf4", f"{PKG}/low_noise_model_bnb_nf4",
                                         "none")[0].config == TINY  # the package's own pair loads


def test_a_fast_transformer_given_to_the_base_loader_is_refused_by_its_files(fast_installed, tmp_path, caplog):
    """The Fast transformer has an expert's shapes: its config.json says what it is."""
    high, low = f"{PKG}/high_noise_model_bnb_nf4", f"{PKG}/low_noise_model_bnb_nf4"
    for fast in ("lingbot/fast/lingbot_world_fast", "lingbot/fast/lingbot_world_fast_bnb_nf4"):
        with pytest.raises(CheckpointError, match=r"high_noise: holds LingBot-World Fast, not a LingBot-World Base "
                           r"expert \(config.json: _class_name 'WanModelFast', has local_attn_size and sink_size\); "
                           r"load this folder with the LingBot-World Fast DiT Loader"):
            LingBotWorldDiTLoader.execute(fast, low, "none")
    with pytest.raises(CheckpointError, match="low_noise: holds LingBot-World Fast"):
        LingBotWorldDiTLoader.execute(high, "lingbot/fast/lingbot_world_fast", "none")
    # Files that cannot tell (no class name, a neutral folder name): loaded as Base, and said so.
    neutral = fast_installed["lingbot"] / "neutral"
    write_synthetic_nf4_expert(neutral, TINY, seed=5)
    config = neutral / "config.json"
    config.write_text(config.read_text().replace('"_class_name": "WanModel",', ""))
    with caplog.at_level("WARNING"):
        dit = LingBotWorldDiTLoader.execute("lingbot/neutral", low, "none")[0]
    assert isinstance(dit, DiTExperts)
    assert "high_noise: the files of" in caplog.text and "loading them as a LingBot-World Base expert" in caplog.text


def test_the_dit_carries_the_control_type_of_its_weights(installed_act):
    """Base-Cam or Act travels with LINGBOT_DIT (told by the control weight's shape, read from
    the headers; nothing loads); experts of the two checkpoints are refused naming both."""
    base, act = load_dit(), load_dit(ACT_PKG)
    assert (base.config.control_type, act.config.control_type) == ("cam", "act")
    assert act.config == TINY_ACT and act.high.expert is None and act.low.expert is None
    assert "act/high_noise_model_bnb_nf4" in act.label
    refusal = (r"low_noise_model_bnb_nf4: low_noise is an Act expert .* but high_noise .*pkg.* is a Base-Cam expert"
               r".*both experts must come from the same model")
    with pytest.raises(CheckpointError, match=refusal):
        LingBotWorldDiTLoader.execute(f"{PKG}/high_noise_model_bnb_nf4", f"{ACT_PKG}/low_noise_model_bnb_nf4", "none")
