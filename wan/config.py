"""Geometry of the LingBot-World DiT, as written in an expert folder's config.json."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

# Fields of the official config.json that describe the network. Anything else in the
# file (diffusers bookkeeping such as "_class_name") is ignored.
_TUPLE_FIELDS = ("patch_size", "window_size")


@dataclass(frozen=True)
class DiTConfig:
    model_type: str = "i2v"
    patch_size: tuple[int, int, int] = (1, 2, 2)
    text_len: int = 512
    in_dim: int = 36
    dim: int = 5120
    ffn_dim: int = 13824
    freq_dim: int = 256
    text_dim: int = 4096
    out_dim: int = 16
    num_heads: int = 40
    num_layers: int = 40
    window_size: tuple[int, int] = (-1, -1)
    qk_norm: bool = True
    cross_attn_norm: bool = True
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.dim % self.num_heads:
            raise ValueError(f"config: dim={self.dim} is not divisible by num_heads={self.num_heads}")
        if (self.dim // self.num_heads) % 2:
            raise ValueError(f"config: head dim {self.dim // self.num_heads} must be even for RoPE")
        if len(self.patch_size) != 3:
            raise ValueError(f"config: patch_size must have 3 entries, got {self.patch_size}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def camera_in_features(self) -> int:
        """Plücker features per token: 6 ray channels x 8x8 pixels x the DiT patch."""
        pt, ph, pw = self.patch_size
        return 6 * 64 * pt * ph * pw

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "DiTConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in names:
                continue
            kwargs[key] = tuple(value) if key in _TUPLE_FIELDS else value
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for key in _TUPLE_FIELDS:
            out[key] = list(out[key])
        return out


# The real A14B expert (both the high- and the low-noise expert have this shape).
A14B = DiTConfig()

# A few-megabyte expert with every layer kind of the real one, for CI on a CPU.
TINY = DiTConfig(dim=64, ffn_dim=128, freq_dim=32, text_dim=32, num_heads=2, num_layers=2)
