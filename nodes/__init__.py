"""ComfyUI nodes of the pack (classic V1 node classes, which old and new hosts both load).

This is the only package that imports ComfyUI (``comfy``, ``folder_paths``); the work is
done by ``pipeline/``, ``loaders/`` and ``wan/``.
"""
from .model_files import register_model_folder

register_model_folder()

from .camera import LingBotCamera  # noqa: E402
from .dit_loader import LingBotDiTLoader  # noqa: E402
from .sampler import LingBotSampler  # noqa: E402
from .text_encode import LingBotTextEncode  # noqa: E402
from .vae import LingBotVAEDecode, LingBotVAEEncode  # noqa: E402
from .routes import register_status_route  # noqa: E402

register_status_route()  # GET /lingbot/status (memory diagnostics)

NODE_CLASS_MAPPINGS = {
    "LingBotTextEncode": LingBotTextEncode,
    "LingBotDiTLoader": LingBotDiTLoader,
    "LingBotCamera": LingBotCamera,
    "LingBotVAEEncode": LingBotVAEEncode,
    "LingBotSampler": LingBotSampler,
    "LingBotVAEDecode": LingBotVAEDecode,
}

NODE_DISPLAY_NAME_MAPPINGS = {
    "LingBotTextEncode": "LingBot T5 Encode + Unload",
    "LingBotDiTLoader": "LingBot NF4 DiT Loader",
    "LingBotCamera": "LingBot Camera Plücker Conditioning",
    "LingBotVAEEncode": "LingBot Wan VAE Encode",
    "LingBotSampler": "LingBot Dual-Expert Sampler",
    "LingBotVAEDecode": "LingBot Wan VAE Decode",
}

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
