"""Read small JSON files (a checkpoint's config files, a Play action log) with errors that
name the file; ``parse_json`` is the one parser both go through."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import CheckpointError


class JsonProblem(ValueError):
    """Text that is not JSON this reader takes; the message says why, for the caller to
    put after the file's name."""


def parse_json(text: str, what: str) -> Any:
    """``json.loads(text)`` with every way it fails as ``JsonProblem``: the parser's message
    with its line and column, or too deep a nesting (``what`` names the kind of file)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise JsonProblem(f"is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from exc
    except RecursionError:
        # Python's parser recurses once per nesting level: a file nested ~100k levels deep
        # (no real one is more than a few) would otherwise surface as a bare RecursionError.
        raise JsonProblem(f"is nested too deeply to be {what} (thousands of levels of [ or {{)") from None


def read_json_object(path: Path, missing_hint: str) -> dict[str, Any]:
    """The JSON object in ``path``; CheckpointError if it is absent, unreadable or not an object."""
    if not path.is_file():
        raise CheckpointError(path, f"not found; {missing_hint}")
    try:
        data = parse_json(path.read_text(encoding="utf-8"), "a config file")
    except JsonProblem as exc:
        raise CheckpointError(path, f"{exc}; replace it with the file from the checkpoint's download") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(path, f"cannot be read ({exc})") from exc
    if not isinstance(data, dict):
        raise CheckpointError(path, f"holds a JSON {type(data).__name__}, expected an object")
    return data
