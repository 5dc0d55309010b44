"""The one way the pack writes a file: into a NEW file beside the target, renamed into place
when complete, and only over an existing target when the caller said so (``overwrite``).

Why a new file: a package may hold hard links to a release's files (``quantize`` links the
T5, the VAE and the tokenizer). Writing into an existing file would change every name of it,
the release's too; renaming a new file over the name leaves the other links as they were.
An interrupted write leaves a hidden ``.NAME.partial-PID`` file, never a half file under the
final name.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any, Iterator


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
        if not overwrite and (target.exists() or target.is_symlink()):
            raise TargetExists(target)  # appeared while writing
        os.replace(partial, target)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise


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
