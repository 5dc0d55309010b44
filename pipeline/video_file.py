"""Write frames to an .mp4 with PyAV (the library ComfyUI itself uses for video)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def to_uint8_frames(video: torch.Tensor) -> np.ndarray:
    """[3, F, H, W] in [-1, 1] -> [F, H, W, 3] uint8."""
    frames = ((video.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return frames.permute(1, 2, 3, 0).contiguous().numpy()


class VideoWriter:
    """An .mp4 written a few frames at a time, so a long video never sits whole in RAM.

    ``write`` takes [3, F, H, W] in [-1, 1] (a decoded piece) and encodes it at once;
    ``close`` (or leaving the ``with`` block, also on an exception such as a cancel) flushes
    the encoder, so the file holds every frame written so far and plays.
    """

    def __init__(self, path: str | Path, fps: int = 16) -> None:
        import av  # optional outside ComfyUI; ComfyUI ships it

        self.path = Path(path)
        self.fps = int(fps)
        self.frames_written = 0
        self._container = av.open(str(self.path), mode="w")
        self._stream = None
        self._av = av

    def write(self, video: torch.Tensor) -> None:
        if video.dim() != 4 or video.shape[0] != 3:
            raise ValueError(f"video piece has shape {tuple(video.shape)}; expected [3, frames, height, width]")
        if self._stream is None:
            self._stream = self._container.add_stream("libx264", rate=self.fps)
            self._stream.width, self._stream.height = int(video.shape[3]), int(video.shape[2])
            self._stream.pix_fmt = "yuv420p"
        elif (video.shape[2], video.shape[3]) != (self._stream.height, self._stream.width):
            raise ValueError(f"video piece is {video.shape[3]}x{video.shape[2]}; the file is "
                             f"{self._stream.width}x{self._stream.height}")
        for start in range(0, video.shape[1], 16):  # uint8 copies of 16 frames at a time
            for frame in to_uint8_frames(video[:, start:start + 16]):
                for packet in self._stream.encode(self._av.VideoFrame.from_ndarray(frame, format="rgb24")):
                    self._container.mux(packet)
                self.frames_written += 1

    def close(self) -> None:
        if self._container is None:
            return
        try:
            if self._stream is not None:
                for packet in self._stream.encode():
                    self._container.mux(packet)
        finally:
            self._container.close()
            self._container = None

    def __enter__(self) -> "VideoWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
