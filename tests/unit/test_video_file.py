"""pipeline/video_file.py: the .mp4 a long video grows into. It plays while it grows and
after its writer was killed (every frame but the last one written), a full disk fails naming
the file and keeps the frames before it, and ``check_writable`` refuses a full disk or an
existing file before any work (a read-only folder: tests/unit/test_node_long_video.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import av
import numpy as np
import pytest
import torch

from comfyui_lingbot_world.pipeline.video_file import VideoWriter, check_writable

H, W = 32, 48
ROOT = Path(__file__).resolve().parents[2]


def _python(script: str, *args: str, **kw) -> subprocess.Popen | subprocess.CompletedProcess:
    """``script`` in a fresh Python with the checkout importable as ``comfyui_lingbot_world``."""
    preamble = f"import sys; sys.path.insert(0, {str(ROOT)!r}); import _standalone; _standalone.import_pack()\n"
    command = [sys.executable, "-c", preamble + script, *args]
    if kw.pop("background", False):
        return subprocess.Popen(command, stdout=subprocess.PIPE, text=True, **kw)
    return subprocess.run(command, capture_output=True, text=True, **kw)


def _piece(frames: int, seed: int = 0) -> torch.Tensor:
    """[3, frames, H, W] in [-1, 1]: flat colours, one per frame, so frames are told apart
    after x264."""
    colours = torch.from_numpy(np.random.default_rng(seed).uniform(-0.8, 0.8, (3, frames, 1, 1))).float()
    return colours.expand(3, frames, H, W).contiguous()


def _frames(path: Path, to_damage: bool = False) -> np.ndarray:
    """Every frame a reader gets from ``path`` now ([F, H, W, 3] uint8); ``to_damage``: the
    frames before a damaged end (a fragment cut by a full disk), as a player shows them."""
    frames = []
    with av.open(str(path)) as container:
        try:
            for frame in container.decode(video=0):
                frames.append(frame.to_ndarray(format="rgb24"))
        except av.error.InvalidDataError:
            if not to_damage:
                raise
    return np.stack(frames) if frames else np.zeros((0, H, W, 3), np.uint8)


def _colours(piece: torch.Tensor) -> np.ndarray:
    return ((piece[:, :, 0, 0].T.clamp(-1, 1) + 1) * 127.5).numpy()


def test_video_file_plays_while_it_grows(tmp_path):
    path = tmp_path / "growing.mp4"
    first, second = _piece(6, seed=1), _piece(5, seed=2)
    with VideoWriter(path, fps=16) as writer:
        writer.write(first)
        # Not closed: a reader (the browser, ComfyUI's VIDEO) gets all but the last frame written.
        now = _frames(path)
        assert now.shape == (5, H, W, 3)
        assert np.abs(now.mean(axis=(1, 2)) - _colours(first)[:5]).max() < 6
        writer.write(second)
        assert len(_frames(path)) == 10
    done = _frames(path)
    assert len(done) == 11  # close writes the last one
    assert np.abs(done.mean(axis=(1, 2)) - _colours(torch.cat([first, second], 1))).max() < 6


_KILLED_WRITER = textwrap.dedent("""
    import sys, time, torch
    from comfyui_lingbot_world.pipeline.video_file import VideoWriter
    writer = VideoWriter(sys.argv[1], fps=16)
    writer.write(torch.linspace(-0.8, 0.8, 8).view(1, 8, 1, 1).expand(3, 8, {h}, {w}).contiguous())
    print("written", flush=True)
    time.sleep(60)
""").format(h=H, w=W)


def test_video_file_after_its_writer_is_killed_plays_every_frame_but_the_last(tmp_path):
    path = tmp_path / "killed.mp4"
    proc = _python(_KILLED_WRITER, str(path), background=True)
    try:
        assert proc.stdout.readline().strip() == "written"
    finally:
        proc.send_signal(signal.SIGKILL)  # a crash: no close, no flush, no end of file
        proc.wait(timeout=30)
    frames = _frames(path)
    assert len(frames) == 7
    expected = (np.linspace(-0.8, 0.8, 8)[:7] + 1) * 127.5
    assert np.abs(frames.mean(axis=(1, 2, 3)) - expected).max() < 6


_FULL_DISK_WRITER = textwrap.dedent("""
    import resource, signal, sys, torch
    from comfyui_lingbot_world.pipeline.video_file import VideoWriter
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails (EFBIG) as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, resource.RLIM_INFINITY))
    torch.manual_seed(0)
    try:
        with VideoWriter(sys.argv[1], fps=16) as writer:
            for _ in range(40):  # noise does not compress: the limit is reached within a few pieces
                writer.write(torch.rand(3, 4, 64, 96) * 2 - 1)
    except OSError as exc:
        print(f"{type(exc).__name__}|{writer.frames_written}|{exc}")
""")


def test_video_file_on_a_full_disk_fails_naming_the_file_and_keeps_the_frames_before(tmp_path):
    path = tmp_path / "full.mp4"
    run = _python(_FULL_DISK_WRITER, str(path), timeout=120)
    kind, written, message = run.stdout.strip().split("|", 2)
    assert kind == "OSError" and f"{path}: writing the video failed after" in message, run.stdout + run.stderr
    assert "the frames before it are in the file" in message
    frames = _frames(path, to_damage=True)  # what reached the disk before it was full plays
    assert 0 < len(frames) <= int(written) < 160


def test_check_writable_creates_an_empty_file_and_keeps_an_existing_one(tmp_path):
    fresh = tmp_path / "new.mp4"
    check_writable(fresh, probe_bytes=4096)
    assert fresh.stat().st_size == 0
    kept = tmp_path / "kept.mp4"
    kept.write_bytes(b"the user's video")
    with pytest.raises(FileExistsError, match="kept.mp4: exists already; it is kept"):
        check_writable(kept)
    assert kept.read_bytes() == b"the user's video"


def test_check_writable_refuses_a_full_disk_naming_the_file_and_leaves_nothing(tmp_path):
    path = tmp_path / "full.mp4"
    script = textwrap.dedent("""
        import resource, signal, sys
        from comfyui_lingbot_world.pipeline.video_file import check_writable
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))
        try:
            check_writable(sys.argv[1])
        except OSError as exc:
            print(exc)
    """)
    run = _python(script, str(path), timeout=60)
    assert f"{path}: cannot write 1 MiB to the video file" in run.stdout, run.stdout + run.stderr
    assert not path.exists()
