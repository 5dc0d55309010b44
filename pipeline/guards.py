"""Checks shared by the stages: values that must be finite, and cancel between layers."""
from __future__ import annotations

import contextlib
from typing import Callable, Iterable, Iterator

import torch
from torch import nn

# The VAE precisions a user can pick; float32 is what the reference runs (docs/conventions.md#reference-behaviours).
VAE_PRECISIONS: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16}


class NonFiniteError(ValueError):
    """A tensor turned NaN or infinite; the message names the stage and the likely cause."""


def is_finite(tensor: torch.Tensor) -> bool:
    """One fused reduction and one device-to-host read: cheap enough for every step."""
    return bool(torch.isfinite(tensor).all())


def check_finite(tensor: torch.Tensor, what: str, causes: str) -> None:
    """Raise NonFiniteError naming ``what`` and the likely ``causes`` unless all values are finite."""
    if not is_finite(tensor):
        raise NonFiniteError(f"{what} holds NaN or infinite values; likely cause: {causes}. "
                             "Nothing was produced from it (it would have been a black or noise video).")


def vae_precision(precision: str) -> torch.dtype:
    try:
        return VAE_PRECISIONS[precision]
    except KeyError:
        raise ValueError(f"VAE precision {precision!r} is not one of {', '.join(VAE_PRECISIONS)}; "
                         "fp32 matches the reference, bf16 halves the VAE's memory") from None


@contextlib.contextmanager
def cancel_between(layers: Iterable[nn.Module], cancel: Callable[[], None] | None) -> Iterator[None]:
    """Call ``cancel`` (which raises to stop) before each of ``layers`` runs, for the duration.

    A forward pre-hook is one Python call per layer: cancel then acts within one layer's
    time instead of one whole forward's.
    """
    if cancel is None:
        yield
        return
    handles = [layer.register_forward_pre_hook(lambda *_: cancel()) for layer in layers]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def check_text(value: str | None, field: str) -> str:
    """``value`` as a str that can be encoded (None is ""); a lone UTF-16 surrogate (what a
    broken copy-paste or a JSON "\\ud800" escape leaves) is refused naming ``field``,
    rather than silently replaced, since the prompt would then not be what was typed."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{field}: expected text, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{field}: character {exc.start} is a lone surrogate (U+{ord(value[exc.start]):04X}), not text; "
            "delete it or paste the text again") from None
    return value
