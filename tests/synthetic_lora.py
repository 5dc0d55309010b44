"""Write LoRA files in the kohya format for a synthetic DiT expert (tests only)."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from comfyui_lingbot_world.loaders.layout import read_config

RANK, ALPHA = 4, 2.0


def kohya_state(expert_folder: Path, seed: int = 0, scale: float = 0.5) -> dict[str, torch.Tensor]:
    """lora_down/lora_up/alpha for every block's self-attention and FFN linears of the
    expert in ``expert_folder`` (shapes from its config.json)."""
    config = read_config(expert_folder)
    g = torch.Generator().manual_seed(seed)
    layers = {"self_attn_q": (config.dim, config.dim), "self_attn_k": (config.dim, config.dim),
              "self_attn_v": (config.dim, config.dim), "self_attn_o": (config.dim, config.dim),
              "ffn_0": (config.ffn_dim, config.dim), "ffn_2": (config.dim, config.ffn_dim)}
    state = {}
    for block in range(config.num_layers):
        for name, (out_f, in_f) in layers.items():
            base = f"lora_unet_blocks_{block}_{name}"
            state[f"{base}.lora_down.weight"] = torch.randn(RANK, in_f, generator=g) * scale
            state[f"{base}.lora_up.weight"] = torch.randn(out_f, RANK, generator=g) * scale
            state[f"{base}.alpha"] = torch.tensor(ALPHA)
    return state


def write_kohya_lora(path: Path, expert_folder: Path, seed: int = 0, wrong_shape_key: str | None = None) -> Path:
    """A kohya LoRA for the expert; ``wrong_shape_key`` names a lora_up key given one row too many."""
    state = kohya_state(expert_folder, seed)
    if wrong_shape_key is not None:
        up = state[wrong_shape_key]
        state[wrong_shape_key] = torch.cat([up, up[:1]])
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path))
    return path
