"""Multi-GPU placement on the CPU: the table of ``devices`` modes and ``auto``'s one rule, the
plan, the CFG split's math, and what is freed.

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
    AUTO_SITUATIONS,
    BASE,
    DEVICES_MODES,
    FAST,
    MODELS,
    PLACEMENTS,
    Degrees,
    Placement,
    auto_mode,
    cuda_placement,
    decide_devices,
    devices_choices,
    modes_table,
    placement_on,
    sequence_parallel_size,
    single,
    split_degrees,
)
from comfyui_lingbot_world.pipeline.sampling import SamplingParams, sample
from comfyui_lingbot_world.pipeline.step_cache import StepStats
from comfyui_lingbot_world.pipeline.text import TextEmbeddings

CPU = torch.device("cpu")
TWO = (CPU, CPU)


# --------------------------------------------------------------------------- the modes and auto's rule

def _gpus(count: int) -> list[torch.device]:
    return [torch.device("cuda", i) for i in range(count)]


def test_the_loaders_combos_come_from_the_table_in_their_saved_order():
    # saved workflows store the values; the table's order keeps each loader's combo as shipped
    assert devices_choices(BASE) == ("single", "expert_per_gpu", "cfg_split", "sequence_parallel", "auto")
    assert devices_choices(FAST) == ("single", "sequence_parallel", "decode_on_second_gpu", "auto")
    assert PLACEMENTS == ("single", "expert_per_gpu", "cfg_split")
    for model in MODELS:  # auto has exactly one row for each situation (auto_mode refuses otherwise), offered there
        picks = [auto_mode(model, situation).name for situation in AUTO_SITUATIONS]
        assert picks[0] == "single" and all(model in DEVICES_MODES[name].models for name in picks)


@pytest.mark.parametrize("gbps, base, fast", [
    (119.9, "sequence_parallel", "sequence_parallel"),  # 2 H200 ranks over NVLink (docs/multi_gpu.md)
    (81.6, "sequence_parallel", "sequence_parallel"),  # 4 H200 ranks over NVLink
    (12.5, "cfg_split", "decode_on_second_gpu"),  # the same exchange with NCCL_P2P_DISABLE=1
    (9.0, "cfg_split", "decode_on_second_gpu"),
])
def test_auto_measures_the_link_of_the_ulysses_group_and_picks_by_the_table(gbps, base, fast):
    for model, want in ((BASE, base), (FAST, fast)):
        for count in (2, 3, 4, 8):
            measured = []
            decision = decide_devices("auto", model, _gpus(count), 40, f"{count} GPUs",
                                      lambda group: measured.append(group) or gbps)
            size = sequence_parallel_size(40, count)
            assert measured == [tuple(_gpus(size))] and decision.gbps == gbps
            assert decision.mode.name == want
            assert decision.devices == tuple(_gpus(size if want == "sequence_parallel" else 2))
            assert decision.said.startswith(f"auto -> {want} (all-to-all {gbps:.1f} GB/s between cuda:0, cuda:1")


@pytest.mark.parametrize("model", MODELS)
def test_auto_with_fewer_than_two_gpus_runs_single_without_measuring(model):
    for gpus, host in (([], "ComfyUI computes on cpu, torch.cuda.device_count() is 0"),
                       (_gpus(1), "torch.cuda.device_count() is 1")):
        decision = decide_devices("auto", model, gpus, 40, host, lambda group: pytest.fail("measured"))
        assert decision.mode.name == "single" and decision.devices == tuple(gpus) and decision.gbps is None
        assert decision.said == f"auto -> single ({host})"


def test_auto_without_a_group_that_divides_the_heads_takes_the_slow_link_row():
    for model, want in ((BASE, "cfg_split"), (FAST, "decode_on_second_gpu")):
        decision = decide_devices("auto", model, _gpus(2), 3, "2 GPUs", lambda group: pytest.fail("measured"))
        assert decision.mode.name == want and decision.devices == tuple(_gpus(2))
        assert "no group of 2 or more GPUs divides the model's 3 heads" in decision.said


def test_a_mode_by_name_runs_on_its_gpus_or_is_refused():
    assert decide_devices("sequence_parallel", BASE, _gpus(6), 40, "", float).devices == tuple(_gpus(5))
    assert decide_devices("cfg_split", BASE, _gpus(4), 40, "", float).devices == tuple(_gpus(2))
    assert decide_devices("decode_on_second_gpu", FAST, _gpus(4), 40, "", float).devices == tuple(_gpus(2))
    assert decide_devices("single", FAST, [], 40, "", float).devices == ()
    with pytest.raises(ValueError, match=r"devices=sequence_parallel needs 2 or more CUDA GPUs, but one GPU; "
                                         "choose devices=single"):
        decide_devices("sequence_parallel", FAST, _gpus(1), 40, "one GPU", float)
    with pytest.raises(ValueError, match="devices=decode_on_second_gpu needs 2 CUDA GPUs, but one GPU"):
        decide_devices("decode_on_second_gpu", FAST, _gpus(1), 40, "one GPU", float)
    with pytest.raises(ValueError, match="devices=sequence_parallel needs 2 or more GPUs whose count divides the "
                                         "model's 3 heads"):
        decide_devices("sequence_parallel", BASE, _gpus(2), 3, "2 GPUs", float)
    with pytest.raises(ValueError, match="devices: 'cfg_split' is not one of single, sequence_parallel, "
                                         "decode_on_second_gpu, auto"):
        decide_devices("cfg_split", FAST, _gpus(2), 40, "", float)


def test_ulysses_group_sizes_and_the_cfg_degrees():
    assert [sequence_parallel_size(40, n) for n in (1, 2, 3, 4, 6, 8)] == [0, 2, 2, 4, 5, 8]
    assert [(d.cfg, d.ulysses) for d in map(split_degrees, (2, 3, 4, 5, 8))] == [(1, 2), (1, 3), (2, 2), (1, 5),
                                                                                  (2, 4)]
    assert all(split_degrees(world).world == world for world in range(2, 9))
    with pytest.raises(ValueError, match="needs a head count divisible by 4; the model has 6 heads"):
        Degrees(ulysses=4).check_heads(6)
    with pytest.raises(ValueError, match="cfg 3"):
        Degrees(ulysses=2, cfg=3)


def test_the_multi_gpu_doc_shows_the_table():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "multi_gpu.md").read_text(encoding="utf-8")
    assert modes_table() in doc, "docs/multi_gpu.md: paste pipeline.placement.modes_table() under 'The devices modes'"
    assert all(f"`{name}`" in modes_table() for name in DEVICES_MODES)


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
