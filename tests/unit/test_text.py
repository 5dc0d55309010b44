"""pipeline/text.py: the text stage frees the encoder, caches the embeddings, and encodes
prompts as the reference does (the text cache itself: test_fail_safe.py's cache cases)."""
from __future__ import annotations

import weakref

import pytest
import torch

from comfyui_lingbot_world.loaders.package import find_package
from comfyui_lingbot_world.pipeline import text as text_stage
from comfyui_lingbot_world.wan.negative_prompt import DEFAULT_NEGATIVE_PROMPT


def test_text_stage_frees_encoder_and_caches(packages, tmp_path, monkeypatch):
    files = find_package(packages["nf4"])
    loaded: list[weakref.ref] = []
    real_load = text_stage.load_t5

    def tracking(path, device, dtype):
        module = real_load(path, device, dtype)
        loaded.append(weakref.ref(module))
        return module

    monkeypatch.setattr(text_stage, "load_t5", tracking)
    first = text_stage.encode_text(files.t5, files.tokenizer, "a red fox", "blurry", "cpu", cache_dir=tmp_path)
    assert not first.from_cache and len(loaded) == 1
    module = loaded[0]()
    assert module is None or all(p is None for p in module._parameters.values())

    def refuse(*a, **k):
        raise AssertionError("the encoder must not load for a cached prompt")

    monkeypatch.setattr(text_stage, "load_t5", refuse)
    again = text_stage.encode_text(files.t5, files.tokenizer, "a red fox", "blurry", "cpu", cache_dir=tmp_path)
    assert again.from_cache
    assert torch.equal(again.positive, first.positive) and torch.equal(again.negative, first.negative)


def test_empty_prompt_is_encoded_and_empty_negative_is_the_default(packages):
    """The reference encodes an empty prompt like any other (just </s>) and replaces an
    empty negative prompt by the config's default one (docs/conventions.md#reference-behaviours)."""
    files = find_package(packages["nf4"])
    empty = text_stage.encode_text(files.t5, files.tokenizer, "", "", "cpu")
    default = text_stage.encode_text(files.t5, files.tokenizer, "", DEFAULT_NEGATIVE_PROMPT, "cpu")
    assert empty.positive.shape[0] == 1  # the end-of-sequence token alone
    torch.testing.assert_close(empty.negative, default.negative)
    assert empty.negative.shape[0] > 50  # the long default prompt, not an empty one
    with pytest.raises(ValueError, match="negative_prompt: character 1 is a lone surrogate"):
        text_stage.encode_text(files.t5, files.tokenizer, "x", "a\udfff", "cpu")
