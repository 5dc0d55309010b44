"""The Wan2.1 video VAE: a causal 3-D convolutional autoencoder, 8x in space and 4x in time.

A clip of 1 + 4k frames maps to 1 + k latent frames of 16 channels. Time is causal: the first
frame is coded on its own, every later latent frame stands for 4 video frames and only looks
back. That lets both directions run as a stream of small chunks (encode: 1 frame, then 4;
decode: one latent frame at a time) in which every temporal convolution remembers the last
frames it was fed, so memory is bounded by one chunk instead of the whole clip.

Module and parameter names follow the official ``Wan2.1_VAE.pth`` so it loads as it is.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from .checkpoint_keys import count_blocks
from .geometry import LATENT_CHANNELS, VAE_STRIDE_S, VAE_STRIDE_T, latent_frames as count_latent_frames, video_frames

# Per-channel statistics of the latent space; encode returns (mu - mean) / std and decode
# undoes it. They are constants of the trained model, not stored in the checkpoint.
LATENT_MEAN = (
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
)
LATENT_STD = (
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
)

# Encoder (or decoder) blocks a VAE file may describe: Wan2.1 has 11 (15 in the decoder).
MAX_STAGE_BLOCKS = 8 * 17


# Per-call memory of the causal layers: layer -> the last input frames it saw (or a marker).
# A fresh dict per encode/decode (and per tile) keeps calls independent and frees it after.
Stream = dict


@dataclass(frozen=True)
class VAEGeometry:
    dim: int = 96
    z_dim: int = LATENT_CHANNELS
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    temperal_downsample: tuple[bool, ...] = (False, True, True)  # spelling of the original config

    def __post_init__(self) -> None:
        if len(self.temperal_downsample) != len(self.dim_mult) - 1:
            raise ValueError(
                f"VAE geometry: temperal_downsample has {len(self.temperal_downsample)} entries, "
                f"expected {len(self.dim_mult) - 1} (one per downsampling stage)"
            )
        if self.dim < 1 or self.z_dim < 1 or self.num_res_blocks < 1 or min(self.dim_mult, default=0) < 1:
            raise ValueError(f"VAE geometry: dim, z_dim, dim_mult and num_res_blocks must be positive ({self})")
        # Far above the Wan2.1 VAE (dim 96, z_dim 16, 4 stages of x1..x4, 2 residual blocks each).
        if (self.dim > 1024 or self.z_dim > 256 or self.num_res_blocks > 16 or len(self.dim_mult) > 8
                or max(self.dim_mult) > 64):
            raise ValueError(f"VAE geometry: {self} is far beyond any Wan VAE (dim <= 1024, z_dim <= 256, at most "
                             "8 stages of at most 16 residual blocks and x64 width); the file is corrupt")

    @property
    def stage_dims(self) -> list[int]:
        return [self.dim * m for m in self.dim_mult]

    @classmethod
    def from_state_dict(cls, tensors: Mapping[str, torch.Tensor]) -> "VAEGeometry":
        """Read the geometry off tensor shapes and block counts of an encoder state dict.

        Any mapping whose values have a ``.shape`` works (meta tensors included).
        """
        for key in ("encoder.conv1.weight", "conv2.weight"):
            if key not in tensors:
                raise ValueError(f"no tensor {key!r}: this is not a Wan2.1 VAE state dict")
        dim = int(tensors["encoder.conv1.weight"].shape[0])
        z_dim = int(tensors["conv2.weight"].shape[0])

        prefix = "encoder.downsamples."
        # From the keys, before anything is built: numbered 0..n-1, n bounded (the decoder's too).
        count = count_blocks(tensors, prefix, MAX_STAGE_BLOCKS)
        count_blocks(tensors, "decoder.upsamples.", MAX_STAGE_BLOCKS)
        if not count:
            raise ValueError("no encoder.downsamples blocks: this is not a Wan2.1 VAE state dict")
        indices = range(count)
        # The blocks are stages of residual blocks, each stage but the last closed by a resampler.
        stages: list[list[int]] = [[]]
        temporal: list[bool] = []
        for i in indices:
            block = f"{prefix}{i}."
            if block + "resample.1.weight" in tensors:
                temporal.append(block + "time_conv.weight" in tensors)
                stages.append([])
            elif block + "residual.2.weight" in tensors:
                stages[-1].append(int(tensors[block + "residual.2.weight"].shape[0]))
            else:
                raise ValueError(f"encoder.downsamples.{i} is neither a residual block nor a resampler")
        counts = {len(s) for s in stages}
        if len(counts) != 1 or 0 in counts:
            raise ValueError(f"encoder stages have different residual block counts: {[len(s) for s in stages]}")
        mults = []
        for stage in stages:
            if stage[-1] % dim:
                raise ValueError(f"encoder stage width {stage[-1]} is not a multiple of the base width {dim}")
            mults.append(stage[-1] // dim)
        return cls(
            dim=dim,
            z_dim=z_dim,
            dim_mult=tuple(mults),
            num_res_blocks=counts.pop(),
            temperal_downsample=tuple(temporal),
        )


# The real Wan2.1 VAE (~127 M parameters).
WAN21 = VAEGeometry()
# Same layer kinds and latent channels (the DiT needs 16), a few hundred kB, for CPU tests.
VAE_TINY = VAEGeometry(dim=8)


class _Numbered(nn.Module):
    """Holds children under fixed numeric names, so parameter keys match the official file
    (whose blocks were nn.Sequential with parameter-free layers in between)."""

    def __init__(self, children: Mapping[int, nn.Module]) -> None:
        super().__init__()
        for index, child in children.items():
            self.add_module(str(index), child)

    def __getitem__(self, index: int) -> nn.Module:
        return self._modules[str(index)]


class RMSNorm(nn.Module):
    """Scale each position's channel vector to unit length times sqrt(channels), then by gamma."""

    def __init__(self, channels: int, gamma_ndim: int) -> None:
        super().__init__()
        self.scale = channels**0.5
        # The official file stores gamma as [C,1,1,1] in conv blocks and [C,1,1] in attention.
        self.gamma = nn.Parameter(torch.ones(channels, *([1] * (gamma_ndim - 1))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gamma = self.gamma.reshape(-1, *([1] * (x.dim() - 2)))
        # In place on normalize's fresh output: one full-size temporary instead of three.
        return F.normalize(x, dim=1).mul_(gamma * self.scale)


def _per_frame_conv2d(conv: nn.Conv2d, x: torch.Tensor, stride: int = 1, padding: int = 0) -> torch.Tensor:
    """Apply a 2-D conv to every frame of [B,C,T,H,W] as a (1,k,k) 3-D conv: no reshuffle copies."""
    return F.conv3d(x, conv.weight.unsqueeze(2), conv.bias, stride=(1, stride, stride), padding=(0, padding, padding))


class CausalConv3d(nn.Conv3d):
    """A 3-D conv that looks only backwards in time.

    Space is zero-padded symmetrically; time gets ``kt - 1`` past frames from the stream (zeros
    before the first chunk), so a clip fed chunk by chunk gives the same result as all at once.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel: int | tuple[int, int, int]) -> None:
        kt, kh, kw = (kernel,) * 3 if isinstance(kernel, int) else kernel
        super().__init__(in_channels, out_channels, (kt, kh, kw), padding=(0, kh // 2, kw // 2))

    def forward(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:  # type: ignore[override]
        past = self.kernel_size[0] - 1
        if past:
            before = stream.get(self)
            if before is None:
                before = x.new_zeros((*x.shape[:2], past, *x.shape[3:]))
            x = torch.cat([before, x], dim=2)
            stream[self] = x[:, :, -past:].clone()  # a copy: a view would pin the whole chunk
        return super().forward(x)


class ResidualBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.residual = _Numbered({
            0: RMSNorm(in_channels, 4),
            2: CausalConv3d(in_channels, out_channels, 3),
            3: RMSNorm(out_channels, 4),
            6: CausalConv3d(out_channels, out_channels, 3),
        })
        self.shortcut = CausalConv3d(in_channels, out_channels, 1) if in_channels != out_channels else None

    def forward(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        r = self.residual
        h = r[2](F.silu(r[0](x), inplace=True), stream)
        h = r[6](F.silu(r[3](h), inplace=True), stream)
        return h + (x if self.shortcut is None else self.shortcut(x, stream))


class AttentionBlock(nn.Module):
    """Single-head self-attention over the pixels of each frame (no mixing across time)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = RMSNorm(channels, 3)
        self.to_qkv = nn.Conv2d(channels, channels * 3, 1)
        self.proj = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        b, c, t, h, w = x.shape
        qkv = _per_frame_conv2d(self.to_qkv, self.norm(x))
        tokens = qkv.flatten(3).permute(0, 2, 3, 1).reshape(b * t, 1, h * w, 3 * c)
        q, k, v = tokens.chunk(3, dim=-1)
        out = F.scaled_dot_product_attention(q, k, v)
        out = out.reshape(b, t, h, w, c).permute(0, 4, 1, 2, 3)
        return x + _per_frame_conv2d(self.proj, out)


class Resample(nn.Module):
    """Halve (encoder) or double (decoder) the frame size, and optionally the frame rate.

    Temporal down: the first chunk's frame passes as it is; later chunks are convolved with
    stride 2 together with the last frame of the previous chunk (4 frames -> 2).
    Temporal up: the first chunk passes as it is; every later frame becomes two, produced by a
    causal conv whose history starts after the first chunk.
    """

    def __init__(self, channels: int, up: bool, temporal: bool) -> None:
        super().__init__()
        self.up, self.temporal = up, temporal
        if up:
            self.resample = _Numbered({1: nn.Conv2d(channels, channels // 2, 3, padding=1)})
            if temporal:
                self.time_conv = CausalConv3d(channels, channels * 2, (3, 1, 1))
        else:
            self.resample = _Numbered({1: nn.Conv2d(channels, channels, 3, stride=2)})
            if temporal:
                self.time_conv = nn.Conv3d(channels, channels, (3, 1, 1), stride=(2, 1, 1))

    def forward(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        return self._up(x, stream) if self.up else self._down(x, stream)

    def _up(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        if self.temporal:
            if self not in stream:
                stream[self] = True  # the first chunk: no temporal doubling
            else:
                b, c, t, h, w = x.shape
                pairs = self.time_conv(x, stream)  # [B, 2C, T]: two output frames per input frame
                x = pairs.view(b, 2, c, t, h, w).permute(0, 2, 3, 1, 4, 5).reshape(b, c, 2 * t, h, w)
        x = F.interpolate(x, scale_factor=(1.0, 2.0, 2.0), mode="nearest-exact")
        return _per_frame_conv2d(self.resample[1], x, padding=1)

    def _down(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        # Pad right and bottom only, then a stride-2 valid conv: H -> H/2 for even H.
        x = _per_frame_conv2d(self.resample[1], F.pad(x, (0, 1, 0, 1)), stride=2)
        if self.temporal:
            last = stream.get(self)
            stream[self] = x[:, :, -1:].clone()
            if last is not None:
                x = self.time_conv(torch.cat([last, x], dim=2))
        return x


def _head(in_channels: int, out_channels: int) -> _Numbered:
    return _Numbered({0: RMSNorm(in_channels, 4), 2: CausalConv3d(in_channels, out_channels, 3)})


def _run_head(head: _Numbered, x: torch.Tensor, stream: Stream) -> torch.Tensor:
    return head[2](F.silu(head[0](x), inplace=True), stream)


def _middle(channels: int) -> nn.ModuleList:
    return nn.ModuleList([ResidualBlock(channels, channels), AttentionBlock(channels), ResidualBlock(channels, channels)])


class Encoder(nn.Module):
    """Video chunk [B,3,T,H,W] -> [B, 2*z_dim, T', H/8, W/8] (mean and log-variance)."""

    def __init__(self, g: VAEGeometry) -> None:
        super().__init__()
        widths = g.stage_dims
        self.conv1 = CausalConv3d(3, g.dim, 3)
        blocks: list[nn.Module] = []
        channels = g.dim
        for stage, width in enumerate(widths):
            for _ in range(g.num_res_blocks):
                blocks.append(ResidualBlock(channels, width))
                channels = width
            if stage < len(widths) - 1:
                blocks.append(Resample(width, up=False, temporal=g.temperal_downsample[stage]))
        self.downsamples = nn.ModuleList(blocks)
        self.middle = _middle(channels)
        self.head = _head(channels, 2 * g.z_dim)

    def forward(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        x = self.conv1(x, stream)
        for block in self.downsamples:
            x = block(x, stream)
        for block in self.middle:
            x = block(x, stream)
        return _run_head(self.head, x, stream)


class Decoder(nn.Module):
    """Latent chunk [B, z_dim, T, h, w] -> video [B, 3, T', 8h, 8w]; stages mirror the encoder."""

    def __init__(self, g: VAEGeometry) -> None:
        super().__init__()
        widths = g.stage_dims[::-1]
        temporal_up = g.temperal_downsample[::-1]
        channels = widths[0]
        self.conv1 = CausalConv3d(g.z_dim, channels, 3)
        self.middle = _middle(channels)
        blocks: list[nn.Module] = []
        for stage, width in enumerate(widths):
            for _ in range(g.num_res_blocks + 1):
                blocks.append(ResidualBlock(channels, width))
                channels = width
            if stage < len(widths) - 1:
                blocks.append(Resample(width, up=True, temporal=temporal_up[stage]))
                channels = width // 2  # the upsampler's conv halves the channels
        self.upsamples = nn.ModuleList(blocks)
        self.head = _head(channels, 3)

    def forward(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        x = self.conv1(x, stream)
        for block in self.middle:
            x = block(x, stream)
        for block in self.upsamples:
            x = block(x, stream)
        return _run_head(self.head, x, stream)


Progress = Callable[[int, int], None]


class WanVAE(nn.Module):
    """Encoder, decoder and the two 1x1x1 convs between them and the latent space.

    Build under ``torch.device("meta")`` to allocate nothing, then load weights (see
    ``loaders.vae_loader``) or call :meth:`init_weights`. Runs in the dtype of its weights.
    """

    def __init__(self, geometry: VAEGeometry = WAN21) -> None:
        super().__init__()
        self.geometry = geometry
        z = geometry.z_dim
        self.encoder = Encoder(geometry)
        self.conv1 = CausalConv3d(2 * z, 2 * z, 1)  # -> mean and log-variance
        self.conv2 = CausalConv3d(z, z, 1)
        self.decoder = Decoder(geometry)

    @property
    def dtype(self) -> torch.dtype:
        return self.conv2.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.conv2.weight.device

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Random weights whose decoded output is finite and mostly inside [-1, 1]: for tests
        and synthetic checkpoints. Materializes a meta-built model on the CPU first."""
        if any(p.is_meta for p in self.parameters()):
            self.to_empty(device="cpu")

        def normal_(tensor: torch.Tensor, std: float, mean: float = 0.0) -> None:
            draw = torch.randn(tensor.shape, generator=generator, dtype=torch.float32)
            tensor.copy_(draw.mul_(std).add_(mean))

        for name, module in self.named_modules():
            if isinstance(module, (nn.Conv2d, nn.Conv3d)):
                fan_in = module.weight[0].numel()
                # Quiet attention outputs and a tame final layer keep pixels mostly unclamped.
                gain = 0.2 if name.endswith(".proj") else 0.5 if name == "decoder.head.2" else 1.0
                normal_(module.weight, gain / math.sqrt(fan_in))
                normal_(module.bias, 0.02)
            elif isinstance(module, RMSNorm):
                normal_(module.gamma, 0.1, mean=1.0)

    def _latent_stats(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (1, -1, 1, 1, 1)
        mean = torch.tensor(LATENT_MEAN, dtype=torch.float32, device=device).view(shape)
        std = torch.tensor(LATENT_STD, dtype=torch.float32, device=device).view(shape)
        return mean, std

    @torch.no_grad()
    def encode(self, video: torch.Tensor, progress: Progress | None = None,
               cancel: Callable[[], None] | None = None) -> torch.Tensor:
        """Video [B,3,F,H,W] in [-1,1] -> normalized latent [B,16,1+(F-1)//4,H/8,W/8], float32.

        Frames past the last full group of 4 are ignored, as in the original. ``video`` may live
        on the CPU: each chunk is moved to the model's device on its own. ``cancel`` is called
        before every chunk (it raises to stop), so a cancel acts within one chunk.
        """
        if video.dim() != 5 or video.shape[1] != 3:
            raise ValueError(f"video has shape {tuple(video.shape)}; expected [batch, 3, frames, height, width]")
        b, _, frames, height, width = video.shape
        if frames < 1 or height % VAE_STRIDE_S or width % VAE_STRIDE_S:
            raise ValueError(
                f"video of {frames} frames at {height}x{width}: needs at least one frame and a height and width divisible by 8"
            )
        latent_frames = count_latent_frames(frames)
        latent = torch.empty((b, self.geometry.z_dim, latent_frames, height // VAE_STRIDE_S, width // VAE_STRIDE_S),
                             dtype=torch.float32, device=self.device)
        stream = StreamEncoder(self)
        for i in range(latent_frames):
            if cancel is not None:
                cancel()
            start, stop = (0, 1) if i == 0 else (1 + VAE_STRIDE_T * (i - 1), 1 + VAE_STRIDE_T * i)
            stream.encode_next(video[:, :, start:stop], out=latent[:, :, i : i + 1], normalize=False)
            if progress is not None:
                progress(i + 1, latent_frames)
        stream.close()
        mean, std = self._latent_stats(self.device)
        return latent.sub_(mean).div_(std)

    @torch.no_grad()
    def decode(
        self,
        latent: torch.Tensor,
        tile: int | None = None,
        progress: Progress | None = None,
        tile_overlap: int | None = None,
        cancel: Callable[[], None] | None = None,
    ) -> torch.Tensor:
        """Normalized latent [B,16,T,h,w] -> video [B,3,1+4(T-1),8h,8w] in [-1,1], in the model's dtype.

        ``tile`` (latent pixels, e.g. 32 = 256 px) decodes overlapping spatial tiles one after
        the other, each with its own full temporal pass, and blends them linearly across the
        overlap (``tile_overlap``, default tile // 4): peak memory then follows the tile, not the
        frame. The result is close to, not equal to, the untiled one.
        ``progress(done, total)`` is called after every decoded latent frame (of every tile),
        ``cancel()`` (which raises to stop) before every one.
        """
        if latent.dim() != 5 or latent.shape[1] != self.geometry.z_dim:
            raise ValueError(
                f"latent has shape {tuple(latent.shape)}; expected [batch, {self.geometry.z_dim}, frames, height/8, width/8]"
            )
        b, _, frames, h, w = latent.shape
        if tile is not None and tile < 1:
            raise ValueError(f"tile is {tile}; give a positive size in latent pixels, or None")
        if tile is None or (tile >= h and tile >= w):
            return self._decode_region(latent, _Counter(progress, frames, cancel)).clamp_(-1.0, 1.0)

        overlap = tile // 4 if tile_overlap is None else tile_overlap
        if not 0 <= overlap < tile:
            raise ValueError(f"tile_overlap is {overlap}; it must be at least 0 and less than tile ({tile})")
        rows, cols = _tile_spans(h, tile, overlap), _tile_spans(w, tile, overlap)
        counter = _Counter(progress, frames * len(rows) * len(cols), cancel)
        s = VAE_STRIDE_S
        out_frames = video_frames(frames)
        video = torch.zeros((b, 3, out_frames, h * s, w * s), dtype=self.dtype, device=self.device)
        weight_rows = _blend_weights(rows, s, self.device)
        weight_cols = _blend_weights(cols, s, self.device)
        for (y0, y1), wy in zip(rows, weight_rows):
            for (x0, x1), wx in zip(cols, weight_cols):
                part = self._decode_region(latent[:, :, :, y0:y1, x0:x1], counter)
                # The 1-D weights are normalized per axis, so their product sums to 1 per pixel.
                # Weighting in float32 keeps bf16 rounding to the one final add.
                weighted = part.float().mul_(wy[:, None] * wx[None, :])
                del part
                video[:, :, :, y0 * s : y1 * s, x0 * s : x1 * s] += weighted
                del weighted
        return video.clamp_(-1.0, 1.0)

    def _decode_region(self, latent: torch.Tensor, counter: "_Counter") -> torch.Tensor:
        """One full temporal pass, one latent frame at a time; unclamped output."""
        b, _, frames, h, w = latent.shape
        s = VAE_STRIDE_S
        video = torch.empty((b, 3, video_frames(frames), h * s, w * s), dtype=self.dtype,
                            device=self.device)
        stream = _RegionDecoder(self)
        filled = 0
        for i in range(frames):
            counter.before()
            filled += stream.decode_frame(latent[:, :, i : i + 1], video[:, :, filled:])
            counter.step()
        stream.close()
        return video

    def stream_encoder(self) -> "StreamEncoder":
        """A causal encoder fed one frame, then groups of 4 frames (see ``StreamEncoder``)."""
        return StreamEncoder(self)

    def stream_decoder(self, tile: int | None = None, tile_overlap: int | None = None) -> "StreamDecoder":
        """A decoder fed latent frames a few at a time, equal to ``decode`` of the whole latent
        (see ``StreamDecoder``)."""
        return StreamDecoder(self, tile, tile_overlap)


class StreamEncoder:
    """The encoder as a stream: ``encode_next`` takes the first frame alone, then 4 frames at a
    time, and returns their latent frame; the causal state is carried between calls.

    ``WanVAE.encode`` runs through this class, so a clip encoded piece by piece is bitwise the
    whole-clip encode. ``state()`` exposes the carried tensors (for a caller that proves the
    stream has reached a fixed point, e.g. on black frames); ``close()`` frees them.
    """

    def __init__(self, vae: WanVAE) -> None:
        self.vae = vae
        self.index = 0  # latent frames produced so far
        self._stream: Stream = {}
        z = vae.geometry.z_dim
        self._mu = (vae.conv1.weight[:z], vae.conv1.bias[:z])  # the log-variance half is unused

    @torch.no_grad()
    def encode_next(self, frames: torch.Tensor, out: torch.Tensor | None = None,
                    normalize: bool = True) -> torch.Tensor:
        """frames [B,3,T,H,W] in [-1,1] (T = 1 for the first call, 4 after) -> latent [B,16,1,H/8,W/8]
        float32 (normalized unless ``normalize`` is False), written into ``out`` when given."""
        expected = 1 if self.index == 0 else VAE_STRIDE_T
        if frames.dim() != 5 or frames.shape[1] != 3 or frames.shape[2] != expected:
            raise ValueError(f"stream encode call {self.index}: frames of shape {tuple(frames.shape)}; expected "
                             f"[batch, 3, {expected}, height, width] (the first frame alone, then groups of 4)")
        vae = self.vae
        moments = vae.encoder(frames.to(device=vae.device, dtype=vae.dtype), self._stream)
        mu = F.conv3d(moments, *self._mu)
        if out is None:
            out = torch.empty(mu.shape, dtype=torch.float32, device=mu.device)
        out.copy_(mu)
        if normalize:
            mean, std = vae._latent_stats(out.device)
            out.sub_(mean).div_(std)
        self.index += 1
        return out

    def state(self) -> dict:
        """The carried causal state (layer -> tensor or marker); read-only for callers."""
        return self._stream

    def close(self) -> None:
        self._stream.clear()


class _RegionDecoder:
    """The decoder's causal state for one spatial region, fed one latent frame at a time."""

    def __init__(self, vae: WanVAE) -> None:
        self.vae = vae
        self.frames_done = 0
        self._stream: Stream = {}

    def decode_frame(self, latent: torch.Tensor, out: torch.Tensor) -> int:
        """Decode latent [B,16,1,h,w] (normalized) into the first frames of ``out``; returns how
        many video frames it wrote (1 for the first latent frame, 4 after). Unclamped."""
        vae = self.vae
        mean, std = vae._latent_stats(vae.device)
        z = latent.to(device=vae.device, dtype=torch.float32) * std + mean
        x = vae.decoder(vae.conv2(z.to(vae.dtype), self._stream), self._stream)
        out[:, :, : x.shape[2]] = x
        self.frames_done += 1
        return x.shape[2]

    def close(self) -> None:
        self._stream.clear()


class StreamDecoder:
    """Decode a latent a few frames at a time with the causal state carried between calls.

    ``decode_next(latent [B,16,T,h,w])`` returns the video frames of those T latent frames
    ([B,3,T',8h,8w] in [-1,1], T' = 1 + 4(T-1) for the first call and 4T after); the
    concatenation of all calls is bitwise ``WanVAE.decode`` of the whole latent with the same
    ``tile`` (each spatial tile keeps its own state and the tiles are blended in the same
    order). Memory holds the state and one call's frames, whatever the video's length.
    Fed one latent frame a call, it gives each latent frame's frames as soon as they are
    decoded (what Play sends the page), bitwise the same.
    """

    def __init__(self, vae: WanVAE, tile: int | None = None, tile_overlap: int | None = None) -> None:
        if tile is not None and tile < 1:
            raise ValueError(f"tile is {tile}; give a positive size in latent pixels, or None")
        self.vae, self.tile, self.tile_overlap = vae, tile, tile_overlap
        self._regions: list[tuple[tuple[int, int], tuple[int, int], _RegionDecoder]] | None = None
        self._weights: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.latent_frames_done = 0

    def _plan(self, h: int, w: int) -> None:
        tile = self.tile
        if tile is None or (tile >= h and tile >= w):
            self._regions = [((0, h), (0, w), _RegionDecoder(self.vae))]
            return
        overlap = tile // 4 if self.tile_overlap is None else self.tile_overlap
        if not 0 <= overlap < tile:
            raise ValueError(f"tile_overlap is {overlap}; it must be at least 0 and less than tile ({tile})")
        rows, cols = _tile_spans(h, tile, overlap), _tile_spans(w, tile, overlap)
        device = self.vae.device
        weight_rows = _blend_weights(rows, VAE_STRIDE_S, device)
        weight_cols = _blend_weights(cols, VAE_STRIDE_S, device)
        self._regions, self._weights = [], []
        for ys, wy in zip(rows, weight_rows):
            for xs, wx in zip(cols, weight_cols):
                self._regions.append((ys, xs, _RegionDecoder(self.vae)))
                self._weights.append((wy, wx))

    @torch.no_grad()
    def decode_next(self, latent: torch.Tensor, cancel: Callable[[], None] | None = None) -> torch.Tensor:
        """Normalized latent frames [B,16,T,h,w] (the next T of the video) -> their video frames."""
        vae = self.vae
        if latent.dim() != 5 or latent.shape[1] != vae.geometry.z_dim or latent.shape[2] < 1:
            raise ValueError(f"latent has shape {tuple(latent.shape)}; expected [batch, {vae.geometry.z_dim}, "
                             "frames >= 1, height/8, width/8]")
        b, _, frames, h, w = latent.shape
        if self._regions is None:
            self._plan(h, w)
            self._shape = (b, h, w)
        elif (b, h, w) != self._shape:
            raise ValueError(f"latent of batch {b} at {h}x{w} after {self._shape[0]} at {self._shape[1]}x"
                             f"{self._shape[2]}: one stream decodes one video")
        first = self.latent_frames_done == 0
        out_frames = video_frames(frames) if first else VAE_STRIDE_T * frames
        s = VAE_STRIDE_S
        tiled = len(self._regions) > 1
        video = (torch.zeros if tiled else torch.empty)((b, 3, out_frames, h * s, w * s), dtype=vae.dtype,
                                                        device=vae.device)
        for index, ((y0, y1), (x0, x1), region) in enumerate(self._regions):
            part = video if not tiled else torch.empty((b, 3, out_frames, (y1 - y0) * s, (x1 - x0) * s),
                                                       dtype=vae.dtype, device=vae.device)
            filled = 0
            for i in range(frames):
                if cancel is not None:
                    cancel()
                filled += region.decode_frame(latent[:, :, i : i + 1, y0:y1, x0:x1], part[:, :, filled:])
            if tiled:
                wy, wx = self._weights[index]
                weighted = part.float().mul_(wy[:, None] * wx[None, :])
                del part
                video[:, :, :, y0 * s : y1 * s, x0 * s : x1 * s] += weighted
                del weighted
        self.latent_frames_done += frames
        return video.clamp_(-1.0, 1.0)

    def close(self) -> None:
        for _, _, region in self._regions or []:
            region.close()
        self._regions = None


class _Counter:
    def __init__(self, progress: Progress | None, total: int, cancel: Callable[[], None] | None = None) -> None:
        self.progress, self.total, self.done = progress, total, 0
        self.cancel = cancel

    def before(self) -> None:
        if self.cancel is not None:
            self.cancel()

    def step(self) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total)


def _tile_spans(length: int, tile: int, overlap: int) -> list[tuple[int, int]]:
    """Evenly spread [start, stop) windows of ``tile`` covering ``length`` with at least ``overlap``."""
    if length <= tile:
        return [(0, length)]
    count = math.ceil((length - overlap) / (tile - overlap))
    # Floor division keeps neighbouring starts at most tile - overlap apart.
    starts = [i * (length - tile) // (count - 1) for i in range(count)]
    return [(start, start + tile) for start in starts]


def _blend_weights(spans: list[tuple[int, int]], scale: int, device: torch.device) -> list[torch.Tensor]:
    """Per span, output-pixel weights that ramp linearly across the overlaps with its neighbours,
    normalized so that the weights of all spans sum to 1 at every pixel."""
    total = spans[-1][1] * scale
    raw = []
    for i, (start, stop) in enumerate(spans):
        weight = torch.ones((stop - start) * scale, dtype=torch.float32, device=device)
        if i > 0:
            n = (spans[i - 1][1] - start) * scale
            if n > 0:
                weight[:n] *= (torch.arange(n, dtype=torch.float32, device=device) + 0.5) / n
        if i < len(spans) - 1:
            n = (stop - spans[i + 1][0]) * scale
            if n > 0:
                weight[-n:] *= (torch.arange(n, 0, -1, dtype=torch.float32, device=device) - 0.5) / n
        raw.append(weight)
    coverage = torch.zeros(total, dtype=torch.float32, device=device)
    for (start, stop), weight in zip(spans, raw):
        coverage[start * scale : stop * scale] += weight
    return [weight / coverage[start * scale : stop * scale] for (start, stop), weight in zip(spans, raw)]
