"""README.md as a new user reads it: a table of contents that reaches every section, one
"What you need" table naming the GPU vendor, the OS and the GPU memory of each mode with
measured figures only, the Base step cache kept apart from LingBot-World Fast, and the
official act2cam command making the official single 121-frame pass."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from comfyui_lingbot_world.tools import generate
from comfyui_lingbot_world.wan.long_video import plan_windows

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "README.md").read_text(encoding="utf-8")
RESULTS = (ROOT / "bench" / "RESULTS.md").read_text(encoding="utf-8")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but - and _ dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _section(title: str) -> str:
    return TEXT.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_table_of_contents_links_every_section_and_only_real_ones():
    headings = re.findall(r"^## (.+)$", TEXT, flags=re.M)
    contents = TEXT.split("**Contents:**", 1)[1].split("\n\n", 1)[0]
    links = re.findall(r"\]\(#([^)]+)\)", contents)
    assert links == [_anchor(h) for h in headings]


def test_what_you_need_names_vendor_os_and_the_memory_of_every_mode_with_measured_figures():
    need = _section("What you need")
    assert TEXT.count("\n## What you need\n") == 1 and need.count("\n|---|---|") == 1  # one table
    for row in ("**GPU vendor**", "NVIDIA", "CUDA", "**OS**", "Linux", "Windows", "Base, the exact path",
                "LingBot-World Fast, 81-frame clip", "Fast Long Video", "Play", "int8"):
        assert row in need, row
    assert not re.search(r"see bench|TBD|to be measured|\?\?", need, flags=re.I)
    figures = set(re.findall(r"(\d+(?:\.\d+)?) GiB", need))
    assert figures and not sorted(f for f in figures if f"{f} GiB" not in RESULTS + _section("Memory and speed"))


def test_the_base_step_cache_is_not_called_fast_mode_beside_lingbot_world_fast():
    assert "## Fast mode" not in TEXT and "## Step cache and other speed-ups (Base)" in TEXT
    speedups = _section("Step cache and other speed-ups (Base)")
    assert "not **LingBot-World Fast**" in speedups
    assert "fast mode:" not in TEXT


def test_readme_official_act2cam_command_is_one_121_frame_pass():
    blocks = re.findall(r"```bash\n(.*?)```", _section("Without ComfyUI"), flags=re.S)
    commands = [shlex.split(re.sub(r"\\\n\s*", " ", b)) for b in blocks if "official_act2cam" in b]
    assert len(commands) == 1
    argv = commands[0][commands[0].index("generate") + 1:]
    args = generate.parse_args(argv)
    assert args.sampling_preset == "official_act2cam" and args.frames == 121
    plan = plan_windows(args.frames, args.window, args.overlap)
    assert len(plan) == 1 and plan[0].frames == 121


def test_readme_says_fast_and_play_have_no_command_line_path():
    assert "LingBot-World Fast and Play have no command-line path" in _section("Without ComfyUI")
    listed = subprocess.run([sys.executable, str(ROOT), "--help"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and "{make_checkpoint,generate,quantize}" in listed.stdout, listed
    for tool in ("fast", "play"):
        refused = subprocess.run([sys.executable, str(ROOT), tool], capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2 and refused.stderr.startswith("usage: python <checkout> {"), refused
