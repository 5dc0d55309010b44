"""Expert folders written from a model in memory, for tests and benchmarks: the whole model
quantized or saved at once (the pack's own writers stream tensor by tensor from files:
``loaders/nf4_convert.py``, ``tools/synthetic/dit.py``)."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ...loaders.bf16 import DEFAULT_MAX_SHARD_BYTES, bf16_tensors, write_bf16_files
from ...loaders.dit_weights import linear_layers
from ...loaders.nf4 import VALID_BLOCKSIZES, NF4Meta, nf4_tensors, quantize_linear, write_nf4_files
from ...wan.model import LingBotDiT
from ...wan.runtime.bnb import Linear4bit, bnb
from ...wan.runtime.weights4 import BLOCKSIZE, DOUBLE_QUANT

__all__ = ["quantize_linears_", "save_bf16_expert", "save_nf4_expert"]


def quantize_linears_(
    model: nn.Module,
    blocksize: int = BLOCKSIZE,
    double_quant: bool = DOUBLE_QUANT,
    compute_dtype: torch.dtype = torch.bfloat16,
) -> nn.Module:
    """Replace every plain nn.Linear of ``model`` by its NF4 ``Linear4bit`` (in place), layer by layer."""
    for name, linear in linear_layers(model).items():
        if not isinstance(linear, Linear4bit):
            model.set_submodule(name, quantize_linear(linear, blocksize, double_quant, compute_dtype))
    return model


def save_nf4_expert(
    model: LingBotDiT,
    folder: str | Path,
    blocksize: int = BLOCKSIZE,
    double_quant: bool = DOUBLE_QUANT,
    compute_dtype: torch.dtype = torch.bfloat16,
    provenance: dict | None = None,
) -> Path:
    """Write ``model`` as an NF4 expert folder (layout A).

    Quantizes one nn.Linear at a time on the device it lives on; RAM holds the packed
    tensors (about a quarter of the bf16 size) on top of the caller's model.
    """
    if blocksize not in VALID_BLOCKSIZES:
        raise ValueError(f"blocksize {blocksize} is not one of {VALID_BLOCKSIZES}")
    extra = {"quantizer": f"bitsandbytes {bnb.__version__}", **(provenance or {})}
    meta = NF4Meta(blocksize=blocksize, double_quant=double_quant, compute_dtype=compute_dtype, extra=extra)
    meta.to_json()  # fail on a bad provenance before the slow part
    with torch.no_grad():
        tensors = dict(nf4_tensors(model, "", blocksize, double_quant, compute_dtype))
    return write_nf4_files(folder, model.config, tensors, meta)


def save_bf16_expert(
    model: LingBotDiT,
    folder: str | Path,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> Path:
    """Write ``model`` as a layout-B expert folder (bf16 shards, index, config.json)."""
    with torch.no_grad():
        return write_bf16_files(folder, model.config, bf16_tensors(model), max_shard_bytes)
