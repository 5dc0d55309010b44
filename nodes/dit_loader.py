"""LingBot-World NF4 DiT Loader (also bf16): names the two experts; nothing heavy is read until sampling."""
from __future__ import annotations

import logging

from comfy_api.latest import io

from ..loaders.expert_config import read_expert_pair
from ..loaders.layout import detect_expert_layout
from ..loaders.model_kind import assumed_message, require_model
from ..wan.config import CONTROL_NAMES
from ..pipeline.placement import BASE, NVLINK_CLASS_GBPS, DevicesDecision, devices_choices, placement_on
from . import inputs
from .host import gpus
from .host.expert_patcher import DiTExperts, ExpertLoadOptions, ExpertPatcher, experts_for_placement
from .host.workers import SequenceParallelExperts
from .host.model_files import EXPERT_KINDS, default_expert_pair, expert_control, list_expert_folders, resolve_model_path

log = logging.getLogger(__name__)

MAX_BLOCK_SWAP = inputs.MAX_BLOCK_SWAP
# "NF4" stays in the name: saved workflows carry it as the node's title, and messages name it.
DISPLAY_NAME = "LingBot-World NF4 DiT Loader (also bf16)"


def picked_note(high: str | None) -> str:
    """What a fresh node picked and why, for the tooltip (Base-Cam first: the camera nodes'
    defaults drive it; an Act package needs W/A/S/D keys)."""
    if high is None:
        return ""
    control = expert_control(high)
    kind = CONTROL_NAMES.get(control, "a checkpoint it could not read")
    why = " (Base-Cam first: the Camera node's defaults drive it)" if control == "cam" else ""
    return f" A fresh node picks {high}: {kind}{why}."


# The placements first, then sequence_parallel and auto (saved workflows keep their values).
DEVICES = devices_choices(BASE)
DEVICES_TOOLTIP = (
    "single: one GPU, the experts take turns (needs ~9.6 GB of VRAM for an NF4 expert plus activations). "
    "expert_per_gpu: high-noise expert on GPU 0, low-noise on GPU 1; no switch, and both stay loaded for the "
    "next run. cfg_split: the running expert on GPUs 0 and 1, the prompt branch on GPU 0 and the negative "
    "branch on GPU 1 at the same time (about half the time per step). sequence_parallel: the running expert on "
    "every GPU (2 or 4; as many as divide its 40 heads), one video's tokens split between them (Ulysses), a "
    "worker process per extra GPU; with 4 GPUs, 2 x 2 with the CFG branches. Pays on NVLink; on PCIe cards "
    "without peer-to-peer choose cfg_split. auto: one GPU: single; with two or more, times an all-to-all "
    "between them once per ComfyUI process (64 MB) and picks sequence_parallel on an NVLink-class link (at least "
    f"{NVLINK_CLASS_GBPS:.0f} GB/s), else cfg_split; the log says what it measured and picked. "
    "See docs/multi_gpu.md.")


def experts_on(decision: DevicesDecision, folders: dict, options: ExpertLoadOptions, config) -> DiTExperts:
    """Both experts' patchers for what ``devices`` decided: one device, expert slots on the
    GPUs (``expert_per_gpu``, ``cfg_split``) or every forward on all of them (``sequence_parallel``)."""
    strategy = decision.mode.strategy
    if strategy == "expert_slots":
        return experts_for_placement(folders, options, config, placement_on(decision.mode.name, decision.devices))
    if strategy == "ulysses":
        group = list(decision.devices)
        high = ExpertPatcher.for_folder("high", folders["high"], options, load_device=group[0])
        low = ExpertPatcher.for_folder("low", folders["low"], options, load_device=group[0])
        return DiTExperts(high=high, low=low, config=config,
                          parallel=SequenceParallelExperts(folders, options, group, rank0={"high": high, "low": low}))
    return DiTExperts(high=ExpertPatcher.for_folder("high", folders["high"], options),
                      low=ExpertPatcher.for_folder("low", folders["low"], options), config=config)


class LingBotWorldDiTLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        experts = list_expert_folders()
        high, low = default_expert_pair(experts, expert_control)
        return io.Schema(
            node_id="LingBotWorldDiTLoader",
            display_name=DISPLAY_NAME,
            category=inputs.BASE_CATEGORY,
            **inputs.search_aliases("lingbot base", "lingbot act", "lingbot base-cam", "lingbot loader", "lingbot nf4"),
            description=(
                "Points at the high-noise and low-noise experts of LingBot-World (NF4 package folders, or "
                "official bf16 folders). Loads nothing here: the sampler has ComfyUI load one expert at a "
                "time straight from disk to the GPU, and drops it (no copy kept in RAM) when it is done "
                "or when ComfyUI needs the memory. A smaller GPU runs them with fewer blocks on the GPU "
                "(block_swap): only the first N blocks stay on the GPU, the rest stream in from pinned RAM as "
                "they are needed. Base-Cam or Act (the action checkpoint) is read from the weights; both "
                "experts must be of the same one."
            ),
            inputs=[
                io.Combo.Input("high_noise", options=experts, default=high,
                               tooltip="Folder of the high-noise expert (e.g. high_noise_model_bnb_nf4), used for "
                               "the early, noisy steps. Folders under models/lingbot and models/diffusion_models "
                               "that hold config.json and the weights are listed." + picked_note(high)),
                io.Combo.Input("low_noise", options=experts, default=low,
                               tooltip="Folder of the low-noise expert (e.g. low_noise_model_bnb_nf4), used for "
                               "the late steps that settle the detail."),
                inputs.quantize_input("For official bf16 experts only: nf4 quantizes each expert while it loads "
                                      "(~9.6 GB instead of ~37 GB of VRAM). NF4 package folders load as they are."),
                inputs.block_swap_input(),
                # Optional: API prompts written before this input still validate.
                io.Combo.Input("devices", options=list(DEVICES), default="single", optional=True,
                               tooltip=DEVICES_TOOLTIP),
                inputs.weights_input(),  # after devices: saved workflows list widget values in order
            ],
            outputs=[inputs.DiT.Output("dit", display_name="dit",
                                      tooltip="Both experts, for the LingBot-World Dual-Expert Sampler.")],
        )

    @classmethod
    def validate_inputs(cls, high_noise, low_noise) -> bool | str:
        return inputs.offered(cls, high_noise=high_noise, low_noise=low_noise)

    @classmethod
    def execute(cls, high_noise: str, low_noise: str, bf16_quantize: str, block_swap: int = 0,
                devices: str = "single", weights: str = inputs.AS_STORED) -> io.NodeOutput:
        options = inputs.load_options(bf16_quantize, block_swap, weights)
        gpus.check_choice(devices, BASE)  # before any file is read: a missing GPU fails at once
        folders = {
            "high": resolve_model_path(high_noise, EXPERT_KINDS, "high_noise", want_dir=True),
            "low": resolve_model_path(low_noise, EXPERT_KINDS, "low_noise", want_dir=True),
        }
        for field, folder in zip(("high_noise", "low_noise"), folders.values()):
            detect_expert_layout(folder)  # a wrong folder fails now, not minutes into a run
            # The Fast transformer has an expert's shapes: only its files tell (loaders/model_kind.py).
            identity = require_model(folder, "base", field)
            if identity.kind == "unknown":
                log.warning("LingBot: %s", assumed_message(identity, "base", field))
        # config.json and the headers: the geometry, and Base-Cam or Act (by the control weight's shape).
        high_config = read_expert_pair(folders["high"], folders["low"], ("high_noise", "low_noise"))
        if folders["high"].resolve() == folders["low"].resolve():
            log.warning("LingBot: high_noise and low_noise are the same folder (%s); the model ships two "
                        "different experts", folders["high"])
        decision = gpus.decide(devices, BASE, high_config.num_heads)  # auto measures the link here
        said = gpus.describe(decision)
        if said:
            log.info("LingBot DiT Loader: %s", said)
        return io.NodeOutput(experts_on(decision, folders, options, high_config))
