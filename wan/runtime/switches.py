"""The pack's process switches: every ``LINGBOT_*`` environment variable, each parsed here and
nowhere else, with one rule for what its value means and one line saying what it does.

On/off switches: unset or empty keeps the default; ``1``, ``true``, ``on``, ``yes`` turn it on
and ``0``, ``false``, ``off``, ``no`` off (any case, spaces ignored); anything else is refused
naming the variable, the value and what it takes. The switches are read when they are used
(a test or a bench may change one between runs); ``check`` reads them all at once, which the
command line does before any model loads. The README's table of switches is this module's
``SWITCHES`` (``tests/unit/test_switches.py`` holds them equal).
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

T = TypeVar("T")

_ON = ("1", "true", "on", "yes")
_OFF = ("0", "false", "off", "no")


@dataclass(frozen=True)
class Switch(Generic[T]):
    """One environment variable: its name, its default, what it takes and what it does."""

    name: str
    default: T
    doc: str  # what it does (the README's table)
    parse: Callable[[str], T]  # the stripped, non-empty value -> T; ValueError when it is not one
    takes: Callable[[], str]  # what it takes, for messages and the README

    def raw(self) -> str:
        """The variable's value, stripped ("" when unset)."""
        return os.environ.get(self.name, "").strip()

    def value(self) -> T:
        """The switch's value now: the default when unset or empty; ValueError naming the
        variable, the value and what it takes when it is none of those."""
        raw = self.raw()
        if not raw:
            return self.default
        try:
            return self.parse(raw)
        except ValueError:
            raise ValueError(f"{self.name}={raw!r} is not a value it takes: {self.takes()}; "
                             f"unset {self.name} for its default") from None

    def __call__(self) -> T:
        return self.value()


def _flag(raw: str) -> bool:
    word = raw.lower()
    if word in _ON:
        return True
    if word in _OFF:
        return False
    raise ValueError(raw)


def flag(name: str, doc: str, default: bool = True) -> Switch[bool]:
    """An on/off switch (the one truthiness rule above)."""
    return Switch(name, default, doc, _flag,
                  lambda: f"0 or 1 (unset: {int(default)})")


def _attention_backends() -> tuple[str, ...]:
    # The table's own names (wan/runtime/attention.py imports this module: read it when asked).
    return importlib.import_module(f"{__package__}.attention").BACKENDS


def _backend(raw: str) -> str:
    name = raw.lower()
    if name not in _attention_backends():
        raise ValueError(raw)
    return name


def count(name: str, doc: str, default: int, minimum: int, unit: str) -> Switch[int]:
    """A whole number of ``unit``, ``minimum`` or more."""
    def parse(raw: str) -> int:
        number = int(raw)  # ValueError for anything but a whole number
        if number < minimum:
            raise ValueError(raw)
        return number
    return Switch(name, default, doc, parse, lambda: f"a whole number of {unit}, {minimum} or more (unset: {default})")


ATTENTION: Switch[str | None] = Switch(
    "LINGBOT_ATTENTION", None,
    "the kernel attention `auto` runs, in every node and the command line (a node's or `--attention`'s own "
    "choice still wins); one that cannot run here is refused before any model loads",
    _backend, lambda: f"one of {', '.join(_attention_backends())} (unset: auto's own pick)")
FUSED = flag("LINGBOT_FUSED", "the fused Triton kernels on CUDA; 0: the PyTorch ops (the same numbers, slower)")
CUDA_GRAPHS = flag("LINGBOT_CUDA_GRAPHS", "LingBot-World Fast's passes captured once as CUDA graphs and replayed "
                   "(never under PyTorch's cudaMallocAsync allocator, ComfyUI's default); 0: every pass eager")
KV_FP8_KEEP = flag("LINGBOT_KV_FP8_KEEP", "a bf16 Fast KV cache keeps `flash_fp8`'s fp8 cast of its committed "
                   "frames between passes; 0: cast again on every pass (less memory, slower)")
FP8_FAST_ACCUM = flag("LINGBOT_FP8_FAST_ACCUM", "fp8 GEMMs on Hopper skip the periodic float32 promotion of their "
                      "partial sums; 0: promoted accumulation (slower, a little closer to float32)")
SWAP_SPREAD = flag("LINGBOT_SWAP_SPREAD", "block swap spreads the swapped blocks over the stack, so each copy "
                   "hides behind the blocks before it; 0: the last blocks (to compare)")
SP_OVERLAP = flag("LINGBOT_SP_OVERLAP", "sequence parallel runs each all-to-all beside the next projection; 0: one "
                  "after the other (the same output)")
STREAM_PRIORITY = flag("LINGBOT_STREAM_PRIORITY", "LingBot-World Fast generates a chunk on a high-priority CUDA "
                       "stream beside the previous chunk's decode; 0: one stream priority")
# Each cancel exchange's flag is read at the next one, so the host waits for the GPU at every
# exchange; every 8 blocks keeps it further ahead than every block (bench/RESULTS.md).
CANCEL_SYNC_BLOCKS = count("LINGBOT_CANCEL_SYNC_BLOCKS", "blocks between two cancel checks shared by the GPUs of "
                           "a several-GPU forward (every rank must agree)", 8, 1, "blocks")

SWITCHES: dict[str, Switch] = {s.name: s for s in (ATTENTION, FUSED, CUDA_GRAPHS, KV_FP8_KEEP, FP8_FAST_ACCUM,
                                                   SWAP_SPREAD, SP_OVERLAP, STREAM_PRIORITY, CANCEL_SYNC_BLOCKS)}


def check() -> None:
    """Read every switch now; ValueError naming each variable set to a value it does not take."""
    wrong = []
    for switch in SWITCHES.values():
        try:
            switch.value()
        except ValueError as exc:
            wrong.append(str(exc))
    if wrong:
        raise ValueError("; ".join(wrong))


__all__ = ["ATTENTION", "CANCEL_SYNC_BLOCKS", "CUDA_GRAPHS", "FP8_FAST_ACCUM", "FUSED", "KV_FP8_KEEP", "SP_OVERLAP",
           "STREAM_PRIORITY", "SWAP_SPREAD", "SWITCHES", "Switch", "check", "count", "flag"]
