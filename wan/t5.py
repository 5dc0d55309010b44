"""The umT5-XXL text encoder (encoder stack only), with the key names of the official file.

State-dict keys, as in ``models_t5_umt5-xxl-enc-bf16.pth``::

    token_embedding.weight                       [vocab, dim]
    blocks.N.norm1.weight                        [dim]
    blocks.N.attn.{q,k,v}.weight                 [dim_attn, dim]
    blocks.N.attn.o.weight                       [dim, dim_attn]
    blocks.N.norm2.weight                        [dim]
    blocks.N.ffn.gate.0.weight                   [dim_ffn, dim]   (GELU branch)
    blocks.N.ffn.fc1.weight                      [dim_ffn, dim]   (linear branch)
    blocks.N.ffn.fc2.weight                      [dim, dim_ffn]
    blocks.N.pos_embedding.embedding.weight      [num_buckets, num_heads]
    norm.weight                                  [dim]

T5 conventions kept here: attention logits are not scaled by 1/sqrt(head_dim), the layer
norm is an RMS norm without bias or mean subtraction computed in float32, the FFN is a
gated GELU (tanh approximation), and every block owns its relative-position bias table.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .checkpoint_keys import count_blocks
from .geometry import MAX_TOKENS

EPS = 1e-6
# Relative distances at or beyond this share the last bucket (fixed by the umT5 release).
MAX_DISTANCE = 128

# The tensors of one encoder block (the official file's names below ``blocks.N.``).
BLOCK_LEAVES = (
    "norm1.weight", "attn.q.weight", "attn.k.weight", "attn.v.weight", "attn.o.weight", "norm2.weight",
    "ffn.gate.0.weight", "ffn.fc1.weight", "ffn.fc2.weight", "pos_embedding.embedding.weight",
)
# Upper bounds of a geometry read from a file, far above umT5-XXL (24 blocks, dim 4096, ffn
# 10240, 64 heads, vocabulary 256,384): checked before anything is built.
GEOMETRY_LIMITS = {
    "vocab_size": 1 << 20, "dim": 16384, "dim_attn": 16384, "dim_ffn": 65536, "num_heads": 256,
    "num_layers": 64, "num_buckets": 1024,
}


@dataclass(frozen=True)
class T5Geometry:
    vocab_size: int
    dim: int
    dim_attn: int
    dim_ffn: int
    num_heads: int
    num_layers: int
    num_buckets: int

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dim", "dim_attn", "dim_ffn", "num_heads", "num_layers", "num_buckets"):
            if getattr(self, name) < 1:
                raise ValueError(f"T5 geometry: {name}={getattr(self, name)} must be positive")
            if getattr(self, name) > GEOMETRY_LIMITS[name]:
                raise ValueError(f"T5 geometry: {name}={getattr(self, name)} is more than {GEOMETRY_LIMITS[name]}, far "
                                 "beyond umT5-XXL; the file is corrupt or not a umT5 encoder")
        if self.dim_attn % self.num_heads:
            raise ValueError(f"T5 geometry: dim_attn={self.dim_attn} is not divisible by num_heads={self.num_heads}")
        if self.num_buckets < 4 or self.num_buckets % 2:
            # half the buckets per direction, half of those exact: needs an even count >= 4
            raise ValueError(f"T5 geometry: num_buckets={self.num_buckets} must be even and at least 4")

    @property
    def head_dim(self) -> int:
        return self.dim_attn // self.num_heads

    @classmethod
    def from_state_dict(cls, tensors: Mapping[str, torch.Tensor]) -> "T5Geometry":
        """Read the geometry from tensor shapes alone (works on meta or memory-mapped tensors).

        Raises ValueError naming the key that is missing or has an unusable shape.
        """

        def shape(key: str, ndim: int) -> tuple[int, ...]:
            if key not in tensors:
                raise ValueError(f"no tensor {key!r}: this is not a umT5 encoder state dict")
            found = tuple(tensors[key].shape)
            if len(found) != ndim:
                raise ValueError(f"tensor {key!r} has shape {found}, expected {ndim} dimensions")
            return found

        vocab_size, dim = shape("token_embedding.weight", 2)
        dim_attn, _ = shape("blocks.0.attn.q.weight", 2)
        dim_ffn, _ = shape("blocks.0.ffn.fc1.weight", 2)
        num_buckets, num_heads = shape("blocks.0.pos_embedding.embedding.weight", 2)
        # From the keys, before anything is built: blocks 0..N-1, each complete, N bounded.
        num_layers = count_blocks(tensors, "blocks.", GEOMETRY_LIMITS["num_layers"], BLOCK_LEAVES, exact=True)
        return cls(vocab_size, dim, dim_attn, dim_ffn, num_heads, num_layers, num_buckets)


UMT5_XXL = T5Geometry(
    vocab_size=256384, dim=4096, dim_attn=4096, dim_ffn=10240, num_heads=64, num_layers=24, num_buckets=32
)
# dim equals wan.config.TINY.text_dim; vocab_size equals the synthetic tokenizer's default size.
T5_TINY = T5Geometry(vocab_size=512, dim=32, dim_attn=32, dim_ffn=64, num_heads=4, num_layers=2, num_buckets=32)


def relative_position_buckets(length: int, num_buckets: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Bidirectional T5 bucket index [length, length] of (key position - query position).

    Half the buckets serve keys before the query, half keys after it; within a half, small
    distances get one bucket each and larger ones share log-spaced buckets up to MAX_DISTANCE.
    """
    pos = torch.arange(length, device=device)
    offset = pos[None, :] - pos[:, None]
    half = num_buckets // 2
    exact = half // 2
    side = (offset > 0).long() * half
    dist = offset.abs()
    # clamp keeps log() finite where dist < exact (those entries take the exact branch anyway)
    scaled = torch.log(dist.clamp(min=1).float() / exact) / math.log(MAX_DISTANCE / exact) * (half - exact)
    far = (exact + scaled.long()).clamp(max=half - 1)
    return side + torch.where(dist < exact, dist, far)


class T5LayerNorm(nn.Module):
    """Scale-only RMS norm; the statistics are taken in float32 whatever the input dtype."""

    def __init__(self, dim: int, eps: float = EPS) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return self.weight * xf.to(self.weight.dtype)


class T5Attention(nn.Module):
    def __init__(self, dim: int, dim_attn: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim_attn // num_heads
        self.q = nn.Linear(dim, dim_attn, bias=False)
        self.k = nn.Linear(dim, dim_attn, bias=False)
        self.v = nn.Linear(dim, dim_attn, bias=False)
        self.o = nn.Linear(dim_attn, dim, bias=False)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """x [B, L, dim]; bias [B or 1, heads, L, L] added to the logits (position + padding)."""
        b, n, _ = x.shape
        heads = (b, n, self.num_heads, self.head_dim)
        q, k, v = (proj(x).view(heads).transpose(1, 2) for proj in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0)  # T5: unscaled logits
        return self.o(out.transpose(1, 2).reshape(b, n, -1))


class T5FeedForward(nn.Module):
    def __init__(self, dim: int, dim_ffn: int) -> None:
        super().__init__()
        self.gate = nn.Sequential(nn.Linear(dim, dim_ffn, bias=False), nn.GELU(approximate="tanh"))
        self.fc1 = nn.Linear(dim, dim_ffn, bias=False)
        self.fc2 = nn.Linear(dim_ffn, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x) * self.gate(x))


class T5RelativeBias(nn.Module):
    """One learned logit offset per (bucket, head)."""

    def __init__(self, num_buckets: int, num_heads: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(num_buckets, num_heads)

    def forward(self, buckets: torch.Tensor) -> torch.Tensor:
        """buckets [L, L] long -> bias [1, heads, L, L]."""
        return self.embedding(buckets).permute(2, 0, 1).unsqueeze(0)


class T5Block(nn.Module):
    def __init__(self, geometry: T5Geometry) -> None:
        super().__init__()
        g = geometry
        self.norm1 = T5LayerNorm(g.dim)
        self.attn = T5Attention(g.dim, g.dim_attn, g.num_heads)
        self.norm2 = T5LayerNorm(g.dim)
        self.ffn = T5FeedForward(g.dim, g.dim_ffn)
        self.pos_embedding = T5RelativeBias(g.num_buckets, g.num_heads)

    def forward(self, x: torch.Tensor, buckets: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        bias = self.pos_embedding(buckets).to(x.dtype)
        if keep is not None:
            # padded keys get the most negative finite logit: exp() underflows to exactly 0
            bias = torch.where(keep[:, None, None, :], bias, torch.finfo(x.dtype).min)
        x = _clamp_fp16(x + self.attn(self.norm1(x), bias))
        return _clamp_fp16(x + self.ffn(self.norm2(x)))


def _clamp_fp16(x: torch.Tensor) -> torch.Tensor:
    # umT5's residual stream can exceed fp16's range; bf16 and fp32 need no guard
    if x.dtype == torch.float16:
        limit = torch.finfo(torch.float16).max - 1000
        x = x.clamp(-limit, limit)
    return x


class UMT5Encoder(nn.Module):
    """umT5 encoder. Build under ``torch.device("meta")`` to allocate nothing, then load."""

    def __init__(self, geometry: T5Geometry) -> None:
        super().__init__()
        self.geometry = geometry
        self.token_embedding = nn.Embedding(geometry.vocab_size, geometry.dim)
        self.blocks = nn.ModuleList(T5Block(geometry) for _ in range(geometry.num_layers))
        self.norm = T5LayerNorm(geometry.dim)

    @property
    def dtype(self) -> torch.dtype:
        return self.token_embedding.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.token_embedding.weight.device

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> "UMT5Encoder":
        """Random weights with the scales umT5 was trained from (tests and synthetic files)."""
        for key, tensor in self.state_dict(keep_vars=True).items():
            if tensor.is_meta:
                raise RuntimeError(f"UMT5Encoder.init_weights: {key} is on the meta device; call to_empty() first")
            fill_initial(tensor, key, self.geometry, generator)
        return self

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """ids [B, L] long, mask [B, L] (nonzero = real token) -> hidden states [B, L, dim]."""
        x = self.token_embedding(ids)
        buckets = relative_position_buckets(ids.shape[1], self.geometry.num_buckets, ids.device)
        keep = None if mask is None else mask.to(ids.device) != 0
        for block in self.blocks:
            x = block(x, buckets, keep)
        return self.norm(x)


def initial_std(key: str, geometry: T5Geometry) -> float | None:
    """Standard deviation of a fresh normal init for ``key``; None for norm weights (all ones)."""
    g = geometry
    leaf = key.split(".", 2)[-1] if key.startswith("blocks.") else key
    stds: dict[str, float | None] = {
        "token_embedding.weight": 1.0,
        "norm.weight": None,
        "norm1.weight": None,
        "norm2.weight": None,
        # small query weights stand in for the missing 1/sqrt(d) logit scale
        "attn.q.weight": (g.dim * g.dim_attn) ** -0.5,
        "attn.k.weight": g.dim**-0.5,
        "attn.v.weight": g.dim**-0.5,
        "attn.o.weight": (g.num_heads * g.dim_attn) ** -0.5,
        "ffn.gate.0.weight": g.dim**-0.5,
        "ffn.fc1.weight": g.dim**-0.5,
        "ffn.fc2.weight": g.dim_ffn**-0.5,
        "pos_embedding.embedding.weight": (2 * g.num_buckets * g.num_heads) ** -0.5,
    }
    if leaf not in stds:
        raise KeyError(f"not a umT5 encoder key: {key!r}")
    return stds[leaf]


def fill_initial(tensor: torch.Tensor, key: str, geometry: T5Geometry, generator: torch.Generator | None) -> None:
    """Fill ``tensor`` in place with the initial values for ``key``."""
    std = initial_std(key, geometry)
    if std is None:
        tensor.fill_(1.0)
    else:
        tensor.normal_(0.0, std, generator=generator)


# UMT5Tokenizer or anything called the same way: (texts, max_len=...) -> (ids, mask)
Tokenize = Callable[..., tuple[torch.Tensor, torch.Tensor]]


@torch.no_grad()
def encode_prompts(
    encoder: UMT5Encoder,
    tokenizer: Tokenize,
    prompts: Sequence[str],
    device: torch.device | str | None = None,
    max_len: int = MAX_TOKENS,
) -> list[torch.Tensor]:
    """Encode prompts; each result is [true token count, dim] (padding removed) on ``device``.

    The batch runs only as long as its longest prompt: padded keys are masked and the
    position bias depends on offsets alone, so real tokens come out as with full padding.
    """
    if not prompts:
        return []
    device = torch.device(device) if device is not None else encoder.device
    ids, mask = tokenizer(list(prompts), max_len=max_len)
    lengths = mask.gt(0).sum(dim=1)
    longest = int(lengths.max())
    ids, mask = ids[:, :longest], mask[:, :longest]
    top = int(ids.max())
    if top >= encoder.geometry.vocab_size:
        raise ValueError(
            f"token id {top} is outside the text encoder's vocabulary of {encoder.geometry.vocab_size}: "
            "the tokenizer folder does not belong to this encoder"
        )
    hidden = encoder(ids.to(device), mask.to(device))
    # clone: a slice would keep (and torch.save would write) the whole padded batch
    return [h[:n].clone() for h, n in zip(hidden, lengths.tolist())]
