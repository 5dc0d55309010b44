"""Multi-GPU placement on the CPU: the plan, the CFG split's math, and what is freed.

Two "devices" here are two slots that both map to the CPU: the code path is the one two
GPUs take (two copies of the expert, the unconditional branch from a worker thread, the
result combined on slot 0), only the device behind each slot is the same.
"""
from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from stand_in_dit import TinyDiT
from comfyui_lingbot_world.loaders.package import find_package
from comfyui_lingbot_world.pipeline import experts as experts_mod
from comfyui_lingbot_world.pipeline.camera import camera_condition, path_from_preset
from comfyui_lingbot_world.pipeline.experts import DiskExperts, PlacedDiskExperts
from comfyui_lingbot_world.pipeline.image import I2VCondition
from comfyui_lingbot_world.pipeline.placement import (
    PLACEMENTS,
    Placement,
    cuda_placement,
    placement_on,
    single,
)
from comfyui_lingbot_world.pipeline.sampling import SamplingParams, sample
from comfyui_lingbot_world.pipeline.step_cache import StepStats
from comfyui_lingbot_world.pipeline.text import TextEmbeddings

CPU = torch.device("cpu")
TWO = (CPU, CPU)


# --------------------------------------------------------------------------- the plan

def test_single_is_one_slot_and_frees_at_the_boundary():
    plan = single("cpu")
    assert plan.devices_of("high") == plan.devices_of("low") == (CPU,)
    switch = plan.switch("high", "low")
    assert switch.free == (("high", 0),) and switch.load == (("low", 0),) and switch.keep == ()
    assert (switch.latent_from, switch.latent_to) == (0, 0)
    assert not plan.keep_resident and not plan.cfg_split


def test_expert_per_gpu_frees_nothing_and_moves_the_latent():
    plan = cuda_placement("expert_per_gpu", 2)
    assert plan.devices_of("high") == (torch.device("cuda", 0),)
    assert plan.devices_of("low") == (torch.device("cuda", 1),)
    switch = plan.switch("high", "low")
    assert switch.free == () and switch.keep == (("high", 0),) and switch.load == (("low", 1),)
    assert (switch.latent_from, switch.latent_to) == (0, 1)
    assert plan.keep_resident and not plan.cfg_split


def test_cfg_split_has_both_copies_and_frees_both_at_the_boundary():
    plan = cuda_placement("cfg_split", 4, first=3)  # ComfyUI computes on GPU 3: it is slot 0
    assert plan.devices == (torch.device("cuda", 3), torch.device("cuda", 0))
    switch = plan.switch("high", "low")
    assert switch.free == (("high", 0), ("high", 1)) and switch.keep == ()
    assert switch.load == (("low", 0), ("low", 1))
    assert plan.cfg_split and not plan.keep_resident


@pytest.mark.parametrize("mode", ["expert_per_gpu", "cfg_split"])
def test_too_few_gpus_is_a_clear_error(mode):
    with pytest.raises(ValueError, match=rf"devices={mode} needs 2 CUDA GPUs.*device_count\(\) is 1"):
        cuda_placement(mode, 1)
    with pytest.raises(ValueError, match="needs 2 devices, got 1"):
        Placement(mode, (CPU,))


def test_unknown_option_and_expert_are_refused():
    with pytest.raises(ValueError, match="'three_gpus' is not one of single, expert_per_gpu, cfg_split"):
        cuda_placement("three_gpus", 8)
    with pytest.raises(ValueError, match="unknown expert 'mid'"):
        single("cpu").slots("mid")
    assert PLACEMENTS[0] == "single"  # the loader's default, first in the list


# --------------------------------------------------------------------------- CFG split with stand-in experts

class TinySource:
    """Both experts, and with ``split`` a second copy of each (same weights) for the unconditional branch."""

    def __init__(self, split: bool) -> None:
        self.cfg_split = split
        self.models = {"high": TinyDiT(1), "low": TinyDiT(2)}
        self.copies = {name: TinyDiT(seed) for name, seed in (("high", 1), ("low", 2))} if split else {}
        self.events: list[tuple[str, str]] = []

    def acquire(self, name):
        self.events.append(("acquire", name))
        return self.models[name]

    def acquire_uncond(self, name):
        self.events.append(("acquire_uncond", name))
        return self.copies[name]

    def release(self, name):
        self.events.append(("release", name))

    def abort(self):
        self.events.append(("abort", ""))

    def calls(self) -> int:
        return sum(m.calls for m in [*self.models.values(), *self.copies.values()])


def _inputs():
    g = torch.Generator().manual_seed(5)
    text = TextEmbeddings(positive=torch.randn(6, 32, generator=g), negative=torch.randn(5, 32, generator=g),
                          from_cache=False)
    condition = I2VCondition(y=torch.randn(20, 3, 4, 6, generator=g), frames=9, height=32, width=48)
    return text, condition


PARAMS = SamplingParams(steps=6, shift=5.0, seed=3, boundary=0.9)


@pytest.mark.parametrize("batch_cfg", [False, True])
def test_cfg_split_equals_the_single_device_latent(batch_cfg):
    text, condition = _inputs()
    params = SamplingParams(steps=6, shift=5.0, seed=3, boundary=0.9, batch_cfg=batch_cfg)
    split = TinySource(split=True)
    got = sample(split, text, condition, None, params)
    want = sample(TinySource(split=False), text, condition, None, params)
    if batch_cfg:
        # One batch of two vs two batches of one: the same math, but the batched matmul may sum in
        # another order, so equal to float32 rounding, not bit for bit.
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    else:  # the same two forwards and the same combination on slot 0: bit for bit
        assert torch.equal(got, want)
    copies = split.copies.values()
    # Every unconditional forward ran on the second copy, from the worker thread, with the run's attention choice.
    assert sum(m.calls for m in copies) == 6 and sum(m.calls for m in split.models.values()) == 6
    assert all(name.startswith("lingbot-cfg-split") for m in copies if m.calls for name in m.threads)
    assert all(threading.main_thread().name in m.threads for m in split.models.values() if m.calls)


def test_cfg_split_keeps_the_runs_attention_choice_in_the_worker():
    text, condition = _inputs()
    split = TinySource(split=True)
    sample(split, text, condition, None, SamplingParams(steps=4, shift=5.0, seed=3, attention="sdpa"))
    used = set().union(*(m.attention for m in [*split.models.values(), *split.copies.values()] if m.calls))
    assert used == {"sdpa"}


def test_cfg_split_with_truncation_and_cache_skips_the_second_device():
    text, condition = _inputs()
    params = SamplingParams(steps=12, shift=5.0, seed=3, boundary=0.9, cfg_truncate=0.25, cache_threshold=0.5,
                            cache_warmup=2)
    split, plain = TinySource(split=True), TinySource(split=False)
    stats, plain_stats = StepStats(), StepStats()
    got = sample(split, text, condition, None, params, stats=stats)
    want = sample(plain, text, condition, None, params, stats=plain_stats)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)  # batch_cfg on for the single device
    assert stats.computed_steps == plain_stats.computed_steps and stats.skipped_forwards > 0
    assert stats.truncated_forwards == 3
    uncond_calls = sum(m.calls for m in split.copies.values())
    cond_calls = sum(m.calls for m in split.models.values())
    # The truncated steps and the cached ones run nothing on the second device.
    truncated_computed = sum(1 for i in stats.computed_steps if i >= 9)
    assert cond_calls == len(stats.computed_steps)
    assert uncond_calls == len(stats.computed_steps) - truncated_computed
    assert stats.forwards == split.calls()


def test_cfg_split_guide_one_runs_only_the_first_device():
    text, condition = _inputs()
    split = TinySource(split=True)
    sample(split, text, condition, None, SamplingParams(steps=4, shift=5.0, seed=3, cfg_high=1.0, cfg_low=1.0))
    assert sum(m.calls for m in split.copies.values()) == 0 and sum(m.calls for m in split.models.values()) == 4


def test_an_interrupt_aborts_the_source_and_stops_the_worker():
    text, condition = _inputs()
    split = TinySource(split=True)
    before = {t.name for t in threading.enumerate()}
    done = []

    def interrupt():
        if len(done) == 2:
            raise KeyboardInterrupt("cancel")
        done.append(1)

    with pytest.raises(KeyboardInterrupt):
        sample(split, text, condition, None, PARAMS, check_interrupt=interrupt)
    assert split.events[-2:] == [("release", split.events[-2][1]), ("abort", "")]
    workers = {t.name for t in threading.enumerate()} - before
    assert not any(name.startswith("lingbot-cfg-split") for name in workers)


# --------------------------------------------------------------------------- the real tiny DiT from disk

@pytest.fixture
def files(package):
    return find_package(package)


@pytest.mark.parametrize("batch_cfg", [False, True])
def test_real_dit_cfg_split_with_camera_matches_one_device(files, batch_cfg):
    text, condition = _inputs()
    camera = camera_condition(path_from_preset("dolly_in", 1.0, 9), 9, 32, 48)
    params = SamplingParams(steps=4, shift=5.0, seed=3, batch_cfg=batch_cfg)
    want = sample(DiskExperts(files.high, files.low, "cpu"), text, condition, camera, params)
    source = PlacedDiskExperts(files.high, files.low, placement_on("cfg_split", TWO))
    got = sample(source, text, condition, camera, params)
    if batch_cfg:
        # Batched vs two single forwards: float32 rounding of the reduction order only.
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    else:
        assert torch.equal(got, want)
    assert source.resident() == {}  # both copies freed at the end


def test_real_dit_expert_per_gpu_matches_and_frees_nothing_at_the_boundary(files, monkeypatch):
    text, condition = _inputs()
    loads: list[str] = []
    real_load = experts_mod.load_expert

    def counting_load(folder, device, quantize=None, blocks_on_gpu=None):
        loads.append(Path(folder).name)
        return real_load(folder, device, quantize, blocks_on_gpu)

    monkeypatch.setattr(experts_mod, "load_expert", counting_load)
    params = SamplingParams(steps=4, shift=5.0, seed=3)
    want = sample(DiskExperts(files.high, files.low, "cpu"), text, condition, None, params)
    source = PlacedDiskExperts(files.high, files.low, placement_on("expert_per_gpu", TWO))
    loads.clear()
    assert torch.equal(sample(source, text, condition, None, params), want)
    assert set(source.resident()) == {("high", 0), ("low", 1)}  # both still there: nothing freed
    sample(source, text, condition, None, params)
    assert len(loads) == 2  # the second run reloaded nothing
    source.close()
    assert source.resident() == {}


def test_real_dit_interrupt_frees_every_copy(files, monkeypatch):
    text, condition = _inputs()
    loads: list[str] = []
    real_load = experts_mod.load_expert
    monkeypatch.setattr(experts_mod, "load_expert",
                        lambda folder, *a, **k: loads.append(Path(folder).name) or real_load(folder, *a, **k))
    for mode in ("expert_per_gpu", "cfg_split"):
        loads.clear()
        source = PlacedDiskExperts(files.high, files.low, placement_on(mode, TWO))
        steps = []

        def interrupt():  # also called before every transformer block, so count finished steps
            if len(steps) == 3:  # past the boundary of 4 steps at shift 5: both experts were used
                raise RuntimeError("interrupted")

        with pytest.raises(RuntimeError, match="interrupted"):
            sample(source, text, condition, None, SamplingParams(steps=4, shift=5.0, seed=3),
                   on_step=lambda done, total: steps.append(done), check_interrupt=interrupt)
        assert {name.split("_")[0] for name in loads} == {"high", "low"}, loads  # interrupted after the boundary
        assert source.resident() == {}, mode


def test_acquire_uncond_without_a_second_copy_is_refused(files):
    source = PlacedDiskExperts(files.high, files.low, placement_on("expert_per_gpu", TWO))
    with pytest.raises(ValueError, match="only cfg_split has a second copy"):
        source.acquire_uncond("high")


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.parametrize("mode", ["expert_per_gpu", "cfg_split"])
def test_two_gpus_match_one(files, mode):
    """The real tiny DiT on two GPUs (Triton kernels on the second GPU, the worker thread) vs one."""
    text, condition = _inputs()
    camera = camera_condition(path_from_preset("dolly_in", 1.0, 9), 9, 32, 48)
    params = SamplingParams(steps=4, shift=5.0, seed=3, batch_cfg=False)
    want = sample(DiskExperts(files.high, files.low, "cuda:0"), text, condition, camera, params)
    source = PlacedDiskExperts(files.high, files.low, cuda_placement(mode, torch.cuda.device_count()))
    previews: set[torch.device] = set()
    got = sample(source, text, condition, camera, params, on_preview=lambda d, n, x0: previews.add(x0.device))
    source.close()
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)  # two GPUs of one model: expected equal
    assert previews == {torch.device("cuda", 0)}
    torch.cuda.synchronize(1)
    torch._C._cuda_clearCublasWorkspaces()  # cuBLAS's per-stream workspaces (33 MiB each) are not copies of ours
    assert torch.cuda.memory_allocated(1) == 0
