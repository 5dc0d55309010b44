"""The one exception type every loader raises: it names the file and what is wrong."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable


class CheckpointError(ValueError):
    """A checkpoint file or folder cannot be used. ``path`` is the file or folder at fault."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


def preview(names: Iterable[str], limit: int = 5) -> str:
    """A few names for an error message, with a count of the rest."""
    names = sorted(names)
    shown = ", ".join(names[:limit])
    return shown + (f" (and {len(names) - limit} more)" if len(names) > limit else "")
