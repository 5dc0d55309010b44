"""Write frames to an .mp4 with PyAV (the library ComfyUI itself uses for video)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def to_uint8_frames(video: torch.Tensor) -> np.ndarray:
    """[3, F, H, W] in [-1, 1] -> [F, H, W, 3] uint8."""
    frames = ((video.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return frames.permute(1, 2, 3, 0).contiguous().numpy()


def write_mp4(video: torch.Tensor, path: str | Path, fps: int = 16) -> Path:
    import av  # optional outside ComfyUI; ComfyUI ships it

    path = Path(path)
    frames = to_uint8_frames(video)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path
