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
* Every linear is a plain `nn.Linear` child, so a loader can swap in quantized layers by name.
* Per-token work runs in chunks of tokens (exact) and the residual stream is updated in
  place, to keep activation memory low; the module is for inference only (no autograd).
"""
from __future__ import annotations

import math
from typing import Callable, Iterator, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import fused
from .attention import attention
from .config import DiTConfig

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


def build_rope(grid: Sequence[int], head_dim: int, device: torch.device, theta: float = 10000.0) -> Rope:
    """cos/sin tables [F*H*W, 1, head_dim // 2] for a token grid flattened frame-major."""
    f, h, w = grid
    angles = []
    for n_pairs, length, shape in zip(rope_axis_dims(head_dim), (f, h, w),
                                      ((f, 1, 1), (1, h, 1), (1, 1, w))):
        inv_freq = 1.0 / torch.pow(theta, torch.arange(0, 2 * n_pairs, 2, dtype=torch.float64, device=device)
                                   / (2 * n_pairs))
        axis = torch.outer(torch.arange(length, dtype=torch.float64, device=device), inv_freq)
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


def rope_slice(rope: Rope, start: int, length: int) -> Rope:
    cos, sin = rope
    return cos[start:start + length], sin[start:start + length]


# Per-token work (norms, q/k projections with RoPE, FFN, camera injection) runs over this
# many rows (batch x tokens) at a time. It is exact (each token is independent) and bounds
# the float32 temporaries and the FFN hidden state: at 480x832x81 (32760 tokens, dim 5120)
# a whole-sequence float32 copy is 0.67 GB per sample, the FFN hidden state 0.9 GB.
TOKEN_CHUNK = 8192


def token_spans(length: int, chunk: int | None = TOKEN_CHUNK, batch: int = 1) -> Iterator[tuple[int, int]]:
    """(start, stop) pairs covering range(length), about `chunk` rows of a batch each."""
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


def _modulate(normed: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """normed * (1 + scale) + shift, in place on a float32 temporary; shift/scale [B, dim]."""
    return normed.mul_(1 + scale[:, None]).add_(shift[:, None])


def normalized_input(x: torch.Tensor, norm: nn.Module, dtype: torch.dtype, chunk: int,
                     shift: torch.Tensor | None = None, scale: torch.Tensor | None = None) -> torch.Tensor:
    """norm(x) [* (1 + scale) + shift] computed in float32 per token chunk, stored in `dtype`."""
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    for start, stop in token_spans(x.shape[1], chunk, x.shape[0]):
        part = norm(x[:, start:stop]).float()
        out[:, start:stop] = part if scale is None else _modulate(part, shift, scale)
    return out


# Produces the float32 input of tokens [start, stop) of a block sub-layer on demand, so the
# normalized copy of the whole sequence never exists at once.
TokenSource = Callable[[int, int], torch.Tensor]


class _Attention(nn.Module):
    """q/k/v/o projections with optional RMS norm on q and k (official names)."""

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

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (self.num_heads, self.head_dim))

    def _empty_heads(self, batch: int, length: int, like: torch.Tensor) -> torch.Tensor:
        return torch.empty(batch, length, self.num_heads, self.head_dim, dtype=like.dtype, device=like.device)

    def _normed(self, linear: nn.Module, norm: nn.Module, x: torch.Tensor, out: torch.Tensor,
                rope: Rope | None = None) -> None:
        """out <- heads(norm(linear(x))), RoPE-rotated when given (norm and rotation in float32)."""
        projected = apply_linear(linear, x)
        if isinstance(norm, RMSNorm):  # the usual case: one fused pass (see fused.py)
            if rope is None:
                out.copy_(fused.run(fused.rms_heads, projected, norm.weight, norm.eps, self.num_heads))
            else:
                out.copy_(fused.run(fused.rms_rope, projected, norm.weight, rope[0], rope[1], norm.eps,
                                    self.num_heads))
            return
        part = self._heads(norm(projected))
        if rope is None:
            out.copy_(part)
        else:
            apply_rope(part, rope, out=out)

    def _project_out(self, out: torch.Tensor, chunk: int) -> torch.Tensor:
        """o(attention output [B, L, H, D]) -> [B, L, dim]."""
        b, length = out.shape[:2]
        out = out.reshape(b, length, -1)
        # o maps dim -> dim, so each chunk's projection overwrites its own input in place.
        for start, stop in token_spans(length, chunk, b):
            out[:, start:stop] = apply_linear(self.o, out[:, start:stop])
        return out

    def compute_dtype(self, fallback: torch.dtype) -> torch.dtype:
        return linear_compute_dtype(self.q) or fallback


class SelfAttention(_Attention):
    def forward(self, inputs: TokenSource, batch: int, length: int, rope: Rope,
                chunk: int = TOKEN_CHUNK) -> torch.Tensor:
        """Self-attention over `length` tokens whose float32 inputs come from `inputs`."""
        q = k = v = None
        for start, stop in token_spans(length, chunk, batch):
            h = inputs(start, stop)
            h = h.to(self.compute_dtype(h.dtype))
            if q is None:
                q, k, v = (self._empty_heads(batch, length, h) for _ in range(3))
            part_rope = rope_slice(rope, start, stop - start)
            self._normed(self.q, self.norm_q, h, q[:, start:stop], part_rope)
            self._normed(self.k, self.norm_k, h, k[:, start:stop], part_rope)
            v[:, start:stop] = self._heads(apply_linear(self.v, h))
            del h
        out = attention(q, k, v)
        del q, k, v  # free them before the output projection
        return self._project_out(out, chunk)


class CrossAttention(_Attention):
    def forward(self, inputs: TokenSource, batch: int, length: int, context: torch.Tensor,
                chunk: int = TOKEN_CHUNK) -> torch.Tensor:
        """Attention from `length` tokens (float32 inputs from `inputs`) to context [B, Lc, dim]."""
        q = None
        for start, stop in token_spans(length, chunk, batch):
            h = inputs(start, stop)
            h = h.to(self.compute_dtype(h.dtype))
            if q is None:
                q = self._empty_heads(batch, length, h)
            self._normed(self.q, self.norm_q, h, q[:, start:stop])
            del h
        k = self._empty_heads(batch, context.shape[1], q)
        self._normed(self.k, self.norm_k, context, k)
        v = self._heads(apply_linear(self.v, context).to(q.dtype))
        out = attention(q, k, v)
        del q, k, v
        return self._project_out(out, chunk)


class DiTBlock(nn.Module):
    """Self-attention, camera injection, cross-attention, FFN; adaLN-modulated."""

    # Rows per chunk of per-token work; 0 or None runs the whole sequence at once (a few %
    # faster on big GPUs, about twice the activation memory).
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

    def forward(self, x: torch.Tensor, e0: torch.Tensor, rope: Rope, context: torch.Tensor,
                camera: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, L, dim] float32 (updated in place and returned); e0 [B, 6, dim] float32;
        context [B, text_len, dim]; camera [B or 1, L, dim] model-level camera tokens or None."""
        chunk = self.token_chunk
        batch, length = x.shape[:2]
        # Separate tensors, not views at six offsets of one buffer: a compiled kernel would
        # specialise (and recompile) on each view's storage offset.
        shift1, scale1, gate1, shift2, scale2, gate2 = (m.clone() for m in (self.modulation.float() + e0).unbind(1))

        attn_dtype = self.self_attn.compute_dtype(torch.float32)
        y = self.self_attn(lambda s, e: fused.run(fused.ln_modulate, x[:, s:e], shift1, scale1, self.norm1.eps,
                                                      attn_dtype),
                           batch, length, rope, chunk)
        x.addcmul_(y, gate1[:, None])
        del y

        if camera is not None:
            for start, stop in token_spans(length, chunk, batch):
                self._inject_camera(x[:, start:stop], camera[:, start:stop])

        y = self.cross_attn(self._cross_input(x), batch, length, context, chunk)
        x.add_(y)
        del y

        for start, stop in token_spans(length, chunk, batch):
            part = x[:, start:stop]  # a view: the in-place update lands in x
            ffn_dtype = linear_compute_dtype(self.ffn[0]) or torch.float32
            h = apply_linear(self.ffn[0], fused.run(fused.ln_modulate, part, shift2, scale2, self.norm2.eps, ffn_dtype))
            part.addcmul_(apply_linear(self.ffn[2], F.gelu(h, approximate="tanh")), gate2[:, None])
        return x

    def _cross_input(self, x: torch.Tensor) -> TokenSource:
        """Tokens [start, stop) of norm3(x), in the cross-attention's compute dtype."""
        norm = self.norm3
        if isinstance(norm, FloatLayerNorm) and norm.weight is not None:
            dtype = self.cross_attn.compute_dtype(torch.float32)
            return lambda s, e: fused.run(fused.ln_affine, x[:, s:e], norm.weight, norm.bias, norm.eps, dtype)
        return lambda s, e: norm(x[:, s:e])

    def _inject_camera(self, x: torch.Tensor, camera: torch.Tensor) -> None:
        """x = (1 + scale(h)) * x + shift(h), h = layer2(silu(layer1(c))) + c, in place on x."""
        hidden = apply_linear(self.cam_injector_layer2, F.silu(apply_linear(self.cam_injector_layer1, camera)))
        hidden = hidden + camera.to(hidden.dtype)
        scale = apply_linear(self.cam_scale_layer, hidden)
        shift = apply_linear(self.cam_shift_layer, hidden)
        del hidden
        # (1 + scale) stays in the layer's output dtype, as in the reference under bf16
        # autocast; the product with the float32 stream is float32.
        x.mul_(1 + scale).add_(shift)


class Head(nn.Module):
    """Final adaLN-modulated projection to patch pixels."""

    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        self.norm = FloatLayerNorm(config.dim, eps=config.eps, elementwise_affine=False)
        self.head = nn.Linear(config.dim, math.prod(config.patch_size) * config.out_dim)
        self.modulation = nn.Parameter(torch.empty(1, 2, config.dim))

    def forward(self, x: torch.Tensor, e: torch.Tensor, chunk: int = TOKEN_CHUNK) -> torch.Tensor:
        shift, scale = (self.modulation.float() + e[:, None]).unbind(1)
        h = normalized_input(x, self.norm, linear_compute_dtype(self.head) or x.dtype, chunk, shift, scale)
        return apply_linear(self.head, h)


class LingBotDiT(nn.Module):
    """LingBot-World expert. Build under `torch.device("meta")` to allocate nothing, then load
    weights; call `init_weights` only for synthetic (random) models."""

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
        # Plain attribute, not a buffer: no state-dict entry, never cast by .to(dtype).
        self._rope_cache: dict[tuple, Rope] = {}

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
    def _patch_grid(self, shape: Sequence[int], what: str) -> tuple[int, int, int]:
        grid = []
        for size, patch, axis in zip(shape, self.config.patch_size, "FHW"):
            if size % patch:
                raise ValueError(f"{what}: {axis}={size} is not a multiple of the patch size {patch}")
            grid.append(size // patch)
        return tuple(grid)  # type: ignore[return-value]

    @torch.no_grad()
    def prepare_camera(self, plucker: torch.Tensor) -> torch.Tensor:
        """Plücker tensor [B, 384, F, H, W] on the latent grid -> camera tokens [B, L, dim]."""
        if plucker.dim() != 5:
            raise ValueError(f"camera: expected a [B, C, F, H, W] Plücker tensor, got shape {tuple(plucker.shape)}")
        b, c, *spatial = plucker.shape
        pt, ph, pw = self.config.patch_size
        if c * pt * ph * pw != self.config.camera_in_features:
            raise ValueError(f"camera: {c} channels x patch {self.config.patch_size} != "
                             f"{self.config.camera_in_features} camera features the checkpoint expects")
        f, h, w = self._patch_grid(spatial, "camera")
        # Patch features ordered (channel, pt, ph, pw), tokens frame-major like the latent.
        tokens = (plucker.reshape(b, c, f, pt, h, ph, w, pw).permute(0, 2, 4, 6, 1, 3, 5, 7)
                  .reshape(b, f * h * w, c * pt * ph * pw))
        embedded = apply_linear(self.patch_embedding_wancamctrl, tokens)
        hidden = apply_linear(self.c2ws_hidden_states_layer2,
                              F.silu(apply_linear(self.c2ws_hidden_states_layer1, embedded)))
        return embedded.to(hidden.dtype) + hidden

    def _embed_time(self, t: torch.Tensor, batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Timestep -> (e [B, dim], e0 [B, 6, dim]), both float32."""
        t = torch.as_tensor(t, device=device)
        if t.dim() > 1 or t.numel() not in (1, batch):
            raise ValueError(f"t: expected one timestep per sample ([{batch}] or a scalar), got shape {tuple(t.shape)}")
        t = t.reshape(-1).expand(batch)
        feats = timestep_features(t, self.config.freq_dim)
        e = apply_linear(self.time_embedding[2], F.silu(apply_linear(self.time_embedding[0], feats))).float()
        e0 = apply_linear(self.time_projection[1], F.silu(e)).float()
        return e, e0.unflatten(1, (6, self.config.dim))

    def _embed_text(self, context: torch.Tensor | Sequence[torch.Tensor], batch: int,
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

    def rope_tables(self, grid: Sequence[int], device: torch.device) -> Rope:
        """RoPE tables for a token grid, cached (one entry) by grid and device."""
        key = (tuple(grid), str(device))
        if key not in self._rope_cache:
            self._rope_cache.clear()
            self._rope_cache[key] = build_rope(grid, self.config.head_dim, device)
        return self._rope_cache[key]

    # ------------------------------------------------------------------ forward
    def run_blocks(self, x: torch.Tensor, e0: torch.Tensor, rope: Rope, context: torch.Tensor,
                   camera: torch.Tensor | None) -> torch.Tensor:
        """The transformer stack; a single place to wrap for block swapping / offloading."""
        for block in self.blocks:
            x = block(x, e0, rope, context, camera)
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
    def forward(self, x: torch.Tensor, t: torch.Tensor, context: torch.Tensor | Sequence[torch.Tensor],
                y: torch.Tensor | None = None, camera_tokens: torch.Tensor | None = None,
                camera: torch.Tensor | None = None) -> torch.Tensor:
        """Predict the flow for latent x [B, 16, F, H, W] at timesteps t [B] (0..1000).

        context: padded [B, Lc, text_dim] (Lc <= text_len) or a list of [L_i, text_dim].
        y: I2V condition [B, 20, F, H, W] (mask + first-frame latent), concatenated to x.
        camera_tokens: output of `prepare_camera` ([B or 1, L, dim]); or pass the Plücker
        tensor as `camera` to compute them here. Neither: camera layers are skipped.
        Returns float32 [B, out_dim, F, H, W].
        """
        if camera is not None:
            if camera_tokens is not None:
                raise ValueError("pass either camera (Plücker) or camera_tokens, not both")
            camera_tokens = self.prepare_camera(camera)
        if x.dim() != 5:
            raise ValueError(f"x: expected [B, C, F, H, W], got shape {tuple(x.shape)}")
        batch, device = x.shape[0], x.device
        conv_dtype = self.patch_embedding.weight.dtype
        inputs = x.to(conv_dtype) if y is None else torch.cat([x.to(conv_dtype), y.to(device, conv_dtype)], dim=1)
        if inputs.shape[1] != self.config.in_dim:
            hint = " (I2V needs y with the mask and image latent)" if y is None else ""
            raise ValueError(f"x/y: {inputs.shape[1]} input channels, the checkpoint expects "
                             f"{self.config.in_dim}{hint}")
        grid = self._patch_grid(x.shape[2:], "x")
        tokens = self.patch_embedding(inputs).flatten(2).transpose(1, 2).to(
            torch.float32, memory_format=torch.contiguous_format)
        del inputs
        if camera_tokens is not None and (camera_tokens.dim() != 3 or camera_tokens.shape[0] not in (1, batch)
                                          or camera_tokens.shape[1:] != tokens.shape[1:]):
            raise ValueError(f"camera_tokens: expected [{batch} or 1, {tokens.shape[1]}, {tokens.shape[2]}] "
                             f"for this latent, got {tuple(camera_tokens.shape)}")

        e, e0 = self._embed_time(t, batch, device)
        text = self._embed_text(context, batch, device)
        rope = self.rope_tables(grid, device)
        tokens = self.run_blocks(tokens, e0, rope, text, camera_tokens)
        del text
        return self.unpatchify(self.head(tokens, e), grid).float()
