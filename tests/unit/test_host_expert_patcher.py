"""nodes/host/expert_patcher.py under the real ComfyUI model manager (CPU): an expert loads
from disk and is dropped on unload; with a multi-GPU placement, one patcher per copy (every
slot maps to the CPU here; the patchers, their registration with ComfyUI and what is
unloaded when are the same as on two GPUs)."""
from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch

from comfy_host import use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
import comfy.model_management as mm  # noqa: E402
from comfy.model_patcher import ModelPatcher  # noqa: E402

from comfyui_lingbot_world.loaders.layout import read_config  # noqa: E402
from comfyui_lingbot_world.nodes.host import expert_patcher as patcher_mod  # noqa: E402
from comfyui_lingbot_world.nodes.host.expert_patcher import (  # noqa: E402
    ComfyExpertSource,
    DiTExperts,
    ExpertLoadOptions,
    ExpertPatcher,
    experts_for_placement,
)
from comfyui_lingbot_world.pipeline.image import I2VCondition  # noqa: E402
from comfyui_lingbot_world.pipeline.placement import placement_on  # noqa: E402
from comfyui_lingbot_world.pipeline.sampling import SamplingParams, sample  # noqa: E402
from comfyui_lingbot_world.pipeline.text import TextEmbeddings  # noqa: E402
from comfyui_lingbot_world.wan.model import LingBotDiT  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture
def folders(package) -> dict[str, Path]:
    return {"high": package / "high_noise_model_bnb_nf4", "low": package / "low_noise_model_bnb_nf4"}


@pytest.fixture
def patcher(folders) -> ExpertPatcher:
    return ExpertPatcher.for_folder("high", folders["high"], ExpertLoadOptions(), load_device=CPU)


@pytest.fixture(autouse=True)
def unload_everything():
    yield
    mm.unload_all_models()
    gc.collect()


def _resident(p: ExpertPatcher) -> bool:
    return any(m is p for m in mm.loaded_models())


def _weight_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.suffix in (".safetensors", ".pt"))


def test_size_is_known_before_anything_loads(patcher, folders):
    assert patcher.model_size() == _weight_bytes(folders["high"]) > 0
    assert patcher.loaded_size() == 0
    assert patcher.expert is None and not patcher.is_resident()
    assert patcher.current_loaded_device() == CPU
    assert patcher.model.state_dict() == {}  # ComfyUI's walks over the model never see weights
    assert patcher.get_ram_usage() == 0


def test_load_models_gpu_loads_the_real_expert(patcher):
    mm.load_models_gpu([patcher], force_full_load=True)
    expert = patcher.expert
    assert isinstance(expert, LingBotDiT)
    assert not any(t.is_meta for t in expert.state_dict().values())
    assert all(t.device == CPU for t in expert.state_dict().values())
    assert patcher.loaded_size() == patcher.model_size()
    assert _resident(patcher)
    assert patcher.get_ram_usage() == patcher.model_size()  # resident in RAM on a CPU host
    assert patcher.model.state_dict() == {}  # still hidden from module walks
    mm.load_models_gpu([patcher], force_full_load=True)
    assert patcher.expert is expert  # already loaded: not read again


def test_unload_all_models_drops_the_expert_and_reload_works(patcher):
    mm.load_models_gpu([patcher], force_full_load=True)
    weight = weakref.ref(next(patcher.expert.parameters()))
    module = weakref.ref(patcher.expert)
    mm.unload_all_models()  # what POST /free {"unload_models": true} runs
    gc.collect()
    assert patcher.expert is None and patcher.loaded_size() == 0
    assert not _resident(patcher)
    assert weight() is None and module() is None  # freed, not offloaded
    mm.load_models_gpu([patcher], force_full_load=True)
    assert isinstance(patcher.expert, LingBotDiT) and patcher.loaded_size() == patcher.model_size()


def test_eviction_under_memory_pressure_drops_the_expert(patcher):
    mm.load_models_gpu([patcher], force_full_load=True)
    weight = weakref.ref(next(patcher.expert.parameters()))
    unloaded = mm.free_memory(1e30, CPU)  # more than any machine has: evict everything
    gc.collect()
    assert [m.model for m in unloaded] == [patcher]
    assert patcher.expert is None and weight() is None


def test_a_partial_unload_request_unloads_fully(patcher):
    mm.load_models_gpu([patcher], force_full_load=True)
    loaded = next(m for m in mm.current_loaded_models if m.model is patcher)
    assert loaded.model_unload(memory_to_free=1) is True  # nothing can go in part: all goes
    mm.current_loaded_models.remove(loaded)  # as free_memory does after a full unload
    assert patcher.expert is None and patcher.loaded_size() == 0


def test_unpatch_model_drops_instead_of_moving_to_ram(patcher):
    mm.load_models_gpu([patcher], force_full_load=True)
    weight = weakref.ref(next(patcher.expert.parameters()))
    patcher.unpatch_model(CPU, unpatch_weights=True)
    gc.collect()
    assert patcher.expert is None and weight() is None and patcher.loaded_size() == 0


def test_detach_keeping_weights_keeps_the_expert(patcher):
    # load_models_gpu detaches a model it is about to use again this way: no reload.
    mm.load_models_gpu([patcher], force_full_load=True)
    expert = patcher.expert
    patcher.detach(unpatch_all=False)
    assert patcher.expert is expert
    patcher.detach(unpatch_all=True)
    assert patcher.expert is None


def test_garbage_collected_patcher_frees_its_expert(folders):
    patcher = ExpertPatcher.for_folder("high", folders["high"], load_device=CPU)  # no fixture keeps it
    mm.load_models_gpu([patcher], force_full_load=True)
    weight = weakref.ref(next(patcher.expert.parameters()))
    del patcher
    gc.collect()
    mm.cleanup_models_gc()
    assert weight() is None
    assert all(m is not None for m in mm.loaded_models())  # ComfyUI dropped its dead entry


def test_clone_shares_the_expert_slot(patcher):
    twin = patcher.clone()
    assert isinstance(twin, ExpertPatcher) and twin.is_clone(patcher)
    mm.load_models_gpu([twin], force_full_load=True)
    assert patcher.expert is twin.expert is not None


def test_expert_source_keeps_one_expert_resident(folders):
    experts = DiTExperts(
        high=ExpertPatcher.for_folder("high", folders["high"], load_device=CPU),
        low=ExpertPatcher.for_folder("low", folders["low"], load_device=CPU),
        config=read_config(folders["high"]),
    )
    source = ComfyExpertSource(experts)
    high = source.acquire("high")
    assert high is experts.high.expert and experts.low.expert is None
    high_weight = weakref.ref(next(high.parameters()))
    del high
    low = source.acquire("low")  # the high expert goes first
    gc.collect()
    assert low is experts.low.expert and experts.high.expert is None and high_weight() is None
    assert _resident(experts.low) and not _resident(experts.high)
    del low
    source.release("low")
    assert experts.low.expert is None and not _resident(experts.low)
    source.close()  # releasing what is not loaded is harmless
    with pytest.raises(ValueError, match="unknown expert 'mid'"):
        source.acquire("mid")


def test_inference_memory_scales_with_tokens(patcher):
    assert patcher.inference_memory(2000, 5120) == 2 * patcher.inference_memory(1000, 5120) > 0


def test_block_swap_sizes_for_a_cuda_load(folders):
    """With block swap on a CUDA device ComfyUI plans VRAM with the resident part only; the
    swapped weights count as RAM while the expert is loaded. Nothing is loaded here."""
    from comfyui_lingbot_world.loaders.expert_size import expert_host_bytes

    cuda = torch.device("cuda")
    full = ExpertPatcher.for_folder("high", folders["high"], ExpertLoadOptions(), load_device=cuda)
    swapped = ExpertPatcher.for_folder("high", folders["high"], ExpertLoadOptions(blocks_on_gpu=1), load_device=cuda)
    host = expert_host_bytes(folders["high"], None, 1)
    assert 0 < host < full.model_size()
    assert swapped.model_size() == full.model_size() - host and swapped.model.host_bytes == host
    assert swapped.get_ram_usage() == 0  # nothing loaded yet
    swapped.model.put(torch.nn.Linear(1, 1))  # stands in for a loaded expert on the GPU
    swapped.model.device = cuda
    assert swapped.get_ram_usage() == host
    # The loaders ignore block swap off CUDA, so on a CPU device the sizes do not change.
    on_cpu = ExpertPatcher.for_folder("high", folders["high"], ExpertLoadOptions(blocks_on_gpu=1), load_device=CPU)
    assert on_cpu.model_size() == full.model_size() and on_cpu.model.host_bytes == 0


# --------------------------------------------------------------------------- multi-GPU placements


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


# --------------------------------------------------------------------------- POST /free on every GPU

# A second device that ComfyUI's unload_all_models() never frees, as cuda:1 on hosts before 0.28 (they free
# only the GPU ComfyUI computes on); on the CPU host both 0.3.75 and 0.28.0 free the CPU alone. Tensors
# "on" cpu:1 live on the CPU; safetensors refuses the name, so the expert is read to "cpu" (``other_gpu``).
OTHER = torch.device("cpu", 1)


@pytest.fixture
def other_gpu(monkeypatch, loads):
    counting_load = patcher_mod.load_expert

    def load(folder, device, quantize=None, blocks_on_gpu=None):
        return counting_load(folder, CPU if device == OTHER else device, quantize, blocks_on_gpu=blocks_on_gpu)

    monkeypatch.setattr(patcher_mod, "load_expert", load)
    yield OTHER
    mm.free_memory(1e30, OTHER)  # what a failed test left there (the autouse fixture frees the CPU)


class Bystander(ModelPatcher):
    """Another model in ComfyUI's list (a small Linear) that counts how often ComfyUI detaches it."""

    def __init__(self, device: torch.device) -> None:
        super().__init__(torch.nn.Linear(4, 4), device, CPU)
        self.detached: list[bool] = []

    def detach(self, unpatch_all=True):
        self.detached.append(unpatch_all)
        return super().detach(unpatch_all)


def _registered(p) -> bool:
    return any(m.model is p for m in mm.current_loaded_models)


def test_the_unload_hook_wraps_the_hosts_function_once():
    """Importing the pack again (another custom-node scan, a test) wraps ``unload_all_models``
    no second time: one unload of the pack's models per ``POST /free``."""
    from comfyui_lingbot_world.nodes.host.unload_all import install_unload_hook

    hooked = mm.unload_all_models
    install_unload_hook()
    install_unload_hook()
    assert mm.unload_all_models is hooked and getattr(hooked, "__wrapped__", None) is not None


@pytest.mark.parametrize("mode", ["expert_per_gpu", "cfg_split"])
def test_free_unloads_every_copy_on_every_gpu(folders, loads, other_gpu, mode):
    """``POST /free`` / Unload Models (``unload_all_models``) leave no copy of either expert on
    either GPU, also where the host frees its own GPU alone; other packs' models on the other
    GPU stay the host's to decide; the next run loads again and gives the same latent."""
    dit = experts_for_placement(folders, ExpertLoadOptions(), read_config(folders["high"]),
                                placement_on(mode, (CPU, OTHER)))
    first, elsewhere = Bystander(CPU), Bystander(OTHER)
    mm.load_models_gpu([first, elsewhere])
    text, condition = _inputs()
    source = ComfyExpertSource(dit)
    want = sample(source, text, condition, None, PARAMS)
    source.close()
    mm.load_models_gpu(dit.all_patchers(), force_full_load=True)  # every copy held by ComfyUI
    assert all(_loaded(dit).values()) and {p.current_loaded_device() for p in dit.copies.values()} == {CPU, OTHER}
    weights = [weakref.ref(next(p.expert.parameters())) for p in dit.copies.values()]

    mm.unload_all_models()  # what POST /free {"unload_models": true} and Unload Models run
    gc.collect()
    assert not any(_loaded(dit).values()) and all(w() is None for w in weights)  # dropped, not kept anywhere
    assert not any(_registered(p) for p in dit.copies.values()) and not _registered(first)
    assert first.detached == [True]
    assert _registered(elsewhere) and elsewhere.detached == []  # not the pack's: the host's own rule

    again = ComfyExpertSource(dit)
    assert torch.equal(sample(again, text, condition, None, PARAMS), want)
    again.abort()


def test_expert_per_gpu_keeps_the_second_gpus_expert_when_comfyui_makes_room_on_its_own(folders, loads, other_gpu):
    """ComfyUI freeing its own GPU for another model drops the high-noise expert only: the
    low-noise one on the other GPU is in nobody's way, and the next run loads the high-noise one alone."""
    dit = experts_for_placement(folders, ExpertLoadOptions(), read_config(folders["high"]),
                                placement_on("expert_per_gpu", (CPU, OTHER)))
    text, condition = _inputs()
    source = ComfyExpertSource(dit)
    want = sample(source, text, condition, None, PARAMS)
    source.close()
    assert _loaded(dit) == {("high", 0): True, ("low", 1): True} and dit.low.current_loaded_device() == OTHER
    mm.free_memory(1e30, CPU)  # ComfyUI evicting everything from the device it computes on
    assert _loaded(dit) == {("high", 0): False, ("low", 1): True}
    again = ComfyExpertSource(dit)
    assert torch.equal(sample(again, text, condition, None, PARAMS), want)
    again.close()
    assert loads == ["high", "low", "high"]
    mm.unload_all_models()
    assert not any(_loaded(dit).values()) and not _registered(dit.low)


def test_a_run_of_the_low_noise_expert_alone_keeps_it_and_free_reaches_it(folders, other_gpu):
    """boundary 1: every step on the low-noise expert, nothing on ComfyUI's GPU; the run keeps
    it on the other GPU for the next run, and POST /free unloads it there."""
    dit = experts_for_placement(folders, ExpertLoadOptions(), read_config(folders["high"]),
                                placement_on("expert_per_gpu", (CPU, OTHER)))
    text, condition = _inputs()
    source = ComfyExpertSource(dit)
    sample(source, text, condition, None, SamplingParams(steps=4, shift=5.0, seed=3, boundary=1.0))
    source.close()
    assert not dit.high.is_resident() and dit.low.is_resident() and _registered(dit.low)
    mm.unload_all_models()
    assert not dit.low.is_resident() and not _registered(dit.low)
