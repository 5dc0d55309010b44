"""The README's shell blocks as the tests read them: each ```bash block with its section and
the marker on the line before it, its commands as a shell splits them, and `hf download`
commands checked by hf's own parser (offline: the parser answers --help before any download).

Markers (HTML comments, invisible on GitHub):
    <!-- readme-check: runs -->           tests/unit/test_readme_commands.py runs the block
    <!-- readme-check: skip: REASON -->   not run by that test (a download, a server, the suite)
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
_FENCE = re.compile(r"^([ \t]*)```bash\n(.*?)^\1```", re.M | re.S)
_MARKER = re.compile(r"^\s*<!-- readme-check: (?:(runs)|skip: (\S.*?)) -->\s*$")


@dataclass(frozen=True)
class Block:
    section: str  # the "## " heading above the block
    text: str
    marker: str | None  # "runs", "skip", or None where the line before the block has no marker
    reason: str  # why a skipped block is not run

    def commands(self) -> list[list[str]]:
        return commands(self.text)


def blocks(text: str | None = None) -> list[Block]:
    """The ```bash blocks of ``text`` (the README's by default), in order."""
    text = README.read_text(encoding="utf-8") if text is None else text
    found = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()]
        marker = _MARKER.match(before.rstrip("\n").rsplit("\n", 1)[-1])
        sections = re.findall(r"^## (.+)$", before, flags=re.M)
        kind = None if marker is None else "runs" if marker.group(1) else "skip"
        found.append(Block(sections[-1] if sections else "", match.group(2), kind,
                           marker.group(2) if marker and marker.group(2) else ""))
    return found


def commands(block: str) -> list[list[str]]:
    """The commands of a shell block: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [words for words in (shlex.split(line, comments=True) for line in joined.splitlines()) if words]


def hf_help(command: list[str], *extra: str) -> subprocess.CompletedProcess:
    """``command`` (``hf download ...``) with ``extra`` and ``--help``, run by the ``hf`` of this
    Python environment (what requirements.txt installs), offline: 0 when hf's parser accepts it."""
    program = shutil.which(command[0], path=str(Path(sys.executable).parent))
    assert program, f"{command[0]!r} is not a command of this environment (huggingface_hub brings 'hf')"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST")},
           "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    return subprocess.run([program, *command[1:], *extra, "--help"], capture_output=True, text=True, env=env,
                          timeout=120)
