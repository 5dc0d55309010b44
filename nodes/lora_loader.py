"""LingBot-World LoRA Loader: adds a LoRA per expert to the DiT; the sampler applies them.

Nothing is read here but the file names: the adapters are checked against the expert's
layers and attached when the sampler loads each expert (pipeline/lora.py), so a malformed
file fails there with its file and key named, and the expert is released.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import folder_paths
from comfy_api.latest import io

from ..pipeline.lora import LoraSpec
from . import inputs
from .host.expert_patcher import DiTExperts

LORA_KIND = "loras"  # ComfyUI's own models/loras folder
NONE = "none"
MAX_STRENGTH = 4.0


def lora_choices() -> list[str]:
    """The choice "none", then the files ComfyUI lists under models/loras."""
    return [NONE, *folder_paths.get_filename_list(LORA_KIND)]


def lora_path(name: str, field: str) -> Path:
    """The file a combo value names in models/loras, or an error naming the input."""
    full = folder_paths.get_full_path(LORA_KIND, name) if name else None
    if full is None or not Path(full).is_file():
        raise ValueError(f"{field}: LoRA file {name!r} not found in models/loras (refresh the node, or put the "
                         "file in ComfyUI/models/loras)")
    return Path(full)


def _strength(value: float, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not -MAX_STRENGTH <= value <= MAX_STRENGTH:
        raise ValueError(f"{field}: {value!r} is not a strength from {-MAX_STRENGTH} to {MAX_STRENGTH}")
    return float(value)


def with_loras(dit: DiTExperts, high: tuple[str, float], low: tuple[str, float]) -> DiTExperts:
    """A new LINGBOT_DIT with the chosen files appended to ``dit``'s LoRAs ("none" adds nothing)."""
    added = []
    (high_name, high_strength), (low_name, low_strength) = high, low
    if high_name != NONE:
        added.append(LoraSpec(lora_path(high_name, "lora_high_noise"), strength_high=high_strength, strength_low=0.0))
    if low_name != NONE:
        added.append(LoraSpec(lora_path(low_name, "lora_low_noise"), strength_high=0.0, strength_low=low_strength))
    # The same expert patchers: chaining loaders never loads or copies an expert.
    return dataclasses.replace(dit, loras=tuple(dit.loras) + tuple(added))


class LingBotWorldLoraLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        choices = lora_choices()
        return io.Schema(
            node_id="LingBotWorldLoraLoader",
            display_name="LingBot-World LoRA Loader",
            category=inputs.BASE_CATEGORY,
            **inputs.search_aliases("lingbot base", "lingbot lora", "lingbot lightning"),
            description=(
                "Adds a LoRA to each expert of the DiT (Wan2.2 A14B LoRAs come as a high-noise and a low-noise "
                "file). The sampler adds the low-rank product to each layer's output while the expert runs, so "
                "NF4 weights and block swap stay as they are. Chain several loaders to stack LoRAs. Formats: "
                "ComfyUI/kohya (lora_down/lora_up + alpha), diffusers (lora_A/lora_B), diffusion_model. "
                "prefixes, diff tensors. LoRAs made for Wan2.2 are untested on LingBot's fine-tuned experts."
            ),
            inputs=[
                inputs.DiT.Input("dit", tooltip="Both experts, from the LingBot-World NF4 DiT Loader (or another "
                                "LoRA Loader)."),
                io.Combo.Input("lora_high_noise", options=choices, default=NONE,
                               tooltip="LoRA for the high-noise expert (the early steps), from models/loras; "
                               "none = no LoRA on it."),
                io.Float.Input("strength_high", default=1.0, min=-MAX_STRENGTH, max=MAX_STRENGTH, step=0.05,
                               tooltip="How strongly the high-noise LoRA applies (0 = not at all)."),
                io.Combo.Input("lora_low_noise", options=choices, default=NONE,
                               tooltip="LoRA for the low-noise expert (the late steps), from models/loras; "
                               "none = no LoRA on it."),
                io.Float.Input("strength_low", default=1.0, min=-MAX_STRENGTH, max=MAX_STRENGTH, step=0.05,
                               tooltip="How strongly the low-noise LoRA applies (0 = not at all)."),
            ],
            outputs=[inputs.DiT.Output("dit_with_loras", display_name="dit",
                                      tooltip="The same experts carrying the LoRAs, for the LingBot-World "
                                      "Dual-Expert Sampler or another LoRA Loader.")],
        )

    @classmethod
    def validate_inputs(cls, lora_high_noise, lora_low_noise) -> bool | str:
        return inputs.offered(cls, lora_high_noise=lora_high_noise, lora_low_noise=lora_low_noise)

    @classmethod
    def execute(cls, dit, lora_high_noise: str, strength_high: float, lora_low_noise: str,
                strength_low: float) -> io.NodeOutput:
        if not isinstance(dit, DiTExperts):
            raise ValueError(f"dit: expected the output of LingBot-World NF4 DiT Loader, got {type(dit).__name__}")
        high = (lora_high_noise, _strength(strength_high, "strength_high"))
        low = (lora_low_noise, _strength(strength_low, "strength_low"))
        return io.NodeOutput(with_loras(dit, high, low))
