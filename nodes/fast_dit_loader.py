"""LingBot-World Fast DiT Loader: names the Fast transformer's folder; nothing heavy is read until a run."""
from __future__ import annotations

import logging

import torch
from comfy_api.latest import io

import comfy.model_management as mm

from ..loaders.layout import detect_expert_layout, read_config
from ..loaders.model_kind import assumed_message, describe, require_model
from ..pipeline.placement import FAST, NVLINK_CLASS_GBPS, devices_choices
from . import inputs
from .host import gpus as host_gpus
from .host.fast_model import FastDiT
from .host.model_files import EXPERT_KINDS, default_fast_folder, list_fast_folders, resolve_model_path

log = logging.getLogger(__name__)

DISPLAY_NAME = "LingBot-World Fast DiT Loader"
FAST_DEVICES = devices_choices(FAST)
DEVICES_TOOLTIP = (
    "single: one GPU. sequence_parallel: every chunk on 2 or 4 GPUs at once (as many as divide the model's 40 "
    "heads; ComfyUI's GPU first), each chunk's tokens split between them and the KV cache split by head, a worker "
    "process per extra GPU kept warm between prompts; each GPU holds a copy of the transformer. Pays on NVLink, "
    "not on PCIe cards without peer-to-peer. decode_on_second_gpu: the transformer on ComfyUI's GPU, the VAE of "
    "Play and Fast Long Video (the start frame's encode, every chunk's decode) on the next GPU, so the decode never "
    "slows the next chunk; the Fast Sampler itself runs as single (measured figures: bench/RESULTS.md). "
    "auto: with 2 or more GPUs, times an all-to-all between them once per ComfyUI process (64 MB) and runs "
    f"sequence_parallel when it moves at least {NVLINK_CLASS_GBPS:.0f} GB/s, else decode_on_second_gpu (Fast has "
    "no CFG to split); model_info says what it measured and picked. See docs/multi_gpu.md.")


def fast_devices(devices: str, heads: int) -> tuple[list[torch.device], torch.device | None, str]:
    """The GPUs the ``devices`` choice runs the transformer on (empty: one device), the VAE's GPU
    when it is another one (None: beside the transformer) and what model_info says of it
    (nothing for ``single``)."""
    decision = host_gpus.decide(devices, FAST, heads)
    said = host_gpus.describe(decision)
    strategy = decision.mode.strategy
    if strategy == "ulysses":
        return list(decision.devices), None, said
    if strategy == "vae_on_next_gpu":
        first, second = decision.devices
        head = said if decision.said else f"devices {decision.mode.name}"
        return [], second, f"{head}: the transformer on {first}, the VAE on {second}"
    return [], None, said


def load_line(options, device: torch.device) -> str:
    """How the transformer will come into memory on ComfyUI's ``device``, for the model_info output."""
    how = "bf16 folders quantized to NF4 while loading" if options.quantize == "nf4" else "loaded as stored"
    if options.weights != inputs.AS_STORED:
        how = f"weights {options.weights} (decided per GPU when the run loads it)"
    if device.type != "cuda":  # no GPU: the model runs where ComfyUI runs it, block swap does not apply
        ignored = f", block_swap {options.blocks_on_gpu} ignored (it needs a GPU)" if options.blocks_on_gpu else ""
        return f"{how}; runs on the {device.type.upper()}, every block in RAM{ignored}"
    swap = f"{options.blocks_on_gpu} blocks on the GPU" if options.blocks_on_gpu else "every block on the GPU"
    return f"{how}; {swap}"


class LingBotWorldFastDiTLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        folders = list_fast_folders()
        return io.Schema(
            node_id="LingBotWorldFastDiTLoader",
            display_name=DISPLAY_NAME,
            category=inputs.FAST_CATEGORY,
            **inputs.search_aliases("lingbot fast", "lingbot fast loader", "lingbot play"),
            description=(
                "Points at the LingBot-World Fast transformer (robbyant/lingbot-world-fast: one causal model, 4 "
                "steps, no CFG, 12 frames per chunk). Loads nothing here: the Fast Sampler has ComfyUI load it "
                "straight from disk to the GPU, quantized to NF4 on the way when bf16_quantize is nf4, and drop "
                "it (no copy kept in RAM) when the run ends. Its weights have a Base expert's shapes, so the "
                "model is told by its files (config.json, folder name): a Base expert is refused, and where the "
                "files cannot tell, model_info says which model is assumed."
            ),
            inputs=[
                io.Combo.Input("fast_model", options=folders, default=default_fast_folder(folders),
                               tooltip="Folder of the Fast transformer: the official download placed as "
                               "lingbot_world_fast inside the Base-Cam folder (bf16, ~37 GB), or its NF4 package "
                               "lingbot_world_fast_bnb_nf4 (~9.6 GB). Folders under models/lingbot and "
                               "models/diffusion_models that hold config.json and the weights are listed."),
                inputs.quantize_input("For the official bf16 folder: nf4 quantizes the transformer while it loads "
                                      "(~9.6 GB instead of ~37 GB of VRAM). NF4 folders load as they are.",
                                      default="nf4"),
                inputs.block_swap_input(),
                inputs.weights_input(),
                # Optional, last: saved workflows list widget values in order and load as single.
                io.Combo.Input("devices", options=list(FAST_DEVICES), default="single", optional=True,
                               tooltip=DEVICES_TOOLTIP),
                inputs.attention_input("Attention kernel of the Fast Sampler, Fast Long Video and Play runs of "
                                       "this transformer."),
            ],
            outputs=[
                inputs.FastDiTType.Output("fast_dit", display_name="fast_dit",
                                          tooltip="The Fast transformer, for the LingBot-World Fast Sampler and "
                                          "Fast Long Video."),
                io.String.Output("model_info", display_name="model_info",
                                 tooltip="What the folder's files say it holds (or which model is assumed when "
                                 "they cannot tell), how it will load, and on which GPUs (what devices=auto "
                                 "measured and picked)."),
            ],
        )

    @classmethod
    def validate_inputs(cls, fast_model) -> bool | str:
        return inputs.offered(cls, fast_model=fast_model)

    @classmethod
    def execute(cls, fast_model: str, bf16_quantize: str = "nf4", block_swap: int = 0,
                weights: str = inputs.AS_STORED, devices: str = "single", attention: str = "auto") -> io.NodeOutput:
        options = inputs.load_options(bf16_quantize, block_swap, weights)
        host_gpus.check_choice(devices, FAST)  # before any file is read: a missing GPU fails at once
        inputs.check_attention(attention)
        folder = resolve_model_path(fast_model, EXPERT_KINDS, "fast_model", want_dir=True)
        detect_expert_layout(folder)  # a wrong folder fails now, not minutes into a run
        identity = require_model(folder, "fast", "fast_model")
        config = read_config(folder)
        if identity.kind == "unknown":
            said = assumed_message(identity, "fast", "fast_model")
            log.warning("LingBot: %s", said)
        else:
            said = describe(identity)
        gpus, decode_gpu, placed = fast_devices(devices, config.num_heads)
        info = f"{said}; {load_line(options, mm.get_torch_device())}" + (f"; {placed}" if placed else "")
        log.info("LingBot Fast DiT Loader: %s", info)
        if attention != "auto":
            info += f"; attention {attention}"
        return io.NodeOutput(FastDiT.for_folder(folder, options, config, identity, gpus, decode_gpu, attention), info)
