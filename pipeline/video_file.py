"""Write frames to an .mp4 with PyAV (the library ComfyUI itself uses for video).

The file is a fragmented MP4 (docs/conventions.md#video-files): a header with an empty
index, then one self-describing fragment per frame, each written to disk as soon as the
next frame arrives. So the file plays while it grows, and after a crash or a full disk it
holds every frame but the last one written; a normal close writes that one too.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

# MP4 muxer options: fragments instead of one index written at the end, a fragment per frame
# (frag_keyframe would wait for x264's next keyframe, 250 frames away), fragments that
# address their own data (what browsers' players expect), and every packet flushed to disk.
MUXER_OPTIONS = {"movflags": "frag_every_frame+empty_moov+default_base_moof", "flush_packets": "1"}
# x264 without lookahead or B-frames: a frame's packet comes out when the frame goes in, so
# what was written is on disk, not inside the encoder.
ENCODER_OPTIONS = {"tune": "zerolatency"}
# Bytes written (then removed) by ``check_writable``: a folder that cannot take this much is
# full for any video.
PROBE_BYTES = 1 << 20


def to_uint8_frames(video: torch.Tensor) -> np.ndarray:
    """[3, F, H, W] in [-1, 1] -> [F, H, W, 3] uint8."""
    frames = ((video.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return frames.permute(1, 2, 3, 0).contiguous().numpy()


def check_writable(path: str | Path, probe_bytes: int = PROBE_BYTES) -> None:
    """Create ``path`` (a new file; its folder must exist) and write ``probe_bytes`` to it,
    then empty it: a read-only folder, an existing file or a full disk fail here, naming
    the file, before any work is spent on its content. Leaves the empty file in place."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise FileExistsError(f"{path}: exists already; it is kept, pick another filename_prefix") from None
    except OSError as exc:
        raise OSError(exc.errno, f"{path}: cannot create the video file ({exc.strerror}; is the folder "
                                 "read-only?)") from exc
    try:
        try:
            probe = memoryview(bytes(probe_bytes))
            while probe:  # a disk about full takes part of a write, then refuses the rest
                probe = probe[os.write(fd, probe):]
            os.fsync(fd)
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)
    except OSError as exc:
        path.unlink(missing_ok=True)
        raise OSError(exc.errno, f"{path}: cannot write {probe_bytes >> 20} MiB to the video file "
                                 f"({exc.strerror}; is the disk full?)") from exc


class VideoWriter:
    """An .mp4 written a few frames at a time, so a long video never sits whole in RAM.

    ``write`` takes [3, F, H, W] in [-1, 1] (a decoded piece) and encodes it at once; its
    frames reach the disk as they are encoded (see the module docstring). ``close`` (or
    leaving the ``with`` block, also on an exception such as a cancel) writes the last
    frame and the end of the file. A failed write (disk full) raises ``OSError`` naming the
    file and how many frames it holds.
    """

    def __init__(self, path: str | Path, fps: int = 16) -> None:
        import av  # optional outside ComfyUI; ComfyUI ships it

        self.path = Path(path)
        self.fps = int(fps)
        self.frames_written = 0
        # format named: the path may be a temporary name without the .mp4 suffix (loaders/new_file.py)
        self._container = av.open(str(self.path), mode="w", format="mp4", options=dict(MUXER_OPTIONS))
        self._stream = None
        self._av = av

    def write(self, video: torch.Tensor) -> None:
        if video.dim() != 4 or video.shape[0] != 3:
            raise ValueError(f"video piece has shape {tuple(video.shape)}; expected [3, frames, height, width]")
        if self._stream is None:
            self._stream = self._container.add_stream("libx264", rate=self.fps, options=dict(ENCODER_OPTIONS))
            self._stream.width, self._stream.height = int(video.shape[3]), int(video.shape[2])
            self._stream.pix_fmt = "yuv420p"
        elif (video.shape[2], video.shape[3]) != (self._stream.height, self._stream.width):
            raise ValueError(f"video piece is {video.shape[3]}x{video.shape[2]}; the file is "
                             f"{self._stream.width}x{self._stream.height}")
        try:
            for start in range(0, video.shape[1], 16):  # uint8 copies of 16 frames at a time
                for frame in to_uint8_frames(video[:, start:start + 16]):
                    for packet in self._stream.encode(self._av.VideoFrame.from_ndarray(frame, format="rgb24")):
                        self._container.mux(packet)
                    self.frames_written += 1
        except (OSError, self._av.error.FFmpegError) as exc:
            raise self._write_error(exc) from exc

    def _write_error(self, exc: Exception) -> OSError:
        reason = getattr(exc, "strerror", None) or str(exc)  # "No space left on device", not the path again
        return OSError(getattr(exc, "errno", None), f"{self.path}: writing the video failed after "
                       f"{self.frames_written} frames ({reason}); the frames before it are in the file and play")

    def close(self) -> None:
        if self._container is None:
            return
        container, self._container = self._container, None
        try:
            try:
                if self._stream is not None:
                    for packet in self._stream.encode():
                        container.mux(packet)
            finally:
                container.close()  # writes the last fragment; closes the file also after a failure
        except (OSError, self._av.error.FFmpegError) as exc:
            raise self._write_error(exc) from exc

    def __enter__(self) -> "VideoWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
            return
        try:  # already failing (a cancel, a full disk): that error is the one to report
            self.close()
        except Exception:  # noqa: BLE001
            pass
