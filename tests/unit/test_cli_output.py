"""What `generate` leaves at --out (tools/generate.py over loaders/new_file.GrowingFile): the
video grows in a new file beside --out, takes the name after its first window when the name is
free, and replaces an existing --out (--overwrite) only once complete. A late failure, a cancel
in the first window and a second run on the same --out: each leaves what was there, keeps what
was finished, and says truthfully which."""
from __future__ import annotations

from pathlib import Path

import av
import pytest
from PIL import Image

from comfyui_lingbot_world.pipeline import long_video
from comfyui_lingbot_world.tools import cli, generate

OLD_VIDEO = b"the user's earlier video"


@pytest.fixture
def image(tmp_path) -> Path:
    path = tmp_path / "in" / "start.png"
    path.parent.mkdir()
    Image.new("RGB", (64, 48), (40, 90, 160)).save(path)
    return path


def _argv(package: Path, image: Path, out: Path, frames: int = 9, *extra: str) -> list[str]:
    """Two windows of 5 frames (the second takes 1 from the first): 5 + 4 = 9 frames."""
    return ["--package", str(package), "--image", str(image), "--prompt", "a walk", "--out", str(out),
            "--size", "32x32", "--frames", str(frames), "--window", "5", "--overlap", "1", "--steps", "1", *extra]


def _frames(path: Path) -> int:
    with av.open(str(path)) as container:
        return sum(1 for _ in container.decode(video=0))


def _stop_in_window(monkeypatch, window: int, error: BaseException, before=None) -> None:
    """``error`` raised when window ``window`` (1-based) starts sampling; ``before(window)``
    runs at the start of every window's sampling."""
    real, calls = long_video.sample, {"n": 0}

    def sample(*args, **kwargs):
        calls["n"] += 1
        if before is not None:
            before(calls["n"])
        if calls["n"] == window:
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(long_video, "sample", sample)


def _left_in(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("overwrite", [False, True], ids=["new-out", "overwrite"])
def test_a_late_failure_keeps_what_was_there_and_the_finished_window(package, image, tmp_path, capsys,
                                                                     monkeypatch, overwrite):
    out = tmp_path / "v.mp4"
    if overwrite:
        out.write_bytes(OLD_VIDEO)
    _stop_in_window(monkeypatch, 2, RuntimeError("CUDA error: an illegal memory access was encountered"))
    with pytest.raises(RuntimeError, match="illegal memory access"):
        cli.run("generate", generate.main, _argv(package, image, out, 9, *(["--overwrite"] if overwrite else [])))
    err = capsys.readouterr().err
    if overwrite:  # the old video is untouched; the finished window is kept beside it
        assert out.read_bytes() == OLD_VIDEO
        assert _frames(tmp_path / "v-2.mp4") == 5
        assert f"{out} is as it was; the 1 of 2 window(s) finished before (5 frames) are in {tmp_path / 'v-2.mp4'}" in err
        assert _left_in(tmp_path) == ["in", "v-2.mp4", "v.mp4"]
    else:  # nothing was there: --out holds the finished window, playable
        assert _frames(out) == 5
        assert f"{out} keeps the 1 of 2 window(s) finished before (5 frames)" in err
        assert _left_in(tmp_path) == ["in", "v.mp4"]


@pytest.mark.parametrize("overwrite", [False, True], ids=["new-out", "overwrite"])
def test_a_cancel_in_the_first_window_writes_nothing_and_says_so(package, image, tmp_path, capsys, monkeypatch,
                                                                 overwrite):
    out = tmp_path / "v.mp4"
    if overwrite:
        out.write_bytes(OLD_VIDEO)
    _stop_in_window(monkeypatch, 1, KeyboardInterrupt())
    code = cli.run("generate", generate.main, _argv(package, image, out, 9, *(["--overwrite"] if overwrite else [])))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 130
    assert "keeps" not in err[-1] and "no window was finished, nothing was written" in err[-1], err
    if overwrite:
        assert out.read_bytes() == OLD_VIDEO and err[-1].endswith(f"{out} is as it was")
        assert _left_in(tmp_path) == ["in", "v.mp4"]
    else:
        assert err[-1].endswith(f"no {out} was made")
        assert _left_in(tmp_path) == ["in"]  # no half file, hidden or not


def test_overwrite_replaces_the_old_video_only_with_the_whole_new_one(package, image, tmp_path, capsys,
                                                                      monkeypatch):
    out = tmp_path / "v.mp4"
    out.write_bytes(OLD_VIDEO)
    seen = []
    _stop_in_window(monkeypatch, 0, RuntimeError("never"), before=lambda n: seen.append(out.read_bytes() == OLD_VIDEO))
    code = cli.run("generate", generate.main, _argv(package, image, out, 9, "--overwrite"))
    assert code == 0, capsys.readouterr().err
    assert seen == [True, True]  # while each window was made, --out still held the old video
    assert _frames(out) == 9 and _left_in(tmp_path) == ["in", "v.mp4"]


def test_two_runs_on_one_out_lose_no_video(package, image, tmp_path, capsys, monkeypatch):
    """Run A and run B both start while --out is free (both pass the check at the start); B
    finishes first, inside A's first window. A then refuses to replace B's video: it keeps its
    own beside it, names it, and fails."""
    out = tmp_path / "v.mp4"
    codes = {}

    def run_b(window: int) -> None:
        if window == 1:
            with monkeypatch.context() as inner:
                inner.setattr(long_video, "sample", real_sample)
                codes["b"] = cli.run("generate", generate.main, _argv(package, image, out, 5))

    real_sample = long_video.sample
    _stop_in_window(monkeypatch, 0, RuntimeError("never"), before=run_b)
    codes["a"] = cli.run("generate", generate.main, _argv(package, image, out, 9))
    err = capsys.readouterr().err
    assert codes == {"b": 0, "a": 1}, err
    kept = tmp_path / "v-2.mp4"
    assert _frames(out) == 5 and _frames(kept) == 9  # B's video at --out, A's beside it
    assert (f"generate: error: --out: {out} appeared while this run was writing (another run with the same --out?); "
            f"it is left as it is, and this video (9 frames) was written to {kept}") in err
    assert _left_in(tmp_path) == ["in", "v-2.mp4", "v.mp4"]
