"""On-disk cache of prompt embeddings, so a prompt seen before never loads the encoder.

A key covers everything that changes the result: the encoder file (path, size, mtime), the
tokenizer folder, the text and the token limit. Entries are small safetensors files.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def _file_identity(path: Path) -> list:
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns]


def _folder_identity(folder: Path) -> list:
    return [_file_identity(p) for p in sorted(folder.iterdir()) if p.is_file()]


# The tokenizer identity when it is read from the encoder file (already in the key).
FROM_ENCODER_FILE = "from-encoder-file"


class EmbeddingCache:
    def __init__(self, folder: Path, encoder_file: Path, tokenizer_dir: Path | None, max_len: int = 512) -> None:
        """``tokenizer_dir`` None: the tokenizer stored inside ``encoder_file``."""
        self.folder = Path(folder)
        tokenizer = FROM_ENCODER_FILE if tokenizer_dir is None else _folder_identity(Path(tokenizer_dir))
        self._base = json.dumps(
            {"encoder": _file_identity(Path(encoder_file)), "tokenizer": tokenizer, "max_len": max_len},
            sort_keys=True,
        )

    def _path(self, text: str) -> Path:
        digest = hashlib.sha256((self._base + "\0" + text).encode("utf-8")).hexdigest()
        return self.folder / f"{digest}.safetensors"

    def get(self, text: str) -> torch.Tensor | None:
        path = self._path(text)
        if not path.is_file():
            return None
        try:
            return load_file(str(path))["embedding"]
        except Exception:  # a cut-short entry (e.g. disk full) is only a cache miss
            return None

    def put(self, text: str, embedding: torch.Tensor) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self._path(text)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        save_file({"embedding": embedding.detach().to("cpu").contiguous()}, str(tmp))
        os.replace(tmp, path)  # readers never see a half-written entry
