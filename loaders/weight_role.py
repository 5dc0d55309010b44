"""T5 or VAE? A weights file told apart by the tensor names in its header, without reading
a tensor: what the node combos use to offer only T5 files as text encoders and only VAE
files as VAEs, whatever the files are called."""
from __future__ import annotations

import json
import struct
import zipfile
from functools import lru_cache
from pathlib import Path

# Key names that only one of the two models has: ComfyUI's .safetensors and the official
# .pth files of each (the VAE's decoder; umT5's embedding and attention blocks).
VAE_KEY_MARKS = ("decoder.conv1.", "decoder.head.", "decoder.upsamples.")
T5_KEY_MARKS = ("shared.weight", "token_embedding.weight", ".SelfAttention.", "blocks.0.attn.q.weight")
# The T5 and VAE files this module (and the T5/VAE loaders) read: safetensors, or a zip-format .pth.
WEIGHT_SUFFIXES = (".pth", ".safetensors")
MAX_HEADER = 100 * 1024 * 1024  # a larger safetensors header is not a model we know


def _safetensors_keys(path: Path) -> str:
    """The JSON header of a .safetensors file (names, dtypes, shapes); no tensor is read."""
    with open(path, "rb") as handle:
        (size,) = struct.unpack("<Q", handle.read(8))
        if size > MAX_HEADER:
            return ""
        return handle.read(size).decode("utf-8", errors="replace")


def _pth_keys(path: Path) -> str:
    """The pickled index of a zip-format .pth (key names as strings); no tensor is read."""
    with zipfile.ZipFile(path) as archive:
        index = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
        if index is None or archive.getinfo(index).file_size > MAX_HEADER:
            return ""
        return archive.read(index).decode("latin-1")


@lru_cache(maxsize=256)
def _role_of(path: str, size: int, mtime_ns: int) -> str | None:
    file = Path(path)
    try:
        text = _safetensors_keys(file) if file.suffix.lower() == ".safetensors" else _pth_keys(file)
    except (OSError, ValueError, struct.error, zipfile.BadZipFile, json.JSONDecodeError):
        text = ""
    if any(mark in text for mark in VAE_KEY_MARKS):
        return "vae"
    if any(mark in text for mark in T5_KEY_MARKS):
        return "t5"
    name = file.name.lower()  # an unreadable index: fall back on the name
    if "vae" in name:
        return "vae"
    if "t5" in name:
        return "t5"
    return None


def weight_role(path: Path) -> str | None:
    """"vae", "t5" or None (unknown), judged by the file's tensor names (cached per file version)."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return _role_of(str(path), stat.st_size, stat.st_mtime_ns)
