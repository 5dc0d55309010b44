"""Checks shared by the DiT expert loaders: does a weights file fit the model of config.json?

Everything here reads shapes from the file headers only, so a mismatched config.json or a
wrong folder is reported before a single weight is loaded.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Mapping, Sequence

import torch
from torch import nn

from ..wan.checkpoint_keys import count_blocks
from ..wan.config import DiTConfig, with_control_weight
from ..wan.model import LingBotDiT
from .errors import CheckpointError
from .layout import MAX_NUM_LAYERS
from .live import track
from .state_dict import expected_tensors

# The config fields that set tensor sizes (the rest: counts, flags, eps).
_SIZE_FIELDS = ("dim", "ffn_dim", "freq_dim", "text_dim", "in_dim", "out_dim", "patch_size")


def build_on_meta(config: DiTConfig, config_path: Path) -> LingBotDiT:
    """The model skeleton (no memory) for ``config``; a config the model rejects is an error."""
    try:
        with torch.device("meta"):
            return track(LingBotDiT(config))
    except ValueError as exc:
        raise CheckpointError(config_path, str(exc)) from exc


def config_with_control(config: DiTConfig, stored_shape: Sequence[int] | None, weights: Path) -> DiTConfig:
    """``config`` with ``control_type`` told by the stored shape [dim, in_features] of
    patch_embedding_wancamctrl.weight in ``weights`` (docs/conventions.md#act-checkpoint):
    config.json is the same for Base-Cam and Act. None (the file lacks the tensor) keeps
    ``config``; the missing key is reported by ``state_dict.check_keys``."""
    if stored_shape is None:
        return config
    try:
        return with_control_weight(config, stored_shape)
    except ValueError as exc:
        raise CheckpointError(weights, str(exc)) from exc


def linear_layers(model: nn.Module) -> dict[str, nn.Linear]:
    """Every nn.Linear of ``model`` by module name (4-bit layers included: they subclass it)."""
    return {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}


def check_block_count(config_path: Path, config: DiTConfig, weights: Path, keys: list[str]) -> None:
    """num_layers in config.json must equal the number of blocks stored in the weights,
    numbered 0..N-1 without a gap (read from the header keys, before anything is built)."""
    try:
        stored = count_blocks(keys, "blocks.", MAX_NUM_LAYERS)  # A14B: 40
    except ValueError as exc:
        raise CheckpointError(weights, str(exc)) from exc
    if stored != config.num_layers:
        span = f"blocks.0 ... blocks.{stored - 1}" if stored else "no blocks at all"
        raise CheckpointError(
            config_path,
            f"says num_layers={config.num_layers} but {weights} holds {stored} transformer block(s) ({span}); "
            "config.json and the weights do not belong together",
        )


def _perturbed(config: DiTConfig, field: str) -> DiTConfig:
    """``config`` with one size field changed (to a value the model still accepts)."""
    if field == "dim":  # keep dim divisible by num_heads with an even head dim
        return dataclasses.replace(config, dim=config.dim + 2 * config.num_heads)
    if field == "patch_size":
        pt, ph, pw = config.patch_size
        return dataclasses.replace(config, patch_size=(pt, ph + 1, pw))
    return dataclasses.replace(config, **{field: getattr(config, field) + 2})


def _meta_shapes(config: DiTConfig) -> dict[str, torch.Tensor]:
    try:
        with torch.device("meta"):
            return expected_tensors(LingBotDiT(config))
    except ValueError:
        return {}


def fields_behind(config: DiTConfig, key: str, axis: int) -> list[str]:
    """The config fields that set axis ``axis`` of tensor ``key``, found by changing each one
    and watching the shape (only used to word an error, so its cost does not matter)."""
    base = _meta_shapes(config)[key].shape[axis]
    found = []
    for field in _SIZE_FIELDS:
        shapes = _meta_shapes(_perturbed(config, field))
        if key in shapes and shapes[key].dim() > axis and shapes[key].shape[axis] != base:
            found.append(field)
    return found


def _axis_name(module: nn.Module | None, leaf: str, ndim: int, axis: int) -> str:
    if isinstance(module, nn.Linear) and leaf == "weight":
        return ("out_features", "in_features")[axis]
    if isinstance(module, nn.Conv3d) and leaf == "weight":
        return ("out_channels", "in_channels", "kernel frames", "kernel height", "kernel width")[axis]
    return "length" if ndim == 1 else f"size of axis {axis}"


def _field_value(config: DiTConfig, field: str) -> str:
    value = getattr(config, field)
    return f"{field}={list(value) if isinstance(value, tuple) else value}"


def check_shapes(
    config_path: Path,
    config: DiTConfig,
    model: nn.Module,
    stored: Mapping[str, tuple[int, ...]],
    file_of: Callable[[str], Path],
) -> None:
    """Compare the model's tensor shapes with ``stored`` (key -> shape as stored in
    ``file_of(key)``).

    A mismatch is reported against config.json, naming the config field that sets the size
    the file contradicts. Linear and conv weights are reported before biases and norms: their
    axis names (in_features, out_features) say the most.
    """
    expected = expected_tensors(model)
    wrong = [key for key, shape in stored.items() if tuple(shape) != tuple(expected[key].shape)]
    if not wrong:
        return
    def owner_and_leaf(key: str) -> tuple[nn.Module, str]:
        owner_name, _, leaf = key.rpartition(".")
        return (model.get_submodule(owner_name) if owner_name else model), leaf

    def is_layer_weight(key: str) -> bool:
        owner, leaf = owner_and_leaf(key)
        return leaf == "weight" and isinstance(owner, (nn.Linear, nn.Conv3d))

    order = {k: i for i, k in enumerate(stored)}
    key = min(wrong, key=lambda k: (not is_layer_weight(k), order[k]))
    shape, want = tuple(stored[key]), tuple(expected[key].shape)
    owner, leaf = owner_and_leaf(key)
    more = f" ({len(wrong) - 1} more tensor(s) disagree)" if len(wrong) > 1 else ""
    weights = file_of(key)
    problem = f"does not match {weights}: it stores {key} with shape {shape}, the model of config.json needs {want}{more}"
    if len(shape) == len(want):
        axis = next(i for i, (a, b) in enumerate(zip(shape, want)) if a != b)
        fields = fields_behind(config, key, axis)
        layer = key[: -len(".weight")] if leaf == "weight" else key
        if fields:
            problem = (
                f"says {' / '.join(_field_value(config, f) for f in fields)} but {weights} stores {layer} with "
                f"{_axis_name(owner, leaf, len(want), axis)} {shape[axis]} (shape {shape}, expected {want}){more}; "
                "config.json and the weights do not belong together"
            )
    raise CheckpointError(config_path, problem)


def float_dtype(dtype: torch.dtype):
    """A ``dtype_for`` callback for ``materialize``: floats become ``dtype``, others stay."""
    return lambda key, tensor: dtype if tensor.is_floating_point() else None
