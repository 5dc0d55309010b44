"""Stage 1: prompts -> umT5 embeddings, with the encoder freed before returning."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..loaders.comfy_t5 import ComfyT5File, is_comfy_t5_file
from ..loaders.errors import CheckpointError
from ..loaders.t5_loader import load_t5
from ..wan.geometry import MAX_TOKENS
from ..wan.t5 import encode_prompts
from ..wan.tokenizer import UMT5Tokenizer
from ..wan.negative_prompt import DEFAULT_NEGATIVE_PROMPT
from .guards import cancel_between, check_finite, check_text
from .memory import build_or_release, release_module, resolve_device
from .text_cache import EmbeddingCache



@dataclass
class TextEmbeddings:
    positive: torch.Tensor  # [L_pos, text_dim], trimmed to the prompt's true length
    negative: torch.Tensor  # [L_neg, text_dim]
    from_cache: bool  # True when the encoder was not loaded at all
    # The texts as the T5 node was given them (None: embeddings from elsewhere, e.g. a core
    # CONDITIONING): a Play session's action log records them so that it replays alone.
    prompt: str | None = None
    negative_prompt: str | None = None


def load_tokenizer(t5_file: Path, tokenizer_dir: Path | None) -> UMT5Tokenizer:
    """The folder's tokenizer, or with ``tokenizer_dir`` None the one stored in ``t5_file``
    (ComfyUI's umT5 .safetensors files carry their SentencePiece model as ``spiece_model``)."""
    if tokenizer_dir is not None:
        return UMT5Tokenizer(tokenizer_dir)
    if not is_comfy_t5_file(t5_file):
        raise CheckpointError(
            t5_file, "holds no tokenizer (only ComfyUI's umt5_xxl_*.safetensors files do); choose the tokenizer "
            "folder that came with it",
        )
    return UMT5Tokenizer.from_sentencepiece_bytes(ComfyT5File(t5_file).tokenizer_bytes(), f"{t5_file}:spiece_model")


def encode_text(
    t5_file: str | Path,
    tokenizer_dir: str | Path | None,
    prompt: str,
    negative_prompt: str,
    device: torch.device | str | None = None,
    cache_dir: str | Path | None = None,
    dtype: torch.dtype = torch.bfloat16,
    check_interrupt: Callable[[], None] | None = None,
    before_load: Callable[[], None] | None = None,
) -> TextEmbeddings:
    """Encode both prompts. Only prompts missing from the cache load the encoder.

    ``tokenizer_dir`` None: use the tokenizer stored in ``t5_file`` (ComfyUI's files).
    ``before_load`` runs just before the encoder is loaded (never on a cache hit): the
    place to make room on the device.
    """
    # As the reference: an empty prompt is encoded like any other, an empty negative prompt
    # means the model's default one.
    prompt, negative_prompt = check_text(prompt, "prompt"), check_text(negative_prompt, "negative_prompt")
    given_negative = negative_prompt
    negative_prompt = negative_prompt or DEFAULT_NEGATIVE_PROMPT
    t5_file = Path(t5_file)
    tokenizer_dir = None if tokenizer_dir is None else Path(tokenizer_dir)
    device = resolve_device(device)
    texts = [prompt, negative_prompt]
    cache = EmbeddingCache(Path(cache_dir), t5_file, tokenizer_dir, MAX_TOKENS, dtype) if cache_dir else None
    found = [cache.get(t) if cache else None for t in texts]
    missing = [t for t, f in zip(texts, found) if f is None]
    if missing:
        tokenizer = load_tokenizer(t5_file, tokenizer_dir)  # fails fast, before the big load
        if before_load:
            before_load()
        encoder = build_or_release(lambda: load_t5(t5_file, device, dtype))  # a failed load frees its part
        try:
            if check_interrupt:
                check_interrupt()
            with cancel_between(encoder.blocks, check_interrupt):  # a cancel acts within one layer
                encoded = encode_prompts(encoder, tokenizer, list(dict.fromkeys(missing)), device, max_len=MAX_TOKENS)
            for emb in encoded:
                check_finite(emb, f"the prompt embedding from {t5_file.name}", "NaN or inf weights in the text encoder")
        finally:
            release_module(encoder)
            del encoder
        fresh = {t: e.to("cpu") for t, e in zip(dict.fromkeys(missing), encoded)}
        if cache:
            for text, emb in fresh.items():
                cache.put(text, emb)
        found = [f if f is not None else fresh[t] for t, f in zip(texts, found)]
    return TextEmbeddings(positive=found[0], negative=found[1], from_cache=not missing, prompt=prompt,
                          negative_prompt=given_negative)
