"""Low-rank adapters (LoRA) on an expert's linear layers, without touching its weights.

A LoRA on a linear layer ``y = x W^T + b`` adds ``scale · (x A^T) B^T`` (A: ``down``
[rank, in], B: ``up`` [out, rank]). Two ways to apply it:

* unmerged (``attach_lora``): the factors hang on the layer (attribute ``LORA_ATTR``);
  a call of the layer itself gets the product added by a forward hook, and ``dense()``
  (the DiT blocks' path, which dequantizes a layer's weight once per block) adds
  ``scale · B A`` to its dense copy. The layer's own weight, 4-bit or not, is never
  written, so ``detach_lora`` restores the expert exactly. The factors live on the
  compute device for the whole run: block swap moves only the layers' ``weight``
  parameters and leaves them alone.
* merged (``merge_lora``, floating-point weights only): ``W += scale · B A`` in place.
  Cheaper per step, but the expert is changed until it is loaded again.

Adapter files may also carry whole-tensor differences for small parameters (biases,
norm weights, block modulation: ComfyUI's ``diff`` / ``diff_b`` / ``diff_m`` keys, found in
the lightx2v distillation LoRAs). ``apply_param_deltas`` adds those in place and keeps a
copy of each original, which ``detach_lora`` puts back. A 4-bit weight is refused.

Pure PyTorch; nothing here knows file formats (see ``loaders.lora``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

import torch
from torch import nn

from .weights8 import is_8bit

LORA_ATTR = "lingbot_lora"
_HOOK_ATTR = "lingbot_lora_hook"
_BACKUP_ATTR = "lingbot_lora_originals"


@dataclass(frozen=True)
class LoraFactors:
    """One adapter on one layer: down [rank, in], up [out, rank], and the total scale
    (alpha / rank times the user's strength)."""

    down: torch.Tensor
    up: torch.Tensor
    scale: float

    def delta(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """scale · B A as a dense [out, in] matrix (computed in float32)."""
        up, down = self.up.to(device, torch.float32), self.down.to(device, torch.float32)
        return (up @ down).mul_(self.scale).to(dtype)


def linear_layers(model: nn.Module) -> dict[str, tuple[int, int]]:
    """Module name -> (out_features, in_features) of every linear layer (4-bit ones included)."""
    return {name: (m.out_features, m.in_features) for name, m in model.named_modules() if isinstance(m, nn.Linear)}


def add_lora_delta(layer: nn.Module, matrix: torch.Tensor) -> torch.Tensor:
    """``matrix + Σ scale · B A`` for the adapters on ``layer`` (a new tensor; ``matrix``
    itself is returned when there are none). One fused addmm per adapter, in the
    matrix's dtype (the product accumulates in float32 inside the matmul)."""
    for f in getattr(layer, LORA_ATTR, ()):
        up, down = f.up.to(matrix.device, matrix.dtype), f.down.to(matrix.device, matrix.dtype)
        matrix = torch.addmm(matrix, up, down, alpha=f.scale)
    return matrix


def _output_hook(layer: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
    x = inputs[0]
    for f in getattr(layer, LORA_ATTR, ()):
        down, up = f.down.to(x.device, output.dtype), f.up.to(x.device, output.dtype)
        output = output + (x.to(output.dtype) @ down.t() @ up.t()) * f.scale
    return output


def _check_shapes(name: str, layer: nn.Module, f: LoraFactors) -> None:
    out_f, in_f = layer.out_features, layer.in_features
    rank = f.down.shape[0]
    if f.down.dim() != 2 or f.up.dim() != 2 or f.down.shape[1] != in_f or f.up.shape != (out_f, rank):
        raise ValueError(f"LoRA for layer {name!r}: down {tuple(f.down.shape)} and up {tuple(f.up.shape)} do not fit "
                         f"a linear layer of {in_f} -> {out_f} features (expected down [r, {in_f}], up [{out_f}, r])")


def attach_lora(model: nn.Module, adapters: Mapping[str, Iterable[LoraFactors]],
                device: torch.device | str | None = None) -> None:
    """Hang ``adapters`` (layer name -> factors) on the model's layers, unmerged.

    ``device``: where the factors live (the compute device; default: the model's first
    parameter's device). Adapters already attached stay; new ones stack on them."""
    device = torch.device(device) if device is not None else next(model.parameters()).device
    for name, factors in adapters.items():
        try:
            layer = model.get_submodule(name)
        except AttributeError as exc:
            raise KeyError(f"LoRA targets layer {name!r}, which this expert does not have") from exc
        if not isinstance(layer, nn.Linear):
            raise TypeError(f"LoRA targets {name!r}, a {type(layer).__name__}; only linear layers take a LoRA")
        factors = list(factors)
        for f in factors:
            _check_shapes(name, layer, f)
        moved = [LoraFactors(f.down.to(device), f.up.to(device), float(f.scale)) for f in factors]
        object.__setattr__(layer, LORA_ATTR, tuple(getattr(layer, LORA_ATTR, ())) + tuple(moved))
        if getattr(layer, _HOOK_ATTR, None) is None:
            object.__setattr__(layer, _HOOK_ATTR, layer.register_forward_hook(_output_hook))


def parameter_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Parameter name -> logical shape (a 4-bit linear weight as [out, in])."""
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    for name, (out_f, in_f) in linear_layers(model).items():
        shapes[f"{name}.weight"] = (out_f, in_f)
    return shapes


def _is_quantized(param: torch.Tensor) -> bool:
    return getattr(param, "quant_state", None) is not None or not param.dtype.is_floating_point or is_8bit(param)


@torch.no_grad()
def apply_param_deltas(model: nn.Module, deltas: Mapping[str, torch.Tensor]) -> None:
    """``param += delta`` for each named parameter, keeping the original for ``detach_lora``."""
    originals: dict[str, torch.Tensor] = model.__dict__.setdefault(_BACKUP_ATTR, {})
    params = dict(model.named_parameters())
    for name, delta in deltas.items():
        param = params.get(name)
        if param is None:
            raise KeyError(f"LoRA difference for {name!r}: this expert has no such parameter")
        if _is_quantized(param):
            raise TypeError(f"LoRA difference for {name!r}: the weight is 4-bit; a full-weight difference cannot be "
                            "added without dequantizing it (use a bf16 expert for this LoRA)")
        if delta.numel() != param.numel():
            raise ValueError(f"LoRA difference for {name!r} has shape {tuple(delta.shape)}, the parameter "
                             f"{tuple(param.shape)}")
        if name not in originals:
            originals[name] = param.data.clone()
        param.data += delta.to(param.device, param.dtype).reshape(param.shape)


def detach_lora(model: nn.Module) -> int:
    """Remove every unmerged adapter and put back parameters changed by
    ``apply_param_deltas``; returns the number of layers that had an adapter."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, original in model.__dict__.pop(_BACKUP_ATTR, {}).items():
            params[name].data.copy_(original)
    count = 0
    for layer in model.modules():
        hook = layer.__dict__.pop(_HOOK_ATTR, None)
        if hook is not None:
            hook.remove()
        if layer.__dict__.pop(LORA_ATTR, None):
            count += 1
    return count


def has_lora(model: nn.Module) -> bool:
    return bool(model.__dict__.get(_BACKUP_ATTR)) or any(getattr(m, LORA_ATTR, None) for m in model.modules())


@torch.no_grad()
def merge_lora(model: nn.Module, adapters: Mapping[str, Iterable[LoraFactors]]) -> None:
    """``W += scale · B A`` in place for floating-point layers (also weights block swap
    keeps in host memory). A 4-bit layer is refused: use ``attach_lora`` for those."""
    for name, factors in adapters.items():
        layer = model.get_submodule(name)
        weight = layer.weight
        if _is_quantized(weight):
            raise TypeError(f"LoRA merge into {name!r}: its weight is quantized ({weight.dtype}); "
                            "apply the LoRA unmerged (attach_lora) on 4-bit and 8-bit experts")
        for f in factors:
            _check_shapes(name, layer, f)
            weight.data += f.delta(weight.dtype, weight.device)
