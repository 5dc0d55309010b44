"""The causal key/value cache of LingBot-World Fast: committed chunks' self-attention keys
and values, per layer, in a memory that does not grow with the video.

LingBot-World Fast generates a video a chunk of 3 latent frames at a time. Inside a chunk
attention is bidirectional; across chunks it is causal: a chunk's queries see the keys and
values of earlier chunks (written by each chunk's final pass at t = 0, the *commit*) and
its own. Keys are stored after RMS norm and RoPE, so a stored key never changes.

Policies (``CachePolicy``):

* full (``window=None``): every committed frame stays, as the official code does. Memory
  grows with the video: at 480x832 one latent frame is 1,560 tokens and its K+V over 40
  layers in bf16 take 1.28 GB (27 GB for an 81-frame video), so this only fits short
  clips on big cards. ``window`` at least the video's latent frames is the same cache.
* sink + sliding window (``window=W, sink=S``): a chunk attends to at most W latent frames
  including its own: the first S frames of the video (the *sink*, never evicted) and the
  most recent others; when a commit does not fit, the oldest non-sink frames are evicted.
  This is the roll of the official code (Self-Forcing style), which the official release
  keeps switched off; the Fast model was trained with the full cache, so a window changes
  what the model sees (its quality on the real weights is not measured here).

Proposed defaults (the lead decides after measuring): window 9, sink 3 — the first chunk
(which holds the conditioning image) plus the previous chunk plus the chunk itself, the
smallest window that keeps both the image and the motion in view. At 480x832 that is 11.5
GB in bf16 (9 frame slots x 1.28 GB: 6 committed + 3 for the chunk being made), plus 0.42 GB
of cross-attention keys and values: with the NF4 transformer (~9 GB) it is sized for a 24 GB
card. The int8 cache stores the 6 committed frames in 8 bits (3.8 GB + 0.12 GB of scales)
and needs one bf16 work buffer of 9 frames for a single layer (0.29 GB): ~4.7 GB with the
cross-attention cache, the choice for a 16 GB card.

Layout (why attention costs no copy): per layer one buffer holds ``window`` frame slots of
tokens x (heads * head_dim). The committed frames occupy slots 0..n-1 in any order
(attention does not care about key order: positions are already in the keys through
RoPE); the chunk being generated writes its keys and values into slots n..n+chunk-1 on
every pass. So the keys a chunk attends to are always the single contiguous slice
``[0, (n + chunk) * tokens)`` of its layer's buffer. At a commit, chunk frames that land past
the committed capacity are copied into the slots of the evicted frames (a chunk's worth
of memory per layer, once per chunk).

int8: committed frames are stored with one absmax scale per token and head (float32);
each layer's pass dequantizes them into one work buffer shared by all layers, behind which
the current chunk writes its own keys and values unquantized (a chunk's own K/V are never
quantized). Quantization error per element is at most scale / 2 (round to nearest).

fp8 attention operands (``LayerKV.attended_fp8``): an attention kernel on fp8 keys and
values with one scale per head (``flash_fp8``) would cast all 9 frames' keys and values on
every pass, 6 of them committed frames that do not change within a chunk. A bf16 cache
keeps their fp8 cast per layer instead (the window's slots again in one byte: 5.75 GB at
480x832 beside the cache's 11.5) with each frame's per-head absmax, so a pass casts the
chunk's own 3 frames, and a committed frame only when the head's scale (the absmax over
all attended frames) moved. The operands are bit for bit ``weights8.quantize_heads`` of
``attended()``. Allocated on the first such call; LINGBOT_KV_FP8_KEEP=0 turns it off.

Every other tensor is allocated when the cache is created; nothing grows with the video's
length. Pure PyTorch: nothing here imports the model.

Kept between sessions (``KeptCache``): a cache made for CUDA graphs (``graphs=True``) is the
model's, not the session's. When its session closes it, it is ``reset`` (no committed frame,
no text, the fp8 operands stale: what a new cache holds) but keeps its buffers and its
graphs, and the model's next ``new_kv_cache`` with the same arguments gets it back: the next
session replays what the last one (or a warm-up) captured. ``free()`` frees it for good.
"""
from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from typing import Callable, Hashable, Iterator, Sequence

import torch

from ..geometry import CHUNK_FRAMES, MAX_TOKENS
from . import fused, switches
from .cuda_graphs import ForwardGraphs
from .weights8 import FP8, head_absmax, heads_scale, requantize_heads

KV_DTYPES = ("bf16", "int8")
INT8_MAX = 127
@dataclass(frozen=True)
class CachePolicy:
    """What the cache keeps. ``window``: latent frames one chunk attends to, its own
    included (None: the full cache, the official setting); ``sink``: the video's first
    latent frames, never evicted (ignored by the full cache, which evicts nothing);
    ``dtype``: "bf16" (the model's compute dtype: bf16 on the GPU, float32 for a float32
    model) or "int8" (committed frames in 8 bits, per token and head scales)."""

    window: int | None = 9
    sink: int = 3
    dtype: str = "bf16"
    chunk: int = CHUNK_FRAMES

    def __post_init__(self) -> None:
        if isinstance(self.chunk, bool) or not isinstance(self.chunk, int) or self.chunk < 1:
            raise ValueError(f"chunk must be a positive number of latent frames, got {self.chunk!r}")
        if self.dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, got {self.dtype!r}")
        if isinstance(self.sink, bool) or not isinstance(self.sink, int) or self.sink < 0:
            raise ValueError(f"kv_sink must be a whole number of latent frames (0 or more), got {self.sink!r}")
        if self.window is None:
            return
        if isinstance(self.window, bool) or not isinstance(self.window, int):
            raise ValueError(f"kv_window must be a whole number of latent frames (or none for the full cache), "
                             f"got {self.window!r}")
        if self.window < self.chunk:
            raise ValueError(f"kv_window={self.window} latent frames is smaller than one chunk ({self.chunk}); "
                             f"a chunk attends to at least itself: use kv_window >= {self.chunk}")
        if self.sink >= self.window:
            raise ValueError(f"kv_sink={self.sink} must be smaller than kv_window={self.window} (the window "
                             "includes the sink frames and the chunk itself)")
        if self.sink + self.chunk > self.window:
            raise ValueError(f"kv_sink={self.sink} plus one chunk ({self.chunk}) exceeds kv_window={self.window}: "
                             f"use kv_sink <= {self.window - self.chunk} or a larger kv_window")

    @property
    def full(self) -> bool:
        return self.window is None

    def resolve(self, latent_frames: int | None) -> tuple[int, int]:
        """(window, sink) in latent frames for a video of ``latent_frames`` (None: open-ended).

        The full cache is a window of the whole video; a window at least the video's length
        is that same cache (nothing is ever evicted, so the sink plays no part)."""
        if latent_frames is not None and (latent_frames < self.chunk or latent_frames % self.chunk):
            raise ValueError(f"frames: {latent_frames} latent frames do not fill whole chunks of {self.chunk}")
        if self.window is None:
            if latent_frames is None:
                raise ValueError("kv_window: the full cache needs the video's length; give a window for an "
                                 "open-ended session")
            return latent_frames, 0
        if latent_frames is not None and self.window >= latent_frames:
            return latent_frames, 0
        return self.window, self.sink

    def describe(self) -> str:
        kind = "full cache" if self.full else f"window {self.window} sink {self.sink}"
        return f"{kind}, {self.dtype}"


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [tokens, heads, head_dim] -> (int8 values, float32 scales [tokens, heads]).

    Symmetric absmax per token and head: scale = max|x| / 127, q = round(x / scale), so
    |x - q * scale| <= scale / 2. An all-zero row gets scale 0 and q = 0 (exact)."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1) / INT8_MAX
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(xf / safe[..., None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def dequantize_int8_pytorch(q: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The definition of ``dequantize_int8`` in PyTorch ops (what runs off CUDA): the product
    in float32, rounded once to out's dtype."""
    out.copy_(q)
    return out.mul_(scale[..., None])


def _dequantize_int8_cuda(kernels, q: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return kernels.dequantize_int8(q, scale, out)


fused.register_kernel(dequantize_int8_pytorch, _dequantize_int8_cuda)


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out`` [tokens, heads, head_dim] <- q * scale, in out's dtype, without temporaries.
    Every layer's pass of an int8 cache runs this over the committed frames' keys and values
    (48 MB of int8 each at 480x832, window 9): on CUDA one Triton pass
    (``triton_kernels.dequantize_int8``, bit for bit the definition) instead of the
    definition's two passes over the bf16 output; elsewhere, or with LINGBOT_FUSED=0,
    ``dequantize_int8_pytorch``."""
    return fused.run(dequantize_int8_pytorch, q, scale, out)


@dataclass(frozen=True)
class CommitPlan:
    """Where a committing chunk's frames go. ``dest[j]``: the committed slot of the chunk's
    frame j (None: evicted at once); ``slot_frames``: absolute frame per committed slot after
    the commit."""

    dest: tuple[int | None, ...]
    slot_frames: tuple[int, ...]


def plan_commit(slot_frames: Sequence[int], new_frames: Sequence[int], capacity: int, sink: int) -> CommitPlan:
    """Commit ``new_frames`` (held in slots n.. after the ``n`` committed ones) into at most
    ``capacity`` slots, evicting the oldest frames not in the sink (frames < ``sink``).

    The chunk's frames that sit below ``capacity`` stay in their slots; the ones past it move
    into the slots of evicted frames. The evicted set is exactly the official roll's: the
    oldest non-sink frames, as many as needed."""
    frames = list(slot_frames) + list(new_frames)
    n = len(slot_frames)
    if len(frames) <= capacity:
        return CommitPlan(tuple(range(n, n + len(new_frames))), tuple(frames))
    evict_count = len(frames) - capacity
    evicted = set(sorted(f for f in frames if f >= sink)[:evict_count])
    if len(evicted) < evict_count:
        raise RuntimeError(f"the cache cannot hold {len(frames)} frames with {capacity} slots and sink {sink}")
    free = [slot for slot in range(capacity) if frames[slot] in evicted]
    movers = [slot for slot in range(capacity, len(frames)) if frames[slot] not in evicted]
    moves = dict(zip(movers, free))
    dest: list[int | None] = []
    for j in range(len(new_frames)):
        slot = n + j
        dest.append(None if frames[slot] in evicted else moves.get(slot, slot))
    after = list(frames[:capacity])
    for src, dst in moves.items():
        after[dst] = frames[src]
    return CommitPlan(tuple(dest), tuple(after))


class LayerKV:
    """One layer's view of the cache during a pass (what a transformer block uses)."""

    def __init__(self, cache: "KVCache", index: int) -> None:
        self.cache, self.index = cache, index

    @property
    def kv_only(self) -> bool:
        """The commit pass of the last layer: only its keys and values are needed."""
        return self.cache.committing and self.index == self.cache.layers - 1

    def new_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Where this pass writes the chunk's keys and values: two contiguous [chunk tokens,
        heads * head_dim] views in the compute dtype."""
        return self.cache._new_kv(self.index)

    def attended(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values the chunk's queries attend to: [L, heads * head_dim] each, one
        contiguous slice (committed frames first, the chunk last). int8: dequantized now."""
        return self.cache._attended(self.index)

    def attended_fp8(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The keys and values of ``attended()`` as an fp8 attention kernel takes them,
        (k, v [1, L, heads, head_dim] fp8 e4m3, k_scales, v_scales [1, heads] float32): bit
        for bit ``weights8.quantize_heads`` of each, with the committed frames cast only when
        their head's scale moved (see the module's docstring). Call after the pass wrote the
        chunk's keys and values (``new_kv``). None where the cache keeps none (int8 caches,
        LINGBOT_KV_FP8_KEEP=0)."""
        return self.cache._attended_fp8(self.index)

    def stored(self) -> None:
        """Call after the layer's attention: in the commit pass, the chunk's keys and values
        become committed frames (int8: quantized; bf16: moved into evicted slots)."""
        if self.cache.committing:
            self.cache._store(self.index)

    def cross(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """This layer's text keys and values, once computed (they never change in a session)."""
        return self.cache._cross[self.index] if self.cache._cross_set[self.index] else None

    def set_cross(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Keep this layer's text keys and values: copied into the cache's own tensors, which
        keep their addresses from one session to the next (graphs read them)."""
        self.cache._set_cross(self.index, k, v)


class KVCache:
    """The cache of one generation session (one prompt, one video or Play session).

    ``latent_frames``: the video's length in latent frames (needed by the full cache; None
    for an open-ended session). The chunk being generated starts at latent frame
    ``frame_start``; the model runs a pass inside ``in_pass`` (``begin_pass`` …
    ``end_pass``). ``close()`` ends the session: it frees everything, unless the model keeps
    the cache for its next session (``keeper``, a ``KeptCache``); ``free()`` always frees.
    """

    def __init__(self, policy: CachePolicy, *, layers: int, heads: int, head_dim: int, frame_tokens: int,
                 dtype: torch.dtype, device: torch.device | str, latent_frames: int | None = None) -> None:
        if frame_tokens < 1 or layers < 1 or heads < 1 or head_dim < 1:
            raise ValueError(f"cache geometry must be positive: layers={layers} heads={heads} head_dim={head_dim} "
                             f"frame_tokens={frame_tokens}")
        self.policy = policy
        self.window, self.sink = policy.resolve(latent_frames)
        self.chunk = policy.chunk
        self.capacity = self.window - self.chunk  # committed frames kept
        self.layers, self.heads, self.head_dim = layers, heads, head_dim
        self.frame_tokens = frame_tokens
        self.latent_frames = latent_frames
        self.dtype, self.device = dtype, torch.device(device)
        self.int8 = policy.dtype == "int8"
        dim = heads * head_dim
        slots = self.window * frame_tokens
        # Plain tensors (not inference tensors): written in place under inference_mode or no_grad alike.
        with torch.inference_mode(False), torch.no_grad():
            if self.int8:
                stored = self.capacity * frame_tokens
                self._k8 = torch.empty(layers, stored, heads, head_dim, dtype=torch.int8, device=self.device)
                self._v8 = torch.empty_like(self._k8)
                self._k_scale = torch.zeros(layers, stored, heads, dtype=torch.float32, device=self.device)
                self._v_scale = torch.zeros_like(self._k_scale)
                self._k = torch.empty(1, slots, dim, dtype=dtype, device=self.device)  # the shared work buffer
                self._v = torch.empty_like(self._k)
            else:
                self._k = torch.empty(layers, slots, dim, dtype=dtype, device=self.device)
                self._v = torch.empty_like(self._k)
        # The text's keys and values per layer (allocated on the first session's first pass) and
        # whether this session has computed them.
        self._cross: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * layers
        self._cross_set = [False] * layers
        # fp8 attention operands kept between passes (``attended_fp8``): made on first use.
        self.keeps_fp8 = not self.int8 and switches.KV_FP8_KEEP()
        self._fp8: _KeptFP8 | None = None
        self._layers = [LayerKV(self, i) for i in range(layers)]
        self.slot_frames: list[int] = []  # absolute latent frame held by each committed slot
        self.frame_start = 0  # the chunk being generated starts at this absolute latent frame
        self.committing = False
        self._plan: CommitPlan | None = None
        self._in_pass = False
        self._broken: str | None = None
        self.closed = False
        # The session's captured forwards (runtime/cuda_graphs.py); they read this cache's
        # buffers, so they live and die with it. None: every pass runs eagerly.
        self.graphs: ForwardGraphs | None = None
        # The model's ``KeptCache`` when the model keeps this cache between sessions (held weakly:
        # the keeper holds the cache, so a dropped model frees both without the cycle collector).
        self._keeper: weakref.ref | None = None

    @property
    def keeper(self) -> "KeptCache | None":
        return None if self._keeper is None else self._keeper()

    @keeper.setter
    def keeper(self, keeper: "KeptCache | None") -> None:
        self._keeper = None if keeper is None else weakref.ref(keeper)

    # ------------------------------------------------------------------ accounting
    def nbytes(self) -> int:
        """Bytes this cache holds on its device (self-attention slots, scales, work buffer and
        the cross-attention keys and values computed so far)."""
        tensors = [self._k, self._v] + ([self._k8, self._v8, self._k_scale, self._v_scale] if self.int8 else [])
        if self._fp8 is not None:
            tensors += self._fp8.tensors()
        total = sum(t.numel() * t.element_size() for t in tensors)
        return total + sum(t.numel() * t.element_size() for kv in self._cross if kv for t in kv)

    @staticmethod
    def estimate_bytes(policy: CachePolicy, *, layers: int, heads: int, head_dim: int, frame_tokens: int,
                       dtype_bytes: int = 2, latent_frames: int | None = None, text_tokens: int = MAX_TOKENS,
                       fp8_operands: bool = False) -> int:
        """What ``nbytes`` will be once the cross-attention cache is filled, without allocating.
        ``fp8_operands``: the run attends with an fp8 kernel, so a bf16 cache also keeps
        the fp8 operands (``attended_fp8``; LINGBOT_KV_FP8_KEEP=0 aside)."""
        window, _ = policy.resolve(latent_frames)
        dim, tokens = heads * head_dim, window * frame_tokens
        cross = 2 * layers * text_tokens * dim * dtype_bytes
        if policy.dtype == "int8":
            stored = (window - policy.chunk) * frame_tokens
            return 2 * (layers * stored * dim + layers * stored * heads * 4 + tokens * dim * dtype_bytes) + cross
        kept = _KeptFP8.estimate_bytes(layers, tokens, heads, head_dim, window) if (
            fp8_operands and switches.KV_FP8_KEEP()) else 0
        return 2 * layers * tokens * dim * dtype_bytes + cross + kept

    # ------------------------------------------------------------------ introspection
    @property
    def committed(self) -> int:
        return len(self.slot_frames)

    @property
    def full(self) -> bool:
        """Every committed slot holds a frame: from here on each chunk's passes have the same
        shapes (what a captured graph needs)."""
        return self.committed == self.capacity

    @property
    def commit_slots(self) -> tuple[int | None, ...] | None:
        """During a commit pass, where the chunk's frames go (``CommitPlan.dest``); else None."""
        return None if self._plan is None else self._plan.dest

    @property
    def cross_ready(self) -> bool:
        return all(self._cross_set)

    def attended_frames(self) -> list[int]:
        """Absolute latent frames the current chunk's queries see, in key order."""
        return list(self.slot_frames) + list(range(self.frame_start, self.frame_start + self.chunk))

    def layer(self, index: int) -> LayerKV:
        return self._layers[index]

    # ------------------------------------------------------------------ passes
    def check_geometry(self, frames: int, frame_tokens: int, heads: int, head_dim: int, layers: int,
                       device: torch.device) -> None:
        """Refuse a pass the cache was not made for (naming what differs)."""
        if self.closed:
            raise RuntimeError("the KV cache was freed (the session ended); start a new session")
        if self._broken:
            raise RuntimeError(f"the KV cache is incomplete after an interrupted pass ({self._broken}); "
                               "start a new session")
        if frames != self.chunk:
            raise ValueError(f"x: {frames} latent frames per pass, the cache works in chunks of {self.chunk}")
        if frame_tokens != self.frame_tokens:
            raise ValueError(f"x: {frame_tokens} tokens per latent frame, the cache was made for {self.frame_tokens} "
                             "(a different width or height)")
        if (heads, head_dim, layers) != (self.heads, self.head_dim, self.layers):
            raise ValueError(f"the cache is for {self.layers} layers of {self.heads}x{self.head_dim}, the model has "
                             f"{layers} layers of {heads}x{head_dim}")
        if torch.device(device) != self.device and not (self.device.type == device.type == "cuda"
                                                       and self.device.index in (None, device.index)):
            raise ValueError(f"the cache is on {self.device}, the model runs on {device}")

    def begin_pass(self, commit: bool) -> None:
        """Start a forward over the current chunk; ``commit``: the t = 0 pass that stores it."""
        if self._in_pass:
            raise RuntimeError("a KV cache pass is already running")
        if commit and self.latent_frames is not None and self.frame_start + self.chunk > self.latent_frames:
            raise ValueError(f"the video has {self.latent_frames} latent frames; chunk at frame {self.frame_start} "
                             "is past its end")
        self._in_pass = True
        self.committing = commit
        if self._fp8 is not None:
            self._fp8.ran = [False] * self.layers
        self._plan = plan_commit(self.slot_frames, range(self.frame_start, self.frame_start + self.chunk),
                                 self.capacity, self.sink) if commit else None

    def end_pass(self) -> None:
        """Finish a pass that ran through every layer; a commit advances to the next chunk."""
        if self.committing:
            self.slot_frames = list(self._plan.slot_frames)
            self.frame_start += self.chunk
        self._in_pass, self.committing, self._plan = False, False, None

    def abort_pass(self, reason: str) -> None:
        """A pass stopped part way (cancel, error): some layers may hold the new chunk and some
        not, so the cache refuses further passes."""
        if self._in_pass and self.committing:
            self._broken = reason
        self._in_pass, self.committing, self._plan = False, False, None

    @contextlib.contextmanager
    def in_pass(self, commit: bool) -> Iterator[None]:
        """A forward over the current chunk: ``begin_pass`` before, ``end_pass`` after, or
        ``abort_pass`` when it raises."""
        self.begin_pass(commit)
        try:
            yield
        except BaseException as exc:
            self.abort_pass(type(exc).__name__)
            raise
        self.end_pass()

    def skip_chunk(self) -> None:
        """Move on to the next chunk without committing this one (the last chunk of a clip:
        nothing will attend to it)."""
        self.frame_start += self.chunk

    def reset(self) -> None:
        """Back to what a new cache holds (no committed frame, the chunk at frame 0, no text,
        the kept fp8 operands stale, an interrupted pass forgotten), in place: every tensor,
        and the graphs that read them, stay where they are."""
        self.slot_frames = []
        self.frame_start = 0
        self._in_pass, self.committing, self._plan, self._broken = False, False, None, None
        self._cross_set = [False] * self.layers
        if self.int8:
            self._k_scale.zero_()
            self._v_scale.zero_()
        if self._fp8 is not None:
            self._fp8.reset()
        if self.graphs is not None and (self.graphs.disabled or "").startswith("capture failed"):
            self.graphs.disabled = None  # a capture that failed (short of memory, say) is tried again
        self.closed = False

    def close(self) -> None:
        """The session is over: every tensor freed now (a node output or traceback may keep the
        object alive), unless the model keeps this cache for its next session (``keeper``):
        then it is ``reset`` and refuses passes until the model hands it out again."""
        if self.keeper is not None:
            self.reset()
            self.closed = True
            return
        self.free()

    def free(self) -> None:
        """Free every tensor now, kept by the model or not (after an out-of-memory error)."""
        if self.keeper is not None:
            self.keeper.forget(self)
        for name in ("_k", "_v", "_k8", "_v8", "_k_scale", "_v_scale"):
            if hasattr(self, name):
                setattr(self, name, None)
        self._fp8 = None
        if self.graphs is not None:
            self.graphs.close()
            self.graphs = None
        self._cross = [None] * self.layers
        self._cross_set = [False] * self.layers
        self.slot_frames = []
        self.closed = True

    # ------------------------------------------------------------------ per layer
    def _set_cross(self, index: int, k: torch.Tensor, v: torch.Tensor) -> None:
        kept = self._cross[index]
        if kept is None or any(a.shape != b.shape or a.dtype != b.dtype for a, b in zip(kept, (k, v))):
            with torch.inference_mode(False), torch.no_grad():
                kept = self._cross[index] = (torch.empty_like(k), torch.empty_like(v))
        kept[0].copy_(k)
        kept[1].copy_(v)
        self._cross_set[index] = True

    def _buffers(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (self._k[0], self._v[0]) if self.int8 else (self._k[index], self._v[index])

    def _new_kv(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self._buffers(index)
        start = self.committed * self.frame_tokens
        stop = start + self.chunk * self.frame_tokens
        return k[start:stop], v[start:stop]

    def _attended(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self._buffers(index)
        n = self.committed * self.frame_tokens
        if self.int8 and n:
            shape = (n, self.heads, self.head_dim)
            dequantize_int8(self._k8[index, :n], self._k_scale[index, :n], k[:n].view(shape))
            dequantize_int8(self._v8[index, :n], self._v_scale[index, :n], v[:n].view(shape))
        stop = n + self.chunk * self.frame_tokens
        return k[:stop], v[:stop]

    def _attended_fp8(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
        if not self.keeps_fp8:
            return None
        if self._fp8 is None:
            with torch.inference_mode(False), torch.no_grad():
                self._fp8 = _KeptFP8(self.layers, self.window * self.frame_tokens, self.heads, self.head_dim,
                                     self.window, self.device)
        kept, ft, n = self._fp8, self.frame_tokens, self.committed
        stop = (n + self.chunk) * ft
        shape = (self.heads, self.head_dim)
        out: list[torch.Tensor] = []
        for j, (source, values) in enumerate(zip(self._buffers(index), (kept.k[index], kept.v[index]))):
            new = source[n * ft:stop].view(self.chunk, ft, *shape)
            kept.amax[j, index, n:n + self.chunk] = head_absmax(new)  # per frame: a commit moves frames
            scales = heads_scale(kept.amax[j, index, :n + self.chunk].amax(0))  # the max over all: exact
            requantize_heads(source[:stop].view(stop, *shape), values[:stop], scales, kept.scale[j, index], n * ft)
            kept.scale[j, index].copy_(scales)
            out += [values[:stop], scales]
        kept.ran[index] = True
        k8, k_scales, v8, v_scales = out
        return k8[None], v8[None], k_scales[None], v_scales[None]

    def _store(self, index: int) -> None:
        """The commit pass's keys and values of layer ``index`` become committed frames."""
        ft, n = self.frame_tokens, self.committed
        k, v = self._buffers(index)
        if self._fp8 is not None:
            self._store_fp8(index)
        if self.int8:
            shape = (self.chunk * ft, self.heads, self.head_dim)
            new = slice(n * ft, (n + self.chunk) * ft)
            for source, q_store, s_store in ((k, self._k8, self._k_scale), (v, self._v8, self._v_scale)):
                q, scale = quantize_int8(source[new].view(shape))
                for j, dest in enumerate(self._plan.dest):
                    if dest is not None:
                        q_store[index, dest * ft:(dest + 1) * ft] = q[j * ft:(j + 1) * ft]
                        s_store[index, dest * ft:(dest + 1) * ft] = scale[j * ft:(j + 1) * ft]
            return
        for j, dest in enumerate(self._plan.dest):
            src = n + j
            if dest is not None and dest != src:
                k[dest * ft:(dest + 1) * ft] = k[src * ft:(src + 1) * ft]
                v[dest * ft:(dest + 1) * ft] = v[src * ft:(src + 1) * ft]

    def _store_fp8(self, index: int) -> None:
        """The kept fp8 operands follow the commit's moves. A layer whose pass cast none
        (the last layer of a commit pass attends to nothing) has its chunk frames' absmax
        taken here and its cast marked stale, so the next pass casts every frame again."""
        kept, ft, n, chunk = self._fp8, self.frame_tokens, self.committed, self.chunk
        if not kept.ran[index]:
            for j, source in enumerate(self._buffers(index)):
                new = source[n * ft:(n + chunk) * ft].view(chunk, ft, self.heads, self.head_dim)
                kept.amax[j, index, n:n + chunk] = head_absmax(new)
            kept.scale[:, index].fill_(-1.0)  # no scale is -1: every head's cast is stale
        for j, dest in enumerate(self._plan.dest):
            src = n + j
            if dest is None or dest == src:
                continue
            kept.amax[:, index, dest] = kept.amax[:, index, src]
            if kept.ran[index]:
                for values in (kept.k[index], kept.v[index]):
                    values[dest * ft:(dest + 1) * ft] = values[src * ft:(src + 1) * ft]


class _KeptFP8:
    """A bf16 cache's fp8 attention operands (``KVCache._attended_fp8``): per layer the
    window's keys and values cast to fp8 e4m3, each slot's per-head absmax (keys, values),
    and the scale each layer's cast was made with (-1: stale)."""

    def __init__(self, layers: int, tokens: int, heads: int, head_dim: int, slots: int,
                 device: torch.device) -> None:
        self.k = torch.empty(layers, tokens, heads, head_dim, dtype=FP8, device=device)
        self.v = torch.empty_like(self.k)
        self.amax = torch.zeros(2, layers, slots, heads, dtype=torch.float32, device=device)
        self.scale = torch.full((2, layers, heads), -1.0, dtype=torch.float32, device=device)
        self.ran = [False] * layers  # layers whose cast this pass made (the commit's moves need it)

    def tensors(self) -> list[torch.Tensor]:
        return [self.k, self.v, self.amax, self.scale]

    def reset(self) -> None:
        """What a new one holds: no absmax, every cast stale (the fp8 values are never read
        before a pass casts them)."""
        self.amax.zero_()
        self.scale.fill_(-1.0)
        self.ran = [False] * len(self.ran)

    @staticmethod
    def estimate_bytes(layers: int, tokens: int, heads: int, head_dim: int, slots: int) -> int:
        return 2 * layers * tokens * heads * head_dim + 4 * 2 * layers * heads * (slots + 1)


class KeptCache:
    """The KV cache a model keeps for its next session (``LingBotDiT.new_kv_cache(...,
    graphs=True)``): the session's CUDA graphs read the cache's buffers, so a cache handed out
    again, reset, with the same arguments replays them, and its buffers need no allocation.

    One cache at a time: ``take`` with other arguments frees the kept one first (so two never
    take memory together); while the kept one is in use (not closed) another session gets a
    cache of its own, freed when it closes. ``release`` frees it (the model unloaded)."""

    def __init__(self) -> None:
        self._cache: KVCache | None = None
        self._key: Hashable = None

    @property
    def cache(self) -> "KVCache | None":
        return self._cache

    def take(self, key: Hashable, build: Callable[[], "KVCache"]) -> "KVCache":
        """The kept cache when it was made with ``key`` and its session closed it (reset),
        else ``build()`` (kept from now on, unless the kept one is in use)."""
        kept = self._cache
        if kept is not None and not kept.closed:
            return build()
        if kept is not None and self._key == key:
            kept.closed = False
            return kept
        self.release()
        cache = build()
        cache.keeper = self
        self._cache, self._key = cache, key
        return cache

    def forget(self, cache: "KVCache") -> None:
        """``cache`` is no longer kept (it is being freed)."""
        cache.keeper = None
        if self._cache is cache:
            self._cache, self._key = None, None

    def release(self) -> None:
        """Free the kept cache now; one still in use is freed when its session closes it."""
        cache = self._cache
        if cache is None:
            return
        self.forget(cache)
        if cache.closed:
            cache.free()


def frames_bytes(frames: int, frame_tokens: int, layers: int, dim: int, dtype_bytes: int = 2) -> int:
    """K+V bytes of ``frames`` latent frames over all layers (1.28 GB a frame at 480x832, A14B)."""
    return 2 * frames * frame_tokens * layers * dim * dtype_bytes


__all__ = ["CHUNK_FRAMES", "CachePolicy", "CommitPlan", "KVCache", "KV_DTYPES", "KeptCache", "LayerKV",
           "dequantize_int8", "dequantize_int8_pytorch", "frames_bytes", "plan_commit", "quantize_int8"]
