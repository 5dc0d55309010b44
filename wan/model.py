"""The LingBot-World diffusion transformer (Wan2.2 I2V-A14B plus camera layers).

Module and parameter names follow the official checkpoints, so their state dicts load as
they are. Inference-oriented choices:

* The residual stream and all modulation arithmetic are float32; each linear layer gets
  its input in its own compute dtype (see `linear_compute_dtype`), so the same module
  runs with float32, bf16 or bitsandbytes 4-bit linears.
* The timestep embedding is computed once per sample ([B, 6, dim]), not once per token:
  the I2V expert uses one timestep for the whole latent, so this is exact.
* RoPE uses float32 cos/sin tables cached per grid and device.
* Camera tokens (`prepare_camera`) do not depend on x or t; a sampler computes them once.
  Nor do the blocks' camera scale and shift: `prepare_camera(..., keep_terms=n)` wraps
  the tokens in `CameraTerms`, which keeps each block's terms from its first forward on
  (a Fast chunk's five forwards share one camera; `runtime/camera_terms.py`).
* Every linear is a plain `nn.Linear` child, so a loader can swap in quantized layers by name.
* Per-token work runs in chunks of tokens (exact) and the residual stream is updated in
  place, to keep activation memory low; the module is for inference only (no autograd).
* Attention runs one sample (CFG branch) at a time, so only one sample's q, k and v exist;
  each linear's weight is made dense once per block (`dense.py`, one dequantize per
  4-bit layer) and written into preallocated buffers; the elementwise chains between the
  matmuls are fused (`fused.py`).
* Causal execution (LingBot-World Fast) is the same model run with a KV cache
  (`runtime/kv_cache.py`, `forward(..., kv_cache=...)`): x is one chunk of latent frames,
  RoPE's frame axis starts at the chunk's first frame, each block writes the chunk's
  keys and values (after norm and RoPE) straight into the cache and attends to the
  cache's contiguous slice of committed frames plus the chunk; the text keys and values
  are computed once per session. Without a cache nothing of this runs.

This module holds the modules and their math. How a forward runs (the checks, the exact,
causal and graphed passes, the sequence-parallel cuts of ``LingBotDiT.sharding``) is
`runtime/executor.py`'s.
"""
from __future__ import annotations

import logging
import math
from typing import Callable, Iterator, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from .runtime import fused
from .runtime import parallel as sequence_parallel
from .runtime.attention import attention, kept_operands_kernel
from .runtime.camera_terms import CameraTerms
from .runtime.cuda_graphs import ForwardGraphs, graphs_off_reason
from .runtime.dense import Dense, dense, shared_input
from .runtime.executor import run_forward
from .runtime.kv_cache import CachePolicy, KeptCache, KVCache, LayerKV
from .runtime.parallel import Gather, SequenceParallel, ShardPlan, Split
from .config import CONTROL_CHANNELS, CONTROL_NAMES, FOLD_PIXELS, DiTConfig

log = logging.getLogger(__name__)

Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, sin), each [L, 1, head_dim // 2] float32


def linear_compute_dtype(layer: nn.Module) -> torch.dtype | None:
    """dtype a linear-like layer wants its input in (None: leave the input as it is).

    bitsandbytes' Linear4bit carries `compute_dtype` (its packed weight is uint8); a plain
    nn.Linear computes in its weight dtype.
    """
    dtype = getattr(layer, "compute_dtype", None)
    if dtype is not None:
        return dtype
    weight = getattr(layer, "weight", None)
    if weight is not None and weight.dtype.is_floating_point:
        return weight.dtype
    quant_state = getattr(weight, "quant_state", None)
    if quant_state is not None and getattr(quant_state, "dtype", None) is not None:
        return quant_state.dtype
    bias = getattr(layer, "bias", None)
    return bias.dtype if bias is not None else None


def apply_linear(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Call `layer` on `x` cast to the layer's compute dtype."""
    dtype = linear_compute_dtype(layer)
    return layer(x if dtype is None else x.to(dtype))


def timestep_features(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal features [B, dim] = (cos(t w_i), sin(t w_i)), w_i = 10000^(-i / (dim/2)).

    Evaluated in float64 because t reaches 1000 and float32 phases would lose digits.
    """
    half = dim // 2
    freqs = torch.pow(10000.0, -torch.arange(half, device=t.device, dtype=torch.float64) / half)
    phase = t.to(torch.float64)[:, None] * freqs[None, :]
    return torch.cat([torch.cos(phase), torch.sin(phase)], dim=1).float()


def rope_axis_dims(head_dim: int) -> tuple[int, int, int]:
    """Rotary pairs per axis (frame, height, width); the frame axis takes the remainder."""
    pairs = head_dim // 2
    return pairs - 2 * (pairs // 3), pairs // 3, pairs // 3


def build_rope(grid: Sequence[int], head_dim: int, device: torch.device, theta: float = 10000.0,
               frame_start: int = 0) -> Rope:
    """cos/sin tables [F*H*W, 1, head_dim // 2] for a token grid flattened frame-major.

    ``frame_start``: position of the grid's first frame on the frame axis (a causal chunk
    continues the positions of the chunks before it)."""
    f, h, w = grid
    angles = []
    for n_pairs, length, shape, start in zip(rope_axis_dims(head_dim), (f, h, w),
                                             ((f, 1, 1), (1, h, 1), (1, 1, w)), (frame_start, 0, 0)):
        inv_freq = 1.0 / torch.pow(theta, torch.arange(0, 2 * n_pairs, 2, dtype=torch.float64, device=device)
                                   / (2 * n_pairs))
        axis = torch.outer(torch.arange(start, start + length, dtype=torch.float64, device=device), inv_freq)
        angles.append(axis.view(*shape, n_pairs).expand(f, h, w, n_pairs))
    phase = torch.cat(angles, dim=-1).reshape(f * h * w, 1, head_dim // 2)
    return torch.cos(phase).float(), torch.sin(phase).float()


def apply_rope(x: torch.Tensor, rope: Rope, out: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate consecutive channel pairs of x [B, L, H, D] in float32.

    The result goes into `out` (same shape, any float dtype; default a new tensor of x's
    dtype), so a bf16 caller never holds a float32 copy of the whole result."""
    cos, sin = rope
    pairs = x.float().unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    if out is None:
        out = torch.empty_like(x)
    rotated = out.unflatten(-1, (-1, 2))
    rotated[..., 0] = (even * cos).addcmul_(odd, sin, value=-1)
    rotated[..., 1] = (even * sin).addcmul_(odd, cos)
    return out


# Per-token work (norms, q/k projections with RoPE, FFN, camera injection) runs over this
# many tokens of a sample at a time. It is exact (each token is independent) and bounds
# the temporaries and the FFN hidden state: at 480x832x81 (32760 tokens, dim 5120) a
# whole-sequence float32 copy is 0.67 GB per sample, the FFN hidden state 0.9 GB.
TOKEN_CHUNK = 8192


def token_spans(length: int, chunk: int | None = TOKEN_CHUNK, batch: int = 1) -> Iterator[tuple[int, int]]:
    """(start, stop) pairs covering range(length), about `chunk` rows of a batch each
    (`batch` 1: `chunk` tokens each)."""
    step = max(1, chunk // max(batch, 1)) if chunk and chunk > 0 else max(length, 1)
    return ((s, min(s + step, length)) for s in range(0, length, step))


class RMSNorm(nn.Module):
    """RMS norm with a learned gain; always returns float32 (callers cast once)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)).mul_(self.weight.float())


class FloatLayerNorm(nn.LayerNorm):
    """LayerNorm computed in float32 whatever the parameter dtype; returns float32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = None if self.weight is None else self.weight.float()
        bias = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps)


# Produces the input of tokens [start, stop) of one sample for a block sub-layer on demand
# ([1, n, dim], already in the sub-layer's compute dtype), so the normalized copy of the
# whole sequence never exists at once.
TokenSource = Callable[[int, int], torch.Tensor]


class _Attention(nn.Module):
    """q/k/v/o projections with optional RMS norm on q and k (official names).

    The block drives these one sample at a time: the attention of one CFG branch needs its
    q, k and v for the whole sequence, and holding them for one sample instead of two is
    what keeps 480p activations small. The linears stay batched where it pays (the block
    calls ``dense`` once per sub-layer for all samples and chunks)."""

    def __init__(self, dim: int, num_heads: int, qk_norm: bool, eps: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.norm_q = RMSNorm(dim, eps) if qk_norm else nn.Identity()
        self.norm_k = RMSNorm(dim, eps) if qk_norm else nn.Identity()

    def _project_norm_(self, linear: Dense, norm: nn.Module, x: torch.Tensor, out: torch.Tensor,
                       rope: Rope | None = None, token_start: int = 0) -> None:
        """out [n, dim] <- norm(linear(x)), RoPE-rotated when given (in place, float32 math)."""
        linear(x, out=out)
        rms = norm if isinstance(norm, RMSNorm) else None
        if rms is not None or rope is not None:
            cos, sin = rope if rope is not None else (None, None)
            weight, eps = (rms.weight, rms.eps) if rms is not None else (None, 0.0)
            fused.run(fused.rms_rope_, out, weight, cos, sin, token_start, eps, self.head_dim)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """One sample's attention: q [Lq, dim], k and v [Lk, dim] -> [Lq, dim] (dim: the heads
        this device holds times head_dim)."""
        heads = (-1, self.head_dim)
        out = attention(q.unflatten(-1, heads)[None], k.unflatten(-1, heads)[None], v.unflatten(-1, heads)[None])
        return out[0].reshape(q.shape[0], -1)

    def _attend_to_cache(self, q: torch.Tensor, cache: LayerKV) -> torch.Tensor:
        """One chunk's queries q [Lq, dim] attending to the cache's keys and values -> [Lq, dim]:
        the cache's kept fp8 operands where the run's kernel takes them (flash_fp8), else
        ``attended()``."""
        q4 = q.unflatten(-1, (-1, self.head_dim))[None]
        kernel = kept_operands_kernel(q4)
        operands = None if kernel is None else cache.attended_fp8()
        if operands is None:
            return self._attend(q, *cache.attended())
        return kernel(q4, *operands)[0].reshape(q.shape[0], -1)


class SelfAttention(_Attention):
    def attend(self, inputs: TokenSource, length: int, rope: Rope, spans: Sequence[tuple[int, int]],
               weights: tuple[Dense, Dense, Dense]) -> torch.Tensor:
        """Attention output [length, dim] of one sample (before ``o``); ``weights`` are the
        dense q, k, v; inputs(s, e) gives its normalized tokens [1, e - s, dim]."""
        wq, wk, wv = weights
        q = k = v = None
        for start, stop in spans:
            h = shared_input(inputs(start, stop)[0], wq, wk, wv)
            if q is None:
                q, k, v = (torch.empty(length, h.shape[-1], dtype=wq.dtype, device=h.device) for _ in range(3))
            self._project_norm_(wq, self.norm_q, h, q[start:stop], rope, start)
            self._project_norm_(wk, self.norm_k, h, k[start:stop], rope, start)
            wv(h, out=v[start:stop])
            del h
        run = sequence_parallel.current()
        if run is not None:  # Ulysses: attend over the whole sequence with this rank's heads
            return run.attend(q, k, v, self.num_heads, attention)
        return self._attend(q, k, v)

    def attend_cached(self, inputs: TokenSource, length: int, rope: Rope, spans: Sequence[tuple[int, int]],
                      weights: tuple[Dense | None, Dense, Dense], cache: LayerKV) -> torch.Tensor | None:
        """Causal attention of one chunk: its keys and values are written into the cache's
        slots for the chunk, and its queries attend to the cache's committed frames plus the
        chunk (one contiguous slice). None (and no q) on the last layer of a commit pass,
        where only the keys and values are needed."""
        run = sequence_parallel.current()
        if run is not None:
            return self._attend_cached_sharded(inputs, length, rope, spans, weights, cache, run)
        wq, wk, wv = weights
        k, v = cache.new_kv()
        if k.shape[0] != length:
            raise ValueError(f"the chunk has {length} tokens, the cache's chunk slots hold {k.shape[0]}")
        q = None if cache.kv_only else torch.empty(length, k.shape[-1], dtype=wq.dtype, device=k.device)
        for start, stop in spans:
            h = shared_input(inputs(start, stop)[0], wq, wk, wv)
            if q is not None:
                self._project_norm_(wq, self.norm_q, h, q[start:stop], rope, start)
            self._project_norm_(wk, self.norm_k, h, k[start:stop], rope, start)
            wv(h, out=v[start:stop])
            del h
        out = None if q is None else self._attend_to_cache(q, cache)
        cache.stored()
        return out

    def _attend_cached_sharded(self, inputs: TokenSource, length: int, rope: Rope, spans: Sequence[tuple[int, int]],
                               weights: tuple[Dense | None, Dense, Dense], cache: LayerKV,
                               run: sequence_parallel.ShardedRun) -> torch.Tensor | None:
        """``attend_cached`` on this rank's ``length`` tokens of the chunk, the cache holding
        this rank's heads of every token: the chunk's k, v (and q) go to the ranks holding
        their heads by one all-to-all each, started as soon as each is projected so that it
        travels while the next one is projected; k and v are received straight into the
        cache's slots. The queries attend to the cache, and a last all-to-all returns the
        output for this rank's tokens."""
        wq, wk, wv = weights
        dst_k, dst_v = cache.new_kv()
        if dst_k.shape[0] != run.length:
            raise ValueError(f"the chunk has {run.length} tokens, the cache's chunk slots hold {dst_k.shape[0]}")
        sp = run.sp
        fits = sp.size * length == run.length  # no padding: the received rows are the cache's slots
        dim = self.num_heads * self.head_dim
        sources = [(start, stop, shared_input(inputs(start, stop)[0], wq, wk, wv)) for start, stop in spans]

        def send(weight: Dense, norm: nn.Module | None, into: torch.Tensor | None) -> sequence_parallel.Exchange:
            projected = torch.empty(length, dim, dtype=dst_k.dtype, device=dst_k.device)
            for start, stop, h in sources:
                if norm is None:
                    weight(h, out=projected[start:stop])
                else:
                    self._project_norm_(weight, norm, h, projected[start:stop], rope, start)
            return sp.start_seq_to_heads(projected, into if fits else None)

        sent = [send(wk, self.norm_k, dst_k), send(wv, None, dst_v)]
        if not cache.kv_only:
            sent.append(send(wq, self.norm_q, None))
        sources.clear()  # the normalized tokens are no longer needed
        keys, values, *queries = (exchange.wait()[:run.length] for exchange in sent)
        if not fits:
            dst_k.copy_(keys)
            dst_v.copy_(values)
        out = None
        if queries:
            attended = self._attend_to_cache(queries[0], cache).unflatten(-1, (-1, self.head_dim))  # this rank's heads
            del queries
            pad = sp.size * length - run.length
            out = sp.heads_to_seq(F.pad(attended, (0, 0, 0, 0, 0, pad))).flatten(1)
        cache.stored()
        return out


class CrossAttention(_Attention):
    def attend(self, inputs: TokenSource, length: int, context: torch.Tensor, spans: Sequence[tuple[int, int]],
               weights: tuple[Dense, Dense, Dense]) -> torch.Tensor:
        """Attention output [length, dim] of one sample (before ``o``) to its text
        ``context`` [Lc, dim]; ``weights`` are the dense q, k, v."""
        wq, wk, wv = weights
        k, v = self.context_kv(context, wk, wv)
        return self.attend_kv(inputs, length, k, v, spans, wq)

    def context_kv(self, context: torch.Tensor, wk: Dense, wv: Dense) -> tuple[torch.Tensor, torch.Tensor]:
        """The text's keys (normed) and values [Lc, dim] for one sample's ``context`` [Lc, dim]."""
        k = torch.empty(context.shape[0], context.shape[-1], dtype=wk.dtype, device=context.device)
        self._project_norm_(wk, self.norm_k, context, k)
        return k, wv(context)

    def attend_kv(self, inputs: TokenSource, length: int, k: torch.Tensor, v: torch.Tensor,
                  spans: Sequence[tuple[int, int]], wq: Dense) -> torch.Tensor:
        """Attention output [length, dim] (before ``o``) of the tokens ``inputs`` gives to the
        text keys ``k`` and values ``v``."""
        q = None
        for start, stop in spans:
            h = inputs(start, stop)[0]
            if q is None:
                q = torch.empty(length, h.shape[-1], dtype=wq.dtype, device=h.device)
            self._project_norm_(wq, self.norm_q, h, q[start:stop])
            del h
        return self._attend(q, k, v.to(q.dtype))


class DiTBlock(nn.Module):
    """Self-attention, camera injection, cross-attention, FFN; adaLN-modulated.

    Order of work (x is the float32 residual stream [B, L, dim], updated in place):
    1. self-attention per sample -> outputs of all samples kept ([L, dim] each);
    2. per token chunk, all samples: o-projection, then gated residual and camera affine
       in one fused pass (camera layers run once per chunk, shared by the CFG branches);
    3. cross-attention per sample -> outputs kept;
    4. per sample and chunk: o-projection, residual add fused with the FFN's input norm,
       FFN (GELU in the first matmul's epilogue), gated residual.
    """

    # Tokens per chunk of per-token work; 0 or None runs the whole sequence at once (a few %
    # faster on big GPUs, more activation memory).
    token_chunk: int | None = TOKEN_CHUNK

    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        dim, eps = config.dim, config.eps
        self.norm1 = FloatLayerNorm(dim, eps=eps, elementwise_affine=False)
        self.self_attn = SelfAttention(dim, config.num_heads, config.qk_norm, eps)
        self.norm3 = (FloatLayerNorm(dim, eps=eps, elementwise_affine=True)
                      if config.cross_attn_norm else nn.Identity())
        self.cross_attn = CrossAttention(dim, config.num_heads, config.qk_norm, eps)
        self.norm2 = FloatLayerNorm(dim, eps=eps, elementwise_affine=False)
        self.ffn = nn.Sequential(nn.Linear(dim, config.ffn_dim), nn.GELU(approximate="tanh"),
                                 nn.Linear(config.ffn_dim, dim))
        # Per-block offsets added to the shared time projection: shift/scale/gate for
        # self-attention, then shift/scale/gate for the FFN.
        self.modulation = nn.Parameter(torch.empty(1, 6, dim))
        self.cam_injector_layer1 = nn.Linear(dim, dim)
        self.cam_injector_layer2 = nn.Linear(dim, dim)
        self.cam_scale_layer = nn.Linear(dim, dim)
        self.cam_shift_layer = nn.Linear(dim, dim)

    @torch.no_grad()  # in-place updates and out= products: inference only
    def forward(self, x: torch.Tensor, e0: torch.Tensor, rope: Rope, context: torch.Tensor | None,
                camera: torch.Tensor | CameraTerms | None = None, cache: LayerKV | None = None) -> torch.Tensor:
        """x [B, L, dim] float32 (updated in place and returned); e0 [B, 6, dim] float32;
        context [B, text_len, dim]; camera [B or 1, L, dim] model-level camera tokens or None.
        cache: this layer's KV cache for causal execution (one sample; context may then be
        None once the cache holds the text's keys and values)."""
        if cache is not None:
            return self._forward_cached(x, e0, rope, context, camera, cache)
        batch, length = x.shape[:2]
        spans = list(token_spans(length, self.token_chunk))
        # Separate tensors, not views at six offsets of one buffer: a compiled kernel would
        # specialise (and recompile) on each view's storage offset.
        shift1, scale1, gate1, shift2, scale2, gate2 = (m.clone() for m in (self.modulation.float() + e0).unbind(1))

        attn = self.self_attn
        weights = (dense(attn.q), dense(attn.k), dense(attn.v))
        dtype, eps1 = weights[0].dtype, self.norm1.eps
        outs = [attn.attend(lambda s, e, b=b: fused.run(fused.ln_modulate, x[b:b + 1, s:e], shift1[b:b + 1],
                                                         scale1[b:b + 1], eps1, dtype),
                            length, rope, spans, weights)
                for b in range(batch)]
        del weights
        self._attention_residual(x, outs, gate1, camera, spans)
        del outs

        cross = self.cross_attn
        weights = (dense(cross.q), dense(cross.k), dense(cross.v))
        outs = [cross.attend(self._cross_input(x, b, weights[0].dtype), length, context[b], spans, weights)
                for b in range(batch)]
        del weights
        self._cross_residual_and_ffn(x, outs, shift2, scale2, gate2, spans)
        return x

    def _forward_cached(self, x: torch.Tensor, e0: torch.Tensor, rope: Rope, context: torch.Tensor | None,
                        camera: torch.Tensor | CameraTerms | None, cache: LayerKV) -> torch.Tensor:
        """The block on one chunk (one sample) with the causal cache: the same math as
        ``forward``; the self-attention's keys/values go through the cache, the text's are
        computed once (``context`` is needed until the cache holds them)."""
        length = x.shape[1]
        spans = list(token_spans(length, self.token_chunk))
        shift1, scale1, gate1, shift2, scale2, gate2 = (m.clone() for m in (self.modulation.float() + e0).unbind(1))
        attn = self.self_attn
        weights = (None if cache.kv_only else dense(attn.q), dense(attn.k), dense(attn.v))
        dtype, eps1 = weights[1].dtype, self.norm1.eps
        out = attn.attend_cached(lambda s, e: fused.run(fused.ln_modulate, x[:, s:e], shift1, scale1, eps1, dtype),
                                 length, rope, spans, weights, cache)
        del weights
        if out is None:  # the last layer of a commit pass: its keys and values are stored
            return x
        self._attention_residual(x, [out], gate1, camera, spans)
        del out
        cross = self.cross_attn
        text_kv = cache.cross()
        if text_kv is None:
            text_kv = cross.context_kv(context[0], dense(cross.k), dense(cross.v))
            cache.set_cross(*text_kv)
        wq = dense(cross.q)
        out = cross.attend_kv(self._cross_input(x, 0, wq.dtype), length, *text_kv, spans, wq)
        del wq
        self._cross_residual_and_ffn(x, [out], shift2, scale2, gate2, spans)
        return x

    def _attention_residual(self, x: torch.Tensor, outs: list[torch.Tensor], gate: torch.Tensor,
                            camera: torch.Tensor | CameraTerms | None, spans: Sequence[tuple[int, int]]) -> None:
        """x += o(attention) * gate, then the camera affine, per token chunk for all samples."""
        wo = dense(self.self_attn.o)
        cam: list[Dense] = []  # the camera layers made dense on first use (kept terms need none)

        def camera_scale_shift(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            if not cam:
                cam.extend(dense(layer) for layer in (self.cam_injector_layer1, self.cam_injector_layer2,
                                                      self.cam_scale_layer, self.cam_shift_layer))
            return self._camera_scale_shift(cam, tokens)

        for start, stop in spans:
            y = torch.empty(len(outs), stop - start, x.shape[-1], dtype=wo.dtype, device=x.device)
            for b, out in enumerate(outs):
                wo(out[start:stop], out=y[b])
            if camera is None:
                x[:, start:stop].addcmul_(y, gate[:, None])
            else:
                if isinstance(camera, CameraTerms):
                    scale, shift = camera.scale_shift(self, start, stop, camera_scale_shift)
                else:
                    scale, shift = camera_scale_shift(camera[:, start:stop])
                fused.run(fused.gate_camera_, x[:, start:stop], y, gate, scale, shift)
            del y

    def keep_camera_terms(self, terms: CameraTerms, length: int) -> None:
        """Compute this block's camera scale and shift of ``terms.tokens`` ahead of a forward,
        per token span as the forward cuts them, into ``terms`` (the graphed Fast path)."""
        cam = [dense(layer) for layer in (self.cam_injector_layer1, self.cam_injector_layer2,
                                          self.cam_scale_layer, self.cam_shift_layer)]
        for start, stop in token_spans(length, self.token_chunk):
            terms.keep(self, start, stop, self._camera_scale_shift(cam, terms.tokens[:, start:stop]))

    @staticmethod
    def _camera_scale_shift(cam: list[Dense], camera: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """scale(h), shift(h) with h = layer2(silu(layer1(c))) + c, in the layers' dtype."""
        layer1, layer2, scale_layer, shift_layer = cam
        hidden = layer2(F.silu(layer1(camera)))
        hidden += camera.to(hidden.dtype)
        return scale_layer(hidden), shift_layer(hidden)

    def _cross_input(self, x: torch.Tensor, b: int, dtype: torch.dtype) -> TokenSource:
        """Tokens [start, stop) of sample b of norm3(x), in the cross-attention's compute ``dtype``."""
        norm = self.norm3
        if isinstance(norm, FloatLayerNorm) and norm.weight is not None:
            return lambda s, e: fused.run(fused.ln_affine, x[b:b + 1, s:e], norm.weight, norm.bias, norm.eps, dtype)
        return lambda s, e: norm(x[b:b + 1, s:e]).to(dtype)

    def _cross_residual_and_ffn(self, x: torch.Tensor, outs: list[torch.Tensor], shift: torch.Tensor,
                                scale: torch.Tensor, gate: torch.Tensor, spans: Sequence[tuple[int, int]]) -> None:
        """x += o(cross attention); x += FFN(norm2(x) modulated) * gate; per sample and chunk."""
        wo, up, down = dense(self.cross_attn.o), dense(self.ffn[0]), dense(self.ffn[2])
        eps = self.norm2.eps
        for b, out in enumerate(outs):
            for start, stop in spans:
                part = x[b:b + 1, start:stop]  # a view: in-place updates land in x
                y = wo(out[start:stop])[None]
                h = fused.run(fused.add_ln_modulate_, part, y, shift[b:b + 1], scale[b:b + 1], eps, up.dtype)
                del y
                part.addcmul_(down(up(h, gelu=True)), gate[b:b + 1, None])
            outs[b] = None  # free this sample's attention output early


class Head(nn.Module):
    """Final adaLN-modulated projection to patch pixels."""

    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        self.norm = FloatLayerNorm(config.dim, eps=config.eps, elementwise_affine=False)
        self.head = nn.Linear(config.dim, math.prod(config.patch_size) * config.out_dim)
        self.modulation = nn.Parameter(torch.empty(1, 2, config.dim))

    def forward(self, x: torch.Tensor, e: torch.Tensor, chunk: int = TOKEN_CHUNK) -> torch.Tensor:
        shift, scale = (self.modulation.float() + e[:, None]).unbind(1)
        dtype = linear_compute_dtype(self.head) or x.dtype
        h = torch.empty(x.shape, dtype=dtype, device=x.device)
        for start, stop in token_spans(x.shape[1], chunk, x.shape[0]):
            h[:, start:stop] = fused.run(fused.ln_modulate, x[:, start:stop], shift, scale, self.norm.eps, dtype)
        return apply_linear(self.head, h)


def control_mismatch_message(channels: int, config: DiTConfig) -> str:
    """Why a control tensor of ``channels`` channels does not fit the checkpoint: names both
    the control it looks like (Base-Cam rays or Act rays + keys) and the one the checkpoint reads."""
    def a(name: str) -> str:
        return f"{'an' if name[0] in 'AEIOU' else 'a'} {name}"

    want = CONTROL_NAMES[config.control_type]
    need = config.control_channels * FOLD_PIXELS
    given = next((t for t, n in CONTROL_CHANNELS.items() if n * FOLD_PIXELS == channels), None)
    if given is not None:
        return (f"camera: {a(CONTROL_NAMES[given])} control tensor ({channels} channels) was given to {a(want)} "
                f"checkpoint, which reads {need} channels; build the {want} control "
                f"({'ray directions + W/A/S/D keys' if config.control_type == 'act' else 'Plücker rays'}) "
                f"or load the {CONTROL_NAMES[given]} checkpoint")
    return (f"camera: {channels} channels x patch {config.patch_size} != {config.camera_in_features} control "
            f"features the {want} checkpoint expects ({need} channels)")


class LingBotDiT(nn.Module):
    """LingBot-World expert. Build under `torch.device("meta")` to allocate nothing, then load
    weights; call `init_weights` only for synthetic (random) models."""

    # Sequence parallel (runtime/parallel.py), declared once for every pass: after the patch
    # embedding each rank keeps its slice of the tokens, of the camera tokens and of the RoPE
    # tables (padding rotates by 0: cos 1, sin 0); the head's output is gathered whole on
    # every rank; the causal cache holds the rank's heads of every token.
    sharding = ShardPlan(splits={"tokens": Split(dim=1), "camera": Split(dim=1),
                                 "rope": (Split(dim=0, fill=1.0), Split(dim=0, fill=0.0))},
                         gathers={"head": Gather(dim=1)}, cache_heads=True)

    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        if tuple(config.window_size) != (-1, -1):
            raise ValueError(f"config: window_size={config.window_size} is not supported; "
                             "LingBot-World uses global attention (-1, -1)")
        if config.model_type not in ("i2v", "t2v"):
            raise ValueError(f"config: model_type={config.model_type!r} is not supported (i2v or t2v)")
        self.config = config
        dim = config.dim
        self.patch_embedding = nn.Conv3d(config.in_dim, dim, kernel_size=config.patch_size,
                                         stride=config.patch_size)
        self.patch_embedding_wancamctrl = nn.Linear(config.camera_in_features, dim)
        self.c2ws_hidden_states_layer1 = nn.Linear(dim, dim)
        self.c2ws_hidden_states_layer2 = nn.Linear(dim, dim)
        self.text_embedding = nn.Sequential(nn.Linear(config.text_dim, dim), nn.GELU(approximate="tanh"),
                                            nn.Linear(dim, dim))
        self.time_embedding = nn.Sequential(nn.Linear(config.freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        self.blocks = nn.ModuleList(DiTBlock(config) for _ in range(config.num_layers))
        self.head = Head(config)
        # Plain attributes, not buffers: no state-dict entry, never cast by .to(dtype).
        self._rope_cache: dict[tuple, Rope] = {}
        # The KV cache (and its CUDA graphs) kept for the next Fast session (new_kv_cache).
        self._kept_cache = KeptCache()

    # ----------------------------------------------------------------- weights
    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Random weights for synthetic checkpoints (the model must be on a real device)."""
        g = generator
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight, generator=g)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (RMSNorm, FloatLayerNorm)):
                if module.weight is not None:
                    nn.init.ones_(module.weight)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        nn.init.xavier_uniform_(self.patch_embedding.weight.view(self.config.dim, -1), generator=g)
        nn.init.zeros_(self.patch_embedding.bias)
        for seq in (self.text_embedding, self.time_embedding):
            for module in seq:
                if isinstance(module, nn.Linear):
                    nn.init.normal_(module.weight, std=0.02, generator=g)
        scale = self.config.dim ** -0.5
        for param in [b.modulation for b in self.blocks] + [self.head.modulation]:
            param.copy_(torch.randn(param.shape, generator=g, device=param.device, dtype=param.dtype) * scale)
        # The official init zeroes head.head; a synthetic model keeps it random so that its
        # output depends on every layer and tests can tell layers apart.

    # --------------------------------------------------------------- embedders
    def patch_grid(self, shape: Sequence[int], what: str) -> tuple[int, int, int]:
        """The token grid of a latent of ``shape`` (F, H, W), each a multiple of the patch."""
        grid = []
        for size, patch, axis in zip(shape, self.config.patch_size, "FHW"):
            if size % patch:
                raise ValueError(f"{what}: {axis}={size} is not a multiple of the patch size {patch}")
            grid.append(size // patch)
        return tuple(grid)  # type: ignore[return-value]

    @torch.no_grad()
    def prepare_camera(self, plucker: torch.Tensor, keep_terms: int = 0) -> torch.Tensor | CameraTerms:
        """Plücker tensor [B, 384, F, H, W] on the latent grid -> camera tokens [B, L, dim].
        ``keep_terms`` > 0: the tokens wrapped in ``CameraTerms``, so that the forwards given
        them compute the camera scale and shift of that many blocks once (memory:
        ``CameraTerms.estimate_bytes``)."""
        tokens = self._camera_tokens(plucker)
        return CameraTerms(tokens, int(keep_terms)) if keep_terms else tokens

    def _camera_tokens(self, plucker: torch.Tensor) -> torch.Tensor:
        if plucker.dim() != 5:
            raise ValueError(f"camera: expected a [B, C, F, H, W] Plücker tensor, got shape {tuple(plucker.shape)}")
        b, c, *spatial = plucker.shape
        pt, ph, pw = self.config.patch_size
        if c * pt * ph * pw != self.config.camera_in_features:
            raise ValueError(control_mismatch_message(c, self.config))
        f, h, w = self.patch_grid(spatial, "camera")
        # Patch features ordered (channel, pt, ph, pw), tokens frame-major like the latent.
        tokens = (plucker.reshape(b, c, f, pt, h, ph, w, pw).permute(0, 2, 4, 6, 1, 3, 5, 7)
                  .reshape(b, f * h * w, c * pt * ph * pw))
        embedded = apply_linear(self.patch_embedding_wancamctrl, tokens)
        hidden = apply_linear(self.c2ws_hidden_states_layer2,
                              F.silu(apply_linear(self.c2ws_hidden_states_layer1, embedded)))
        return embedded.to(hidden.dtype) + hidden

    def embed_patches(self, x: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor:
        """x (and y) -> the token stream [B, L, dim]: contiguous float32 (the fused kernels
        read rows; .to() alone keeps the transposed view when the weights are float32)."""
        conv_dtype = self.patch_embedding.weight.dtype
        inputs = x.to(conv_dtype) if y is None else torch.cat([x.to(conv_dtype), y.to(x.device, conv_dtype)], dim=1)
        return self.patch_embedding(inputs).flatten(2).transpose(1, 2).to(torch.float32).contiguous()

    def embed_time(self, t: torch.Tensor, batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Timestep -> (e [B, dim], e0 [B, 6, dim]), both float32."""
        t = torch.as_tensor(t, device=device)
        if t.dim() > 1 or t.numel() not in (1, batch):
            raise ValueError(f"t: expected one timestep per sample ([{batch}] or a scalar), got shape {tuple(t.shape)}")
        t = t.reshape(-1).expand(batch)
        feats = timestep_features(t, self.config.freq_dim)
        e = apply_linear(self.time_embedding[2], F.silu(apply_linear(self.time_embedding[0], feats))).float()
        e0 = apply_linear(self.time_projection[1], F.silu(e)).float()
        return e, e0.unflatten(1, (6, self.config.dim))

    def embed_text(self, context: torch.Tensor | Sequence[torch.Tensor], batch: int,
                   device: torch.device) -> torch.Tensor:
        """Text states, zero-padded to text_len (all positions are attended, as the reference does)."""
        text_len, text_dim = self.config.text_len, self.config.text_dim
        items = list(context) if not isinstance(context, torch.Tensor) else None
        if items is not None:
            if any(u.dim() != 2 for u in items):
                raise ValueError("context: list entries must be [L_i, text_dim] tensors")
            longest = max(u.shape[0] for u in items)
            context = torch.stack([F.pad(u, (0, 0, 0, longest - u.shape[0])) for u in items])
        if context.dim() != 3 or context.shape[-1] != text_dim:
            raise ValueError(f"context: expected [B, L, {text_dim}], got shape {tuple(context.shape)}")
        if context.shape[1] > text_len:
            raise ValueError(f"context: {context.shape[1]} text tokens exceed text_len={text_len}")
        if context.shape[0] not in (1, batch):
            raise ValueError(f"context: batch {context.shape[0]} does not match the latent batch {batch}")
        context = F.pad(context.to(device), (0, 0, 0, text_len - context.shape[1])).expand(batch, -1, -1)
        hidden = F.gelu(apply_linear(self.text_embedding[0], context), approximate="tanh")
        return apply_linear(self.text_embedding[2], hidden)

    def rope_tables(self, grid: Sequence[int], device: torch.device, frame_start: int = 0) -> Rope:
        """RoPE tables for a token grid whose first frame sits at ``frame_start``, cached (one
        entry) by grid, start and device."""
        key = (tuple(grid), str(device), frame_start)
        if key not in self._rope_cache:
            self._rope_cache.clear()
            self._rope_cache[key] = build_rope(grid, self.config.head_dim, device, frame_start=frame_start)
        return self._rope_cache[key]

    def new_kv_cache(self, policy: CachePolicy, latent_height: int, latent_width: int,
                     latent_frames: int | None = None, device: torch.device | str | None = None,
                     parallel: SequenceParallel | None = None, graphs: bool = False) -> KVCache:
        """A causal KV cache for this model at a latent of ``latent_height`` x ``latent_width``,
        in the self-attention's compute dtype (bf16 for NF4 or bf16 weights), on the device of
        the model's resident weights unless ``device`` is given. ``latent_frames``: the
        video's length (needed by the full cache; None for an open-ended session).
        ``parallel``: this rank's head shard of the cache (heads / group size, every token).
        ``graphs``: the session's passes, once their shapes repeat, are captured as CUDA
        graphs and replayed (``runtime/cuda_graphs.py``; bit for bit the eager result; none
        off CUDA), and the cache is the model's: closed, it is kept (reset) for the next
        call with the same arguments, which gets it back with its graphs
        (``runtime/kv_cache.KeptCache``; ``release_state`` frees it)."""
        pt, ph, pw = self.config.patch_size
        if pt != 1:
            raise ValueError(f"the causal cache needs a temporal patch of 1, the model has {pt}")
        if latent_height % ph or latent_width % pw:
            raise ValueError(f"latent {latent_height}x{latent_width} is not a multiple of the patch {ph}x{pw}")
        dtype = linear_compute_dtype(self.blocks[0].self_attn.k) or torch.float32
        heads = self.sharding.local_heads(parallel, self.config.num_heads)
        device = torch.device(device if device is not None else self.patch_embedding.weight.device)

        def build() -> KVCache:
            cache = KVCache(policy, layers=self.config.num_layers, heads=heads, head_dim=self.config.head_dim,
                            frame_tokens=(latent_height // ph) * (latent_width // pw), dtype=dtype, device=device,
                            latent_frames=latent_frames)
            off = graphs_off_reason(cache.device) if graphs else None
            if graphs and off is None:
                cache.graphs = ForwardGraphs(cache.device)
            elif graphs and cache.device.type == "cuda":
                log.info("LingBot: this session's passes run eagerly, without CUDA graphs: %s", off)
            return cache

        if not graphs:
            self._kept_cache.release()  # an earlier session's kept cache would sit beside this one
            return build()
        return self._kept_cache.take((policy, latent_height, latent_width, latent_frames, device, dtype, parallel),
                                     build)

    def keeps_captures(self) -> bool:
        """Whether the model keeps a cache whose CUDA graphs hold captured passes (what a later
        session with the same shapes replays at once)."""
        kept = self._kept_cache.cache
        graphs = None if kept is None else kept.graphs
        return graphs is not None and graphs.disabled is None and graphs.captures > 0

    def release_state(self) -> None:
        """Free what the model keeps between runs besides its weights (the kept KV cache and
        its graphs); ``pipeline.memory.release_module`` calls it."""
        self._kept_cache.release()

    # ------------------------------------------------------------------ forward
    def run_blocks(self, x: torch.Tensor, e0: torch.Tensor, rope: Rope, context: torch.Tensor | None,
                   camera: torch.Tensor | CameraTerms | None, kv_cache: KVCache | None = None) -> torch.Tensor:
        """The transformer stack; a single place to wrap for block swapping / offloading.
        ``kv_cache``: causal execution, each block gets its layer of the cache."""
        if kv_cache is None:
            for block in self.blocks:
                x = block(x, e0, rope, context, camera)
            return x
        for index, block in enumerate(self.blocks):
            x = block(x, e0, rope, context, camera, kv_cache.layer(index))
        return x

    def unpatchify(self, x: torch.Tensor, grid: Sequence[int]) -> torch.Tensor:
        """[B, L, pt*ph*pw*C] -> [B, C, F, H, W]."""
        pt, ph, pw = self.config.patch_size
        f, h, w = grid
        c = self.config.out_dim
        x = x.reshape(x.shape[0], f, h, w, pt, ph, pw, c).permute(0, 7, 1, 4, 2, 5, 3, 6)
        return x.reshape(x.shape[0], c, f * pt, h * ph, w * pw)

    # Inference only: the residual stream is updated in place, which autograd cannot replay,
    # and an accidental graph would keep every activation alive.
    @torch.no_grad()
    def forward(self, x: torch.Tensor, t: torch.Tensor, context: torch.Tensor | Sequence[torch.Tensor] | None,
                y: torch.Tensor | None = None, camera_tokens: torch.Tensor | CameraTerms | None = None,
                camera: torch.Tensor | None = None, cancel: Callable[[], None] | None = None,
                kv_cache: KVCache | None = None, commit: bool = False,
                parallel: SequenceParallel | None = None) -> torch.Tensor | None:
        """Predict the flow for latent x [B, 16, F, H, W] at timesteps t [B] (0..1000).

        context: padded [B, Lc, text_dim] (Lc <= text_len) or a list of [L_i, text_dim].
        y: I2V condition [B, 20, F, H, W] (mask + first-frame latent), concatenated to x.
        camera_tokens: output of `prepare_camera` ([B or 1, L, dim], or its `CameraTerms`:
        the blocks' camera terms kept for the next forwards); or pass the Plücker tensor as
        `camera` to compute them here. Neither: camera layers are skipped.
        cancel: called before every transformer block (it raises to stop), so a cancel acts
        within one block's time; a pre-hook, so block swapping's loop checks it too.
        kv_cache: causal execution (LingBot-World Fast). x is the chunk that starts at latent
        frame ``kv_cache.frame_start`` (B = 1, F = the cache's chunk); it attends to the
        cache's committed frames and itself. context may be None once the cache holds the
        text's keys and values (after the first pass of a session).
        commit: with kv_cache, the pass at t = 0 on the chunk's final x0 that stores its keys
        and values for the chunks after it; returns None (its output is not needed) and moves
        the cache to the next chunk.
        parallel: this process's Ulysses group (wan/runtime/parallel.py): every rank of it
        calls forward with the same arguments; each computes its slice of the tokens and all
        get the whole prediction. With kv_cache, the cache must be the rank's head shard
        (``new_kv_cache(..., parallel=parallel)``).
        Returns float32 [B, out_dim, F, H, W]. How it runs (the checks, the exact, causal and
        graphed passes, the cuts of ``sharding``): ``runtime/executor.py``.
        """
        return run_forward(self, x, t, context, y, camera_tokens, camera, cancel, kv_cache, commit, parallel)
