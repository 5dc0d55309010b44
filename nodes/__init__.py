"""ComfyUI nodes of the pack (classic V1 node classes, which old and new hosts both load).

This is the only package that imports ComfyUI (``comfy``, ``folder_paths``); the work is
done by ``pipeline/``, ``loaders/`` and ``wan/``.
"""
from .model_files import register_model_folder

register_model_folder()

from .camera import LingBotWorldCamera  # noqa: E402
from .dit_loader import LingBotWorldDiTLoader  # noqa: E402
from .sampler import LingBotWorldSampler  # noqa: E402
from .text_encode import LingBotWorldTextEncode  # noqa: E402
from .vae import LingBotWorldVAEDecode, LingBotWorldVAEEncode  # noqa: E402
from .routes import register_status_route  # noqa: E402

register_status_route()  # GET /lingbot/status (memory diagnostics)

NODE_CLASS_MAPPINGS = {
    "LingBotWorldTextEncode": LingBotWorldTextEncode,
    "LingBotWorldDiTLoader": LingBotWorldDiTLoader,
    "LingBotWorldCamera": LingBotWorldCamera,
    "LingBotWorldVAEEncode": LingBotWorldVAEEncode,
    "LingBotWorldSampler": LingBotWorldSampler,
    "LingBotWorldVAEDecode": LingBotWorldVAEDecode,
}

NODE_DISPLAY_NAME_MAPPINGS = {
    "LingBotWorldTextEncode": "LingBot-World T5 Encode + Unload",
    "LingBotWorldDiTLoader": "LingBot-World NF4 DiT Loader",
    "LingBotWorldCamera": "LingBot-World Camera Plücker Conditioning",
    "LingBotWorldVAEEncode": "LingBot-World Wan VAE Encode",
    "LingBotWorldSampler": "LingBot-World Dual-Expert Sampler",
    "LingBotWorldVAEDecode": "LingBot-World Wan VAE Decode",
}

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
