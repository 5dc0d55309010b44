"""How a run uses its GPUs, as data: the loaders' ``devices`` modes, and ``auto``'s one rule.

``DEVICES_MODES`` has one row per mode: the GPUs it needs, its strategy, which loaders offer
it (the DiT Loader's two experts with CFG, ``base``; the Fast DiT Loader's one causal
transformer, ``fast``) and when ``auto`` picks it. Both loaders, the worker pool, the
benchmark and docs/multi_gpu.md read it; ``decide_devices`` is the one place a ``devices``
choice (``auto`` included) becomes a row and a GPU count.

Strategies (``STRATEGIES``):

- ``one_device``: everything on one device (``single``).
- ``expert_slots``: copies of the experts on device *slots* 0, 1, ... in this process
  (``Placement``): ``expert_per_gpu`` puts the high-noise expert on slot 0 and the
  low-noise one on slot 1 (they share no device, so neither is freed when the other takes
  over, and both may stay resident between runs); ``cfg_split`` puts the running expert on
  slots 0 and 1, the conditional branch on slot 0 and the unconditional one on slot 1 in the
  same step (at the boundary both copies of the high-noise expert are freed before the
  low-noise one loads on both). The rules are about slots, so a CPU test can give two slots
  the same device and still check the plan.
- ``ulysses``: one process per GPU, one forward's tokens split over them
  (``wan/runtime/parallel.py``; the worker processes in ``pipeline/parallel_pool/``); a
  batched-CFG forward on 4 or more GPUs (an even count) runs as ``Degrees(cfg=2)``: the
  prompt and negative samples on the two halves of the GPUs (``split_degrees``).
- ``vae_on_next_gpu``: the transformer on ComfyUI's GPU, the VAE's streams on the next one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

BASE, FAST = "base", "fast"
MODELS = (BASE, FAST)
AUTO = "auto"
STRATEGIES = ("one_device", "expert_slots", "ulysses", "vae_on_next_gpu")
# When ``auto`` picks a row: fewer than 2 GPUs usable; a link at or above NVLINK_CLASS_GBPS;
# a slower link (or no group of 2 or more GPUs that divides the model's heads).
ONE_GPU, FAST_LINK, SLOW_LINK = "one_gpu", "fast_link", "slow_link"
AUTO_SITUATIONS = (ONE_GPU, FAST_LINK, SLOW_LINK)

# Effective all-to-all bandwidth (bytes each rank sends to the others per second,
# ``RankPool.measure_link``) from which the link counts as NVLink-class and sequence parallel
# pays. NVLink pairs measure several times this and peer-to-peer-less PCIe pairs a fraction of
# it (docs/multi_gpu.md, "Sequence parallel"): it sits between the two with room on both sides.
NVLINK_CLASS_GBPS = 40.0


@dataclass(frozen=True)
class DevicesMode:
    """One ``devices`` mode of the loaders."""

    name: str
    gpus: int  # the least it needs
    strategy: str  # one of STRATEGIES
    models: tuple[str, ...]  # the loaders that offer it (BASE, FAST)
    auto_when: str | None  # the AUTO_SITUATIONS entry in which ``auto`` picks it; None: never
    summary: str  # what runs where, for docs/multi_gpu.md's table
    experts: dict[str, tuple[int, ...]] | None = None  # expert_slots and single: expert -> its slots
    max_gpus: int | None = None  # None: as many as divide the model's heads (ulysses)

    def needs(self) -> str:
        """How many CUDA GPUs it needs, in words ("2", "2 or more")."""
        return f"{self.gpus}" if self.max_gpus == self.gpus else f"{self.gpus} or more"


DEVICES_MODES: dict[str, DevicesMode] = {row.name: row for row in (
    DevicesMode("single", 1, "one_device", MODELS, ONE_GPU,
                "one GPU: the experts take turns (Fast: the transformer)",
                experts={"high": (0,), "low": (0,)}, max_gpus=1),
    DevicesMode("expert_per_gpu", 2, "expert_slots", (BASE,), None,
                "the high-noise expert on GPU 0, the low-noise one on GPU 1; both stay loaded",
                experts={"high": (0,), "low": (1,)}, max_gpus=2),
    DevicesMode("cfg_split", 2, "expert_slots", (BASE,), SLOW_LINK,
                "the running expert on GPUs 0 and 1: the prompt branch on GPU 0, the negative one on GPU 1",
                experts={"high": (0, 1), "low": (0, 1)}, max_gpus=2),
    DevicesMode("sequence_parallel", 2, "ulysses", MODELS, FAST_LINK,
                "every forward's tokens split over 2 or more GPUs (a divisor of the heads), a worker process per "
                "extra GPU; with CFG on 4 or more (an even count): 2 groups, one per branch"),
    DevicesMode("decode_on_second_gpu", 2, "vae_on_next_gpu", (FAST,), SLOW_LINK,
                "the transformer on GPU 0, the VAE of Play and Fast Long Video on GPU 1", max_gpus=2),
)}
# The modes with expert slots, in the DiT Loader's order (``single`` first: its default).
PLACEMENTS = tuple(name for name, row in DEVICES_MODES.items() if row.experts is not None)
GPUS_NEEDED = {name: row.gpus for name, row in DEVICES_MODES.items()}
EXPERTS = ("high", "low")


def devices_choices(model: str) -> tuple[str, ...]:
    """The ``devices`` combo of ``model``'s loader: its rows in table order, then ``auto``."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; expected one of {', '.join(MODELS)}")
    return (*(name for name, row in DEVICES_MODES.items() if model in row.models), AUTO)


def auto_mode(model: str, situation: str) -> DevicesMode:
    """The row ``auto`` picks for ``model`` in ``situation`` (one of AUTO_SITUATIONS)."""
    rows = [row for row in DEVICES_MODES.values() if model in row.models and row.auto_when == situation]
    if len(rows) != 1:
        raise ValueError(f"DEVICES_MODES has {len(rows)} rows that auto picks for {model} in {situation}; "
                         "it needs exactly one")
    return rows[0]


# ----------------------------------------------------------------------------- degrees of a Ulysses group

@dataclass(frozen=True)
class Degrees:
    """How a parallel forward's ranks split (xDiT's ParallelConfig): ``cfg`` groups (1, or 2:
    one per CFG branch) of ``ulysses`` ranks each, sharing the tokens; ``world`` ranks in all."""

    ulysses: int
    cfg: int = 1

    def __post_init__(self) -> None:
        if self.cfg not in (1, 2) or self.ulysses < 1:
            raise ValueError(f"parallel degrees: cfg {self.cfg} (1 or 2) x ulysses {self.ulysses} (1 or more)")

    @property
    def world(self) -> int:
        return self.cfg * self.ulysses

    def check_heads(self, heads: int) -> None:
        if heads % self.ulysses:
            raise ValueError(f"sequence parallel over {self.ulysses} GPUs needs a head count divisible by "
                             f"{self.ulysses}; the model has {heads} heads")


def split_degrees(world: int) -> Degrees:
    """The degrees of a batched-CFG forward (prompt and negative) on ``world`` ranks: two
    groups, one per branch, from 4 ranks on (an even count); else one group of all."""
    if world >= 4 and world % 2 == 0:
        return Degrees(ulysses=world // 2, cfg=2)
    return Degrees(ulysses=world)


def sequence_parallel_size(heads: int, count: int) -> int:
    """The most GPUs of ``count`` a Ulysses group can use (a divisor of ``heads``, at least
    2); 0 when none can."""
    return max((p for p in range(2, count + 1) if heads % p == 0), default=0)


# ----------------------------------------------------------------------------- the one devices rule

@dataclass(frozen=True)
class DevicesDecision:
    """What a ``devices`` choice runs: the row and its GPUs (ComfyUI's first; empty for
    ``single`` on a host without one), and for ``auto`` the link it measured and why
    (``said``: the words of the log and of model_info)."""

    mode: DevicesMode
    devices: tuple[torch.device, ...]
    said: str
    gbps: float | None = None


def check_devices(choice: str, model: str, gpu_count: int, host: str) -> DevicesMode | None:
    """Refuse a choice ``model``'s loader does not offer, or a mode with too few GPUs
    (``gpu_count``: the CUDA GPUs usable, 0 when ComfyUI computes on the CPU; ``host`` says
    so in words). The row, or None for ``auto`` (which never refuses)."""
    choices = devices_choices(model)
    if choice not in choices:
        raise ValueError(f"devices: {choice!r} is not one of {', '.join(choices)}")
    if choice == AUTO:
        return None
    row = DEVICES_MODES[choice]
    if gpu_count < row.gpus and row.gpus > 1:
        raise ValueError(f"devices={choice} needs {row.needs()} CUDA GPUs, but {host}; choose devices=single, or "
                         f"start ComfyUI where {row.gpus} GPUs are visible (CUDA_VISIBLE_DEVICES)")
    return row


def decide_devices(choice: str, model: str, gpus: Sequence[torch.device], heads: int, host: str,
                   measure_link: Callable[[tuple[torch.device, ...]], float]) -> DevicesDecision:
    """The one rule for a loader's ``devices`` (both loaders call it; ``gpus``: the usable
    CUDA GPUs, ComfyUI's first, empty when it computes on the CPU; ``host`` says how many in
    words):

    - a mode by name runs as asked on the first of ``gpus`` (``sequence_parallel``: as many
      as divide the model's ``heads``), refused with too few;
    - ``auto``: with fewer than 2 GPUs, ``single``; else ``measure_link(group)`` times an
      all-to-all over the GPUs of a Ulysses group (GB/s): at or above NVLINK_CLASS_GBPS the
      loader's fast-link row (``sequence_parallel``), below it (or with no group that divides
      the heads) its slow-link row (``cfg_split`` for the DiT Loader, ``decode_on_second_gpu``
      for the Fast one): DEVICES_MODES' ``auto_when``.
    """
    gpus = tuple(torch.device(g) for g in gpus)
    row = check_devices(choice, model, len(gpus), host)
    if row is None and len(gpus) < 2:
        return DevicesDecision(auto_mode(model, ONE_GPU), gpus[:1], f"auto -> single ({host})")
    if row is None:
        group = _devices_of(auto_mode(model, FAST_LINK), gpus, heads)
        if not group:
            row = auto_mode(model, SLOW_LINK)
            return DevicesDecision(row, _devices_of(row, gpus, heads), f"auto -> {row.name} (no group of 2 or more "
                                   f"GPUs divides the model's {heads} heads)")
        gbps = float(measure_link(group))
        situation = FAST_LINK if gbps >= NVLINK_CLASS_GBPS else SLOW_LINK
        row = auto_mode(model, situation)
        under = "" if situation == FAST_LINK else f", under {NVLINK_CLASS_GBPS:.0f} GB/s"
        names = ", ".join(str(g) for g in group)
        return DevicesDecision(row, _devices_of(row, gpus, heads),
                               f"auto -> {row.name} (all-to-all {gbps:.1f} GB/s between {names}{under})", gbps)
    devices = _devices_of(row, gpus, heads)
    if not devices and row.gpus > 1:
        raise ValueError(f"devices={choice} needs 2 or more GPUs whose count divides the model's {heads} heads; "
                         f"{host}")
    return DevicesDecision(row, devices, "")


def _devices_of(row: DevicesMode, gpus: tuple[torch.device, ...], heads: int) -> tuple[torch.device, ...]:
    """The GPUs ``row`` runs on: its first ``max_gpus``; for a Ulysses split as many as divide
    the heads (at most ``max_gpus``), none when no group of 2 or more does."""
    count = min(len(gpus), row.max_gpus or len(gpus))
    if row.strategy == "ulysses":
        return gpus[:sequence_parallel_size(heads, count)]
    return gpus[:count]


def modes_table() -> str:
    """DEVICES_MODES as the markdown table of docs/multi_gpu.md (a test keeps the doc equal)."""
    lines = ["| devices | GPUs | strategy | DiT Loader | Fast DiT Loader | `auto` picks it | what runs where |",
             "|---|---|---|---|---|---|---|"]
    when = {ONE_GPU: "fewer than 2 GPUs", FAST_LINK: f"link ≥ {NVLINK_CLASS_GBPS:.0f} GB/s",
            SLOW_LINK: "slower link", None: "never"}
    for row in DEVICES_MODES.values():
        offered = ["yes" if model in row.models else "—" for model in MODELS]
        gpus = row.needs() if row.gpus > 1 else "1"
        lines.append(f"| `{row.name}` | {gpus} | {row.strategy} | {offered[0]} | {offered[1]} | "
                     f"{when[row.auto_when]} | {row.summary} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- expert slots

@dataclass(frozen=True)
class Switch:
    """What happens at the boundary from one expert to the other, as (expert, slot) pairs."""

    free: tuple[tuple[str, int], ...]  # copies dropped before the next expert loads
    load: tuple[tuple[str, int], ...]  # copies of the next expert brought in
    keep: tuple[tuple[str, int], ...]  # copies of the previous expert that stay resident
    latent_from: int  # slot the latent leaves (the previous expert's first slot)
    latent_to: int  # slot it moves to


@dataclass(frozen=True)
class Placement:
    """A mode with expert slots (PLACEMENTS) on real devices: slot -> device."""

    mode: str
    devices: tuple[torch.device, ...]  # slot -> device

    def __post_init__(self) -> None:
        if self.mode not in PLACEMENTS:
            raise ValueError(f"devices: {self.mode!r} is not one of {', '.join(PLACEMENTS)}")
        if len(self.devices) < GPUS_NEEDED[self.mode]:
            raise ValueError(f"devices={self.mode} needs {GPUS_NEEDED[self.mode]} devices, got {len(self.devices)}")

    def slots(self, expert: str) -> tuple[int, ...]:
        if expert not in EXPERTS:
            raise ValueError(f"unknown expert {expert!r}; expected 'high' or 'low'")
        return DEVICES_MODES[self.mode].experts[expert]

    def devices_of(self, expert: str) -> tuple[torch.device, ...]:
        """The devices holding ``expert``; the first runs the conditional branch."""
        return tuple(self.devices[s] for s in self.slots(expert))

    @property
    def cfg_split(self) -> bool:
        """The unconditional branch runs on a second copy of the running expert."""
        return len(self.slots("high")) > 1

    def conflicts(self, expert: str, other: str) -> tuple[int, ...]:
        """Slots of ``other`` that ``expert`` needs: those copies go before ``expert`` loads."""
        mine = set(self.slots(expert))
        return tuple(s for s in self.slots(other) if s in mine)

    @property
    def keep_resident(self) -> bool:
        """True when the experts share no slot: neither ever has to give way to the other, so
        both stay resident (the sources' ``keep_resident``)."""
        return not self.conflicts("low", "high")

    def switch(self, previous: str, following: str) -> Switch:
        freed = self.conflicts(following, previous)
        return Switch(
            free=tuple((previous, s) for s in freed),
            load=tuple((following, s) for s in self.slots(following)),
            keep=tuple((previous, s) for s in self.slots(previous) if s not in freed),
            latent_from=self.slots(previous)[0],
            latent_to=self.slots(following)[0],
        )


def single(device: torch.device | str) -> Placement:
    return Placement("single", (torch.device(device),))


def cuda_placement(mode: str, device_count: int, first: int = 0) -> Placement:
    """The placement ``mode`` on CUDA GPUs ``first``, ``first + 1``, ... (wrapping), checking the count."""
    if mode not in PLACEMENTS:
        raise ValueError(f"devices: {mode!r} is not one of {', '.join(PLACEMENTS)}")
    check_devices(mode, BASE, device_count, f"torch.cuda.device_count() is {device_count}")
    order = [(first + i) % device_count for i in range(device_count)]
    return Placement(mode, tuple(torch.device("cuda", i) for i in order[:GPUS_NEEDED[mode]]))


def placement_on(mode: str, devices: Sequence[torch.device | str]) -> Placement:
    """The placement ``mode`` on explicit devices (tests, benchmarks: e.g. two CPU slots)."""
    return Placement(mode, tuple(torch.device(d) for d in devices))
