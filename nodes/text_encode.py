"""LingBot-World T5 Encode + Unload: prompts -> umT5 embeddings, encoder freed before returning."""
from __future__ import annotations

from pathlib import Path

import folder_paths
from comfy_api.latest import io

from ..pipeline.text import TextEmbeddings, encode_text
from ..wan.negative_prompt import DEFAULT_NEGATIVE_PROMPT
from . import inputs
from .host.devices import TEXT_WORKSPACE, check_interrupt, make_room, pick_device
from .host.model_files import (T5_KINDS, TOKENIZER_KINDS, default_in_package, list_t5_files, list_tokenizer_folders,
                               resolve_model_path)

CACHE_USER = "lingbot_world"
# Tokenizer choice for ComfyUI's umt5_xxl_*.safetensors, which carry their own SentencePiece model.
TOKENIZER_FROM_FILE = "(from the encoder file)"


def embedding_cache_dir() -> Path:
    """Where encoded prompts are kept between runs and restarts.

    ComfyUI's temp folder is wiped at every start, so it would not spare a single T5 load
    after a restart. A "system user" folder (user/__lingbot_world) persists, belongs to
    this ComfyUI install, and is never served over HTTP; models/ is kept for weights.
    """
    system_dir = getattr(folder_paths, "get_system_user_directory", None)
    if system_dir is not None:
        base = Path(system_dir(CACHE_USER))
    else:  # hosts older than the system-user API
        base = Path(folder_paths.get_user_directory()) / f"__{CACHE_USER}"
    return base / "text_embeddings"


class LingBotWorldTextEncode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        t5_files, tokenizers = list_t5_files(), list_tokenizer_folders()
        return io.Schema(
            node_id="LingBotWorldTextEncode",
            display_name="LingBot-World T5 Encode + Unload",
            category=inputs.FILES_CATEGORY,
            **inputs.search_aliases("lingbot text", "lingbot prompt", "lingbot t5"),
            description=(
                "Encodes the prompt and the negative prompt with umT5-XXL, then frees the encoder "
                "(VRAM and RAM) before the video model loads. Encoded prompts are cached on disk, so "
                "a prompt seen before does not load the encoder at all."
            ),
            inputs=[
                io.Combo.Input("t5_file", options=t5_files, default=default_in_package(t5_files),
                               tooltip="umT5-XXL encoder weights, e.g. models_t5_umt5-xxl-enc-bf16.pth or ComfyUI's "
                               "umt5_xxl_fp16 / umt5_xxl_fp8_e4m3fn_scaled .safetensors, from models/lingbot or "
                               "models/text_encoders."),
                io.Combo.Input("tokenizer", options=tokenizers + [TOKENIZER_FROM_FILE],
                               default=default_in_package(tokenizers) or TOKENIZER_FROM_FILE,
                               tooltip="Folder with the umT5 tokenizer (tokenizer.json or spiece.model), e.g. the "
                               f"package's tokenizer/ folder; {TOKENIZER_FROM_FILE} for ComfyUI's "
                               "umt5_xxl_*.safetensors, which carry their tokenizer."),
                io.String.Input("prompt", multiline=True, default="",
                                tooltip="What the video shows and how the scene moves."),
                io.String.Input("negative_prompt", multiline=True, default=DEFAULT_NEGATIVE_PROMPT,
                                tooltip="What to steer away from. The default is the one the model was tuned with."),
                inputs.device_input(),
            ],
            outputs=[inputs.Text.Output("text", display_name="text",
                                       tooltip="The prompt embeddings for the LingBot sampler.")],
        )

    @classmethod
    def validate_inputs(cls, t5_file, tokenizer) -> bool | str:
        return inputs.offered(cls, t5_file=t5_file, tokenizer=tokenizer)

    @classmethod
    def execute(cls, t5_file: str, tokenizer: str, prompt: str, negative_prompt: str, device: str) -> io.NodeOutput:
        t5_path = resolve_model_path(t5_file, T5_KINDS, "t5_file", want_dir=False)
        tokenizer_dir = (None if tokenizer == TOKENIZER_FROM_FILE
                         else resolve_model_path(tokenizer, TOKENIZER_KINDS, "tokenizer", want_dir=True))
        target = pick_device(device)
        text: TextEmbeddings = encode_text(
            t5_path, tokenizer_dir, prompt, negative_prompt, target,
            cache_dir=embedding_cache_dir(), check_interrupt=check_interrupt,
            before_load=lambda: make_room(target, t5_path, TEXT_WORKSPACE),
        )
        return io.NodeOutput(text)
