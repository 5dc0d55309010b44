"""A Play session: LingBot-World Fast driven live by the keys a page holds.

``PlaySession.run()`` is the whole session, in the calling thread (ComfyUI's worker: the
session is one queued prompt). It makes one Fast chunk at a time with ``FastGenerator``
(open-ended: a window cache policy), the image condition encoded lazily
(``StreamedI2V``), the chunk's camera from the keys held when it starts (``PlayCamera``,
the Play law), decodes each chunk with the VAE's causal stream decoder one latent frame at
a time, and appends each latent frame's frames to the video file and sends them to the
page as soon as they are decoded. What starts a chunk comes from
``PlayControls``, which the server's routes feed (docs/play_protocol.md).

Before the page is told the session started, the Fast generator warms up (``warm_up``:
throwaway chunks that compile the kernels and capture the CUDA graphs a first chunk would
otherwise pay for; the session's frames are bit for bit a cold session's); the
``started`` event and ``PlayResult`` carry how long it took.

The session ends on Stop, when ``chunk_budget`` chunks are done, after ``idle_timeout_s``
seconds with no input and no page of the controller connected, on an interrupt (raised by
``check_interrupt``, checked while waiting and before every forward; it propagates) or on
an error. Every end closes the video file (what was written stays playable), frees the
cache and the VAE streams, and sends the "ended" state. The action log is handed to
``save_log`` after every chunk written and once more at the end (with the end's reason),
so a process killed mid-session leaves the log of the chunks its video holds. A replay of the action log through
the Fast clip path (``pipeline.camera.path_from_play_actions`` + ``sample_fast``, same seed
and cache settings) gives the same latents bit for bit.

Nothing here imports ComfyUI: the node passes the model, the callbacks and the sinks.
"""
from __future__ import annotations

import logging
import math
import statistics
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch
from torch import nn

from ...wan.geometry import LATENT_CHANNELS, VAE_STRIDE_T, latent_size, video_frames
from ...wan.play_camera import format_actions
from ...wan.runtime.kv_cache import CachePolicy
from ...wan.scheduler import DEFAULT_FAST_STEPS, fast_step_indices
from ...wan.vae import WanVAE
from ..fast.conditions import StreamedI2V
from ..fast.generator import DEFAULT_POLICY, ChunkPlan, FastGenerator, FastParams
from ..fast.worker import ChunkWorker, generation_first
from ..memory import empty_device_cache
from ..text import TextEmbeddings
from .chunk_camera import PlayCamera
from .controls import ChunkRequest, PlayControls
from .frames import jpeg_frames
from .protocol import (EVENT_FRAMES, EVENT_STARTED, EVENT_STARTING, EVENT_STATE, KEYS, MODES, STARTING_IMAGE,
                       STARTING_WARMUP, keys_text)
from .registry import SESSIONS, SessionRegistry

log = logging.getLogger(__name__)

MAX_CHUNK_BUDGET = 320  # 3,837 frames, 4 minutes at 16 fps; the model's RoPE table reached ~341 chunks
DEFAULT_CHUNK_BUDGET = 80  # 957 frames: one minute
KEYFRAMES_PLAY = "per chunk (Play)"  # the Camera node's keyframe timing that replays a session
# Latent frames encoded ahead when a session opens (the condition's fixed point is at ~30).
PREFETCH_LATENT_FRAMES = 48


@dataclass(frozen=True)
class PlaySettings:
    width: int
    height: int
    seed: int = 0
    shift: float = 10.0
    chunk_budget: int = DEFAULT_CHUNK_BUDGET
    mode: str = "turn"
    idle_timeout_s: float = 120.0
    policy: CachePolicy = DEFAULT_POLICY
    fps: int = 16
    vae_precision: str = "fp32"  # recorded in the log: the replay's VAE Encode must use the same
    attention: str | None = None
    camera_terms: int = 0  # FastParams.camera_terms: blocks whose camera terms a chunk keeps
    cuda_graphs: bool = False  # FastParams.cuda_graphs: the chunk's passes replayed from CUDA graphs
    steps: int = DEFAULT_FAST_STEPS  # denoising steps a chunk (wan.scheduler.FAST_STEP_INDICES); in the log
    # FastGenerator.warm_up before the session starts; None: on a GPU (on the CPU there is
    # nothing to compile or capture, only time to lose).
    warm_up: bool | None = None
    poll_s: float = 0.1  # how often a waiting session looks at the interrupt flag and the page

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode: {self.mode!r} is not one of {', '.join(MODES)}")
        if isinstance(self.chunk_budget, bool) or not 1 <= int(self.chunk_budget) <= MAX_CHUNK_BUDGET:
            raise ValueError(f"chunk_budget must be 1..{MAX_CHUNK_BUDGET} chunks, got {self.chunk_budget!r}")
        if not (math.isfinite(self.idle_timeout_s) and self.idle_timeout_s > 0):
            raise ValueError(f"idle_timeout must be a number of seconds > 0, got {self.idle_timeout_s!r}")
        if self.policy.full:
            raise ValueError("kv_window: a Play session has no known length, so the full cache cannot be used; "
                             "give a window (e.g. 9 latent frames with kv_sink 3)")
        if not 1 <= int(self.fps) <= 120:
            raise ValueError(f"fps must be 1..120, got {self.fps!r}")
        fast_step_indices(self.steps)  # refused naming steps


class FrameDecoder(Protocol):
    """Latent frames [1,16,T,h,w] (normalized, the next T of the video) → their video frames
    [1,3,T',8h,8w] in [-1,1], state carried between calls (``WanVAE.stream_decoder`` is one;
    a decoder with ``device`` / ``dtype`` attributes gets its input there)."""

    def decode_next(self, latent: torch.Tensor, cancel: Callable[[], None] | None = None) -> torch.Tensor: ...

    def close(self) -> None: ...


class VideoSink(Protocol):
    def write(self, video: torch.Tensor) -> None: ...

    def close(self) -> None: ...


@dataclass
class PlayResult:
    reason: str  # stop | budget | idle
    latent: torch.Tensor  # normalized [16, F_lat, h/8, w/8] float32 on the CPU
    log: dict  # the action log and the settings a replay needs
    chunks: int
    frames: int
    latency_s: list[float] = field(default_factory=list)  # input → the first frames of the chunk it asked for, sent
    chunk_s: list[float] = field(default_factory=list)  # the transformer's time per chunk
    decode_s: list[float] = field(default_factory=list)  # the VAE's per chunk
    warm_up_s: float | None = None  # the generator's warm-up before the session started (None: none ran)


class PlaySession:
    """One session (see the module docstring). ``image``: the start frame [3, H, W] in
    [-1, 1] at the session's size; ``vae``: the VAE used to encode it and to decode every
    chunk (the caller frees it after ``run``). ``emit(event, data)`` sends an event to the
    page; ``client_connected()`` tells whether the controller's page is connected;
    ``interrupt_types``: what ``check_interrupt`` raises (reported as reason "interrupt").
    ``overlap``: decode, write and send chunk n on a worker thread (a second CUDA stream)
    while chunk n+1 generates — a key pressed meanwhile starts its chunk at once; False:
    one after the other; None: overlap on a GPU (``pipeline.fast.worker.ChunkWorker``).
    ``decoder``: makes the stream decoder of the chunks (a ``FrameDecoder``, e.g. a tiny
    video VAE's); None: ``vae.stream_decoder()``, the Wan VAE's, on the VAE's device.
    ``save_log(log)``: stores the action log (``action_log()``) after each chunk is written
    and when the session ends, never before its first chunk."""

    def __init__(self, model: nn.Module, text: torch.Tensor | TextEmbeddings, vae: WanVAE, image: torch.Tensor,
                 settings: PlaySettings, *, writer: VideoSink | None = None,
                 emit: Callable[[str, dict], None] | None = None, controller: str | None = None,
                 node_id: str | None = None, client_connected: Callable[[], bool] | None = None,
                 check_interrupt: Callable[[], None] | None = None,
                 interrupt_types: tuple[type[BaseException], ...] = (), video_ref: dict | None = None,
                 clock: Callable[[], float] = time.monotonic, registry: SessionRegistry = SESSIONS,
                 session_id: str | None = None, overlap: bool | None = None, recipe: dict | None = None,
                 decoder: Callable[[], FrameDecoder] | None = None,
                 save_log: Callable[[dict], None] | None = None) -> None:
        if tuple(image.shape) != (3, settings.height, settings.width):
            raise ValueError(f"image: expected [3, {settings.height}, {settings.width}] in [-1, 1], got "
                             f"{list(image.shape)}")
        self.session_id = session_id or uuid.uuid4().hex
        self.model, self.text, self.vae, self.image = model, text, vae, image
        self.settings = settings
        self.writer, self._emit_to = writer, emit
        self.controller, self.node_id = controller, node_id
        self._connected = client_connected
        self._check = check_interrupt
        self.interrupt_types = interrupt_types
        self.video_ref = video_ref
        self.recipe = dict(recipe or {})  # what the caller knows of the inputs (prompt, start image): the log's too
        self.clock = clock
        self.registry = registry
        self.controls = PlayControls(settings.mode, clock=clock)
        self.camera = PlayCamera(settings.height, settings.width)
        self.chunks_done = 0
        self.frames_done = 0
        self.ended = False
        self.end_reason: str | None = None
        self.latency_s: list[float] = []
        self.chunk_s: list[float] = []
        self.decode_s: list[float] = []
        self.warm_up_s: float | None = None
        self._latents: list[torch.Tensor] = []
        self._state: str | None = None
        self._seen_at = clock()
        self._generator: FastGenerator | None = None
        self._i2v: StreamedI2V | None = None
        self._decoder: FrameDecoder | None = None
        self._make_decoder = decoder
        self._save_log = save_log
        self._worker: ChunkWorker | None = None
        self._overlap = overlap
        self._jobs: dict[int, list] = {}  # chunk -> [request, started, generated] until it is delivered

    # ---------------------------------------------------------------- what the page sees
    def _emit(self, event: str, data: dict) -> None:
        if self._emit_to is not None:
            self._emit_to(event, {"session_id": self.session_id, "node_id": self.node_id, **data})

    def state(self) -> str:
        return "ended" if self.ended else self.controls.state()

    def status(self) -> dict:
        """What ``GET /lingbot/play/{id}`` answers."""
        return {"session_id": self.session_id, "node_id": self.node_id, "state": self.state(),
                "mode": self.settings.mode, "chunks_done": self.chunks_done, "frames_done": self.frames_done, "controller": self.controller,
                "keys": keys_text(self.controls.keys), "reason": self.end_reason}

    def _publish_state(self, force: bool = False) -> None:
        state = self.state()
        if state == self._state and not force:
            return
        self._state = state
        data = {"state": state, "chunks_done": self.chunks_done, "frames_done": self.frames_done}
        if state == "ended":
            data["reason"] = self.end_reason
            data["video"] = self.video_ref if self.chunks_done else None
        self._emit(EVENT_STATE, data)

    # ---------------------------------------------------------------- the session
    def run(self) -> PlayResult:
        settings = self.settings
        self.registry.begin(self)
        reason = "error"
        try:
            self._open()
            reason = self._loop()
        except BaseException as exc:
            reason = "interrupt" if self.interrupt_types and isinstance(exc, self.interrupt_types) else "error"
            raise
        finally:
            self._close(reason)
        return PlayResult(reason, self.latent(), self.action_log(), self.chunks_done, self.frames_done,
                          list(self.latency_s), list(self.chunk_s), list(self.decode_s), self.warm_up_s)

    def _start(self) -> None:
        """Warm the generator up (where the settings say), then tell the page the session started."""
        settings = self.settings
        warm = settings.warm_up if settings.warm_up is not None else self._generator.device.type == "cuda"
        if warm:
            self.warm_up_s = self._generator.warm_up(camera=True).seconds
        self._emit(EVENT_STARTED, {"controller": self.controller, "mode": settings.mode, "fps": settings.fps,
                                   "width": settings.width, "height": settings.height,
                                   "chunk_budget": settings.chunk_budget,
                                   "idle_timeout_s": settings.idle_timeout_s, "keys": KEYS,
                                   "warm_up_s": self.warm_up_s})
        self._publish_state(force=True)

    def _open(self) -> None:
        settings = self.settings
        self._emit(EVENT_STARTING, {"step": STARTING_IMAGE})
        self._i2v = StreamedI2V(self.vae, self.image, None, check_interrupt=self._check)
        # To its fixed point (~30 latent frames): the encoder's state is gone before the
        # decoder's exists; bounded, as an open-ended session has no length to stop at.
        self._i2v.prefetch(PREFETCH_LATENT_FRAMES)
        self._emit(EVENT_STARTING, {"step": STARTING_WARMUP})
        params = FastParams(seed=settings.seed, shift=settings.shift, policy=settings.policy,
                            timestep_indices=fast_step_indices(settings.steps), attention=settings.attention,
                            camera_terms=settings.camera_terms, cuda_graphs=settings.cuda_graphs)
        self._decoder = self._make_decoder() if self._make_decoder is not None else self.vae.stream_decoder()
        device = self.model.patch_embedding.weight.device
        overlap = device.type == "cuda" if self._overlap is None else self._overlap
        self._worker = ChunkWorker(self._deliver, overlap=overlap, device=device)
        self._generator = FastGenerator(self.model, self.text, self._i2v, params, latent_frames=None,
                                        check_interrupt=self._check_all)

    def _loop(self) -> str:
        ended = {"reason": "budget"}

        def plan(c: int) -> ChunkPlan | None:
            if c >= self.settings.chunk_budget:
                return None
            request, reason = self._wait_for_request()
            if request is None:
                ended["reason"] = reason
                return None
            self._publish_state()  # running
            self._jobs[c] = [request, self.clock()]
            return ChunkPlan(self.camera.next_chunk(request.keys))

        try:
            # The decode beside yields to the chunks; the warm-up runs on their stream, so the
            # memory it leaves cached is what the chunks allocate from.
            with generation_first(self._generator.device, self._worker.overlap):
                self._start()
                self._generator.run(plan, self._generated)
        finally:
            self.controls.chunk_done()
        self._worker.close()  # the last chunk's frames are written and sent before the session ends
        return ended["reason"]

    def _generated(self, c: int, x0: torch.Tensor) -> None:
        """Chunk ``c`` is made: keep its latent, hand it to the decode (which, overlapped,
        runs while the next chunk starts) and take the next key press."""
        self._latents.append(x0.float().cpu())
        self._jobs[c].append(self.clock())
        self._worker.submit(c, x0)
        self.controls.chunk_done()
        self._publish_state()

    def _idle(self) -> bool:
        now = self.clock()
        if self._connected is None or self._connected():
            self._seen_at = now
        return now - max(self._seen_at, self.controls.last_input) >= self.settings.idle_timeout_s

    def _check_all(self) -> None:
        """The interrupt check, and the decode worker's failure (raised here, not lost)."""
        if self._worker is not None:
            self._worker.check()
        if self._check is not None:
            self._check()

    def _wait_for_request(self) -> tuple[ChunkRequest | None, str | None]:
        while True:
            self._check_all()
            if self.controls.stop_requested:
                return None, "stop"
            if self._idle():
                return None, "idle"
            request = self.controls.take_request()
            if request is not None:
                return request, None
            self._publish_state()
            self.controls.wait(self.settings.poll_s)

    def _deliver(self, c: int, x0: torch.Tensor) -> None:
        """Decode chunk ``c``, send it to the page and write it to the file (on the decode
        worker when overlapped: in order, one chunk at a time), one latent frame at a time:
        each latent frame's frames (1 for the video's first, 4 after) are sent and written
        as soon as they are decoded, so the chunk's first frame does not wait for its last
        (the stream decoder's pieces together are bitwise the whole chunk's decode). The
        page gets them before the .mp4 does: the file's H.264 encode, the slowest step on
        the CPU, is not in the key → frame time."""
        request, started, generated = self._jobs.pop(c)
        # The decoder may be on the CPU or another GPU than the transformer.
        latent = x0[None].to(device=getattr(self._decoder, "device", self.vae.device),
                             dtype=getattr(self._decoder, "dtype", self.vae.dtype))
        parts = int(latent.shape[2])
        first = self.frames_done == 0
        chunk_frames = video_frames(parts) if first else VAE_STRIDE_T * parts
        keys, chunk_s = keys_text(request.keys), generated - started
        decode_s, sent, latency = 0.0, 0, None
        for part in range(parts):
            begun = self.clock()
            # Cancel only before a chunk's first frames: once some are out the chunk is
            # finished (two latent frames more), so the file and the log hold whole chunks.
            video = self._decoder.decode_next(latent[:, :, part:part + 1],
                                              cancel=self._check if part == 0 else None)[0].float().cpu()
            decode_s += self.clock() - begun
            frames = jpeg_frames(video)
            sent_at = self.clock()
            if part == 0 and request.asked_at is not None:
                # Key to the chunk's first frame as the page meets it: decoded and encoded
                # for it (every part carries the chunk's figure).
                latency = sent_at - request.asked_at
                self.latency_s.append(latency)
            self._emit(EVENT_FRAMES, {"chunk": c, "first_frame": self.frames_done + sent, "frames": frames,
                                      "part": part, "last": part == parts - 1, "chunk_frames": chunk_frames,
                                      "keys": keys, "latency_s": latency, "chunk_s": chunk_s, "sent_at": sent_at})
            if self.writer is not None:
                self.writer.write(video)
            sent += len(frames)
        self.decode_s.append(decode_s)
        self.chunk_s.append(chunk_s)
        self.chunks_done += 1
        self.frames_done += sent
        try:
            self._store_log()  # the chunk is in the file: the log on disk replays it from now on
        except OSError as exc:  # the session goes on; the write at its end says it again if it still fails
            log.warning("LingBot Play: the action log after chunk %d could not be written: %s", self.chunks_done, exc)
        # Every page gets the counts with the chunk's last frames (a state event sent when the
        # chunk was generated may predate its decode): viewers show what the controller shows.
        self._publish_state(force=True)

    def _store_log(self) -> None:
        if self._save_log is not None and self.chunks_done:
            self._save_log(self.action_log())

    def _close(self, reason: str) -> None:
        self.end_reason = reason
        graphs = self._generator.graph_counts() if self._generator is not None else None
        if self.chunk_s:
            # Where a chunk's time went, for whoever reads the server's log after a slow session.
            log.info("LingBot Play: %d chunks (%s); the transformer %.3f s, the decode %.3f s per chunk (median)%s",
                     self.chunks_done, reason, statistics.median(self.chunk_s),
                     statistics.median(self.decode_s) if self.decode_s else 0.0,
                     f"; CUDA graphs: {graphs}" if graphs is not None else "")
        try:
            if self._worker is not None:
                self._worker.close(failed=True)  # the chunk in flight is written; a failure there was raised
            for closer in (self._generator, self._decoder, self._i2v):
                if closer is not None:
                    closer.close()
            self._generator = self._decoder = self._i2v = self._worker = None
            if self.writer is not None:
                self.writer.close()  # the file holds every finished chunk and plays
            self._store_log()  # with the end's reason
        finally:
            self.ended = True
            self.controls.stop()
            self.registry.end(self)
            self._publish_state(force=True)
            empty_device_cache()

    # ---------------------------------------------------------------- what it made
    def latent(self) -> torch.Tensor:
        """The session's normalized latent [16, F_lat, h/8, w/8] (float32, CPU)."""
        if not self._latents:
            return torch.empty(LATENT_CHANNELS, 0, *latent_size(self.settings.height, self.settings.width))
        return torch.cat(self._latents, dim=1)

    def action_log(self) -> dict:
        """The keys of every finished frame and the settings that replay them."""
        settings = self.settings
        frames = self.frames_done
        keys = self.camera.law.keys_per_frame[:max(0, frames - 1)]
        return {
            "actions": format_actions(keys), "frames": frames, "chunks": self.chunks_done,
            "chunk_keys": [keys_text(k) for k in self.camera.chunk_keys[:self.chunks_done]],
            "seed": settings.seed, "shift": settings.shift, "steps": settings.steps,
            "kv_window": settings.policy.window, "kv_sink": settings.policy.sink, "kv_dtype": settings.policy.dtype,
            "keyframes": KEYFRAMES_PLAY,
            "width": settings.width, "height": settings.height, "vae_precision": settings.vae_precision,
            "fps": settings.fps, "mode": settings.mode, "ended": self.end_reason,
            **self.recipe,
        }
