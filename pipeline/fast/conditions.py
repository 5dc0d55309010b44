"""Per-chunk conditioning of LingBot-World Fast: the image condition y and the camera.

The official code builds y (mask + VAE latent of the image followed by black frames) and
the Plücker camera tensor once for the whole video and splits them into chunks of 3
latent frames. Here each chunk's part is produced when the chunk starts, so a 961-frame
stream never holds a whole-video tensor:

* ``WholeI2V`` / ``SlicedCamera`` slice tensors built for the whole clip (what the clip
  sampler gets from the ordinary image and camera stages).
* ``StreamedI2V`` encodes the conditioning clip with the VAE's causal stream only as far as
  the chunks need, which is bitwise the whole-clip encode. The black frames after the
  image drive the encoder's carried state to a fixed point (after ~30 latent frames: the
  encoder's reach back in time, a property of the architecture); once the state is proven
  bitwise unchanged by one more black group, every later latent frame is that same frame,
  so it is reused and the VAE released. Until then the state stays on the VAE's device
  (2.24 GB at 480x832 in float32); ``prefetch()`` encodes ahead to release it early.
* ``KeyframeCamera`` keeps only the path's per-latent-frame relative poses (the same
  float32 chain as the whole-video camera, normalized by the whole path's largest step)
  and makes each chunk's Plücker rays on demand: bitwise the slice of the whole tensor.
"""
from __future__ import annotations

from typing import Callable, Protocol, Sequence

import numpy as np
import torch

from ...wan.camera import (CameraError, fold_rays, interpolate_poses, cut_trajectory, plucker_rays, relative_poses,
                           scale_intrinsics)
from ...wan.conditioning import check_frame_count, check_size
from ...wan.geometry import CHUNK_FRAMES, LATENT_CHANNELS, VAE_STRIDE_T, latent_frames, latent_size, video_frames
from ...wan.vae import WanVAE
from ..camera import CameraCondition, CameraPath
from ..image import I2VCondition

MASK_CHANNELS = 4
CAMERA_CHANNELS = 384


class I2VSource(Protocol):
    """The image condition y, a few latent frames at a time."""

    latent_height: int
    latent_width: int

    def chunk(self, start: int, count: int) -> torch.Tensor:
        """y [20, count, h/8, w/8] float32 of latent frames start..start+count-1."""

    def close(self) -> None: ...


class CameraSource(Protocol):
    def chunk(self, start: int, count: int) -> torch.Tensor:
        """Plücker tensor [1, 384, count, h/8, w/8] float32 of latent frames start.."""


def chunk_mask(start: int, count: int, lat_h: int, lat_w: int) -> torch.Tensor:
    """The I2V mask of latent frames start..start+count-1: 1 on latent frame 0 (the given
    image), 0 elsewhere; the slice of ``conditioning.first_frame_mask``."""
    mask = torch.zeros(MASK_CHANNELS, count, lat_h, lat_w)
    if start == 0:
        mask[:, 0] = 1.0
    return mask


class WholeI2V:
    """Slices of a y built for the whole clip (``pipeline.image.encode_image``)."""

    def __init__(self, condition: I2VCondition | torch.Tensor) -> None:
        self.y = condition.y if isinstance(condition, I2VCondition) else condition
        if self.y.dim() != 4 or self.y.shape[0] != MASK_CHANNELS + LATENT_CHANNELS:
            raise ValueError(f"y: expected [20, frames, h/8, w/8], got {tuple(self.y.shape)}")
        self.latent_height, self.latent_width = int(self.y.shape[2]), int(self.y.shape[3])

    def chunk(self, start: int, count: int) -> torch.Tensor:
        if start + count > self.y.shape[1]:
            raise ValueError(f"y covers {self.y.shape[1]} latent frames; frames {start}..{start + count - 1} asked")
        return self.y[:, start:start + count]

    def close(self) -> None:
        pass


def _same_state(before: dict, after: dict) -> bool:
    """Whether two VAE stream states hold bitwise the same tensors (and markers)."""
    if before.keys() != after.keys():
        return False
    for key, value in after.items():
        old = before[key]
        if isinstance(value, torch.Tensor):
            if not isinstance(old, torch.Tensor) or old.shape != value.shape or not torch.equal(old, value):
                return False
        elif old != value:
            return False
    return True


class StreamedI2V:
    """y encoded lazily with the VAE's causal stream: latent frame i needs only video frames
    up to 4i, so chunk c encodes up to its last frame and no further.

    ``image`` [3, H, W] in [-1, 1] (``wan.conditioning.image_to_tensor``); ``latent_frames``
    None for an open-ended session. ``release_vae`` is called once the VAE is no longer
    needed (every later y frame proven constant, the video's last frame encoded, or
    ``close()``); e.g. to free its memory.
    ``check_interrupt`` runs before every encoded group of 4 frames.
    """

    def __init__(self, vae: WanVAE, image: torch.Tensor, latent_frames: int | None = None,
                 release_vae: Callable[[], None] | None = None,
                 check_interrupt: Callable[[], None] | None = None) -> None:
        if image.dim() != 3 or image.shape[0] != 3:
            raise ValueError(f"image: expected [3, height, width] in [-1, 1], got {tuple(image.shape)}")
        height, width = int(image.shape[1]), int(image.shape[2])
        check_size(height, width)
        self.latent_height, self.latent_width = latent_size(height, width)
        self.latent_frames = latent_frames
        self._vae: WanVAE | None = vae
        self._encoder = vae.stream_encoder()
        self._image = image
        self._black: torch.Tensor | None = None
        self._release = release_vae
        self._check = check_interrupt
        self._latents: list[torch.Tensor] = []  # normalized latent frames [16, h/8, w/8], float32 on the CPU
        self._armed = False
        self.constant_from: int | None = None  # latent frames from here on are all this one

    @property
    def encoded(self) -> int:
        """Latent frames actually run through the encoder so far."""
        return len(self._latents)

    def _encode_one(self) -> None:
        vae = self._vae
        if vae is None:
            raise RuntimeError("the image condition's VAE was released; start a new session")
        index = len(self._latents)
        if index == 0:
            frames = self._image[None, :, None]
        else:
            if self._black is None:
                self._black = torch.zeros(1, 3, VAE_STRIDE_T, *self._image.shape[1:], dtype=vae.dtype,
                                          device=vae.device)
            frames = self._black
        # Armed (the last two latent frames were equal): keep the state this step starts from,
        # to prove the stream has reached its fixed point.
        before = dict(self._encoder.state()) if self._armed else None
        with torch.inference_mode():
            latent = self._encoder.encode_next(frames)[0, :, 0].float().cpu()
        if before is not None and _same_state(before, self._encoder.state()):
            self.constant_from = index
        del before
        self._armed = index >= 2 and torch.equal(latent, self._latents[-1])
        self._latents.append(latent)
        if self.constant_from is not None or len(self._latents) == self.latent_frames:
            self._free_vae()  # nothing more to encode

    def latent(self, index: int) -> torch.Tensor:
        """Normalized latent frame ``index`` [16, h/8, w/8] of the conditioning clip."""
        if self.latent_frames is not None and index >= self.latent_frames:
            raise ValueError(f"the video has {self.latent_frames} latent frames; frame {index} asked")
        while self.constant_from is None and len(self._latents) <= index:
            if self._check is not None:
                self._check()
            self._encode_one()
        if self.constant_from is not None and index >= self.constant_from:
            return self._latents[self.constant_from]
        return self._latents[index]

    def prefetch(self, count: int | None = None) -> None:
        """Encode now up to ``count`` latent frames (None: the video's length, or until the
        frames are proven constant), e.g. to release the VAE before the transformer runs."""
        stop = count if count is not None else self.latent_frames
        index = 0
        while self.constant_from is None and (stop is None or index < stop):
            self.latent(index)
            index += 1

    def chunk(self, start: int, count: int) -> torch.Tensor:
        latent = torch.stack([self.latent(i) for i in range(start, start + count)], dim=1)
        return torch.cat([chunk_mask(start, count, self.latent_height, self.latent_width), latent])

    def _free_vae(self) -> None:
        if self._vae is None:
            return
        self._encoder.close()
        self._vae = self._black = None
        if self._release is not None:
            self._release()

    def close(self) -> None:
        self._free_vae()


class SlicedCamera:
    """Slices of a whole-clip camera condition (``pipeline.camera``)."""

    def __init__(self, condition: CameraCondition) -> None:
        self.condition = condition

    def chunk(self, start: int, count: int) -> torch.Tensor:
        plucker = self.condition.plucker
        if start + count > plucker.shape[2]:
            raise ValueError(f"the camera covers {plucker.shape[2]} latent frames; frames {start}.."
                             f"{start + count - 1} asked")
        return plucker[:, :, start:start + count]


def whole_chunk_latents(frames: int, chunk: int = CHUNK_FRAMES) -> int:
    """The latent frames a Fast video of ``frames`` asked (4n + 1) is made of: the latent count
    cut down to whole chunks, as the official ``WanI2VFast.generate`` does (961 -> 240, the
    video 957 frames). ValueError naming ``frames`` when not even one chunk fits."""
    check_frame_count(frames)
    latent = latent_frames(frames)
    latent -= latent % chunk
    if latent < chunk:
        raise ValueError(f"frames={frames} is shorter than one chunk of {VAE_STRIDE_T * chunk} frames; use at "
                         f"least {video_frames(chunk)}")
    return latent


class KeyframeCamera:
    """A camera path's Plücker rays made chunk by chunk: the path's relative poses at the
    latent rate are computed once (as ``wan.camera.build_camera`` does for the whole video,
    the translations scaled by the whole path's largest step), the rays per chunk.

    ``chunk``: LingBot-World Fast's rule for a count that is not whole chunks (official
    ``WanI2VFast.generate``): the first ``frames`` poses (the count asked) are spread over the
    whole-chunk latent count (``whole_chunk_latents``), not cut to the frames made first."""

    def __init__(self, poses: np.ndarray | torch.Tensor, intrinsics: np.ndarray | torch.Tensor, frames: int,
                 height: int, width: int, source: str = "camera path", chunk: int | None = None) -> None:
        check_size(height, width)
        c2ws, k, used = cut_trajectory(poses, intrinsics, frames, source)
        if used < frames:
            raise CameraError(f"{source}: {len(poses)} poses cover only {used} frames but {frames} were asked; "
                              f"use frames <= {used} or a longer path")
        self.frames, self.height, self.width = frames, height, width
        count = latent_frames(frames) if chunk is None else whole_chunk_latents(frames, chunk)
        self.keyframes = relative_poses(interpolate_poses(c2ws, count)).to(torch.float32)
        self.intrinsics = scale_intrinsics(k, height, width).to(torch.float32)

    @classmethod
    def of_keyframes(cls, keyframes: torch.Tensor, intrinsics: np.ndarray, frames: int, height: int,
                     width: int) -> "KeyframeCamera":
        """A camera whose relative keyframes [F_lat, 4, 4] are already made (an action
        string's act2cam keyframes, a Play log's per-chunk ones); ``intrinsics`` one row in
        480×832 pixels."""
        check_size(height, width)
        camera = cls.__new__(cls)
        camera.frames, camera.height, camera.width = frames, height, width
        camera.keyframes = torch.as_tensor(keyframes).to(torch.float32)
        camera.intrinsics = scale_intrinsics(intrinsics, height, width).to(torch.float32)
        return camera

    def chunk(self, start: int, count: int) -> torch.Tensor:
        if start + count > self.keyframes.shape[0]:
            raise ValueError(f"the camera covers {self.keyframes.shape[0]} latent frames; frames {start}.."
                             f"{start + count - 1} asked")
        h, w = self.height, self.width
        out = torch.empty(1, CAMERA_CHANNELS, count, *latent_size(h, w), dtype=torch.float32)
        for i in range(count):
            rays = plucker_rays(self.keyframes[start + i:start + i + 1], self.intrinsics, h, w)
            out[0, :, i:i + 1] = fold_rays(rays)
        return out


def path_camera(path: CameraPath, frames: int, height: int, width: int, chunk: int = CHUNK_FRAMES) -> KeyframeCamera:
    """The chunk source of a whole camera path with the camera a one-pass Camera node gives
    for it (the path's ``chunk_keyframes``: an action string's act2cam keyframes, a Play
    log's per-chunk ones, else the pose chain). Act files are refused: Fast reads Base-Cam rays.

    ``frames``: the count ASKED (4n + 1), not the whole-chunk count made (``stream_frames``):
    as the official ``generate_fast``, the keyframes are spread over the frames asked and the
    latent is cut to whole chunks of ``chunk`` (961 asked: 240 keyframes over poses 0..960,
    957 frames made). The Play law is per chunk, so its keyframes are a prefix either way."""
    check_size(height, width)
    keyframes = path.chunk_keyframes(frames, whole_chunk_latents(frames, chunk))
    return KeyframeCamera.of_keyframes(keyframes, path.intrinsics, frames, height, width)


def as_camera_source(camera: CameraSource | CameraCondition | None) -> CameraSource | None:
    """A camera chunk source for a whole-clip condition, a source, or None (no camera)."""
    if camera is None or hasattr(camera, "chunk"):
        return camera
    if isinstance(camera, CameraCondition):
        return SlicedCamera(camera)
    raise TypeError(f"camera: expected a CameraCondition or a chunk source, got {type(camera).__name__}")


def as_i2v_source(condition: I2VSource | I2VCondition) -> I2VSource:
    if hasattr(condition, "chunk"):
        return condition
    if isinstance(condition, I2VCondition):
        return WholeI2V(condition)
    raise TypeError(f"condition: expected an I2VCondition or a chunk source, got {type(condition).__name__}")


__all__: Sequence[str] = ["CameraSource", "I2VSource", "KeyframeCamera", "SlicedCamera", "path_camera", "StreamedI2V", "WholeI2V",
                          "as_camera_source", "as_i2v_source", "chunk_mask", "whole_chunk_latents"]
