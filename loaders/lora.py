"""Read a Wan LoRA file (.safetensors) into per-layer factors for ``wan.runtime.lora``.

Key formats accepted (the ones ComfyUI users have for Wan; ComfyUI's own
``comfy.lora.model_lora_keys_unet`` maps the same names):

* kohya / ComfyUI: ``lora_unet_blocks_0_self_attn_q.lora_down.weight``, ``.lora_up.weight``
  and optionally ``.alpha`` (the layer name with ``.`` written as ``_``);
* diffusers / PEFT: ``diffusion_model.blocks.0.self_attn.q.lora_A.weight`` and
  ``.lora_B.weight``, with or without the ``diffusion_model.`` prefix;
* dotted names with ``lora_down``/``lora_up`` (+ ``.alpha``), with or without the prefix;
* whole-tensor differences as ComfyUI applies them: ``X.diff`` (X's weight), ``X.diff_b``
  (X's bias), ``X.diff_m`` (X's modulation), e.g. in the lightx2v distillation LoRAs.

The scale of one adapter is ``alpha / rank`` when the file stores an alpha, else 1 (as
ComfyUI does), times the user's strength. Anything else is refused with the file and key
named: keys of another kind (``.dora_scale``, ...), keys that match no layer or parameter,
shapes that do not fit the layer, a down without its up, and non-finite values.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import torch
from safetensors import safe_open
from torch import nn

from ..wan.runtime.lora import LoraFactors, linear_layers, parameter_shapes
from .errors import CheckpointError, preview

PREFIXES = ("model.diffusion_model.", "diffusion_model.")
KOHYA_PREFIX = "lora_unet_"
# suffix -> role
_SUFFIXES = {
    ".lora_down.weight": "down", ".lora_up.weight": "up",
    ".lora_A.weight": "down", ".lora_B.weight": "up",
    ".alpha": "alpha",
    ".diff_b": "diff_b", ".diff_m": "diff_m", ".diff": "diff",
}
# difference kind -> the parameter of the named module it changes
_DIFF_PARAM = {"diff": "weight", "diff_b": "bias", "diff_m": "modulation"}


@dataclass
class LoraFile:
    """What one file does to one expert: low-rank adapters per linear layer, and
    whole-tensor differences per parameter (already scaled by the strength)."""

    adapters: dict[str, list[LoraFactors]] = field(default_factory=dict)
    param_deltas: dict[str, torch.Tensor] = field(default_factory=dict)


def _split(key: str) -> tuple[str, str] | None:
    for suffix, role in _SUFFIXES.items():
        if key.endswith(suffix):
            return key[: -len(suffix)], role
    return None


def _layer_name(base: str, kohya: Mapping[str, str]) -> str | None:
    if base.startswith(KOHYA_PREFIX):
        return kohya.get(base[len(KOHYA_PREFIX):])
    for prefix in PREFIXES:
        if base.startswith(prefix):
            return base[len(prefix):]
    return base


def read_lora(path: str | Path, model: nn.Module, strength: float = 1.0) -> LoraFile:
    """The file's adapters and differences for ``model``'s layers, scaled by ``strength``.

    Every key's name and shape is checked from the file header before any tensor is read,
    so what is read is bounded by the layers it adapts: a 3 GiB tensor of the wrong shape
    (or of a rank beyond the layer's size) is refused unread.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(path, "LoRA file not found; put it in ComfyUI/models/loras")
    layers = linear_layers(model)
    shapes = parameter_shapes(model)
    modules = {name for name, _ in model.named_modules() if name}
    kohya = {name.replace(".", "_"): name for name in modules}
    try:
        handle = safe_open(str(path), framework="pt", device="cpu")
    except Exception as exc:  # noqa: BLE001 - any parse failure is a bad file
        raise CheckpointError(path, f"not a readable .safetensors file ({exc})") from exc
    result = LoraFile()
    with handle as f:
        keys = list(f.keys())
        if not keys:
            raise CheckpointError(path, "the file holds no tensors")
        unknown = [k for k in keys if _split(k) is None]
        if unknown:
            raise CheckpointError(path, f"keys of a kind this loader does not apply: {preview(unknown)} "
                                        "(supported: lora_down/lora_up/alpha and lora_A/lora_B)")
        header = {key: tuple(f.get_slice(key).get_shape()) for key in keys}
        targets = {key: _target(path, key, header[key], kohya, layers, shapes) for key in keys}
        adapters = _check_adapters(path, header, targets, layers)
        tensors: dict[str, torch.Tensor] = {}
        for key in keys:  # the whole file fits: now read it
            tensor = f.get_tensor(key)
            if not torch.isfinite(tensor.float()).all():
                raise CheckpointError(path, f"key {key!r} holds non-finite values (NaN or inf)")
            if _split(key)[1] in _DIFF_PARAM:  # type: ignore[index]
                result.param_deltas[targets[key]] = tensor.float() * strength
            else:
                tensors[key] = tensor
    for name, (down_key, up_key, alpha_key) in adapters.items():
        down, up = tensors[down_key], tensors[up_key]
        alpha = float(tensors[alpha_key]) if alpha_key is not None else None
        scale = (alpha / down.shape[0] if alpha is not None else 1.0) * strength
        result.adapters[name] = [LoraFactors(down, up, scale)]
    return result


def _target(path: Path, key: str, shape: tuple[int, ...], kohya: Mapping[str, str],
            layers: Mapping[str, tuple[int, int]], shapes: Mapping[str, tuple[int, ...]]) -> str:
    """The layer (adapter factors, alpha) or parameter (differences) ``key`` changes, from
    its name and header shape alone."""
    base, role = _split(key)  # type: ignore[misc]
    name = _layer_name(base, kohya)
    if role in _DIFF_PARAM:
        param = f"{name}.{_DIFF_PARAM[role]}" if name else None
        if param not in shapes:
            raise CheckpointError(path, f"key {key!r} matches no parameter of the expert "
                                        "(is this a LoRA for Wan2.2 A14B?)")
        if math.prod(shape) != math.prod(shapes[param]):
            raise CheckpointError(path, f"key {key!r} has shape {shape}, but {param} has shape {shapes[param]}")
        return param
    if name is None or name not in layers:
        raise CheckpointError(path, f"key {key!r} matches no linear layer of the expert "
                                    "(is this a LoRA for Wan2.2 A14B?)")
    if role == "alpha" and math.prod(shape) != 1:
        raise CheckpointError(path, f"key {key!r} should be one number, has shape {shape}")
    return name


def _check_adapters(path: Path, header: Mapping[str, tuple[int, ...]], targets: Mapping[str, str],
                    layers: Mapping[str, tuple[int, int]]) -> dict[str, tuple[str, str, str | None]]:
    """Layer -> (down key, up key, alpha key or None), after checking from the header that
    each layer has both factors, of shapes [r, in] and [out, r] with 1 <= r <= min(in, out)
    (a higher rank adds nothing that rank min(in, out) cannot hold)."""
    roles: dict[str, dict[str, str]] = defaultdict(dict)
    for key, target in targets.items():
        role = _split(key)[1]  # type: ignore[index]
        if role not in _DIFF_PARAM:
            roles[target][role] = key
    adapters = {}
    for name, got in roles.items():
        base = _split(next(iter(got.values())))[0]  # type: ignore[index]
        if "down" not in got or "up" not in got:
            missing = "down (lora_down / lora_A)" if "down" not in got else "up (lora_up / lora_B)"
            raise CheckpointError(path, f"layer key {base!r} has no {missing} weight")
        down, up = header[got["down"]], header[got["up"]]
        out_f, in_f = layers[name]
        if len(down) != 2 or len(up) != 2 or down[1] != in_f or up[0] != out_f or up[1] != down[0]:
            raise CheckpointError(path, f"key {base!r}: down {down} and up {up} do not fit layer {name} "
                                        f"({in_f} -> {out_f}; expected down [r, {in_f}], up [{out_f}, r])")
        rank = down[0]
        if rank < 1:
            raise CheckpointError(path, f"key {base!r} has rank 0 (down {down}, up {up}): an empty adapter, "
                                        "not a LoRA; the file is broken or was exported without weights")
        if rank > min(in_f, out_f):
            raise CheckpointError(path, f"key {base!r} has rank {rank}, more than layer {name} can use "
                                        f"({in_f} -> {out_f}: at most {min(in_f, out_f)}); the file is corrupt")
        adapters[name] = (got["down"], got["up"], got.get("alpha"))
    return adapters
