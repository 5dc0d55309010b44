"""The .mp4 files the video nodes (Long Video, Fast Long Video, Play) write in ComfyUI's output folder."""
from __future__ import annotations

import os
from pathlib import Path

import folder_paths

from ...pipeline.video_file import check_writable


def check_prefix(filename_prefix: str) -> None:
    """A prefix ComfyUI can turn into a file name: no NUL or other control characters."""
    bad = sorted({repr(c) for c in filename_prefix if ord(c) < 32 or ord(c) == 127})
    if bad:
        raise ValueError(f"filename_prefix: {filename_prefix!r} contains the control character(s) "
                         f"{', '.join(bad)}; use letters, digits, '-', '_' and '/' for subfolders")


def output_file(filename_prefix: str, width: int, height: int) -> tuple[Path, str, str]:
    """A new .mp4 in ComfyUI's output folder, its file name and subfolder (as Save Video
    names them). The file is created (empty) and a probe written to it, so a bad prefix, a
    read-only folder or a full disk fail here, naming the path, before any window."""
    check_prefix(filename_prefix)
    output = folder_paths.get_output_directory()
    try:
        folder, filename, counter, subfolder, _ = folder_paths.get_save_image_path(filename_prefix, output, width,
                                                                                   height)
    except OSError as exc:  # ComfyUI makes the folder itself (newer hosts): one it cannot make is named
        raise OSError(exc.errno, f"{os.path.join(output, os.path.dirname(filename_prefix))}: cannot create the folder "
                                 f"for the video ({exc.strerror}); check filename_prefix and that the output folder "
                                 "is writable") from exc
    except Exception as exc:  # ComfyUI refuses a prefix that leaves the output folder with a bare Exception
        raise ValueError(f"filename_prefix: {filename_prefix!r} points outside the output folder; use a relative "
                         f"name such as 'LingBotWorld/long'") from exc
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise OSError(exc.errno, f"{folder}: cannot create the folder for the video ({exc.strerror}); check "
                                 "filename_prefix and that the output folder is writable") from exc
    name = f"{filename}_{counter:05}_.mp4"
    path = Path(folder) / name
    check_writable(path)
    return path, name, subfolder


__all__ = ["check_prefix", "output_file"]
