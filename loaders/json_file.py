"""Read the small JSON files of a checkpoint folder with errors that name the file."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import CheckpointError


def read_json_object(path: Path, missing_hint: str) -> dict[str, Any]:
    """The JSON object in ``path``; CheckpointError if it is absent, unreadable or not an object."""
    if not path.is_file():
        raise CheckpointError(path, f"not found; {missing_hint}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(path, f"is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from exc
    except RecursionError:
        # Python's parser recurses once per nesting level: a file nested ~100k levels deep
        # (no real config is more than a few) would otherwise surface as a bare RecursionError.
        raise CheckpointError(path, "is nested too deeply to be a config file (thousands of levels of [ or {); "
                              "replace it with the file from the checkpoint's download") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(path, f"cannot be read ({exc})") from exc
    if not isinstance(data, dict):
        raise CheckpointError(path, f"holds a JSON {type(data).__name__}, expected an object")
    return data
