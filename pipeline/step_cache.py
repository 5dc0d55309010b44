"""Fewer model evaluations per video: step caching (EasyCache rule) and CFG truncation.

The sampler asks a ``StepPolicy`` for each step's velocity instead of calling the expert
itself. With every option off the policy calls ``expert.velocity`` exactly as the sampler
did before, so the exact path is unchanged bit for bit.

Step caching follows EasyCache (Zhou et al. 2025, "Less is Enough: Training-Free Video
Diffusion Acceleration via Runtime-Adaptive Caching", arXiv 2507.02860), as its authors
apply it to Wan2.2 A14B:

* the cached quantity is the model's *transformation*, output − input, one per CFG branch;
  a skipped step returns ``input + transformation`` for each branch;
* after two computed steps the transformation rate ``k = mean|Δoutput| / mean|Δinput|``
  (between the last two computed steps, conditional branch) is known; at each later step
  the predicted relative output change ``k · mean|x_t − x_{t−1}| / mean|last output|`` is
  added to an accumulator; while the sum stays under the threshold the step is skipped,
  otherwise the step is computed and the sum starts again from 0;
* the decision is made on the conditional branch and applies to both branches together
  (a skipped step saves both forwards; each branch reuses its own transformation);
* the first ``warmup`` steps and the last step of each expert are always computed, and
  the state is reset when the expert changes (the two experts are different networks).

The authors' default for Wan2.2 I2V-A14B is a threshold of 0.05 (0.06 for T2V) with a
warm-up of 7 forwards counted over both branches, i.e. the first 4 steps of each expert.
Their Wan2.2 script always computes the last two steps of the high-noise expert and the
last step of the low-noise one; here the last step of each expert is computed (as their
single-model Wan2.1 rule does for the last step of the run).

CFG truncation drops the unconditional branch for the last ``cfg_truncate`` fraction of
the steps (the velocity is then the conditional prediction alone, as with guidance 1).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import torch

# EasyCache authors' settings for Wan2.2 I2V-A14B (their easycache_generate.py defaults).
EASYCACHE_I2V_THRESHOLD = 0.05
EASYCACHE_T2V_THRESHOLD = 0.06
EASYCACHE_WARMUP_STEPS = 4


class Expert(Protocol):
    """What the policy needs from the sampler's resident expert."""

    def velocity(self, latent: torch.Tensor, timestep: float, guide: float, batch_cfg: bool) -> torch.Tensor: ...

    def branches(self, latent: torch.Tensor, timestep: float, uncond: bool,
                 batch_cfg: bool) -> tuple[torch.Tensor, torch.Tensor | None]: ...


@dataclass
class StepStats:
    """Counts of one sampling run, for callers and benchmarks."""

    steps: int = 0
    forwards: int = 0  # model evaluations actually computed (one per CFG branch)
    skipped_forwards: int = 0  # evaluations replaced by the cache
    truncated_forwards: int = 0  # unconditional evaluations dropped by CFG truncation
    computed_steps: list[int] = field(default_factory=list)
    cached_steps: list[int] = field(default_factory=list)
    # (step, predicted relative output change) for every step the cache rule judged: shows
    # how far a run was from skipping (the threshold is compared with their running sum).
    predicted_changes: list[tuple[int, float]] = field(default_factory=list)


def combine(cond: torch.Tensor, uncond: torch.Tensor | None, guide: float) -> torch.Tensor:
    """Classifier-free guidance, written as the sampler always has (bit-identical)."""
    if uncond is None:
        return cond.float()
    return (uncond + guide * (cond - uncond)).float()


def truncated_steps(steps: int, fraction: float) -> int:
    """How many final steps run without the unconditional branch."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"cfg_truncate must be within 0..1 (a fraction of the steps), got {fraction}")
    return int(math.floor(fraction * steps + 1e-9))


def _mean_abs(t: torch.Tensor) -> float:
    return float(t.float().abs().mean())


class EasyCacheRule:
    """The skip decision of EasyCache for one expert's run of steps (see module docstring).

    ``decide(x, step, last)`` returns True when the step must be computed; after a
    computed step the caller reports the conditional output with ``computed(x, output)``.
    """

    def __init__(self, threshold: float, warmup: int = EASYCACHE_WARMUP_STEPS) -> None:
        if threshold < 0:
            raise ValueError(f"cache threshold must be 0 (off) or positive, got {threshold}")
        if warmup < 0:
            raise ValueError(f"cache warm-up must be 0 or more steps, got {warmup}")
        self.threshold, self.warmup = threshold, warmup
        self.reset()

    def reset(self) -> None:
        self.accumulated = 0.0
        self.k: float | None = None
        self.prev_input: torch.Tensor | None = None  # input of the previous step, computed or not
        self.last_computed_input: torch.Tensor | None = None
        self.last_output: torch.Tensor | None = None  # conditional output of the last computed step
        self.predicted: list[float] = []  # the accumulator after each decided step (for tests/logs)
        self.change: float | None = None  # the last step's predicted change, if the rule judged it

    def decide(self, x: torch.Tensor, step_in_expert: int, last_in_expert: bool) -> bool:
        compute = True
        self.change = None
        if step_in_expert < self.warmup or last_in_expert:
            self.accumulated = 0.0
        elif self.k is not None and self.prev_input is not None and self.last_output is not None:
            change = self.k * _mean_abs(x - self.prev_input) / max(_mean_abs(self.last_output), 1e-12)
            self.change = change
            self.accumulated += change
            self.predicted.append(self.accumulated)
            if self.accumulated < self.threshold:
                compute = False
            else:
                self.accumulated = 0.0
        self.prev_input = x.clone()
        return compute

    def computed(self, x: torch.Tensor, output: torch.Tensor) -> None:
        if self.last_output is not None and self.last_computed_input is not None:
            input_change = _mean_abs(x - self.last_computed_input)
            if input_change > 0:
                self.k = _mean_abs(output - self.last_output) / input_change
        self.last_computed_input = x.clone()
        self.last_output = output.detach().float().clone()


class StepPolicy:
    """Computes, reuses or truncates each step's model evaluations; counts what it did.

    ``cache_threshold`` 0 and ``cfg_truncate`` 0 leave the sampler exactly as it was.
    """

    def __init__(self, steps: int, cache_threshold: float = 0.0, cache_warmup: int = EASYCACHE_WARMUP_STEPS,
                 cfg_truncate: float = 0.0, batch_cfg: bool = True, stats: StepStats | None = None) -> None:
        self.steps = steps
        self.batch_cfg = batch_cfg
        self.first_truncated = steps - truncated_steps(steps, cfg_truncate)
        self.rule = EasyCacheRule(cache_threshold, cache_warmup) if cache_threshold > 0 else None
        self.stats = stats if stats is not None else StepStats()
        self.stats.steps = steps
        self._transforms: tuple[torch.Tensor, torch.Tensor | None] | None = None

    def expert_changed(self) -> None:
        """The expert changed: cached transformations of the other network are meaningless."""
        if self.rule is not None:
            self.rule.reset()
        self._transforms = None

    def velocity(self, expert: Expert, latent: torch.Tensor, timestep: float, guide: float, index: int,
                 step_in_expert: int, last_in_expert: bool) -> torch.Tensor:
        uncond = guide != 1.0 and index < self.first_truncated
        if guide != 1.0 and not uncond:
            self.stats.truncated_forwards += 1
        if self.rule is None:
            self.stats.forwards += 2 if uncond else 1
            self.stats.computed_steps.append(index)
            if uncond:  # the sampler's own call: bit-identical to the exact path
                return expert.velocity(latent, timestep, guide, self.batch_cfg)
            cond, _ = expert.branches(latent, timestep, False, self.batch_cfg)
            return combine(cond, None, guide)
        x = latent.float()
        compute = self.rule.decide(x, step_in_expert, last_in_expert)
        if self.rule.change is not None:
            self.stats.predicted_changes.append((index, self.rule.change))
        cached = self._transforms
        if not compute and cached is not None and (not uncond or cached[1] is not None):
            self.stats.skipped_forwards += 2 if uncond else 1
            self.stats.cached_steps.append(index)
            cond = (x + cached[0]).to(latent.device)
            return combine(cond, (x + cached[1]).to(latent.device) if uncond else None, guide)
        cond, un = expert.branches(latent, timestep, uncond, self.batch_cfg)
        self.stats.forwards += 2 if uncond else 1
        self.stats.computed_steps.append(index)
        cond_f = cond.float()
        self.rule.computed(x, cond_f)
        self._transforms = (cond_f - x, None if un is None else un.float() - x)
        return combine(cond, un, guide)
