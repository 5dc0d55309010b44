"""Play's live decoder: ComfyUI's tiny video VAE (TAEHV: ``lighttaew2_1`` in models/vae_approx,
loaded by core's Load VAE) fed one latent frame at a time.

ComfyUI's ``TAEHV.decode`` decodes a whole latent at once; Play needs each latent frame's
frames as soon as the frame exists, with the decoder's memory carried from chunk to chunk.
``TinyStreamDecoder`` runs ComfyUI's own decoder modules in the order its sequential
decode runs them (``comfy.taesd.taehv.apply_model_with_memblocks``, one time step at a
time, depth first) but keeps each memory block's last input between calls, so the frames of
all calls together are the whole latent's decode. It is fed the raw Wan 2.1 latent
(normalized × std + mean: what the tiny Wan 2.1 decoders take) and returns frames in
[-1, 1] like ``WanVAE``'s stream decoder.

Picture quality: the tiny decoder's frames are a preview of the Wan VAE's (the node's latent
output decodes with the full VAE); none of this pack's measurements judge them.
"""
from __future__ import annotations

import copy
from collections import deque
from typing import Callable

import torch

from comfy.taesd.taehv import TAEHV, MemBlock, TGrow, TPool

from ...wan.geometry import LATENT_CHANNELS
from ...wan.vae import LATENT_MEAN, LATENT_STD


def tiny_video_vae(vae, name: str = "live_decoder") -> TAEHV:
    """ComfyUI's VAE object → its TAEHV module for Wan 2.1 latents; anything else is refused
    with what it is and what to load instead."""
    model = getattr(vae, "first_stage_model", None)
    if not isinstance(model, TAEHV):
        kind = type(model).__name__ if model is not None else type(vae).__name__
        raise ValueError(f"{name}: expected a tiny video VAE for Wan 2.1 (lighttaew2_1.safetensors in "
                         f"models/vae_approx, picked in core's Load VAE), got a {kind}; leave {name} unconnected to "
                         "decode with the Wan VAE")
    if model.latent_channels != LATENT_CHANNELS or model.patch_size != 1:
        raise ValueError(f"{name}: this tiny VAE takes {model.latent_channels}-channel latents (Wan 2.2's or "
                         f"another model's); LingBot-World's are Wan 2.1's ({LATENT_CHANNELS} channels): load "
                         "lighttaew2_1")
    return model


class TinyStreamDecoder:
    """``decode_next(latent [B,16,T,h,w], cancel)`` → [B,3,T',8h,8w] in [-1,1] (T' = 1 + 4(T-1)
    on the first call, 4T after), ComfyUI's TAEHV decoder with its memory carried between calls."""

    def __init__(self, model: TAEHV, device: torch.device, dtype: torch.dtype) -> None:
        self.model, self.device, self.dtype = model, torch.device(device), dtype
        self.blocks = list(model.decoder)
        if any(isinstance(b, TPool) for b in self.blocks):
            raise ValueError("live_decoder: this TAEHV decoder pools time; it is not a video decoder")
        self._memory: list[torch.Tensor | None] = [None] * len(self.blocks)
        self.latent_frames_done = 0
        shape = (1, LATENT_CHANNELS, 1, 1, 1)
        self._mean = torch.tensor(LATENT_MEAN, dtype=torch.float32, device=self.device).view(shape)
        self._std = torch.tensor(LATENT_STD, dtype=torch.float32, device=self.device).view(shape)

    @torch.no_grad()
    def decode_next(self, latent: torch.Tensor, cancel: Callable[[], None] | None = None) -> torch.Tensor:
        if latent.dim() != 5 or latent.shape[1] != LATENT_CHANNELS or latent.shape[2] < 1:
            raise ValueError(f"latent has shape {tuple(latent.shape)}; expected [batch, {LATENT_CHANNELS}, "
                             "frames >= 1, height/8, width/8]")
        raw = latent.to(device=self.device, dtype=torch.float32) * self._std + self._mean
        frames: list[torch.Tensor] = []
        for i in range(raw.shape[2]):
            if cancel is not None:
                cancel()
            frames.extend(self._step(raw[:, :, i].to(self.dtype)))
        video = torch.stack(frames, 2)
        if self.latent_frames_done == 0:
            video = video[:, :, self.model.frames_to_trim:]  # the first latent frame is one video frame
        self.latent_frames_done += raw.shape[2]
        return video.float().mul_(2.0).sub_(1.0).clamp_(-1.0, 1.0)

    def _step(self, x: torch.Tensor) -> list[torch.Tensor]:
        """One latent frame through the decoder, depth first as ComfyUI's sequential decode runs it."""
        out: list[torch.Tensor] = []
        work = deque([(x, 0)])
        while work:
            xt, i = work.popleft()
            if i == len(self.blocks):
                out.append(xt)
                continue
            block = self.blocks[i]
            if isinstance(block, MemBlock):
                past = self._memory[i]
                new = block(xt, xt * 0 if past is None else past)
                self._memory[i] = xt
                work.appendleft((new, i + 1))
            elif isinstance(block, TGrow):
                grown = block(xt)
                batch, channels, height, width = xt.shape[0], grown.shape[1], grown.shape[2], grown.shape[3]
                for piece in reversed(grown.view(batch, block.stride * channels, height, width).chunk(block.stride, 1)):
                    work.appendleft((piece, i + 1))
            else:
                work.appendleft((block(xt), i + 1))
        return out

    def close(self) -> None:
        self._memory = [None] * len(self.blocks)


def live_decoder(vae, device: torch.device) -> Callable[[], TinyStreamDecoder]:
    """A Play session's decoder factory for ComfyUI's tiny VAE ``vae`` on ``device`` (where the
    session's Wan VAE goes). The session decodes with its own copy (~10 MB): ComfyUI may move
    or unload its model while the session runs, and the copy goes with the session."""
    model = tiny_video_vae(vae)
    device = torch.device(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    own = copy.deepcopy(model).to(device=device, dtype=dtype).eval().requires_grad_(False)
    return lambda: TinyStreamDecoder(own, device, dtype)


__all__ = ["TinyStreamDecoder", "live_decoder", "tiny_video_vae"]
