"""LoRA adapters on the experts for one run: a strength per expert, applied on acquire."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..loaders.errors import CheckpointError
from ..loaders.lora import read_lora
from ..wan.runtime.lora import apply_param_deltas, attach_lora, detach_lora, merge_lora
from .sampling import ExpertSource


@dataclass(frozen=True)
class LoraSpec:
    """One LoRA file and its strength on each expert (0 leaves that expert alone)."""

    path: Path
    strength_high: float = 1.0
    strength_low: float = 1.0

    def strength(self, expert: str) -> float:
        return self.strength_high if expert == "high" else self.strength_low


class LoraExperts:
    """An ExpertSource whose experts carry the given LoRAs while they are acquired.

    Unmerged (default): the adapters are attached on acquire and detached on release, so
    the expert (4-bit or bf16, with or without block swap) is left exactly as loaded for
    the next run. ``merge=True`` (bf16 experts only) adds them into the weights instead;
    use it only with a source that loads a fresh expert per acquire (``DiskExperts``),
    because the merged weights stay changed until the expert is loaded again.
    """

    def __init__(self, source: ExpertSource, loras: list[LoraSpec], merge: bool = False) -> None:
        self.source, self.loras, self.merge = source, list(loras), merge
        self._models: dict[str, nn.Module] = {}

    def acquire(self, name: str) -> nn.Module:
        model = self.source.acquire(name)
        if self._models.get(name) is model:
            return model  # already carries this run's adapters
        detach_lora(model)  # adapters of an earlier, interrupted run
        try:
            for spec in self.loras:
                strength = spec.strength(name)
                if strength == 0:
                    continue
                lora = read_lora(spec.path, model, strength)
                try:
                    if self.merge:
                        merge_lora(model, lora.adapters)
                    else:
                        attach_lora(model, lora.adapters, _compute_device(model))
                    apply_param_deltas(model, lora.param_deltas)
                except (TypeError, KeyError, ValueError) as exc:
                    raise CheckpointError(spec.path, f"cannot apply to the {name}-noise expert: {exc}") from exc
        except Exception:
            detach_lora(model)
            self.source.release(name)
            raise
        self._models[name] = model
        return model

    def release(self, name: str) -> None:
        model = self._models.pop(name, None)
        if model is not None:
            detach_lora(model)
        self.source.release(name)


def _compute_device(model: nn.Module) -> torch.device:
    """Where the blocks compute: the head's weight never moves under block swap."""
    head = getattr(model, "head", None)
    params = list(head.parameters()) if head is not None else []
    return (params[0] if params else next(model.parameters())).device
