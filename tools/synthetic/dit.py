"""Random (synthetic) DiT experts for tests and benchmarks, in either checkpoint layout.

Every tensor is drawn from its own generator, seeded by (seed, state-dict key), so a model
built in memory and one streamed to disk part by part hold the same values, whatever order
they are made in. Values depend on the device's random generator (CPU and CUDA differ).

Why not ``LingBotDiT.init_weights``: it initialises the whole model at once, and the writers
must never hold a whole A14B expert (37 GB in bf16). The rules below follow the same spirit
(Xavier-uniform linears, unit norms, modulation ~ N(0, 1/dim)) but are per tensor, and they
keep biases non-zero so that round-trip tests compare real values everywhere.
"""
from __future__ import annotations

import contextlib
import hashlib
import math
import re
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import torch
from torch import nn

from ...wan.config import DiTConfig
from ...wan.runtime.bnb import bnb
from ...wan.model import LingBotDiT
from ...loaders.bf16 import DEFAULT_MAX_SHARD_BYTES, write_bf16_files
from ...loaders.nf4 import NF4Meta, nf4_tensors, write_nf4_files

_BLOCK_PREFIX = re.compile(r"^blocks\.(\d+)$")


def _key_seed(seed: int, key: str) -> int:
    digest = hashlib.blake2b(f"{seed}/{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def _seed_key(key: str, distinct_blocks: int | None) -> str:
    """The key whose seed ``key`` uses: blocks past ``distinct_blocks`` repeat the earlier ones."""
    if distinct_blocks:
        match = re.match(r"^blocks\.(\d+)\.", key)
        if match:
            return f"blocks.{int(match.group(1)) % distinct_blocks}." + key[match.end():]
    return key


@torch.no_grad()
def _fill(owner: nn.Module, leaf: str, tensor: torch.Tensor, generator: torch.Generator, dim: int) -> None:
    values = torch.empty(tensor.shape, dtype=torch.float32, device=tensor.device)
    if leaf == "weight" and isinstance(owner, (nn.Linear, nn.Conv3d)):
        fan_out = tensor.shape[0]
        fan_in = tensor.numel() // fan_out
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        values.uniform_(-bound, bound, generator=generator)
    elif leaf == "weight" and tensor.dim() == 1:  # RMS / layer norm gains
        values.normal_(1.0, 0.05, generator=generator)
    elif leaf == "modulation":
        values.normal_(0.0, dim**-0.5, generator=generator)
    else:  # biases and anything else
        values.normal_(0.0, 0.02, generator=generator)
    tensor.copy_(values)


@torch.no_grad()
def fill_synthetic_(
    module: nn.Module, config: DiTConfig, seed: int, prefix: str = "", distinct_blocks: int | None = None,
) -> nn.Module:
    """Give every tensor of a materialized ``module`` (named ``prefix`` in the expert) its synthetic values."""
    for key, tensor in module.state_dict(keep_vars=True).items():
        owner_name, _, leaf = key.rpartition(".")
        owner = module.get_submodule(owner_name) if owner_name else module
        generator = torch.Generator(device=tensor.device)
        generator.manual_seed(_key_seed(seed, _seed_key(prefix + key, distinct_blocks)))
        _fill(owner, leaf, tensor, generator, config.dim)
    return module


def make_synthetic_expert(
    config: DiTConfig, seed: int = 0, device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16,
) -> LingBotDiT:
    """A whole random expert on ``device`` (meant for small geometries; A14B needs ~37 GB in bf16)."""
    with torch.device("meta"):
        model = LingBotDiT(config)
    model.to_empty(device=device)
    fill_synthetic_(model, config, seed)
    return model.to(dtype).eval().requires_grad_(False)


def expert_parts(model: LingBotDiT) -> Iterator[tuple[str, nn.Module]]:
    """The expert as (prefix, module) pieces small enough to hold one at a time: each top-level
    layer, then each transformer block."""
    if any(True for _ in model.named_parameters(recurse=False)) or any(True for _ in model.named_buffers(recurse=False)):
        raise ValueError("LingBotDiT holds tensors outside its submodules; expert_parts would miss them")
    for name, child in model.named_children():
        if name == "blocks":
            for index, block in enumerate(child):
                yield f"blocks.{index}", block
        else:
            yield name, child


def _counted(parts: Iterator[tuple[str, nn.Module]], on_part: Callable[[int, int], None] | None
             ) -> Iterator[tuple[str, nn.Module]]:
    """``parts`` with ``on_part(done, total)`` called after each one is handled."""
    parts = list(parts)
    for done, item in enumerate(parts, 1):
        yield item
        if on_part is not None:
            on_part(done, len(parts))


@contextlib.contextmanager
def _materialized(part: nn.Module, prefix: str, config: DiTConfig, seed: int, device: torch.device | str,
                  dtype: torch.dtype, distinct_blocks: int | None) -> Iterator[nn.Module]:
    """``part`` holding its synthetic values on ``device`` for the duration; back on meta after."""
    part.to_empty(device=device)
    try:
        fill_synthetic_(part, config, seed, prefix + ".", distinct_blocks)
        yield part.to(dtype)
    finally:
        part.to_empty(device="meta")


def _repeated_block(prefix: str, distinct_blocks: int | None) -> int | None:
    """Index of the earlier block that block ``prefix`` copies, or None."""
    match = _BLOCK_PREFIX.match(prefix)
    if distinct_blocks and match and int(match.group(1)) >= distinct_blocks:
        return int(match.group(1)) % distinct_blocks
    return None


def write_synthetic_nf4_expert(
    folder: str | Path,
    config: DiTConfig,
    seed: int = 0,
    device: torch.device | str = "cpu",
    blocksize: int = 64,
    double_quant: bool = True,
    distinct_blocks: int | None = None,
    config_fields: Mapping[str, Any] | None = None,
    on_part: Callable[[int, int], None] | None = None,
) -> Path:
    """Write a random NF4 expert (layout A) without ever holding it in bf16.

    Each part is made on ``device``, quantized there by bitsandbytes and kept only as packed
    CPU tensors. ``distinct_blocks=k`` makes block i a copy of block i % k (same values, no
    new quantization): large files for size and memory tests, cheaply. ``config_fields``:
    config.json as given (the Fast transformer's, ``loaders.model_kind.fast_config_fields``).
    ``on_part(done, total)`` after each part (``expert_parts``) is made.
    """
    with torch.device("meta"):
        model = LingBotDiT(config)
    tensors: dict[str, torch.Tensor] = {}
    for prefix, part in _counted(expert_parts(model), on_part):
        source_block = _repeated_block(prefix, distinct_blocks)
        if source_block is not None:
            source = f"blocks.{source_block}."
            for key in [k for k in tensors if k.startswith(source)]:
                # safetensors refuses tensors that share memory, hence the clone.
                tensors[f"{prefix}.{key[len(source):]}"] = tensors[key].clone()
            continue
        with _materialized(part, prefix, config, seed, device, torch.bfloat16, distinct_blocks) as live:
            tensors.update(nf4_tensors(live, prefix + ".", blocksize, double_quant, torch.bfloat16))
    provenance = {"source": "synthetic (comfyui_lingbot_world.tools.synthetic.dit)", "seed": seed}
    meta = NF4Meta(blocksize=blocksize, double_quant=double_quant, compute_dtype=torch.bfloat16,
                   extra={"quantizer": f"bitsandbytes {bnb.__version__}", **provenance})
    return write_nf4_files(folder, config, tensors, meta, config_fields)


def write_synthetic_bf16_expert(
    folder: str | Path,
    config: DiTConfig,
    seed: int = 0,
    device: torch.device | str = "cpu",
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    distinct_blocks: int | None = None,
    config_fields: Mapping[str, Any] | None = None,
    on_part: Callable[[int, int], None] | None = None,
) -> Path:
    """Write a random bf16 expert (layout B); memory holds one part plus one shard at most.
    ``config_fields``: config.json as given, ``on_part`` as for the NF4 writer."""
    with torch.device("meta"):
        model = LingBotDiT(config)

    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        for prefix, part in _counted(expert_parts(model), on_part):
            with _materialized(part, prefix, config, seed, device, torch.bfloat16, distinct_blocks) as live:
                for key, tensor in live.state_dict().items():
                    yield f"{prefix}.{key}", tensor.to("cpu")

    return write_bf16_files(folder, config, stream(), max_shard_bytes, config_fields)
