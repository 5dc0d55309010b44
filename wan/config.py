"""Geometry of the LingBot-World DiT, as written in an expert folder's config.json, and
which control signal a checkpoint reads (known from its weights' shape, not the config)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .geometry import LATENT_CHANNELS, MAX_TOKENS, PATCH_SIZE

# Fields of the official config.json that describe the network. Anything else in the
# file (diffusers bookkeeping such as "_class_name") is ignored.
_TUPLE_FIELDS = ("patch_size", "window_size")
# Not a config.json field: the official configs of Base-Cam and Act are alike, so the
# control type comes from patch_embedding_wancamctrl.weight's shape (control_type_from_features).
_NOT_IN_CONFIG_JSON = ("control_type",)

# Control channels per pixel: Base-Cam reads Plücker rays (origin + direction), Act reads
# ray directions + W/A/S/D keys (docs/conventions.md#act-checkpoint). Each is folded 8×8, then patched like the latent.
CONTROL_CHANNELS = {"cam": 6, "act": 7}
CONTROL_NAMES = {"cam": "Base-Cam", "act": "Act"}
FOLD_PIXELS = 8 * 8
CONTROL_WEIGHT = "patch_embedding_wancamctrl.weight"


@dataclass(frozen=True)
class DiTConfig:
    model_type: str = "i2v"
    patch_size: tuple[int, int, int] = PATCH_SIZE
    text_len: int = MAX_TOKENS
    in_dim: int = 36
    dim: int = 5120
    ffn_dim: int = 13824
    freq_dim: int = 256
    text_dim: int = 4096
    out_dim: int = LATENT_CHANNELS
    num_heads: int = 40
    num_layers: int = 40
    window_size: tuple[int, int] = (-1, -1)
    qk_norm: bool = True
    cross_attn_norm: bool = True
    eps: float = 1e-6
    control_type: str = "cam"  # "cam" (Base-Cam) or "act"; from the weights, see with_control_weight

    def __post_init__(self) -> None:
        if self.dim % self.num_heads:
            raise ValueError(f"config: dim={self.dim} is not divisible by num_heads={self.num_heads}")
        if (self.dim // self.num_heads) % 2:
            raise ValueError(f"config: head dim {self.dim // self.num_heads} must be even for RoPE")
        if len(self.patch_size) != 3:
            raise ValueError(f"config: patch_size must have 3 entries, got {self.patch_size}")
        if self.control_type not in CONTROL_CHANNELS:
            raise ValueError(f"config: control_type={self.control_type!r} is not one of {', '.join(CONTROL_CHANNELS)}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def control_channels(self) -> int:
        """Control channels per pixel: 6 (Base-Cam) or 7 (Act)."""
        return CONTROL_CHANNELS[self.control_type]

    @property
    def camera_in_features(self) -> int:
        """Control features per token: the channels x 8x8 pixels x the DiT patch (1536 for
        Base-Cam, 1792 for Act at patch (1, 2, 2))."""
        return control_in_features(self.control_type, self.patch_size)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "DiTConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in names or key in _NOT_IN_CONFIG_JSON:
                continue
            kwargs[key] = tuple(value) if key in _TUPLE_FIELDS else value
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for key in _TUPLE_FIELDS:
            out[key] = list(out[key])
        for key in _NOT_IN_CONFIG_JSON:
            del out[key]
        return out


def control_in_features(control_type: str, patch_size: Sequence[int] = PATCH_SIZE) -> int:
    """Input features of patch_embedding_wancamctrl for a control type and DiT patch."""
    pt, ph, pw = patch_size
    return CONTROL_CHANNELS[control_type] * FOLD_PIXELS * pt * ph * pw


def control_type_from_features(in_features: int, patch_size: Sequence[int] = PATCH_SIZE) -> str:
    """"cam" or "act" from patch_embedding_wancamctrl.weight's input features (its shape is
    [dim, in_features]): 1536 → Base-Cam, 1792 → Act at patch (1, 2, 2). ValueError otherwise."""
    for control_type in CONTROL_CHANNELS:
        if int(in_features) == control_in_features(control_type, patch_size):
            return control_type
    known = ", ".join(f"{control_in_features(t, patch_size)} ({CONTROL_NAMES[t]}, {n} channels)"
                      for t, n in CONTROL_CHANNELS.items())
    raise ValueError(f"{CONTROL_WEIGHT} has {in_features} input features; a LingBot-World checkpoint with "
                     f"patch {list(patch_size)} has {known}: this is not a LingBot-World camera/action checkpoint")


def with_control_weight(config: DiTConfig, weight_shape: Sequence[int]) -> DiTConfig:
    """``config`` with ``control_type`` set from the stored shape [dim, in_features] of
    patch_embedding_wancamctrl.weight (as a file header gives it). ValueError for a shape
    that is neither Base-Cam's nor Act's."""
    shape = tuple(int(n) for n in weight_shape)
    if len(shape) != 2:
        raise ValueError(f"{CONTROL_WEIGHT} has shape {list(shape)}; expected [dim, in_features]")
    return dataclasses.replace(config, control_type=control_type_from_features(shape[1], config.patch_size))


# The real A14B expert (both the high- and the low-noise expert have this shape).
A14B = DiTConfig()

# A few-megabyte expert with every layer kind of the real one, for CI on a CPU.
TINY = DiTConfig(dim=64, ffn_dim=128, freq_dim=32, text_dim=32, num_heads=2, num_layers=2)
TINY_ACT = dataclasses.replace(TINY, control_type="act")
