"""nodes/text_encode.py: LingBot-World T5 Encode + Unload inside the ComfyUI host (CPU)."""
from __future__ import annotations

import pytest
import torch

from comfy_host import comfy_state_reset, use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
from node_runs import PKG, encode_prompt  # noqa: E402
from comfyui_lingbot_world.nodes.text_encode import LingBotWorldTextEncode, embedding_cache_dir  # noqa: E402
from comfyui_lingbot_world.pipeline.text import TextEmbeddings  # noqa: E402


clean_comfy_state = pytest.fixture(autouse=True)(comfy_state_reset)


def test_text_node_encodes_caches_and_validates(installed):
    text = encode_prompt()
    assert isinstance(text, TextEmbeddings) and not text.from_cache
    assert text.positive.dim() == 2 and text.negative.dim() == 2
    cache = embedding_cache_dir()
    assert cache.is_relative_to(installed["user"]) and any(cache.iterdir())
    again = encode_prompt()
    assert again.from_cache
    torch.testing.assert_close(again.positive, text.positive)
    with pytest.raises(ValueError, match="prompt: character 2 is a lone surrogate"):
        LingBotWorldTextEncode.execute(f"{PKG}/models_t5_umt5-xxl-enc-bf16.pth", f"{PKG}/tokenizer", "ab\ud800", "", "auto")
    with pytest.raises(ValueError, match="tokenizer: folder"):
        LingBotWorldTextEncode.execute(f"{PKG}/models_t5_umt5-xxl-enc-bf16.pth", f"{PKG}/nope", "x", "", "auto")
