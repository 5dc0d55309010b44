"""The one way the pack writes a file: into a NEW file beside the target, renamed into place
when complete, and only over an existing target when the caller said so (``overwrite``).

Why a new file: a package may hold hard links to a release's files (``quantize`` links the
T5, the VAE and the tokenizer). Writing into an existing file would change every name of it,
the release's too; renaming a new file over the name leaves the other links as they were.
An interrupted write leaves a hidden ``.NAME.partial-PID`` file, never a half file under the
final name. Where the caller did not allow replacing, the rename itself refuses a target that
appeared while the file was written (``rename_no_replace``): two writers of one name never
lose a file silently. ``GrowingFile`` is the same rule for a file written in pieces (a video
window by window).
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from pathlib import Path
from types import TracebackType
from typing import Any, Iterator

# Names tried beside a taken target (``NAME-2.mp4``, ``NAME-3.mp4``, ...) before giving up.
MAX_FREE_NAMES = 1000


class TargetExists(FileExistsError):
    """The target exists and the caller did not allow replacing it."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"{path} exists; pass --overwrite to replace it, or choose another name")
        self.path = path


def partial_name(target: Path) -> Path:
    """A hidden temporary name beside ``target``, unique to this call (two threads or
    processes writing the same target never share one), that a write goes to first."""
    return target.with_name(f".{target.name}.partial-{os.getpid()}-{secrets.token_hex(4)}")


def refuse_existing(target: str | Path, overwrite: bool) -> None:
    """Raise TargetExists when ``target`` exists (a file, a folder or a link) and not ``overwrite``."""
    target = Path(target)
    if not overwrite and (target.exists() or target.is_symlink()):
        raise TargetExists(target)


@contextlib.contextmanager
def new_file(target: str | Path, overwrite: bool = True) -> Iterator[Path]:
    """Yield a fresh path to write the whole file to; on a clean exit it is renamed to
    ``target`` (replacing the name, never the old file's contents); on an error it is deleted.

    ``overwrite=False`` refuses an existing target before anything is written."""
    target = Path(target)
    refuse_existing(target, overwrite)
    if target.is_dir() and not target.is_symlink():
        raise IsADirectoryError(f"{target} is a folder; it cannot be replaced by a file")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_name(target)
    try:
        yield partial
        if not partial.is_file():
            raise FileNotFoundError(f"{partial}: the writer for {target} wrote nothing")
        if overwrite:
            os.replace(partial, target)
        else:
            try:
                rename_no_replace(partial, target)
            except FileExistsError:
                raise TargetExists(target) from None  # appeared while writing
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise


def rename_no_replace(source: str | Path, target: str | Path) -> None:
    """Rename ``source`` to ``target`` unless a ``target`` exists, the check and the rename one
    step no other writer gets between: FileExistsError then, and ``source`` is kept.

    A hard link takes the new name (the system refuses an existing one), then the old name goes.
    Where a file system has no hard links (FAT, some network shares), an exclusive create claims
    the name first and the rename replaces that empty claim."""
    source, target = Path(source), Path(target)
    try:
        os.link(source, target)
    except FileExistsError:
        raise
    except OSError:  # no hard links here
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        os.replace(source, target)
        return
    os.unlink(source)


def rename_to_free_name(source: str | Path, target: str | Path) -> Path:
    """Rename ``source`` to ``target``, or, where that name is taken, to the first free
    ``STEM-N.SUFFIX`` beside it (N = 2, 3, ...), never replacing a file. Returns the name it got."""
    target = Path(target)
    candidates = [target] + [target.with_name(f"{target.stem}-{n}{target.suffix}") for n in range(2, MAX_FREE_NAMES)]
    for candidate in candidates:
        try:
            rename_no_replace(source, candidate)
            return candidate
        except FileExistsError:
            continue
    raise FileExistsError(f"{target} and {MAX_FREE_NAMES - 2} names beside it (such as {candidates[-1].name}) "
                          f"exist; the new file is kept as {source}")


class GrowingFile:
    """A file written in pieces (a video, window by window) to a new name beside ``target``.

    The writer opens ``path``. After each complete piece the writer calls ``piece_done()``:
    while no file holds the target's name, this one takes it then (``rename_no_replace``), and the
    writer goes on appending to the same file, so the pieces finished so far are visible and kept.
    An existing target (or one another writer made meanwhile) is never replaced by an unfinished
    file: with ``overwrite`` it is replaced when the ``with`` block ends cleanly; without, the
    finished file goes to a free name beside it. A failed or cancelled run leaves the target as it
    was; its finished pieces, if any, are in ``kept``; with none, its file is deleted.

    After the block: ``kept`` is where the file is (None: nothing was kept), ``pieces`` how many
    pieces it holds, ``replaced`` whether an earlier file at the target was replaced.
    """

    def __init__(self, target: str | Path, overwrite: bool = False) -> None:
        self.target = Path(target)
        self.overwrite = overwrite
        refuse_existing(self.target, overwrite)
        if self.target.is_dir() and not self.target.is_symlink():
            raise IsADirectoryError(f"{self.target} is a folder; it cannot be replaced by a file")
        self.path = partial_name(self.target)
        self.pieces = 0
        self.kept: Path | None = None
        self.replaced = False
        self._named = False  # the file holds the target's name

    def piece_done(self) -> None:
        self.pieces += 1
        if self._named:
            return
        try:
            rename_no_replace(self.path, self.target)
        except OSError:  # a file holds the name (kept until the end), or an open file cannot be renamed here
            return
        self._named = True

    def __enter__(self) -> "GrowingFile":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._named:
            self.kept = self.target
        elif not self.path.exists():
            return
        elif exc_type is None and self.overwrite:
            self.replaced = self.target.exists() or self.target.is_symlink()
            os.replace(self.path, self.target)
            self.kept = self.target
        elif exc_type is None or self.pieces:
            self.kept = rename_to_free_name(self.path, self.target)
        else:
            self.path.unlink(missing_ok=True)


def write_bytes(target: str | Path, data: bytes, overwrite: bool = True) -> Path:
    """``data`` to ``target`` through a new file (see ``new_file``)."""
    target = Path(target)
    with new_file(target, overwrite) as partial:
        with open(partial, "xb") as handle:
            handle.write(data)
    return target


def write_text(target: str | Path, text: str, overwrite: bool = True) -> Path:
    """UTF-8 ``text`` to ``target`` through a new file."""
    return write_bytes(target, text.encode("utf-8"), overwrite)


def write_json(target: str | Path, data: Any, overwrite: bool = True, indent: int | None = 2) -> Path:
    """``data`` as JSON (a newline at the end) to ``target`` through a new file."""
    return write_text(target, json.dumps(data, indent=indent) + "\n", overwrite)


def install(temporary: str | Path, target: str | Path) -> None:
    """Rename the finished ``temporary`` (a file or a folder) to ``target``. An existing target
    (the caller has checked it may go) is first renamed aside, then deleted once the new one is
    in place: its files are unlinked, never written, so hard links to them keep their bytes."""
    temporary, target = Path(temporary), Path(target)
    old = None
    if target.exists() or target.is_symlink():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
    os.replace(temporary, target)
    if old is not None:
        remove(old)


def remove(path: str | Path) -> None:
    """Delete a file, a link or a folder tree (unlinking, never truncating)."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()
