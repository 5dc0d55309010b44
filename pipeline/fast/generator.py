"""The chunk engine of LingBot-World Fast, and the clip sampler built on it.

Per chunk of 3 latent frames (12 video frames), the official few-step rule (docs/conventions.md#lingbot-world-fast,
``wan.scheduler.fast_schedule``): start from noise; 4 times (``FastParams.timestep_indices``:
fewer steps take the first entries of the official list), the model predicts the flow v
at the step's timestep, x0 = x_t − σ·v, and (except after the last step) the chunk is
re-noised to the next timestep with fresh noise; no CFG. Then one more forward on the final
x0 at t = 0 — the *commit* — stores the chunk's keys and values in the KV cache, where the
following chunks see them. 5 forwards a chunk (steps + 1); only the commit writes the cache's committed
frames (the denoising passes write the chunk's own slots, which the next pass overwrites).

``FastGenerator`` is the engine for all three callers — the clip sampler (``sample_fast``),
the long-video stream (decode and write each chunk as it comes) and interactive Play (the
camera of a chunk is decided when the chunk starts). ``next_chunk(camera)`` returns the
chunk's x0; ``run(plan, on_chunk)`` is the one chunk loop the three call with what differs
(a per-chunk ``ChunkPlan`` provider, an on-chunk sink): it checks each chunk for NaN/inf
and turns a CUDA out-of-memory into one naming the size and what to change. The cache is
closed by ``close()``, and on any error or cancel inside a chunk (freed on an out-of-memory
error; a cache made for CUDA graphs is otherwise kept by the model for its next session).

``warm_up()`` (Play, before its first key) runs throwaway chunks first, so that what a
first chunk pays once — kernel compilation and autotuning, buffers, the capture of the CUDA
graphs — is paid before anyone waits for a frame; the session then starts on a reset cache,
its frames bit for bit a cold session's.
"""
from __future__ import annotations

import contextlib
import math
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence, TypeVar

import torch
from torch import nn

from ...wan.conditioning import check_frame_count
from ...wan.geometry import (CHUNK_FRAMES, LATENT_CHANNELS, VAE_STRIDE_T, check_seed, latent_frames, pixel_size,
                             video_frames)
from ...wan.runtime.attention import CHOICES as ATTENTION_CHOICES, attention_backend
from ...wan.runtime.camera_terms import CameraTerms
from ...wan.runtime.kv_cache import CachePolicy, KVCache
from ...wan.scheduler import FAST_TIMESTEP_INDICES, FastSchedule, fast_schedule
from ..camera import CameraCondition
from ..guards import NonFiniteError, is_finite
from ..image import I2VCondition
from ..memory import empty_device_cache
from ..text import TextEmbeddings
from .conditions import CAMERA_CHANNELS, CameraSource, I2VSource, as_camera_source, as_i2v_source
from .noise import ChunkNoise, NoiseSource

# The proposal for a 24 GB card (see wan/runtime/kv_cache.py for the reasons and sizes);
# CachePolicy(window=9, sink=3, dtype="int8") for 16 GB; CachePolicy(window=None) is the
# official full cache.
DEFAULT_POLICY = CachePolicy(window=9, sink=3, dtype="bf16")
R = TypeVar("R")


@dataclass(frozen=True)
class FastParams:
    seed: int = 0
    shift: float = 10.0  # generate_fast.py's sample_shift for i2v-A14B (its function default is 5.0)
    policy: CachePolicy = DEFAULT_POLICY
    # Entries of the 1000-step table a chunk steps through: the official 4, or the first 3, 2 or
    # 1 of them (wan.scheduler.fast_step_indices(steps), the nodes' ``steps``).
    timestep_indices: tuple[int, ...] = FAST_TIMESTEP_INDICES
    attention: str | None = None  # wan.runtime.attention CHOICES for this run; None: auto
    # Blocks whose camera scale and shift are kept for the chunk's five forwards (bit for bit
    # the same output, fewer GEMMs a chunk; memory: pipeline.memory.camera_terms_bytes per
    # block; 0: none). The Fast nodes set it from their memory plan.
    camera_terms: int = 0
    # Once a session's cache is full, its passes are captured as CUDA graphs and replayed
    # (bit for bit the eager result; ~1,200 fewer kernel launches a forward). Off the GPU, or
    # with block swap, the passes run eagerly whatever this says.
    cuda_graphs: bool = False

    @property
    def steps(self) -> int:
        """Denoising steps a chunk takes (its forwards: these + the commit)."""
        return len(self.timestep_indices)

    def __post_init__(self) -> None:
        if not math.isfinite(self.shift) or self.shift <= 0:
            raise ValueError(f"shift must be a finite number > 0, got {self.shift}")
        if self.attention is not None and self.attention not in ATTENTION_CHOICES:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION_CHOICES)}, got {self.attention!r}")
        check_seed(self.seed)
        if isinstance(self.camera_terms, bool) or int(self.camera_terms) < 0:
            raise ValueError(f"camera_terms must be a block count >= 0, got {self.camera_terms!r}")


def fast_latent_frames(frames: int, chunk: int = CHUNK_FRAMES) -> int:
    """Latent frames of a Fast video of ``frames`` video frames: 4n + 1 frames whose latent
    count fills whole chunks (9, 21, 33, ..., 81, ..., 957). Anything else is refused
    naming ``frames`` and the nearest counts that work (the official code cuts silently)."""
    check_frame_count(frames)
    lat = latent_frames(frames)
    if lat % chunk == 0:
        return lat
    below = lat - lat % chunk
    above = below + chunk
    nearest = [f"{video_frames(n)}" for n in (below, above) if n >= chunk]
    raise ValueError(f"frames={frames} ({lat} latent frames) does not fill whole chunks of {chunk} latent frames "
                     f"({VAE_STRIDE_T * chunk} video frames); use {' or '.join(nearest)}")


@dataclass(frozen=True)
class ChunkPlan:
    """What the caller decides when a chunk starts: its Plücker camera [1, 384, chunk,
    h/8, w/8] (None: no camera) and whether to run its commit pass (a clip's last chunk
    skips it: nothing reads it)."""

    camera: torch.Tensor | None = None
    commit: bool = True


class FastOutOfMemoryError(torch.cuda.OutOfMemoryError):
    """A CUDA out-of-memory of a Fast run, its message already naming the chunk, the size
    and what to change (callers pass it on as it is)."""


def _on_device(device: torch.device):
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


@dataclass(frozen=True)
class WarmUp:
    """What ``FastGenerator.warm_up`` ran: its wall time, the throwaway chunks and forwards,
    and the CUDA graphs it captured (0 where an earlier session's are replayed, or without
    graphs)."""

    seconds: float
    chunks: int
    forwards: int
    captures: int


class FastGenerator:
    """One Fast generation session: the model, the prompt, the image condition and a KV cache.

    ``model``: a LingBotDiT (the Fast transformer; any loaded layout, block swap included).
    ``text``: the prompt's umT5 states [L, text_dim], or ``TextEmbeddings`` (its positive
    prompt; there is no negative prompt: no CFG).
    ``condition``: an ``I2VSource`` (``WholeI2V``, ``StreamedI2V``) or an ``I2VCondition``.
    ``latent_frames``: the video's length in latent frames (None: open-ended, e.g. Play;
    the full cache then cannot be used). ``noise``: default ``ChunkNoise(params.seed)``.
    ``check_interrupt`` runs before every forward and every transformer block (it raises to
    stop); any exception inside a chunk frees the cache and ends the session.
    """

    def __init__(self, model: nn.Module, text: torch.Tensor | TextEmbeddings, condition: I2VSource | I2VCondition,
                 params: FastParams = FastParams(), noise: NoiseSource | None = None,
                 latent_frames: int | None = None, check_interrupt: Callable[[], None] | None = None) -> None:
        if isinstance(text, TextEmbeddings):
            text = text.positive
        if text.dim() != 2:
            raise ValueError(f"text: expected the prompt's states [tokens, text_dim], got {tuple(text.shape)}")
        self.model, self.params = model, params
        self.schedule: FastSchedule = fast_schedule(params.shift, params.timestep_indices)
        self.chunk_frames = params.policy.chunk
        self.latent_frames = latent_frames
        self.i2v = as_i2v_source(condition)
        self.noise = noise if noise is not None else ChunkNoise(params.seed, renoises=self.schedule.steps - 1)
        self.device = model.patch_embedding.weight.device
        self.text = text
        self._check = check_interrupt
        self.chunk_index = 0
        self.forwards = 0  # model forwards run, commits included
        self.cache: KVCache | None = None
        detail = None
        try:
            self.cache = self._new_cache()
        except torch.cuda.OutOfMemoryError as exc:
            detail = str(exc)
        if detail is not None:
            raise self._out_of_memory(1, detail)
        # float32 scalars: the official re-noise is float32 arithmetic ((1 - σ')·x0 + σ'·ε).
        self._renoise = [torch.tensor(s, dtype=torch.float32) for s in self.schedule.renoise_sigmas]

    def _new_cache(self) -> KVCache:
        """The session's KV cache: the model's kept one where it has one for these arguments."""
        return self.model.new_kv_cache(self.params.policy, self.i2v.latent_height, self.i2v.latent_width,
                                       self.latent_frames, device=self.device, graphs=self.params.cuda_graphs)

    # ----------------------------------------------------------------- chunks
    @property
    def frame_start(self) -> int:
        """Latent frame where the next chunk starts."""
        return self.chunk_index * self.chunk_frames

    def _check_camera(self, camera: torch.Tensor) -> torch.Tensor:
        expected = (1, CAMERA_CHANNELS, self.chunk_frames, self.i2v.latent_height, self.i2v.latent_width)
        if tuple(camera.shape) != expected:
            raise ValueError(f"camera chunk: expected a Plücker tensor of shape {list(expected)}, got "
                             f"{list(camera.shape)}")
        return camera

    def _forward(self, x: torch.Tensor, t: float, y: torch.Tensor, camera_tokens: torch.Tensor | CameraTerms | None,
                 commit: bool = False) -> torch.Tensor | None:
        if self._check is not None:
            self._check()
        cache = self.cache
        context = None if cache.cross_ready else [self.text.to(self.device)]
        extra = {"cancel": self._check} if self._check is not None else {}
        out = self.model(x[None], torch.tensor([t], dtype=torch.float32, device=self.device), context, y=y,
                         camera_tokens=camera_tokens, kv_cache=cache, commit=commit, **extra)
        self.forwards += 1
        return None if out is None else out[0]

    def next_chunk(self, camera: torch.Tensor | None = None, commit: bool = True,
                   on_step: Callable[[int, torch.Tensor], None] | None = None) -> torch.Tensor:
        """Generate the next chunk: x0 [16, chunk, h/8, w/8] float32 on the model's device.

        ``camera``: the chunk's Plücker tensor [1, 384, chunk, h/8, w/8] (None: no camera).
        ``commit``: run the t = 0 pass that stores the chunk for the chunks after it (a clip's
        last chunk skips it: nothing would read it). ``on_step(step, x0)`` after every step.
        """
        if self.cache is None:
            raise RuntimeError("this Fast session was closed (finished, cancelled or failed); start a new one")
        c, n = self.chunk_index, self.chunk_frames
        if self.latent_frames is not None and self.frame_start + n > self.latent_frames:
            raise ValueError(f"the video has {self.latent_frames} latent frames; all {c} chunks are done")
        x0 = self._guarded(lambda: self._run_chunk(c, n, camera, commit, on_step))
        self.chunk_index += 1
        return x0

    def _guarded(self, work: Callable[[], R]) -> R:
        """``work()`` on the model's device with the run's attention kernel; any exception
        closes the session (the cache freed on an out-of-memory error)."""
        try:
            with _on_device(self.device), attention_backend(self.params.attention), torch.inference_mode():
                return work()
        except BaseException as exc:
            self.close(free=isinstance(exc, torch.cuda.OutOfMemoryError))
            # The traceback would keep the chunk's activations alive for as long as the error
            # is kept (by ComfyUI: until the next prompt); the frames below this one are done.
            if exc.__traceback__ is not None:
                traceback.clear_frames(exc.__traceback__.tb_next)
            raise

    # ----------------------------------------------------------------- warm-up
    def warm_up(self, camera: bool = True) -> WarmUp:
        """Throwaway chunks before the first one, then a reset cache for the session (see the
        module's docstring). The chunks have the session's shapes (its first chunk's y, its
        prompt, a zero camera when ``camera`` with its ``camera_terms``) and go through the
        cache's real slots and commit moves, so the CUDA graphs they capture carry the keys
        the session's passes will have; each runs one denoising pass (two where the first
        was a graph's warm-up, so the second captures it) and the commit, until a chunk
        with the cache full runs nothing eagerly and captures nothing (without graphs: the
        first chunk with the cache full, every shape seen). Every forward is an ordinary
        one, so a ``ParallelModel``'s workers warm up with it; the cache is closed and taken
        again (the model's kept one comes back reset, with its graphs). Call it before the
        first chunk; a CUDA out-of-memory error is raised as ``next_chunk``'s."""
        if self.cache is None:
            raise RuntimeError("this Fast session was closed (finished, cancelled or failed); start a new one")
        if self.chunk_index or self.forwards:
            raise RuntimeError("warm_up runs before the session's first chunk")
        started = time.perf_counter()
        out_of_memory: list[str] = []
        with self._closed_on_failure(out_of_memory):
            chunks, captures = self._guarded(lambda: self._warm_chunks(camera))
            # Closed and taken again, not reset here: a ParallelModel's close and new-cache reach its
            # workers' caches too (the model's kept cache comes back reset, with its graphs).
            self.cache.close()
            self.cache = None
            self.cache = self._new_cache()
        if out_of_memory:
            raise self._out_of_memory(1, out_of_memory[0])
        forwards, self.forwards = self.forwards, 0
        return WarmUp(time.perf_counter() - started, chunks, forwards, captures)

    def _warm_chunks(self, camera: bool) -> tuple[int, int]:
        """The warm-up's chunks: (chunks run, graphs captured)."""
        cache, n, device = self.cache, self.chunk_frames, self.device
        h, w = self.i2v.latent_height, self.i2v.latent_width
        x = torch.randn(LATENT_CHANNELS, n, h, w, generator=torch.Generator().manual_seed(0)).to(device)
        y = self.i2v.chunk(0, n).to(device)[None]
        t = float(self.schedule.timesteps[0])
        graphs = cache.graphs
        counts = (lambda: (graphs.captures, graphs.eager)) if graphs is not None else (lambda: (0, 0))
        first_captures = counts()[0]
        # The chunks that fill the cache; then the commits' slot moves, which repeat after at most
        # as many chunks, each seen twice (a graph's warm-up, its capture); one chunk more that
        # replays everything.
        limit = 3 * -(-cache.capacity // n) + 1
        chunks = 0
        while chunks < limit and (self.latent_frames is None or cache.frame_start + n <= self.latent_frames):
            full, before = cache.full, counts()
            tokens = None  # a camera per chunk, as a real chunk's: its kept terms go with the chunk
            if camera:
                tokens = self.model.prepare_camera(torch.zeros(1, CAMERA_CHANNELS, n, h, w, device=device),
                                                   keep_terms=self.params.camera_terms)
            for _ in range(1 + (graphs.warmup if graphs is not None else 0)):
                eager = counts()[1]
                self._forward(x, t, y, tokens)
                if counts()[1] == eager or not full:  # replayed or captured (or no graphs): one pass is enough
                    break
            self._forward(x, 0.0, y, tokens, commit=True)
            del tokens
            chunks += 1
            if full and counts() == before:
                break
        return chunks, counts()[0] - first_captures

    def _run_chunk(self, c: int, n: int, camera: torch.Tensor | None, commit: bool,
                   on_step: Callable[[int, torch.Tensor], None] | None) -> torch.Tensor:
        model, schedule, device = self.model, self.schedule, self.device
        y = self.i2v.chunk(self.frame_start, n).to(device)[None]
        camera_tokens = None
        if camera is not None:
            camera_tokens = model.prepare_camera(self._check_camera(camera).to(device),
                                                 keep_terms=self.params.camera_terms)
        shape = (LATENT_CHANNELS, n, self.i2v.latent_height, self.i2v.latent_width)
        x = self.noise.initial(c, shape).to(device)
        x0 = x
        for i, t in enumerate(schedule.timesteps):
            v = self._forward(x, float(t), y, camera_tokens)
            # flow -> x0 in float64, as the official conversion, back to float32
            x0 = (x.double() - schedule.sigmas[i] * v.double()).float()
            del v
            if on_step is not None:
                on_step(i, x0)
            if i + 1 < schedule.steps:
                sigma = self._renoise[i].to(device)
                x = (1 - sigma) * x0 + sigma * self.noise.renoise(c, i, shape).to(device)
        if commit:
            self._forward(x0, 0.0, y, camera_tokens, commit=True)
        else:
            self.cache.skip_chunk()
        return x0

    def run(self, plan: Callable[[int], ChunkPlan | None], on_chunk: Callable[[int, torch.Tensor], None] | None = None,
            on_step: Callable[[int, int | None], None] | None = None, chunks: int | None = None) -> int:
        """The chunk loop: ``plan(index)`` when each chunk starts (None ends the run; it may
        wait, e.g. for a key), the chunk made, checked for NaN/inf (``NonFiniteError``) and
        handed to ``on_chunk(index, x0)`` (x0 on the model's device). Runs until ``plan``
        returns None or ``chunks`` chunks are done; returns the chunks made.
        ``on_step(done, total)`` after every denoising step (total None when open-ended).
        Any error closes the session; a CUDA OOM frees the cache and is raised again as
        ``torch.cuda.OutOfMemoryError`` naming the chunk, the size and what to change."""
        steps = self.schedule.steps
        total_steps = None if chunks is None else chunks * steps
        c, out_of_memory = self.chunk_index, []
        with self._closed_on_failure(out_of_memory):
            while chunks is None or self.chunk_index < chunks:
                c = self.chunk_index
                job = plan(c)
                if job is None:
                    break
                step_done = (lambda i, _x, c=c: on_step(c * steps + i + 1, total_steps)) if on_step else None
                x0 = self.next_chunk(job.camera, commit=job.commit, on_step=step_done)
                del job
                if not is_finite(x0):
                    raise NonFiniteError(non_finite_message(c, chunks))
                if on_chunk is not None:
                    on_chunk(c, x0)
                del x0
            return self.chunk_index
        raise self._out_of_memory(c + 1, out_of_memory[0])

    @contextlib.contextmanager
    def _closed_on_failure(self, out_of_memory: list[str]) -> Iterator[None]:
        """Any exception in the block closes the session (the cache freed on an out-of-memory
        error). A CUDA out-of-memory error other than the pack's own is kept as its text only
        (its traceback holds the chunk's activations) in ``out_of_memory`` and not raised: the
        caller raises ``_out_of_memory`` outside the ``except``."""
        try:
            yield
        except FastOutOfMemoryError:
            self.close(free=True)
            raise
        except torch.cuda.OutOfMemoryError as exc:
            out_of_memory.append(str(exc))
            self.close(free=True)
        except BaseException:
            self.close()
            raise

    def _out_of_memory(self, chunk: int, detail: str | None) -> FastOutOfMemoryError:
        """Memory given back, the error to raise (outside the ``except``: no traceback kept)."""
        empty_device_cache()
        frames = None if self.latent_frames is None else video_frames(self.latent_frames)
        height, width = pixel_size(self.i2v.latent_height, self.i2v.latent_width)
        return FastOutOfMemoryError(out_of_memory_message(frames, height, width, self.params.policy, chunk, detail))

    def graph_counts(self) -> dict | None:
        """The CUDA graphs of this session's cache so far: captured, replayed, run eagerly, and
        why they were turned off (None: no graphs)."""
        graphs = None if self.cache is None else self.cache.graphs
        if graphs is None:
            return None
        return {"captures": graphs.captures, "replays": graphs.replays, "eager": graphs.eager,
                "disabled": graphs.disabled}

    def close(self, free: bool = False) -> None:
        """End the session: the KV cache closed (kept by the model for its next session when it
        was made for CUDA graphs, else freed; ``free``: freed either way) and the image
        condition's VAE released, if it still holds one."""
        if self.cache is not None:
            if free:
                self.cache.free()
            else:
                self.cache.close()
            self.cache = None
        self.i2v.close()

    def __enter__(self) -> "FastGenerator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --------------------------------------------------------------------------- the clip sampler

OOM_HINT = ("use a smaller kv_window or the int8 cache, reduce width/height, or enable block swap in the "
            "LingBot-World DiT loader")


def out_of_memory_message(frames: int | None, height: int, width: int, policy: CachePolicy, chunk: int,
                          detail: str | None) -> str:
    """``frames`` None: an open-ended run (Play)."""
    lines = (detail or "").strip().splitlines()
    size = f"{width}x{height}, open-ended" if frames is None else f"{frames} frames at {width}x{height}"
    return (f"CUDA out of memory in LingBot-World Fast at chunk {chunk} ({size}, "
            f"{policy.describe()}): {OOM_HINT}. The cache was freed, so the next run starts clean. "
            f"({lines[0] if lines else 'no details'})")


def non_finite_message(chunk: int, chunks: int | None) -> str:
    """``chunks`` None: an open-ended run (Play)."""
    of = "" if chunks is None else f" of {chunks}"
    return (f"chunk {chunk + 1}{of} turned NaN/inf; likely cause: NaN or inf weights in the Fast "
            "transformer's file, an extreme focal length in the camera intrinsics, or an overflow. The run was "
            "stopped instead of decoding a black video.")


def sample_fast(
    model: nn.Module,
    text: torch.Tensor | TextEmbeddings,
    condition: I2VSource | I2VCondition,
    camera: CameraSource | CameraCondition | None,
    params: FastParams,
    frames: int,
    noise: NoiseSource | None = None,
    on_chunk: Callable[[int, torch.Tensor], None] | None = None,
    on_preview: Callable[[int, int, torch.Tensor], None] | None = None,
    on_step: Callable[[int, int], None] | None = None,
    check_interrupt: Callable[[], None] | None = None,
) -> torch.Tensor:
    """A whole Fast clip: the latent [16, F_lat, H/8, W/8] (float32, CPU) of ``frames`` video
    frames (``fast_latent_frames``), chunk after chunk.

    ``camera``: a whole-clip ``CameraCondition`` (sliced per chunk), a chunk source
    (``KeyframeCamera``) or None. ``on_chunk(index, x0)`` and ``on_preview(done, total, x0)``
    (ComfyUI's previewer: the chunk's latent [16, 3, H/8, W/8] on the device) after every
    chunk; ``on_step(done, total)`` after every denoising step. The last chunk skips its
    commit pass (steps + 1 forwards a chunk, steps for the last). A CUDA OOM frees the cache and is
    raised again as ``torch.cuda.OutOfMemoryError`` naming the size and what to change.
    """
    latent_frames = fast_latent_frames(frames, params.policy.chunk)
    source = as_i2v_source(condition)
    cameras = as_camera_source(camera)
    if isinstance(camera, CameraCondition) and camera.frames != frames:
        raise ValueError(f"camera is for {camera.frames} frames but frames={frames}; use the same frame count")
    if isinstance(condition, I2VCondition) and condition.frames != frames:
        raise ValueError(f"the image condition is for {condition.frames} frames but frames={frames}")
    chunks = latent_frames // params.policy.chunk
    latent = torch.empty(LATENT_CHANNELS, latent_frames, source.latent_height, source.latent_width)

    def plan(c: int) -> ChunkPlan:
        cam = None if cameras is None else cameras.chunk(c * params.policy.chunk, params.policy.chunk)
        return ChunkPlan(cam, commit=c + 1 < chunks)

    def keep(c: int, x0: torch.Tensor) -> None:
        start = c * params.policy.chunk
        latent[:, start:start + params.policy.chunk] = x0.cpu()
        if on_chunk is not None:
            on_chunk(c, x0)
        if on_preview is not None:
            on_preview(c + 1, chunks, x0)

    with FastGenerator(model, text, source, params, noise, latent_frames, check_interrupt) as generator:
        generator.run(plan, keep, on_step, chunks)
    return latent


__all__: Sequence[str] = ["ChunkPlan", "DEFAULT_POLICY", "FastGenerator", "FastOutOfMemoryError", "FastParams", "WarmUp",
                          "fast_latent_frames", "sample_fast"]
