"""ComfyUI nodes of the pack, in ComfyUI's V3 schema (``comfy_api.latest.io``).

This is the only package that imports ComfyUI (``comfy``, ``folder_paths``); the work is
done by ``pipeline/``, ``loaders/`` and ``wan/``.

Registration: both hosts we support (0.3.75 and 0.27) read ``comfy_entrypoint`` only when
a pack has no ``NODE_CLASS_MAPPINGS``, and the pack's root ``__init__`` always defines that
name (empty outside ComfyUI). Both hosts accept V3 classes in NODE_CLASS_MAPPINGS, so the
V3 nodes are registered there; ``comfy_entrypoint`` is offered too, for loaders that look
for it.
"""
from comfy_api.latest import ComfyExtension, io

from .host.model_files import register_model_folder
from .host.host_settings import follow_host_settings

register_model_folder()
follow_host_settings()

from .camera import LingBotWorldCamera  # noqa: E402
from .dit_loader import LingBotWorldDiTLoader  # noqa: E402
from .fast_dit_loader import LingBotWorldFastDiTLoader  # noqa: E402
from .fast_long_video import LingBotWorldFastLongVideo  # noqa: E402
from .fast_sampler import LingBotWorldFastSampler  # noqa: E402
from .lora_loader import LingBotWorldLoraLoader  # noqa: E402
from .long_video import LingBotWorldLongVideo  # noqa: E402
from .play import LingBotWorldPlay  # noqa: E402
from .play_log import LingBotWorldPlayLog  # noqa: E402
from .sampler import LingBotWorldSampler  # noqa: E402
from .text_encode import LingBotWorldTextEncode  # noqa: E402
from .vae import LingBotWorldVAEDecode, LingBotWorldVAEEncode  # noqa: E402
from .host.play_routes import register_play_routes  # noqa: E402
from .host.routes import register_status_route  # noqa: E402
from .host.client_errors import name_files_relatively  # noqa: E402
from .host.combo_check import check_combos  # noqa: E402
from .host.unload_all import install_unload_hook  # noqa: E402

register_status_route()  # GET /lingbot/status (memory diagnostics)
register_play_routes()  # /lingbot/play...: the Play panel's keys and controls
install_unload_hook()  # POST /free and Unload Models also unload the pack's models on the other GPUs

NODES: list[type[io.ComfyNode]] = [
    LingBotWorldTextEncode,
    LingBotWorldDiTLoader,
    LingBotWorldCamera,
    LingBotWorldVAEEncode,
    LingBotWorldSampler,
    LingBotWorldVAEDecode,
    LingBotWorldLoraLoader,
    LingBotWorldLongVideo,
    LingBotWorldFastDiTLoader,
    LingBotWorldFastSampler,
    LingBotWorldFastLongVideo,
    LingBotWorldPlay,
    LingBotWorldPlayLog,
]

for _node in NODES:
    name_files_relatively(_node)  # errors reach the client naming files relative to ComfyUI's folders
    check_combos(_node)  # an unknown combo value is refused when queued, also on hosts that do not check

# Written out rather than read off the schemas, which would scan the model folders at import.
NODE_CLASS_MAPPINGS = {node.__name__: node for node in NODES}  # class name == node_id
NODE_DISPLAY_NAME_MAPPINGS = {
    "LingBotWorldTextEncode": "LingBot-World T5 Encode + Unload",
    "LingBotWorldDiTLoader": "LingBot-World NF4 DiT Loader (also bf16)",
    "LingBotWorldCamera": "LingBot-World Camera (Act, Base-Cam)",
    "LingBotWorldVAEEncode": "LingBot-World Wan VAE Encode",
    "LingBotWorldSampler": "LingBot-World Dual-Expert Sampler",
    "LingBotWorldVAEDecode": "LingBot-World Wan VAE Decode",
    "LingBotWorldLoraLoader": "LingBot-World LoRA Loader",
    "LingBotWorldLongVideo": "LingBot-World Long Video",
    "LingBotWorldFastDiTLoader": "LingBot-World Fast DiT Loader",
    "LingBotWorldFastSampler": "LingBot-World Fast Sampler",
    "LingBotWorldFastLongVideo": "LingBot-World Fast Long Video",
    "LingBotWorldPlay": "LingBot-World Play",
    "LingBotWorldPlayLog": "LingBot-World Play Log",
}


class LingBotWorldExtension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return list(NODES)


async def comfy_entrypoint() -> LingBotWorldExtension:
    return LingBotWorldExtension()


__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "comfy_entrypoint"]
