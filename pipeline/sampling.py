"""Stage 3: denoise with the two experts, high-noise first, one resident at a time."""
from __future__ import annotations

import contextlib
import contextvars
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Protocol

import torch
from torch import nn

from ..wan.geometry import LATENT_CHANNELS, check_seed
from ..wan.scheduler import SCHEDULES, make_sampler
from .camera import CameraCondition
from .guards import NonFiniteError, is_finite
from .image import I2VCondition
from .memory import empty_device_cache
from .step_cache import EASYCACHE_WARMUP_STEPS, StepPolicy, StepStats
from .text import TextEmbeddings
from ..wan.runtime.attention import CHOICES as ATTENTION_CHOICES, attention_backend


class ExpertSource(Protocol):
    """Where the sampler gets the "high" and "low" experts. Optional members, looked up with
    getattr: ``cfg_split`` (True: ``acquire_uncond(name)`` gives a second copy on another
    device for the unconditional branch, pipeline/placement.py) and ``abort()`` (frees
    every expert after an error or a cancel)."""

    def acquire(self, name: str) -> nn.Module: ...

    def release(self, name: str) -> None: ...


@dataclass(frozen=True)
class SamplingParams:
    steps: int = 40
    shift: float = 10.0
    cfg_high: float = 5.0  # guidance scale while the high-noise expert runs (1: no negative pass)
    cfg_low: float = 5.0  # the same for the low-noise expert
    boundary: float = 0.947
    seed: int = 0
    sampler: str = "unipc"
    # Run the conditional and unconditional CFG branches as one batch of two: the camera
    # layers then run once per block for both, and the matmuls are larger. Costs about
    # 1.8 GB more activation memory at 480x832x81 than two separate passes.
    batch_cfg: bool = True
    # The step cache (pipeline/step_cache.py); every default is off, i.e. the exact sampler.
    cache_threshold: float = 0.0  # EasyCache threshold; 0: every step computed
    cache_warmup: int = EASYCACHE_WARMUP_STEPS  # steps of each expert always computed
    cfg_truncate: float = 0.0  # fraction of the last steps without the unconditional branch
    attention: str | None = None  # wan.runtime.attention CHOICES for this run; None: auto
    # Noise schedule (wan/scheduler.py): "wan" = the reference's (integer timesteps from
    # 999), "lightning" = the step-distilled adapters' (float timesteps from 1000).
    schedule: str = "wan"

    def __post_init__(self) -> None:
        # The fields carry the names of the node inputs they come from, so a message names both.
        for field in ("shift", "cfg_high", "cfg_low", "boundary", "cache_threshold", "cfg_truncate"):
            value = getattr(self, field)
            if not math.isfinite(value):  # NaN passes every < / > test below (and ComfyUI's min/max)
                raise ValueError(f"{field} must be a finite number, got {value}")
        if self.cache_threshold < 0:
            raise ValueError(f"cache_threshold must be 0 (off) or positive, got {self.cache_threshold}")
        if not 0.0 <= self.cfg_truncate <= 1.0:
            raise ValueError(f"cfg_truncate must be within 0..1, got {self.cfg_truncate}")
        if self.attention is not None and self.attention not in ATTENTION_CHOICES:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION_CHOICES)}, got {self.attention!r}")
        check_seed(self.seed)  # what torch.Generator.manual_seed takes; checked before any model
        if self.steps < 1:
            raise ValueError(f"steps must be at least 1, got {self.steps}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if not 0.0 <= self.boundary <= 1.0:
            raise ValueError(f"boundary must be within 0..1, got {self.boundary}")
        if self.shift <= 0:
            raise ValueError(f"shift must be positive, got {self.shift}")


def expert_for(timestep: float, boundary: float) -> str:
    return "high" if timestep >= boundary * 1000.0 else "low"


def initial_noise(condition: I2VCondition, seed: int) -> torch.Tensor:
    _, f_lat, h, w = condition.y.shape
    generator = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(LATENT_CHANNELS, f_lat, h, w, generator=generator, dtype=torch.float32)


def check_camera_matches(camera: CameraCondition | None, condition: I2VCondition) -> None:
    if camera is None:
        return
    if (camera.frames, camera.height, camera.width) != (condition.frames, condition.height, condition.width):
        raise ValueError(
            f"camera is for {camera.frames} frames at {camera.width}x{camera.height} but the image condition is "
            f"{condition.frames} frames at {condition.width}x{condition.height}; use the same size and frames"
        )


def _device_of(model: nn.Module) -> torch.device:
    return next(t.device for t in model.parameters())


def _on_device(device: torch.device):
    """Make ``device`` the thread's current CUDA device: Triton kernels (wan/runtime/fused.py) launch on
    the current device, which is ComfyUI's first GPU unless an expert lives on another one."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


class _UncondCopy:
    """CFG split: the second copy of the expert, run for the unconditional branch from a worker
    thread so that both devices compute at once (the forward releases the GIL in CUDA calls)."""

    def __init__(self, model: nn.Module, y: torch.Tensor, negative: torch.Tensor,
                 camera_tokens: torch.Tensor | None, cancel: Callable[[], None] | None = None) -> None:
        self.model = model
        self.extra = {"cancel": cancel} if cancel else {}
        self.device = _device_of(model)
        self.y, self.negative = y.to(self.device), negative.to(self.device)
        # Copied, not recomputed: the same weights give the same tokens, and a copy is exact.
        self.camera_tokens = None if camera_tokens is None else camera_tokens.to(self.device)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lingbot-cfg-split")

    def _forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        with _on_device(self.device), torch.inference_mode():
            return self.model(x.to(self.device), t.to(self.device), [self.negative], y=self.y,
                              camera_tokens=self.camera_tokens, **self.extra)[0]

    def start(self, x: torch.Tensor, t: torch.Tensor):
        # A new thread does not inherit context variables (the run's attention choice): copy them.
        return self._worker.submit(contextvars.copy_context().run, self._forward, x, t)

    def close(self) -> None:
        self._worker.shutdown(wait=True)


class _ActiveExpert:
    """The expert in use, its device, and what stays fixed while it is resident.

    With ``uncond_model`` (CFG split) the unconditional branch runs on that model's device
    at the same time as the conditional one and is combined on this expert's device; when
    no unconditional branch is needed (guidance 1, CFG truncation) the second device idles.
    """

    def __init__(self, name: str, model: nn.Module, text: TextEmbeddings, condition: I2VCondition,
                 camera: CameraCondition | None, uncond_model: nn.Module | None = None,
                 cancel: Callable[[], None] | None = None) -> None:
        self.name, self.model, self.cancel = name, model, cancel
        self.device = _device_of(model)
        self.y = condition.y[None].to(self.device)
        self.positive = text.positive.to(self.device)
        self.negative = text.negative.to(self.device)
        self.camera_tokens = None
        if camera is not None:  # the camera tokens do not change between steps or CFG branches
            with _on_device(self.device), torch.inference_mode():
                self.camera_tokens = model.prepare_camera(camera.plucker.to(self.device))
        self.split = None if uncond_model is None else _UncondCopy(uncond_model, self.y, self.negative,
                                                                   self.camera_tokens, cancel)

    def close(self) -> None:
        if self.split is not None:
            self.split.close()
            self.split = None

    def _split_branches(self, x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pending = self.split.start(x, t)
        try:
            cond = self._forward(x, t, [self.positive], self.y)[0]
        finally:
            uncond = pending.result()  # always wait: the worker must not outlive a failed step
        return cond, uncond.to(self.device)

    def _forward(self, x: torch.Tensor, t: torch.Tensor, context: list[torch.Tensor], y: torch.Tensor) -> torch.Tensor:
        # cancel: checked before every transformer block (see LingBotDiT.forward)
        extra = {"cancel": self.cancel} if self.cancel else {}
        return self.model(x, t, context, y=y, camera_tokens=self.camera_tokens, **extra)

    def branches(self, latent: torch.Tensor, timestep: float, uncond: bool,
                 batch_cfg: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The raw conditional (and unconditional, when asked) predictions of one step."""
        x = latent[None].to(self.device)
        t = torch.tensor([timestep], device=self.device, dtype=torch.float32)
        with _on_device(self.device), torch.inference_mode():
            if not uncond:
                return self._forward(x, t, [self.positive], self.y)[0], None
            if self.split is not None:
                return self._split_branches(x, t)
            if batch_cfg:
                both = self._forward(x.expand(2, -1, -1, -1, -1), t.expand(2), [self.positive, self.negative],
                                     self.y.expand(2, -1, -1, -1, -1))
                return both[0], both[1]
            cond = self._forward(x, t, [self.positive], self.y)[0]
            return cond, self._forward(x, t, [self.negative], self.y)[0]

    def velocity(self, latent: torch.Tensor, timestep: float, guide: float, batch_cfg: bool) -> torch.Tensor:
        if guide == 1.0:  # no guidance: the unconditional branch is not needed
            return self.branches(latent, timestep, False, batch_cfg)[0].float()
        cond, uncond = self.branches(latent, timestep, True, batch_cfg)
        with torch.inference_mode():
            return (uncond + guide * (cond - uncond)).float()


def non_finite_message(step: int, steps: int, expert: str, condition: I2VCondition,
                       camera: CameraCondition | None) -> str:
    camera_hint = "an extreme focal length in the camera intrinsics (e.g. 1e-300), " if camera is not None else ""
    return (f"the latent turned NaN/inf at step {step} of {steps} ({expert}-noise expert, {condition.frames} "
            f"frames at {condition.width}x{condition.height}); likely cause: NaN or inf weights in the "
            f"{expert}-noise expert's file, {camera_hint}or an overflow (extreme guidance or shift). "
            "The run was stopped instead of decoding a black video.")


OOM_HINT = ("reduce width/height/frames, or enable block swap in the LingBot-World NF4 DiT Loader (fewer blocks on "
            "the GPU)")


def out_of_memory_message(condition: I2VCondition, detail: str | None) -> str:
    """What a user reads after a CUDA OOM in sampling: the size that did not fit and what to change."""
    lines = (detail or "").strip().splitlines()
    return (
        f"CUDA out of memory while sampling {condition.frames} frames at {condition.width}x{condition.height}: "
        f"{OOM_HINT}. The experts were released, so the next run starts clean. "
        f"({lines[0] if lines else 'no details'})"
    )


def sample(
    experts: ExpertSource,
    text: TextEmbeddings,
    condition: I2VCondition,
    camera: CameraCondition | None,
    params: SamplingParams,
    on_step: Callable[[int, int], None] | None = None,
    check_interrupt: Callable[[], None] | None = None,
    stats: StepStats | None = None,
    on_preview: Callable[[int, int, torch.Tensor], None] | None = None,
) -> torch.Tensor:
    """Return the denoised latent [16, F_lat, H/8, W/8] (float32, CPU).

    ``stats``, when given, is filled with the forwards computed, skipped and truncated.
    ``on_preview(done, total, x0)`` gets each step's prediction of the clean (normalized)
    latent [16, F_lat, H/8, W/8] on the first expert's device (with one GPU, the expert's), for live previews.

    A CUDA out-of-memory error releases the expert and is raised again as a
    ``torch.cuda.OutOfMemoryError`` (so hosts still see an OOM) that names the size and
    suggests what to change.
    """
    check_camera_matches(camera, condition)
    detail = None
    try:
        with attention_backend(params.attention):
            return _denoise(experts, text, condition, camera, params, on_step, check_interrupt, stats, on_preview)
    except torch.cuda.OutOfMemoryError as exc:
        # Keep only the text: the exception's traceback holds the step's activations
        # (on the GPU) until it is gone, which it is once this block ends.
        detail = str(exc)
    except BaseException:
        _abort(experts)
        raise
    _abort(experts)
    empty_device_cache()
    raise torch.cuda.OutOfMemoryError(out_of_memory_message(condition, detail))


def _abort(experts: ExpertSource) -> None:
    """After an error or interrupt: a source that keeps experts resident between runs
    (expert per GPU) frees them all now, so ComfyUI goes on with the memory released."""
    abort = getattr(experts, "abort", None)
    if abort is not None:
        abort()


def _activate(experts: ExpertSource, name: str, text: TextEmbeddings, condition: I2VCondition,
              camera: CameraCondition | None, cancel: Callable[[], None] | None = None) -> _ActiveExpert:
    model = experts.acquire(name)
    uncond_model = experts.acquire_uncond(name) if getattr(experts, "cfg_split", False) else None
    return _ActiveExpert(name, model, text, condition, camera, uncond_model, cancel)


def _deactivate(experts: ExpertSource, active: _ActiveExpert) -> None:
    active.close()
    experts.release(active.name)


def _denoise(
    experts: ExpertSource,
    text: TextEmbeddings,
    condition: I2VCondition,
    camera: CameraCondition | None,
    params: SamplingParams,
    on_step: Callable[[int, int], None] | None,
    check_interrupt: Callable[[], None] | None,
    stats: StepStats | None = None,
    on_preview: Callable[[int, int, torch.Tensor], None] | None = None,
) -> torch.Tensor:
    sampler = make_sampler(params.sampler, params.steps, params.shift, params.schedule)
    latent = initial_noise(condition, params.seed)
    active: _ActiveExpert | None = None
    timesteps = sampler.timesteps.tolist()
    names = [expert_for(t, params.boundary) for t in timesteps]
    policy = StepPolicy(params.steps, params.cache_threshold, params.cache_warmup, params.cfg_truncate,
                        params.batch_cfg, stats)
    in_expert = 0
    preview_device: torch.device | None = None  # where the run started: ComfyUI's previewer runs there
    try:
        for index, timestep in enumerate(timesteps):
            if check_interrupt:
                check_interrupt()
            name = expert_for(timestep, params.boundary)
            if active is None or active.name != name:
                if active is not None:
                    _deactivate(experts, active)
                    active = None
                active = _activate(experts, name, text, condition, camera, check_interrupt)
                if preview_device is None:
                    preview_device = active.device
                latent = latent.to(active.device)
                policy.expert_changed()
                in_expert = 0
            guide = params.cfg_high if name == "high" else params.cfg_low
            last_in_expert = index + 1 == len(names) or names[index + 1] != name
            velocity = policy.velocity(active, latent, timestep, guide, index, in_expert, last_in_expert)
            in_expert += 1
            if on_preview:  # flow matching: x_t = x0 + sigma * velocity
                on_preview(index + 1, params.steps,
                           (latent - float(sampler.sigmas[index]) * velocity).to(preview_device))
            latent = sampler.step(velocity, index, latent)
            if not is_finite(latent):  # one fused reduction per step: a NaN never becomes a black video
                raise NonFiniteError(non_finite_message(index + 1, params.steps, name, condition, camera))
            if on_step:
                on_step(index + 1, params.steps)
    finally:
        if active is not None:
            _deactivate(experts, active)
    return latent.float().cpu()
