"""The umT5 tokenizer, read from a local folder (google/umt5-xxl files), without transformers.

Output matches the Hugging Face T5 tokenizer called with ``padding="max_length",
truncation=True``: the text's pieces, then ``</s>``, then ``<pad>`` up to ``max_len``.
"""
from __future__ import annotations

import html
import re
import warnings
from pathlib import Path
from typing import Sequence

import torch

from .geometry import MAX_TOKENS

TOKENIZER_JSON = "tokenizer.json"
SENTENCEPIECE_MODEL = "spiece.model"
PAD, EOS = "<pad>", "</s>"

_WHITESPACE = re.compile(r"\s+")


class TokenizerError(ValueError):
    """The tokenizer folder or one of its files cannot be used."""


class PromptTruncatedWarning(UserWarning):
    """A prompt had more tokens than the text encoder takes; the tail was dropped."""


def clean_text(text: str) -> str:
    """Repair mojibake (when ftfy is installed), undo HTML escapes, collapse whitespace."""
    try:
        import ftfy
    except ImportError:
        pass
    else:
        text = ftfy.fix_text(text)
    text = html.unescape(html.unescape(text))  # twice: prompts scraped from the web are often double-escaped
    return _WHITESPACE.sub(" ", text).strip()


class _JsonBackend:
    """A ``tokenizers`` tokenizer.json (what the Hugging Face fast tokenizer reads)."""

    def __init__(self, file: Path) -> None:
        from tokenizers import Tokenizer

        try:
            self._tok = Tokenizer.from_file(str(file))
        except Exception as exc:
            raise TokenizerError(f"{file}: cannot be read as a tokenizer.json ({exc})") from exc
        # padding and truncation are done by UMT5Tokenizer, whatever the file asks for
        self._tok.no_padding()
        self._tok.no_truncation()
        self.pad_id = self._special_id(file, PAD)
        self.eos_id = self._special_id(file, EOS)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def _special_id(self, file: Path, token: str) -> int:
        found = self._tok.token_to_id(token)
        if found is None:
            raise TokenizerError(f"{file}: has no {token!r} token; this is not a T5/umT5 tokenizer")
        return found

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]


class _SentencePieceBackend:
    """A SentencePiece model: spiece.model when tokenizer.json is absent, or the bytes of one
    (ComfyUI stores it inside the encoder file)."""

    def __init__(self, file: Path | str, model_proto: bytes | None = None) -> None:
        try:
            import sentencepiece
        except ImportError as exc:
            raise TokenizerError(
                f"{file}: reading a SentencePiece tokenizer needs the 'sentencepiece' package "
                "(pip install sentencepiece; ComfyUI's own requirements include it)"
            ) from exc
        try:
            if model_proto is not None:
                self._sp = sentencepiece.SentencePieceProcessor(model_proto=model_proto)
            else:
                self._sp = sentencepiece.SentencePieceProcessor(model_file=str(file))
        except Exception as exc:
            raise TokenizerError(f"{file}: cannot be read as a SentencePiece model ({exc})") from exc
        self.eos_id = self._sp.eos_id() if self._sp.eos_id() >= 0 else self._sp.piece_to_id(EOS)
        # T5 models define pad as id 0; the value only fills masked positions
        self.pad_id = self._sp.pad_id() if self._sp.pad_id() >= 0 else 0
        self.vocab_size = self._sp.get_piece_size()

    def encode(self, texts: list[str]) -> list[list[int]]:
        return self._sp.encode(texts)


class UMT5Tokenizer:
    """Tokenizer of a local folder holding ``tokenizer.json`` (preferred) or ``spiece.model``."""

    @classmethod
    def from_sentencepiece_bytes(cls, model_proto: bytes, source: str | Path) -> "UMT5Tokenizer":
        """A tokenizer from a serialized SentencePiece model; ``source`` names it in errors."""
        tokenizer = cls.__new__(cls)
        tokenizer.folder = Path(source)
        tokenizer._backend = _SentencePieceBackend(source, model_proto=model_proto)
        return tokenizer

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        wanted = f"{TOKENIZER_JSON} or {SENTENCEPIECE_MODEL} (the google/umt5-xxl tokenizer files)"
        if not self.folder.is_dir():
            what = "is not a folder" if self.folder.exists() else "does not exist"
            raise TokenizerError(f"tokenizer folder {self.folder} {what}; it should hold {wanted}")
        if (self.folder / TOKENIZER_JSON).is_file():
            self._backend: _JsonBackend | _SentencePieceBackend = _JsonBackend(self.folder / TOKENIZER_JSON)
        elif (self.folder / SENTENCEPIECE_MODEL).is_file():
            self._backend = _SentencePieceBackend(self.folder / SENTENCEPIECE_MODEL)
        else:
            raise TokenizerError(f"tokenizer folder {self.folder} holds neither {wanted}")

    @property
    def vocab_size(self) -> int:
        return self._backend.vocab_size

    @property
    def pad_id(self) -> int:
        return self._backend.pad_id

    @property
    def eos_id(self) -> int:
        return self._backend.eos_id

    def __call__(self, texts: Sequence[str] | str, max_len: int = MAX_TOKENS) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (ids [B, max_len] long, mask [B, max_len] long with 1 on real tokens and ``</s>``)."""
        if max_len < 1:
            raise ValueError(f"max_len={max_len}: must be at least 1 (room for the end token)")
        if isinstance(texts, str):
            texts = [texts]
        cleaned = [clean_text(t) for t in texts]
        ids = torch.full((len(cleaned), max_len), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(cleaned), max_len), dtype=torch.long)
        for row, (text, pieces) in enumerate(zip(cleaned, self._backend.encode(cleaned))):
            if len(pieces) + 1 > max_len:
                message = (
                    f"prompt {_start(text)!r} has {len(pieces) + 1} tokens (with the end token), more than the "
                    f"text encoder's {max_len}; the tokens after the first {max_len - 1} are dropped"
                )
                warnings.warn(message, PromptTruncatedWarning, stacklevel=2)
                pieces = pieces[: max_len - 1]
            row_ids = list(pieces) + [self.eos_id]
            ids[row, : len(row_ids)] = torch.tensor(row_ids, dtype=torch.long)
            mask[row, : len(row_ids)] = 1
        return ids, mask


def _start(text: str, chars: int = 60) -> str:
    return text if len(text) <= chars else text[:chars] + "..."
