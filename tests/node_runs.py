"""The pack's nodes run in-process on the tiny package, for the node tests.

Use after ``comfy_host.use_comfy_in_process()`` and with the ``installed`` fixture
(tests/unit/conftest.py): the package is models/lingbot/pkg. The node classes are imported
inside the functions, so this module itself imports nothing of ComfyUI.
"""
from __future__ import annotations

import numpy as np
import torch

H, W, FRAMES = 32, 48, 5
PKG = "lingbot/pkg"
ACT_PKG = "lingbot/act"  # the tiny Act package (the installed_act fixture)
HIGH, LOW = f"{PKG}/high_noise_model_bnb_nf4", f"{PKG}/low_noise_model_bnb_nf4"
T5_FILE, TOKENIZER, VAE_FILE = f"{PKG}/models_t5_umt5-xxl-enc-bf16.pth", f"{PKG}/tokenizer", f"{PKG}/Wan2.1_VAE.pth"


def start_image(h: int = 40, w: int = 60) -> torch.Tensor:
    """A ComfyUI IMAGE batch [1, h, w, 3] of noise (the same every call)."""
    rng = np.random.default_rng(0)
    return torch.from_numpy(rng.random((1, h, w, 3), dtype=np.float32))


def encode_prompt():
    from comfyui_lingbot_world.nodes.text_encode import LingBotWorldTextEncode

    return LingBotWorldTextEncode.execute(T5_FILE, TOKENIZER, "a castle in the clouds", "blurry", "auto")[0]


def encode_start(frames: int = FRAMES):
    from comfyui_lingbot_world.nodes.vae import LingBotWorldVAEEncode

    return LingBotWorldVAEEncode.execute(start_image(), VAE_FILE, W, H, frames, "auto")[0]


def load_dit(package: str = PKG):
    from comfyui_lingbot_world.nodes.dit_loader import LingBotWorldDiTLoader

    return LingBotWorldDiTLoader.execute(f"{package}/high_noise_model_bnb_nf4", f"{package}/low_noise_model_bnb_nf4",
                                         "none")[0]


def run_sampler(dit, text, i2v, camera=None, steps: int = 3, seed: int = 1, **inputs) -> dict:
    """The sampler node with shift 4 and boundary 0.9: the LATENT dict it returns."""
    from comfyui_lingbot_world.nodes.sampler import LingBotWorldSampler

    return LingBotWorldSampler.execute(dit, i2v, steps, 5.0, 5.0, 4.0, 0.9, seed, "unipc", text=text,
                                       camera=camera, **inputs)[0]


def not_resident(dit) -> bool:
    """Neither expert loaded, and neither in ComfyUI's list of loaded models."""
    import comfy.model_management as mm

    return dit.high.expert is None and dit.low.expert is None and \
        not any(m is dit.high or m is dit.low for m in mm.loaded_models())


def options(spec) -> list:
    """A combo's choices, in the V1 form ([...], {...}) or V3's ("COMBO", {"options": [...]})."""
    return spec[0] if isinstance(spec[0], list) else spec[1]["options"]


def core_conditioning(embedding: torch.Tensor, pad_to: int = 512, mask: bool = False) -> list:
    """What core CLIP Text Encode gives for a umT5 prompt: [[emb [1, 512, dim], extras]], zero-padded."""
    padded = torch.zeros(1, max(pad_to, len(embedding)), embedding.shape[-1])
    padded[0, : len(embedding)] = embedding
    extras = {"pooled_output": None}
    if mask:
        extras["attention_mask"] = (torch.arange(padded.shape[1]) < len(embedding)).long()[None]
    return [[padded, extras]]


# --------------------------------------------------------------------------- LingBot-World Fast

FAST = "lingbot/fast/lingbot_world_fast"  # the fast_installed fixture's tiny Fast transformer (bf16)
FAST_NF4 = "lingbot/fast/lingbot_world_fast_bnb_nf4"
FAST_FRAMES = 21  # two chunks of 12 frames (the first 9)


def load_fast(folder: str = FAST, quantize: str = "none", block_swap: int = 0):
    """The Fast DiT Loader's (fast_dit, model_info)."""
    from comfyui_lingbot_world.nodes.fast_dit_loader import LingBotWorldFastDiTLoader

    return tuple(LingBotWorldFastDiTLoader.execute(folder, quantize, block_swap).args)


def run_fast_sampler(fast_dit, text, i2v, camera=None, seed: int = 1, kv_cache: str = "sliding_window",
                     kv_window: int = 9, kv_sink: int = 3, kv_dtype: str = "bf16", shift: float = 10.0,
                     **inputs) -> dict:
    """The Fast Sampler node: the LATENT dict it returns."""
    from comfyui_lingbot_world.nodes.fast_sampler import LingBotWorldFastSampler

    return LingBotWorldFastSampler.execute(fast_dit, i2v, kv_cache, kv_window, kv_sink, kv_dtype, shift, seed,
                                           text=text, camera=camera, **inputs)[0]


def fast_not_resident(fast_dit) -> bool:
    """The Fast transformer not loaded, and not in ComfyUI's list of loaded models."""
    import comfy.model_management as mm

    return fast_dit.patcher.expert is None and not any(m is fast_dit.patcher for m in mm.loaded_models())


class MemoryPlanAsked(Exception):
    """Raised by ``record_fast_runs``' stand-in: the node got as far as its memory plan."""


def record_fast_runs(monkeypatch, node_module) -> list[dict]:
    """Stand in for ``prepared_fast_run`` in a Fast node's module: each call's arguments, by
    name, go into the list returned; then ``MemoryPlanAsked`` stops the node (nothing loads)."""
    import inspect

    from comfyui_lingbot_world.nodes.host import fast_model

    calls: list[dict] = []
    signature = inspect.signature(fast_model.prepared_fast_run)

    def stand_in(*args, **kwargs):
        calls.append(dict(signature.bind(*args, **kwargs).arguments))
        raise MemoryPlanAsked

    monkeypatch.setattr(node_module, "prepared_fast_run", stand_in)
    return calls
