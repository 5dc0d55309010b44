"""The README's Quick start download, copied as written: a valid command of the `hf` that
requirements.txt installs, run from the folder step 1 leaves the user in. No network here:
the command is parsed by the real CLI (an unknown option fails before --help is answered)."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import tiny_package

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def _quick_start_blocks() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [b for b in re.findall(r"```bash\n(.*?)```", section, flags=re.S)]


def _commands(block: str) -> list[list[str]]:
    joined = re.sub(r"\\\n\s*", " ", block)
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.strip()]


def _download_command() -> list[str]:
    found = [c for block in _quick_start_blocks() for c in _commands(block) if c and "download" in c]
    assert len(found) == 1, found
    return found[0]


def test_requirements_install_the_hf_command():
    names = [re.split(r"[<>=~! ]", line.strip())[0].lower().replace("_", "-")
             for line in (ROOT / "requirements.txt").read_text().splitlines() if line.strip() and line[0] != "#"]
    assert "huggingface-hub" in names
    assert _download_command()[0] == "hf"


def test_readme_download_is_a_valid_hf_download_invocation():
    command = _download_command()
    # The program as the user's shell finds it in the environment step 1 installed into.
    program = shutil.which(command[0], path=str(Path(sys.executable).parent))
    assert program, f"{command[0]!r} is not a command of this environment (huggingface_hub brings 'hf')"
    hf = Path(program)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST")},
           "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    done = subprocess.run([str(hf), *command[1:], "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "hf download" in done.stdout
    # The check is able to fail: a misspelt option is refused by the same parser.
    wrong = subprocess.run([str(hf), *command[1:], "--local-dirr", "x", "--help"], capture_output=True, text=True,
                           env=env, timeout=120)
    assert wrong.returncode != 0


def test_readme_download_lands_where_the_workflows_look():
    """Step 1 ends in ComfyUI/custom_nodes; the package must land in ComfyUI/models/lingbot/
    under the folder name the shipped workflows use."""
    first = [c for c in _commands(_quick_start_blocks()[0]) if c]
    assert first[0] == ["cd", "ComfyUI/custom_nodes"]
    command = _download_command()
    local_dir = PurePosixPath(command[command.index("--local-dir") + 1])
    landed = PurePosixPath(os.path.normpath(PurePosixPath("ComfyUI/custom_nodes") / local_dir))
    assert landed == PurePosixPath("ComfyUI/models/lingbot") / tiny_package.COMFY_PACKAGE_NAME
    assert command[2] == "cahlen/lingbot-world-base-cam-nf4"
