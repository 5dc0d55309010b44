"""Flow-matching samplers: the noise schedule, UniPC (order 2, bh2) and plain Euler.

The model predicts the flow ``v`` of the straight path x_σ = (1-σ)·x0 + σ·noise, so a clean
estimate is ``x0 = x - σ·v``. Both samplers walk the same shifted schedule from σ≈1 to 0.

The schedule follows the LingBot-World reference exactly (docs/conventions.md#sampling-schedule): the training range
σ ∈ [1 - 1/T, 0] (T = 1000 training timesteps, the top value stored as float32) is cut into
``steps`` equal pieces, the last point (0) is dropped, every σ is shifted with
σ' = s·σ / (1 + (s-1)·σ), and a final σ = 0 is appended. The reference hands the DiT integer
timesteps (σ'·T truncated towards zero); ``.timesteps`` holds those same values as floats.

The "lightning" schedule is the one the Wan2.2-Lightning / LightX2V step-distilled adapters
were trained at (docs/conventions.md#wan22-lightning): σ = 1 − i/steps (from exactly 1, i.e. their step list 1000, 750,
500, 250 for 4 steps), shifted the same way, and the DiT gets the float timesteps σ'·T
(1000, 937.5, 833.33…, 625 at shift 5), not truncated.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "DEFAULT_FAST_STEPS",
    "FAST_STEPS",
    "FAST_STEP_INDICES",
    "FAST_TIMESTEP_INDICES",
    "FastSchedule",
    "SAMPLERS",
    "SAMPLER_CLASSES",
    "SCHEDULES",
    "FlowEulerSampler",
    "FlowUniPCSampler",
    "flow_sigmas",
    "fast_schedule",
    "fast_step_indices",
    "flow_timesteps",
    "make_sampler",
]

SCHEDULES = ("wan", "lightning")


def _check_schedule_args(steps: int, shift: float, num_train_timesteps: int, schedule: str = "wan") -> None:
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps must be a positive integer; got {steps!r}")
    if not math.isfinite(float(shift)) or float(shift) <= 0:
        raise ValueError(f"shift must be a finite number > 0; got {shift!r}")
    if num_train_timesteps < 2:
        raise ValueError(f"num_train_timesteps must be >= 2; got {num_train_timesteps!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")


def _shifted_schedule(steps: int, shift: float, num_train_timesteps: int, schedule: str = "wan") -> np.ndarray:
    """The ``steps`` shifted sigmas (float64, without the final 0)."""
    _check_schedule_args(steps, shift, num_train_timesteps, schedule)
    # The reference derives its top sigma from a float32 training table, so 1 - 1/T is
    # rounded to float32 before the linspace; the bottom of that table is exactly 0.
    # The Lightning adapters start at sigma 1 itself (their step list starts at T).
    sigma_top = 1.0 if schedule == "lightning" else float(np.float32(1.0 - 1.0 / num_train_timesteps))
    sigmas = np.linspace(sigma_top, 0.0, steps + 1)[:-1]
    shift = float(shift)
    return shift * sigmas / (1.0 + (shift - 1.0) * sigmas)


def flow_sigmas(steps: int, shift: float, num_train_timesteps: int = 1000, schedule: str = "wan") -> torch.Tensor:
    """Shifted sigmas of a ``steps``-step run plus the final 0: float32 [steps + 1]."""
    sigmas = _shifted_schedule(steps, shift, num_train_timesteps, schedule)
    return torch.from_numpy(np.append(sigmas, 0.0).astype(np.float32))


def flow_timesteps(steps: int, shift: float, num_train_timesteps: int = 1000, schedule: str = "wan") -> torch.Tensor:
    """DiT timesteps of a ``steps``-step run: float32 [steps].

    "wan": integer-valued. The reference converts σ'·T to int64 (truncation) before calling
    the model, so the model never sees fractional timesteps; we keep that so results and the
    expert switch at the boundary (t >= 947) match it. "lightning": σ'·T as it is (float),
    as the step-distilled adapters were trained.
    """
    sigmas = _shifted_schedule(steps, shift, num_train_timesteps, schedule)
    timesteps = sigmas * num_train_timesteps
    return torch.from_numpy((timesteps if schedule == "lightning" else np.trunc(timesteps)).astype(np.float32))


class _FlowSampler:
    """Shared bookkeeping: the schedule and the step-index discipline."""

    def __init__(self, steps: int, shift: float, num_train_timesteps: int = 1000, schedule: str = "wan") -> None:
        self.steps = int(steps)
        self.shift = float(shift)
        self.num_train_timesteps = int(num_train_timesteps)
        self.schedule = schedule
        self.sigmas = flow_sigmas(steps, shift, num_train_timesteps, schedule)
        self.timesteps = flow_timesteps(steps, shift, num_train_timesteps, schedule)
        # Python floats of the float32 schedule, for scalar coefficient arithmetic.
        self._sig = [float(s) for s in self.sigmas]
        self._next_index = 0

    def __len__(self) -> int:
        return self.steps

    def reset(self) -> None:
        """Forget the history so the sampler can start a new run from index 0."""
        self._next_index = 0

    def _begin_step(self, index: int) -> None:
        index = int(index)
        if not 0 <= index < self.steps:
            raise IndexError(f"step index {index} is outside 0..{self.steps - 1}")
        if index == 0:
            self.reset()  # a new run always starts at index 0
        elif index != self._next_index:
            raise ValueError(
                f"{type(self).__name__} is a multistep sampler and must be stepped in order: "
                f"expected index {self._next_index}, got {index} (call reset() to restart)"
            )

    def _end_step(self, index: int) -> None:
        self._next_index = int(index) + 1

    def to(self, device: torch.device | str) -> "_FlowSampler":
        """Move every tensor the sampler keeps between steps to ``device`` (returns self).

        ``step`` calls it with the incoming sample's device, so the history follows the
        latent when a run moves it to another GPU (expert per GPU, pipeline/placement.py)."""
        return self

    def state_tensors(self) -> list[torch.Tensor]:
        """The tensors kept between steps (for checks of where they live)."""
        return []


class FlowEulerSampler(_FlowSampler):
    """First-order flow-matching Euler: x ← x + (σ_{i+1} − σ_i)·v."""

    def step(self, model_output: torch.Tensor, index: int, sample: torch.Tensor) -> torch.Tensor:
        self._begin_step(index)
        x = sample.float()
        self.to(x.device)
        v = model_output.to(device=x.device, dtype=torch.float32)
        out = x + (self._sig[index + 1] - self._sig[index]) * v
        self._end_step(index)
        return out


def _log_snr(sigma: float) -> float:
    """λ(σ) = log(α/σ) with α = 1 − σ; +inf at σ = 0 (the clean end)."""
    if sigma <= 0.0:
        return math.inf
    return math.log(1.0 - sigma) - math.log(sigma)


class FlowUniPCSampler(_FlowSampler):
    """UniPC multistep for flow prediction: order 2, B(h) = e^h − 1 (bh2), data prediction.

    Each step first applies the UniC corrector to the incoming sample (using the new model
    output), then the UniP predictor moves to the next sigma. Order rises to 2 after the
    first step and drops back to 1 on the last step (lower-order final), where σ = 0 and
    the predictor returns the clean estimate itself.
    """

    order = 2

    def reset(self) -> None:
        super().reset()
        self._x0_history: list[torch.Tensor] = []  # clean estimates, oldest first (≤ 2)
        self._last_sample: torch.Tensor | None = None  # sample the last predictor started from
        self._last_order = 0

    def to(self, device: torch.device | str) -> "FlowUniPCSampler":
        device = torch.device(device)
        self._x0_history = [m.to(device) for m in self._x0_history]
        if self._last_sample is not None:
            self._last_sample = self._last_sample.to(device)
        return self

    def state_tensors(self) -> list[torch.Tensor]:
        return list(self._x0_history) + ([] if self._last_sample is None else [self._last_sample])

    def __init__(self, steps: int, shift: float, num_train_timesteps: int = 1000, schedule: str = "wan") -> None:
        super().__init__(steps, shift, num_train_timesteps, schedule)
        if self._sig[0] >= 1.0:  # log(α/σ) is −inf at σ = 1: UniPC's step sizes are undefined there
            raise ValueError(f"the {schedule!r} schedule starts at sigma 1, where UniPC cannot step; use the "
                             "euler sampler")
        self.reset()

    def _coefficients(self, i_from: int, i_to: int) -> tuple[float, float, float, float]:
        """(σ_t/σ_s, α_t, φ = e^{-h} − 1, h) for a move from sigma index i_from to i_to."""
        sig_s, sig_t = self._sig[i_from], self._sig[i_to]
        h = _log_snr(sig_t) - _log_snr(sig_s)
        phi = -1.0 if math.isinf(h) else math.expm1(-h)
        return sig_t / sig_s, 1.0 - sig_t, phi, h

    def _correct(self, x0_new: torch.Tensor, index: int) -> torch.Tensor:
        """UniC: refine the sample at sigma ``index`` with the model output taken there."""
        x_prev = self._last_sample
        m0 = self._x0_history[-1]
        ratio, alpha_t, phi, h = self._coefficients(index - 1, index)
        b_h = phi  # bh2
        x = ratio * x_prev - (alpha_t * phi) * m0
        if self._last_order == 1:
            return x - (alpha_t * b_h * 0.5) * (x0_new - m0)
        # Order 2: weights solve [[1, 1], [r, 1]]·ρ = b for the two differences.
        r = (_log_snr(self._sig[index - 2]) - _log_snr(self._sig[index - 1])) / h
        d1 = (self._x0_history[-2] - m0) / r
        hh = -h
        g1 = phi / hh - 1.0
        g2 = g1 / hh - 0.5
        b1, b2 = g1 / b_h, 2.0 * g2 / b_h
        rho0 = (b1 - b2) / (1.0 - r)
        rho1 = b1 - rho0
        return x - (alpha_t * b_h) * (rho0 * d1 + rho1 * (x0_new - m0))

    def _predict(self, x: torch.Tensor, index: int, order: int) -> torch.Tensor:
        """UniP: move from sigma ``index`` to ``index + 1``."""
        m0 = self._x0_history[-1]
        ratio, alpha_t, phi, h = self._coefficients(index, index + 1)
        out = ratio * x - (alpha_t * phi) * m0
        if order == 2:
            r = (_log_snr(self._sig[index - 1]) - _log_snr(self._sig[index])) / h
            d1 = (self._x0_history[-2] - m0) / r
            out = out - (alpha_t * phi * 0.5) * d1  # bh2, order-2 weight fixed at 1/2
        return out

    def step(self, model_output: torch.Tensor, index: int, sample: torch.Tensor) -> torch.Tensor:
        """Advance ``sample`` (at sigma ``index``) given the flow prediction taken there."""
        self._begin_step(index)
        x = sample.float()
        self.to(x.device)  # the history follows the latent (a move to another GPU between steps)
        v = model_output.to(device=x.device, dtype=torch.float32)
        # The clean estimate uses the sample the model actually saw (before correction).
        x0 = x - self._sig[index] * v
        if index > 0:
            x = self._correct(x0, index)
        self._x0_history = (self._x0_history + [x0])[-2:]
        order = min(self.order, self.steps - index, index + 1)
        self._last_sample = x
        self._last_order = order
        out = self._predict(x, index, order)
        self._end_step(index)
        return out


# The samplers by name (the place to add one): a class taking (steps, shift, schedule=...).
SAMPLER_CLASSES: dict[str, type[_FlowSampler]] = {"unipc": FlowUniPCSampler, "euler": FlowEulerSampler}
SAMPLERS = tuple(SAMPLER_CLASSES)


def make_sampler(name: str, steps: int, shift: float, schedule: str = "wan") -> _FlowSampler:
    """A fresh sampler by name from ``SAMPLER_CLASSES`` ("unipc", the reference's choice, or
    "euler"), on the ``schedule`` "wan" (the reference's) or "lightning" (the step-distilled
    adapters')."""
    key = str(name).strip().lower()
    if key in SAMPLER_CLASSES:
        return SAMPLER_CLASSES[key](steps, shift, schedule=schedule)
    raise ValueError(f"unknown sampler {name!r}; choose one of {', '.join(SAMPLERS)}")


# --------------------------------------------------------------------------- LingBot-World Fast

# The Fast model's 4 steps are these entries of a 1000-step schedule (docs/conventions.md#lingbot-world-fast).
FAST_TIMESTEP_INDICES = (0, 179, 358, 679)
FAST_TABLE_STEPS = 1000
# Fewer steps, the same model (docs/conventions.md#fewer-fast-steps): N steps take the first N
# entries of the official list, as the official ``generate(timesteps_index=...)`` would run them
# with that argument (the loop unchanged: the last step's x0 is the chunk, then the commit at
# t = 0). 1 step is the official 4-step schedule's first (t, sigma), NVIDIA flashdreams' 1-step
# LingBot-World setting (``denoising_timesteps=[1000]``). 4 is the official default.
FAST_STEP_INDICES: dict[int, tuple[int, ...]] = {n: FAST_TIMESTEP_INDICES[:n] for n in (4, 3, 2, 1)}
FAST_STEPS = tuple(FAST_STEP_INDICES)  # 4, 3, 2, 1: the choices offered
DEFAULT_FAST_STEPS = 4


def fast_step_indices(steps: int) -> tuple[int, ...]:
    """The timestep indices of a Fast run of ``steps`` steps (``FAST_STEP_INDICES``)."""
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or int(steps) not in FAST_STEP_INDICES:
        raise ValueError(f"steps: {steps!r} is not one of {', '.join(map(str, FAST_STEPS))} (LingBot-World Fast "
                         f"runs 4, its official schedule, or the first 3, 2 or 1 of those timesteps)")
    return FAST_STEP_INDICES[int(steps)]


@dataclass(frozen=True)
class FastSchedule:
    """The few-step rule of LingBot-World Fast, per step i:

    x0 = x_t − ``sigmas[i]``·v (float64, the result cast to float32); unless it is the last
    step, x_next = (1 − σ')·x0 + σ'·ε with σ' = ``renoise_sigmas[i]`` (float32 arithmetic).
    The model sees ``timesteps[i]`` (integer-valued); a final pass at t = 0 commits the chunk.
    """

    timesteps: tuple[int, ...]
    sigmas: tuple[float, ...]  # the float32 table value, as a Python float
    renoise_sigmas: tuple[float, ...]  # one fewer than the steps

    @property
    def steps(self) -> int:
        return len(self.timesteps)


def fast_schedule(shift: float = 10.0, indices: tuple[int, ...] = FAST_TIMESTEP_INDICES,
                  num_train_timesteps: int = 1000) -> FastSchedule:
    """The Fast model's timesteps and sigmas, computed as the official sampler does.

    The official code builds a 1000-step flow schedule (the same formula as ``flow_sigmas``:
    float32 top sigma, linspace, shift, integer timesteps by truncation, a float32 sigma
    table ending in 0) and takes the timesteps at ``indices``. A timestep value repeats over
    neighbouring table entries (978 is entries 176..182 at shift 10), and the two lookups it
    makes pick different ones: flow → x0 uses the first entry with that value (an argmin),
    re-noising to the next timestep uses the second one when there are several (the
    scheduler's ``index_for_timestep``), else the only one.
    """
    sigmas64 = _shifted_schedule(FAST_TABLE_STEPS, shift, num_train_timesteps)
    timesteps = (sigmas64 * num_train_timesteps).astype(np.int64)  # truncation, as the reference
    table = np.append(sigmas64, 0.0).astype(np.float32)
    indices = tuple(int(i) for i in indices)
    if not indices or any(not 0 <= i < FAST_TABLE_STEPS for i in indices) or list(indices) != sorted(set(indices)):
        raise ValueError(f"timestep indices must be increasing entries of 0..{FAST_TABLE_STEPS - 1}, got {indices}")
    chosen = [int(timesteps[i]) for i in indices]

    def first(value: int) -> int:
        return int(np.flatnonzero(timesteps == value)[0])

    def for_noise(value: int) -> int:
        where = np.flatnonzero(timesteps == value)
        return int(where[1] if len(where) > 1 else where[0])

    return FastSchedule(
        timesteps=tuple(chosen),
        sigmas=tuple(float(table[first(t)]) for t in chosen),
        renoise_sigmas=tuple(float(table[for_noise(t)]) for t in chosen[1:]),
    )
