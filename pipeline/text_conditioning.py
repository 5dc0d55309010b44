"""ComfyUI CONDITIONING (core CLIPLoader type wan + CLIPTextEncode) -> the pack's TextEmbeddings.

ComfyUI's umT5 pads every prompt to at least 512 tokens and zeroes the padded rows
(``zero_out_masked``); some hosts also put an ``attention_mask`` in the extras. The pack's
DiT takes each prompt at its true length (like the reference), so the padding is cut off.
"""
from __future__ import annotations

from typing import Any

import torch

from .guards import check_finite
from .text import TextEmbeddings


def _true_length(embedding: torch.Tensor, extras: dict) -> int:
    mask = extras.get("attention_mask") if isinstance(extras, dict) else None
    if isinstance(mask, torch.Tensor) and mask.numel() >= 1:
        length = int(mask.reshape(-1)[: embedding.shape[0]].gt(0).sum())
    else:  # padded rows are exact zeros: the length runs to the last non-zero row
        nonzero = embedding.abs().amax(dim=-1).gt(0).nonzero()
        length = int(nonzero[-1]) + 1 if len(nonzero) else 0
    return max(length, 1)  # an empty prompt still has its end token


def embedding_from_conditioning(conditioning: Any, field: str) -> torch.Tensor:
    """One CONDITIONING list [[emb [1, L, dim], extras], ...] -> [L_true, dim] (CPU)."""
    if not isinstance(conditioning, (list, tuple)) or not conditioning:
        raise ValueError(f"{field}: expected a CONDITIONING from CLIP Text Encode, got {type(conditioning).__name__}")
    if len(conditioning) != 1:
        raise ValueError(
            f"{field}: holds {len(conditioning)} conditionings (combined or timestep-ranged); "
            "connect a single CLIP Text Encode"
        )
    entry = conditioning[0]
    if not isinstance(entry, (list, tuple)) or len(entry) < 1 or not isinstance(entry[0], torch.Tensor):
        raise ValueError(f"{field}: not a CONDITIONING entry [tensor, dict]; connect CLIP Text Encode")
    embedding, extras = entry[0], (entry[1] if len(entry) > 1 else {})
    if embedding.dim() != 3 or embedding.shape[0] != 1:
        raise ValueError(
            f"{field}: embedding has shape {tuple(embedding.shape)}; expected [1, tokens, dim] from a umT5 "
            "text encoder (CLIPLoader with type wan)"
        )
    embedding = embedding[0]
    if embedding.shape[0] == 0 or embedding.shape[1] == 0 or not embedding.is_floating_point():
        raise ValueError(
            f"{field}: the CONDITIONING is empty (embedding of shape [1, {embedding.shape[0]}, {embedding.shape[1]}], "
            f"{embedding.dtype}); connect CLIP Text Encode (CLIPLoader type wan) with the {field} prompt"
        )
    # Here, not in the sampler: a NaN conditioning would otherwise surface as a NaN latent
    # blamed on the expert file.
    check_finite(embedding, f"{field}: the CONDITIONING from CLIP Text Encode",
                 "NaN or inf weights in the text encoder file CLIPLoader loaded, or a node that changed the "
                 "conditioning; encode the prompt again with a good umT5 file")
    if field == "positive" and not bool(embedding.abs().amax() > 0):
        raise ValueError(
            "positive: the CONDITIONING is all zeros (a Conditioning Zero Out?); the prompt must come from CLIP Text "
            "Encode. (An all-zero negative is accepted: it means no negative prompt.)"
        )
    return embedding[: _true_length(embedding, extras)].detach().to("cpu").contiguous()


def text_from_conditioning(positive: Any, negative: Any) -> TextEmbeddings:
    """Core CONDITIONING pair -> TextEmbeddings, each trimmed to its true token length."""
    if negative is None:
        raise ValueError("negative: connect a negative CONDITIONING (CLIP Text Encode) next to positive")
    pos = embedding_from_conditioning(positive, "positive")
    neg = embedding_from_conditioning(negative, "negative")
    if pos.shape[-1] != neg.shape[-1]:
        raise ValueError(f"positive has {pos.shape[-1]} features per token but negative {neg.shape[-1]}; "
                         "encode both with the same text encoder")
    return TextEmbeddings(positive=pos, negative=neg, from_cache=False)
