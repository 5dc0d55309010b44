"""The prompt cache validates what it reads: an entry with the right key
but the wrong embedding width used to break its prompt on every run; now it is dropped, with
a warning, and the prompt is encoded again."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import tiny_package
from comfyui_lingbot_world.pipeline import text as text_stage
from comfyui_lingbot_world.pipeline import text_cache
from comfyui_lingbot_world.pipeline.text_cache import EmbeddingCache


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    return tiny_package.build(tmp_path_factory.mktemp("prompt_cache"), "nf4")


def _forge(cache: EmbeddingCache, text: str, embedding: torch.Tensor) -> Path:
    """An entry under ``text``'s own key (right name, right metadata) holding ``embedding``."""
    key = cache._key(text)
    path = cache._path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({text_cache._TENSOR: embedding}, str(path), metadata={text_cache._KEY: key})
    return path


def test_entry_of_the_wrong_width_is_dropped_with_a_warning(package, tmp_path, caplog):
    cache = EmbeddingCache(tmp_path / "cache", package / "models_t5_umt5-xxl-enc-bf16.pth", package / "tokenizer")
    assert cache.width == 32  # the tiny encoder's
    path = _forge(cache, "a fox", torch.randn(5, 48).to(torch.bfloat16))
    with caplog.at_level(logging.WARNING):
        assert cache.get("a fox") is None
    assert "dropped entry" in caplog.text and "(5, 48)" in caplog.text
    assert not path.exists()


def test_text_stage_heals_a_bad_entry_on_the_next_run(package, tmp_path, caplog):
    t5, tokenizer = package / "models_t5_umt5-xxl-enc-bf16.pth", package / "tokenizer"
    cache_dir = tmp_path / "cache"
    cache = EmbeddingCache(cache_dir, t5, tokenizer, text_stage.MAX_TOKENS)
    _forge(cache, "a fox", torch.randn(5, 48).to(torch.bfloat16))
    first = text_stage.encode_text(t5, tokenizer, "a fox", "", "cpu", cache_dir=cache_dir)
    assert first.positive.shape[-1] == 32 and not first.from_cache
    again = text_stage.encode_text(t5, tokenizer, "a fox", "", "cpu", cache_dir=cache_dir)
    assert again.from_cache and torch.equal(again.positive, first.positive)


def test_unreadable_entry_is_dropped_too(package, tmp_path, caplog):
    cache = EmbeddingCache(tmp_path / "cache", package / "models_t5_umt5-xxl-enc-bf16.pth", package / "tokenizer")
    path = cache._path(cache._key("an owl"))
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x00" * 40)
    with caplog.at_level(logging.WARNING):
        assert cache.get("an owl") is None
    assert not path.exists() and "cannot be read" in caplog.text
