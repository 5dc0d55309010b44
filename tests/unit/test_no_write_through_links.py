"""Every writer of the pack writes a NEW file and renames it into place, and refuses an
existing target without --overwrite (loaders/new_file.py): a package whose T5, VAE and
tokenizer are hard links to a release's files (what ``quantize`` makes) can be written over
with make_checkpoint or quantize and the release keeps every byte."""
from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

import pytest

from comfyui_lingbot_world.loaders import new_file
from comfyui_lingbot_world.tools import cli, make_checkpoint, quantize


def _md5s(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.md5(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _run(prog: str, main, argv: list[str], capsys) -> tuple[int, str]:
    code = cli.run(prog, main, argv)
    return code, capsys.readouterr().err


@pytest.fixture
def release_and_linked_package(tmp_path: Path, capsys) -> tuple[Path, Path, dict[str, str]]:
    release, package = tmp_path / "lingbot-world-base-cam", tmp_path / "package"
    code, err = _run("make_checkpoint", make_checkpoint.main,
                     ["--preset", "tiny", "--layout", "bf16", "--out", str(release), "--seed", "3"], capsys)
    assert code == 0, err
    code, err = _run("quantize", quantize.main, ["--src", str(release), "--out", str(package)], capsys)
    assert code == 0, err
    vae = make_checkpoint.VAE_FILE
    if not (package / vae).samefile(release / vae):
        pytest.skip("this filesystem cannot hard-link; quantize copied the shared files")
    return release, package, _md5s(release)


def test_make_checkpoint_over_a_linked_package_needs_overwrite_and_leaves_the_release_byte_for_byte(
        release_and_linked_package, capsys) -> None:
    release, package, before = release_and_linked_package
    argv = ["--preset", "tiny", "--layout", "nf4", "--out", str(package), "--seed", "11"]
    vae_before = (package / make_checkpoint.VAE_FILE).read_bytes()
    code, err = _run("make_checkpoint", make_checkpoint.main, argv, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--out" in err and "already holds" in err and "--overwrite" in err and "Wan2.1_VAE.pth" in err
    assert (package / make_checkpoint.VAE_FILE).read_bytes() == vae_before  # refused before any work

    code, err = _run("make_checkpoint", make_checkpoint.main, argv + ["--overwrite"], capsys)
    assert code == 0, err
    assert _md5s(release) == before  # md5sum -c of the release: every file OK
    for name in (make_checkpoint.VAE_FILE, make_checkpoint.T5_FILE):  # replaced in the package, not linked
        assert not (package / name).samefile(release / name)
        assert (package / name).read_bytes() != (release / name).read_bytes()
    assert not list(package.glob(".*"))  # no temporary left


def test_quantize_over_a_package_rewritten_by_make_checkpoint_leaves_the_release_byte_for_byte(
        release_and_linked_package, capsys) -> None:
    release, package, before = release_and_linked_package
    code, err = _run("make_checkpoint", make_checkpoint.main,
                     ["--preset", "tiny", "--layout", "nf4", "--out", str(package), "--parts", "vae,tokenizer",
                      "--seed", "5", "--overwrite"], capsys)
    assert code == 0, err
    code, err = _run("quantize", quantize.main, ["--src", str(release), "--out", str(package), "--overwrite"], capsys)
    assert code == 0, err
    assert _md5s(release) == before
    assert (package / make_checkpoint.VAE_FILE).samefile(release / make_checkpoint.VAE_FILE)  # linked again


def test_new_file_replaces_the_name_not_the_linked_file(tmp_path: Path) -> None:
    original, link = tmp_path / "release.bin", tmp_path / "package.bin"
    original.write_bytes(b"release")
    os.link(original, link)
    with pytest.raises(new_file.TargetExists, match="package.bin exists; pass --overwrite"):
        new_file.write_bytes(link, b"other", overwrite=False)
    new_file.write_bytes(link, b"other", overwrite=True)
    assert original.read_bytes() == b"release" and link.read_bytes() == b"other"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["package.bin", "release.bin"]


def test_new_file_leaves_nothing_when_the_writer_fails(tmp_path: Path) -> None:
    target = tmp_path / "model.safetensors"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="disk full"):
        with new_file.new_file(target) as partial:
            partial.write_bytes(b"half")
            raise RuntimeError("disk full")
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]


def test_generate_overwrite_writes_a_new_video_and_preview_not_into_linked_files(tmp_path: Path, monkeypatch,
                                                                                 capsys) -> None:
    import tiny_package
    from PIL import Image

    from comfyui_lingbot_world.tools import generate

    package = tiny_package.build(tmp_path / "pkg", "nf4")
    image = tmp_path / "start.png"
    Image.new("RGB", (64, 48), (40, 90, 160)).save(image)
    kept = tmp_path / "kept"
    kept.mkdir()
    out, preview = tmp_path / "v.mp4", tmp_path / "v.png"
    for name, path in (("video.mp4", out), ("preview.png", preview)):
        (kept / name).write_bytes(b"a video the user keeps")
        os.link(kept / name, path)
    before = _md5s(kept)

    class Result:
        frames_written, windows_done = 5, 1

    def fake_generate(package, image, prompt, negative, frames, height, width, out, *args, **kwargs):
        with out:  # what pipeline/generate.py does with the GrowingFile: PyAV opens its path for writing
            with open(out.path, "wb") as handle:
                handle.write(b"new frames")
            out.piece_done()
        return Result()

    monkeypatch.setattr(generate, "generate", fake_generate)
    argv = ["--package", str(package), "--image", str(image), "--prompt", "a walk", "--out", str(out),
            "--size", "32x32", "--steps", "1", "--frames", "5", "--preset", "dolly_in", "--preview", str(preview)]
    code, err = _run("generate", generate.main, argv, capsys)
    assert code == 2 and "--out" in err and "--overwrite" in err
    code, err = _run("generate", generate.main, argv + ["--overwrite"], capsys)
    assert code == 0, err
    assert _md5s(kept) == before
    assert out.read_bytes() == b"new frames" and Image.open(preview).format == "PNG"



# --------------------------------------------------------------------------- no replacing, growing files


@pytest.mark.parametrize("hard_links", [True, False], ids=["hard-link", "no-hard-links"])
def test_rename_no_replace_refuses_an_existing_name_and_keeps_both(tmp_path: Path, monkeypatch, hard_links) -> None:
    if not hard_links:  # FAT, some network shares: the exclusive-create claim instead
        monkeypatch.setattr(new_file.os, "link", lambda *a, **k: (_ for _ in ()).throw(PermissionError(1, "no links")))
    source, target = tmp_path / ".new.partial", tmp_path / "v.mp4"
    source.write_bytes(b"new")
    target.write_bytes(b"someone else's")
    with pytest.raises(FileExistsError):
        new_file.rename_no_replace(source, target)
    assert source.read_bytes() == b"new" and target.read_bytes() == b"someone else's"
    assert new_file.rename_to_free_name(source, target) == tmp_path / "v-2.mp4"
    assert (tmp_path / "v-2.mp4").read_bytes() == b"new" and not source.exists()


def test_new_file_without_overwrite_never_replaces_a_target_made_while_writing(tmp_path: Path) -> None:
    target = tmp_path / "config.json"
    with pytest.raises(new_file.TargetExists):
        with new_file.new_file(target, overwrite=False) as partial:
            partial.write_bytes(b"mine")
            target.write_bytes(b"another writer's")  # made between the start and the rename
    assert target.read_bytes() == b"another writer's" and _names(tmp_path) == ["config.json"]


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_growing_file_takes_a_free_name_after_its_first_piece(tmp_path: Path) -> None:
    target = tmp_path / "v.mp4"
    with new_file.GrowingFile(target) as video:
        with open(video.path, "wb") as handle:  # the writer keeps this handle across the rename
            handle.write(b"window 1")
            handle.flush()
            assert not target.exists()
            video.piece_done()
            assert target.read_bytes() == b"window 1"  # visible (and kept) from now on
            handle.write(b", window 2")
    assert video.kept == target and target.read_bytes() == b"window 1, window 2" and _names(tmp_path) == ["v.mp4"]


@pytest.mark.parametrize("outcome", ["complete", "failed-after-a-piece", "failed-before-any-piece"])
def test_growing_file_replaces_an_existing_target_only_when_complete(tmp_path: Path, outcome) -> None:
    target = tmp_path / "v.mp4"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError) if outcome != "complete" else contextlib.nullcontext():
        with new_file.GrowingFile(target, overwrite=True) as video:
            video.path.write_bytes(b"piece")
            if outcome != "failed-before-any-piece":
                video.piece_done()
                assert target.read_bytes() == b"old"
            if outcome != "complete":
                raise RuntimeError("out of memory")
    if outcome == "complete":
        assert video.kept == target and video.replaced and target.read_bytes() == b"piece"
    elif outcome == "failed-after-a-piece":  # the old file stays; the finished piece beside it
        assert target.read_bytes() == b"old" and video.kept == tmp_path / "v-2.mp4"
        assert video.kept.read_bytes() == b"piece"
    else:
        assert target.read_bytes() == b"old" and video.kept is None and _names(tmp_path) == ["v.mp4"]
