"""On-disk cache of prompt embeddings, so a prompt seen before never loads the encoder.

A key covers everything that changes the result: the encoder file (path, size, mtime), the
tokenizer folder, the text, the token limit and the dtype. Entries are small safetensors
files that carry their full key inside, so an entry is used only for the key it was written
for.

The cache can never stop a run nor change one: a write that fails (disk full, read-only
folder, the folder is a file) is logged and the run goes on uncached; an entry that does
not belong to its key, cannot be read, or whose tensor has the wrong shape (its width must
be the encoder's, read from the encoder file's header), dtype or holds non-finite values,
is deleted with a warning and counts as a miss (the fresh result replaces it).
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..loaders.errors import CheckpointError
from ..loaders.new_file import new_file
from ..loaders.t5_loader import t5_width
from ..wan.geometry import MAX_TOKENS

log = logging.getLogger(__name__)

_TENSOR = "embedding"
_KEY = "lingbot_key"


def _file_identity(path: Path) -> list:
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns]


def _folder_identity(folder: Path) -> list:
    return [_file_identity(p) for p in sorted(folder.iterdir()) if p.is_file()]


# The tokenizer identity when it is read from the encoder file (already in the key).
FROM_ENCODER_FILE = "from-encoder-file"


class EmbeddingCache:
    def __init__(self, folder: Path, encoder_file: Path, tokenizer_dir: Path | None, max_len: int = MAX_TOKENS,
                 dtype: torch.dtype = torch.bfloat16) -> None:
        """``tokenizer_dir`` None: the tokenizer stored inside ``encoder_file``."""
        self.folder = Path(folder)
        self.max_len = max_len
        self.dtype = dtype
        try:
            # Every entry must have the encoder's width: a stale or foreign entry of another
            # width would otherwise break its prompt on every run.
            self.width = t5_width(Path(encoder_file))
            tokenizer = FROM_ENCODER_FILE if tokenizer_dir is None else _folder_identity(Path(tokenizer_dir))
            self._base: str | None = json.dumps(
                {"encoder": _file_identity(Path(encoder_file)), "tokenizer": tokenizer,
                 "max_len": max_len, "dtype": str(dtype)},
                sort_keys=True,
            )
        except (OSError, CheckpointError) as exc:  # a missing or broken file: the loader reports it, clearly
            log.warning("LingBot prompt cache off for this run: %s", exc)
            self._base = None

    def _key(self, text: str) -> str:
        return self._base + "\0" + text  # type: ignore[operator]

    def _path(self, key: str) -> Path:
        # surrogatepass: a key never fails to encode (the text stage refuses such prompts
        # itself, naming the field).
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
        return self.folder / f"{digest}.safetensors"

    def get(self, text: str) -> torch.Tensor | None:
        """The cached embedding of ``text``, or None (a miss) for anything not exactly right."""
        if self._base is None:
            return None
        key = self._key(text)
        path = self._path(key)
        if not path.is_file():
            return None
        try:
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                if (handle.metadata() or {}).get(_KEY) != key:
                    return self._drop(path, "it was written for another prompt or encoder")  # copied or colliding
                embedding = handle.get_tensor(_TENSOR)
        except Exception as exc:  # noqa: BLE001 - a cut-short, foreign or unreadable entry is only a miss
            return self._drop(path, f"it cannot be read ({exc})")
        if (embedding.dim() != 2 or not 1 <= embedding.shape[0] <= self.max_len or embedding.shape[1] != self.width
                or embedding.dtype != self.dtype):
            return self._drop(path, f"it holds a {embedding.dtype} tensor of shape {tuple(embedding.shape)}, not "
                              f"[1..{self.max_len} tokens, {self.width}] {self.dtype}")
        if not bool(torch.isfinite(embedding).all()):
            return self._drop(path, "it holds NaN or infinite values")
        return embedding

    @staticmethod
    def _drop(path: Path, why: str) -> None:
        """Delete a bad entry (with a warning) so that the fresh result takes its place; a miss."""
        log.warning("LingBot prompt cache: dropped entry %s because %s; the prompt is encoded again", path.name, why)
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass
        return None

    def put(self, text: str, embedding: torch.Tensor) -> bool:
        """Store an entry atomically; False (with a warning logged) when it cannot be written."""
        if self._base is None:
            return False
        key = self._key(text)
        path = self._path(key)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            # A new file renamed into place (loaders/new_file.py): readers never see a
            # half-written entry, and an entry that is a hard link is never written into.
            with new_file(path) as partial:
                save_file({_TENSOR: embedding.detach().to("cpu").contiguous()}, str(partial), metadata={_KEY: key})
            return True
        except Exception as exc:  # noqa: BLE001 - disk full, read-only, the folder is a file...
            log.warning("LingBot prompt cache: could not write an entry to %s (%s); running uncached",
                        self.folder, exc)
            return False
