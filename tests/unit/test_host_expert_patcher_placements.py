"""Multi-GPU placements under the real ComfyUI model manager (CPU): one patcher per copy.

Every slot maps to the CPU here; the patchers, their registration with ComfyUI and what is
unloaded when are the same as on two GPUs.
"""
from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

from comfy_host import use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
import comfy.model_management as mm  # noqa: E402

from comfyui_lingbot_world.loaders.layout import read_config  # noqa: E402
from comfyui_lingbot_world.nodes.host import expert_patcher as patcher_mod  # noqa: E402
from comfyui_lingbot_world.nodes.host.expert_patcher import (  # noqa: E402
    ComfyExpertSource,
    ExpertLoadOptions,
    experts_for_placement,
)
from comfyui_lingbot_world.pipeline.image import I2VCondition  # noqa: E402
from comfyui_lingbot_world.pipeline.placement import placement_on  # noqa: E402
from comfyui_lingbot_world.pipeline.sampling import SamplingParams, sample  # noqa: E402
from comfyui_lingbot_world.pipeline.text import TextEmbeddings  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture
def folders(package) -> dict[str, Path]:
    return {"high": package / "high_noise_model_bnb_nf4", "low": package / "low_noise_model_bnb_nf4"}


@pytest.fixture(autouse=True)
def unload_everything():
    yield
    mm.unload_all_models()
    gc.collect()


@pytest.fixture
def loads(monkeypatch) -> list[str]:
    seen: list[str] = []
    real_load = patcher_mod.load_expert

    def counting_load(folder, device, quantize=None, blocks_on_gpu=None):
        seen.append(Path(folder).name.split("_")[0])
        return real_load(folder, device, quantize, blocks_on_gpu=blocks_on_gpu)

    monkeypatch.setattr(patcher_mod, "load_expert", counting_load)
    return seen


def _dit(folders, mode):
    return experts_for_placement(folders, ExpertLoadOptions(), read_config(folders["high"]),
                                 placement_on(mode, (CPU, CPU)))


def _inputs():
    g = torch.Generator().manual_seed(5)
    text = TextEmbeddings(positive=torch.randn(6, 32, generator=g), negative=torch.randn(5, 32, generator=g),
                          from_cache=False)
    return text, I2VCondition(y=torch.randn(20, 3, 4, 6, generator=g), frames=9, height=32, width=48)


def _loaded(dit) -> dict[tuple[str, int], bool]:
    managed = mm.loaded_models()
    return {key: p.is_resident() and any(m is p for m in managed) for key, p in dit.copies.items()}


PARAMS = SamplingParams(steps=4, shift=5.0, seed=3)


def test_one_patcher_per_copy_on_its_slot_device(folders):
    dit = _dit(folders, "cfg_split")
    assert set(dit.copies) == {("high", 0), ("high", 1), ("low", 0), ("low", 1)}
    assert dit.high is dit.copies[("high", 0)] and dit.low is dit.copies[("low", 0)]
    assert len({id(p) for p in dit.copies.values()}) == 4  # each copy accounted on its own
    assert dit.get_ram_usage() == 0  # nothing loaded yet


def test_cfg_split_loads_both_copies_and_frees_them_at_the_boundary_and_the_end(folders, loads):
    dit = _dit(folders, "cfg_split")
    source = ComfyExpertSource(dit)
    high = source.acquire("high")
    assert source.cfg_split and source.acquire_uncond("high") is dit.copies[("high", 1)].expert is not high
    assert _loaded(dit) == {("high", 0): True, ("high", 1): True, ("low", 0): False, ("low", 1): False}
    del high
    source.acquire("low")  # both high copies go first
    assert _loaded(dit) == {("high", 0): False, ("high", 1): False, ("low", 0): True, ("low", 1): True}
    source.close()
    assert not any(_loaded(dit).values()) and loads == ["high", "high", "low", "low"]


def test_cfg_split_sampling_through_comfy_equals_one_device(folders):
    text, condition = _inputs()
    single = experts_for_placement(folders, ExpertLoadOptions(), read_config(folders["high"]),
                                   placement_on("single", (CPU,)))
    want = sample(ComfyExpertSource(single), text, condition, None, SamplingParams(steps=4, shift=5.0, seed=3,
                                                                                    batch_cfg=False))
    dit = _dit(folders, "cfg_split")
    source = ComfyExpertSource(dit)
    try:
        got = sample(source, text, condition, None, SamplingParams(steps=4, shift=5.0, seed=3, batch_cfg=False))
    finally:
        source.close()
    assert torch.equal(got, want)
    assert not any(_loaded(dit).values())


def test_expert_per_gpu_keeps_both_resident_and_reloads_nothing(folders, loads):
    text, condition = _inputs()
    dit = _dit(folders, "expert_per_gpu")
    source = ComfyExpertSource(dit)
    first = sample(source, text, condition, None, PARAMS)
    source.close()
    assert _loaded(dit) == {("high", 0): True, ("low", 1): True}  # still under ComfyUI's manager
    again = ComfyExpertSource(dit)
    second = sample(again, text, condition, None, PARAMS)
    again.close()
    assert torch.equal(first, second) and loads == ["high", "low"]
    mm.unload_all_models()  # ComfyUI's own "unload models" drops them
    gc.collect()
    assert not any(p.is_resident() for p in dit.copies.values())


@pytest.mark.parametrize("mode", ["expert_per_gpu", "cfg_split"])
def test_interrupt_unloads_every_copy(folders, mode):
    text, condition = _inputs()
    dit = _dit(folders, mode)
    source = ComfyExpertSource(dit)
    steps = []

    def interrupt():
        if len(steps) == 3:
            raise mm.InterruptProcessingException()
        steps.append(1)

    with pytest.raises(mm.InterruptProcessingException):
        sample(source, text, condition, None, PARAMS, check_interrupt=interrupt)
    assert not any(p.is_resident() for p in dit.copies.values())
    assert not any(_loaded(dit).values())
