"""A DiT expert under ComfyUI's memory manager: loaded from disk on demand, dropped on unload.

ComfyUI's ``ModelPatcher`` normally owns a model that lives in RAM and moves it between
devices. An NF4 expert is ~9.6 GB and comes straight from a memory-mapped file, so keeping
an offloaded copy in RAM is the very thing that kills 64 GB machines. ``ExpertPatcher``
keeps ComfyUI's bookkeeping but changes what load and unload mean:

- load (``load_models_gpu``): stream the expert from its folder straight to the device;
- unload (eviction under memory pressure, ``POST /free``, ``release``): drop every tensor;
  the next load reads the file again (from the page cache when RAM allows). Unloading
  always ends in ``unpatch_model(unpatch_weights=True)``, which is where the drop happens.

The patcher's ``model`` is an ``ExpertSlot``: an empty ``nn.Module`` that holds the expert
outside its registered submodules, so ComfyUI code that walks, moves or measures the
patcher's model (``.to()``, ``state_dict()``) never sees or copies the expert's weights.
``model_size()`` is the size of the expert's files, known before anything is loaded.

Only methods that exist on ``ModelPatcher`` in both the test host (0.3.75) and current
ComfyUI are overridden; ``__init__`` keeps ``ModelPatcher``'s signature so that
``clone()`` still works (clones share the slot, as ComfyUI clones share a model).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

import comfy.model_management as mm
from comfy.model_patcher import ModelPatcher

from ...loaders.expert_size import expert_memory
from ...pipeline.experts import AS_STORED, load_expert, weight_kind_for
from ...pipeline.lora import LoraExperts
from ...pipeline.memory import activation_bytes, lora_device_bytes, release_module
from ...pipeline.placement import Placement
from ...pipeline.sampling import ExpertSource
from ...wan.config import DiTConfig

log = logging.getLogger(__name__)

QUANTIZE_CHOICES = ("none", "nf4")


@dataclass(frozen=True)
class ExpertLoadOptions:
    """How an expert is brought into memory."""

    quantize: str | None = None  # "nf4": quantize a bf16 (layout B) expert while loading
    # The weight kind the linears are held in (pipeline.experts.WEIGHT_CHOICES): "as stored"
    # follows ``quantize``; auto / bf16 / nf4 / fp8 / int8 are resolved per folder and
    # device when the patcher is made, into ``quantize`` (the kind itself).
    weights: str = AS_STORED
    # Blocks kept wholly on the GPU; the others' linear weights stream from pinned RAM
    # during each forward (wan/runtime/block_swap.py). None: every block on the GPU.
    blocks_on_gpu: int | None = None


class ExpertSlot(nn.Module):
    """What the patcher calls its model: a name, a folder, and the expert while resident."""

    def __init__(self, name: str, folder: Path, options: ExpertLoadOptions, host_bytes: int = 0) -> None:
        super().__init__()
        self.name = name
        self.folder = Path(folder)
        self.options = options
        self.host_bytes = host_bytes  # pinned RAM the expert holds while resident (block swap)
        # Not a registered submodule on purpose: see the module docstring.
        object.__setattr__(self, "_expert", None)

    @property
    def expert(self) -> nn.Module | None:
        return self._expert

    @property
    def label(self) -> str:
        """How log lines name it: "the high-noise expert", or another model's name (Fast)."""
        return f"the {self.name}-noise expert" if self.name in ("high", "low") else f"the {self.name} transformer"

    def put(self, module: nn.Module) -> None:
        object.__setattr__(self, "_expert", module)

    def take(self) -> nn.Module | None:
        module = self._expert
        object.__setattr__(self, "_expert", None)
        return module

    def extra_repr(self) -> str:
        return f"name={self.name!r}, folder={str(self.folder)!r}, resident={self._expert is not None}"


def _same_device(a: torch.device | str | None, b: torch.device | str | None) -> bool:
    if a is None or b is None:
        return False
    a, b = torch.device(a), torch.device(b)
    return a.type == b.type and (a.index or 0) == (b.index or 0)


class ExpertPatcher(ModelPatcher):
    model: ExpertSlot

    @classmethod
    def for_folder(
        cls,
        name: str,
        folder: str | Path,
        options: ExpertLoadOptions = ExpertLoadOptions(),
        load_device: torch.device | None = None,
        offload_device: torch.device | None = None,
    ) -> "ExpertPatcher":
        """A patcher for the expert in ``folder``; reads only file sizes and headers, loads nothing.

        With block swap on a CUDA device, the size ComfyUI plans VRAM with is only the part
        that stays on the GPU; the rest is accounted as RAM (``get_ram_usage``).
        """
        folder = Path(folder)
        load_device = load_device if load_device is not None else mm.get_torch_device()
        offload_device = offload_device if offload_device is not None else torch.device("cpu")
        # The kind the expert loads in, decided once here: the sizes below depend on it.
        kind = weight_kind_for(folder, load_device, options.weights, options.quantize, options.blocks_on_gpu)
        options = ExpertLoadOptions(quantize=kind, weights=kind or AS_STORED, blocks_on_gpu=options.blocks_on_gpu)
        # The loaders ignore block swap off CUDA, so it changes no size there.
        swap = options.blocks_on_gpu if torch.device(load_device).type == "cuda" else None
        on_device, host = expert_memory(folder, options.quantize, swap)  # one read of the headers
        slot = ExpertSlot(name, folder, options, host_bytes=host)
        return cls(slot, load_device, offload_device, size=on_device)

    # -- state ---------------------------------------------------------------------------

    @property
    def expert(self) -> nn.Module | None:
        """The resident expert, or None when it is not loaded."""
        return self.model.expert

    def is_resident(self) -> bool:
        return self.model.expert is not None

    def get_ram_usage(self) -> int:
        # What dropping this patcher would give back to system RAM right now.
        if not self.is_resident():
            return 0
        if torch.device(self.current_loaded_device()).type == "cpu":
            return self.model_size()
        return self.model.host_bytes  # block-swapped weights in pinned RAM

    def inference_memory(self, tokens: int, dim: int) -> int:
        """Working memory ComfyUI should leave free while this expert runs on ``tokens`` tokens."""
        return activation_bytes(tokens, dim)

    # -- loading -------------------------------------------------------------------------

    def load(self, device_to=None, lowvram_model_memory=0, force_patch_weights=False, full_load=False):
        device = torch.device(device_to) if device_to is not None else torch.device(self.load_device)
        if self.is_resident():
            if _same_device(self.current_loaded_device(), device):
                return
            self._drop()  # never move an expert between devices: that makes a second copy
        log.info("LingBot: loading %s from %s to %s", self.model.label, self.model.folder, device)
        options = self.model.options
        module = load_expert(self.model.folder, device, options.quantize, blocks_on_gpu=options.blocks_on_gpu)
        module.eval()
        self.model.put(module)
        self.model.device = device
        self.model.model_loaded_weight_memory = self.model_size()
        self.model.model_lowvram = False
        self.model.lowvram_patch_counter = 0

    def partially_load(self, device_to, extra_memory=0, force_patch_weights=False):
        # ComfyUI asks for "as much as fits"; an expert is all or nothing.
        if self.is_resident() and _same_device(self.current_loaded_device(), device_to):
            return 0
        self.load(device_to, full_load=True)
        return self.model_size()

    # -- unloading -----------------------------------------------------------------------

    def partially_unload(self, device_to, memory_to_free=0, force_patch_weights=False):
        # Nothing can be freed in part. Returning 0 makes LoadedModel.model_unload go on
        # to a full detach(), which drops the expert.
        return 0

    def unpatch_model(self, device_to=None, unpatch_weights=True):
        # ModelPatcher.detach(unpatch_all=True) ends here and drops the expert; detach(False)
        # keeps it, as ComfyUI means (load_models_gpu re-registering a model it uses again).
        if unpatch_weights:
            self._drop()  # unloading means dropping, never offloading to RAM
        return super().unpatch_model(device_to, unpatch_weights)

    def _drop(self) -> None:
        module = self.model.take()
        self.model.model_loaded_weight_memory = 0
        self.model.device = self.offload_device
        if module is not None:
            log.info("LingBot: dropped %s", self.model.label)
            release_module(module)


@dataclass
class DiTExperts:
    """The LINGBOT_DIT value: both experts of one model, each under its own patcher.

    ``high`` and ``low`` are the patchers on each expert's first device. With a multi-GPU
    ``placement`` (pipeline/placement.py), ``copies`` holds a patcher for every
    (expert, slot) pair, each with that slot's device as its load device, so ComfyUI's
    memory manager accounts and evicts every copy on its own GPU.
    """

    high: ExpertPatcher
    low: ExpertPatcher
    config: DiTConfig  # shared by both experts: config.json, and control_type ("cam"/"act") from the headers
    placement: Placement | None = None  # None: one device, the experts take turns (today's behaviour)
    copies: dict[tuple[str, int], ExpertPatcher] = field(default_factory=dict)
    loras: tuple = ()  # pipeline.lora.LoraSpec from LoRA Loader nodes, applied while the sampler runs
    # nodes/host/workers.py SequenceParallelExperts: every forward on all its GPUs (None: off)
    parallel: object | None = None

    @property
    def label(self) -> str:
        """How messages name the checkpoint: the high-noise expert's folder and its package."""
        folder = self.high.model.folder
        return f"the DiT Loader's checkpoint (high_noise {folder.parent.name}/{folder.name})"

    def patcher(self, name: str) -> ExpertPatcher:
        if name == "high":
            return self.high
        if name == "low":
            return self.low
        raise ValueError(f"unknown expert {name!r}; expected 'high' or 'low'")

    def patchers(self, name: str) -> list[ExpertPatcher]:
        """Every patcher of ``name``, in slot order (the first runs the conditional branch)."""
        first = self.patcher(name)
        if self.placement is None:
            return [first]
        return [self.copies[(name, slot)] for slot in self.placement.slots(name)]

    def all_patchers(self) -> list[ExpertPatcher]:
        return self.patchers("high") + self.patchers("low")

    def get_ram_usage(self) -> int:
        # Newer ComfyUI hosts weigh cached node outputs by this when RAM runs short.
        return sum(p.get_ram_usage() for p in self.all_patchers())


def experts_for_placement(folders: dict[str, Path], options: ExpertLoadOptions, config: DiTConfig,
                          placement: Placement) -> DiTExperts:
    """One patcher per (expert, slot) of ``placement``, each loading to its slot's device."""
    copies = {
        (name, slot): ExpertPatcher.for_folder(name, folders[name], options, load_device=placement.devices[slot])
        for name in ("high", "low") for slot in placement.slots(name)
    }
    return DiTExperts(high=copies[("high", placement.slots("high")[0])],
                      low=copies[("low", placement.slots("low")[0])],
                      config=config, placement=placement, copies=copies)


def unload_patcher(patcher: ModelPatcher) -> None:
    """Unload one patcher through ComfyUI's own bookkeeping, then make sure it is dropped."""
    loaded = mm.current_loaded_models
    for index in range(len(loaded) - 1, -1, -1):
        if loaded[index].model is patcher:
            loaded[index].model_unload()
            loaded.pop(index)
    patcher.detach()
    mm.soft_empty_cache()


class ComfyExpertSource:
    """pipeline.sampling.ExpertSource on top of ComfyUI's model manager.

    ``acquire`` asks ComfyUI to load the expert (every copy the placement asks for, evicting
    other models as needed); ``release`` unloads it at once when the other expert needs its
    device, so with one device the two experts are never resident together.

    ``keep_resident``: an expert stays loaded after use, and acquiring one unloads nothing of
    the other (both resident, e.g. across a long video's windows; ComfyUI may still evict
    one under memory pressure); ``close`` unloads both. With ``expert_per_gpu`` the experts
    share no GPU (``Placement.keep_resident``): they are kept, and ``close`` leaves them
    loaded under ComfyUI's memory manager (which evicts each when its GPU needs the memory),
    so the next run reloads nothing; ``POST /free`` and Unload Models unload both, on whichever
    GPU (``unload_all.py``). ``abort`` (error, interrupt) always unloads every copy.
    """

    def __init__(self, experts: DiTExperts, inference_memory: int = 0, keep_resident: bool = False) -> None:
        self.experts = experts
        self.inference_memory = int(inference_memory)
        self.keep_resident = keep_resident or self._placement_keeps()

    @property
    def cfg_split(self) -> bool:
        placement = self.experts.placement
        return placement is not None and placement.cfg_split

    def _placement_keeps(self) -> bool:
        placement = self.experts.placement
        return placement is not None and placement.keep_resident

    def acquire(self, name: str) -> nn.Module:
        patchers = self.experts.patchers(name)
        other = "low" if name == "high" else "high"
        placement = self.experts.placement
        if self.keep_resident:
            in_the_way = []
        elif placement is None:
            in_the_way = [self.experts.patcher(other)]
        else:
            in_the_way = [self.experts.copies[(other, slot)] for slot in placement.conflicts(name, other)]
        for patcher in in_the_way:
            if patcher.is_resident():
                unload_patcher(patcher)
        mm.load_models_gpu(patchers, memory_required=self.inference_memory, force_full_load=True)
        return self._module(name, patchers[0])

    def acquire_uncond(self, name: str) -> nn.Module:
        """CFG split: the copy of ``name`` on the second GPU (loaded by ``acquire``)."""
        patchers = self.experts.patchers(name)
        if len(patchers) < 2:
            raise ValueError(f"the {name}-noise expert has one copy; only devices=cfg_split has a second one")
        return self._module(name, patchers[1])

    @staticmethod
    def _module(name: str, patcher: ExpertPatcher) -> nn.Module:
        module = patcher.expert
        if module is None:  # load_models_gpu returned without loading: a host we do not know
            raise RuntimeError(f"ComfyUI did not load the {name}-noise expert from {patcher.model.folder} "
                               f"to {patcher.load_device}")
        return module

    def release(self, name: str) -> None:
        if self.keep_resident:
            return
        for patcher in self.experts.patchers(name):
            unload_patcher(patcher)

    def abort(self) -> None:
        for patcher in self.experts.all_patchers():
            unload_patcher(patcher)

    def close(self) -> None:
        if self._placement_keeps():
            return
        self.abort()


def run_experts(dit: DiTExperts, tokens: int, keep_resident: bool = False) -> tuple[ComfyExpertSource, ExpertSource]:
    """The experts one sampling run uses: ``(comfy, source)``. ``comfy`` is the
    ComfyUI-managed source (close it when the run ends, also on errors); ``source`` is what
    ``pipeline.sampling.sample`` takes: ``comfy`` itself, or, when LoRA Loaders added
    LoRAs to ``dit``, ``comfy`` with the LoRAs attached on each acquire and detached on each
    release (``pipeline.lora.LoraExperts``, which refuses a malformed file naming it).

    Every node that samples gets its experts here, so all apply the same LoRAs the same
    way. A LoRA file deleted since the LoRA Loader ran is refused before any expert loads.
    """
    loras = list(dit.loras)
    if dit.parallel is not None:
        from .workers import SequenceParallelSource  # workers.py imports this module

        if loras:
            raise ValueError("devices=sequence_parallel does not apply LoRAs yet (the workers' copies would run "
                             "without them); choose devices=single or cfg_split with a LoRA Loader")
        comfy = SequenceParallelSource(dit.parallel, inference_memory=dit.high.inference_memory(tokens, dit.config.dim))
        return comfy, comfy
    for spec in loras:
        if not spec.path.is_file():
            raise FileNotFoundError(f"LoRA file {spec.path} no longer exists; pick another in the LoRA Loader")
    memory = dit.high.inference_memory(tokens, dit.config.dim) + lora_device_bytes([spec.path for spec in loras or []])
    comfy = ComfyExpertSource(dit, inference_memory=memory, keep_resident=keep_resident)
    return comfy, (LoraExperts(comfy, loras) if loras else comfy)
