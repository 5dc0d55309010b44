"""The README's Quick start download, copied as written: a valid command of the `hf` that
requirements.txt installs, run from the folder step 1 leaves the user in. No network here:
the command is parsed by the real CLI (an unknown option fails before --help is answered)."""
from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

import readme_blocks
import tiny_package

ROOT = Path(__file__).resolve().parents[2]


def _quick_start_blocks() -> list[readme_blocks.Block]:
    return [b for b in readme_blocks.blocks() if b.section == "Quick start"]


def _download_command() -> list[str]:
    found = [c for block in _quick_start_blocks() for c in block.commands() if c and "download" in c]
    assert len(found) == 1, found
    return found[0]


def test_requirements_install_the_hf_command():
    names = [re.split(r"[<>=~! ]", line.strip())[0].lower().replace("_", "-")
             for line in (ROOT / "requirements.txt").read_text().splitlines() if line.strip() and line[0] != "#"]
    assert "huggingface-hub" in names
    assert _download_command()[0] == "hf"


def test_readme_download_is_a_valid_hf_download_invocation():
    command = _download_command()
    done = readme_blocks.hf_help(command)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "hf download" in done.stdout
    # The check is able to fail: a misspelt option is refused by the same parser.
    assert readme_blocks.hf_help(command, "--local-dirr", "x").returncode != 0


def test_readme_download_lands_where_the_workflows_look():
    """Step 1 ends in ComfyUI/custom_nodes; the package must land in ComfyUI/models/lingbot/
    under the folder name the shipped workflows use."""
    first = _quick_start_blocks()[0].commands()
    assert first[0] == ["cd", "ComfyUI/custom_nodes"]
    command = _download_command()
    local_dir = PurePosixPath(command[command.index("--local-dir") + 1])
    landed = PurePosixPath(os.path.normpath(PurePosixPath("ComfyUI/custom_nodes") / local_dir))
    assert landed == PurePosixPath("ComfyUI/models/lingbot") / tiny_package.COMFY_PACKAGE_NAME
    assert command[2] == "cahlen/lingbot-world-base-cam-nf4"
