"""scripts/demo.sh as a new user runs it: twice in a row (it replaces its own video), never
over a file the user named, and a first run that says it is installing before pip starts."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import av
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "demo.sh"
DEFAULT_OUT = ROOT / "test-artifacts" / "demo.mp4"


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """The demo's package folder, shared by the tests (written once, by the first run)."""
    return tmp_path_factory.mktemp("demo_work")


def _demo(tmp_path: Path, work: Path, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    # This test's Python environment has everything: the demo reuses it and installs nothing.
    base.update(LINGBOT_VENV=sys.prefix, DEMO_WORK=str(work))
    base.update(env)
    return subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, capture_output=True, text=True, env=base, timeout=300)


def _frames(path: Path) -> int:
    with av.open(str(path)) as video:
        return sum(1 for _ in video.decode(video=0))


def test_demo_runs_twice_in_a_row(tmp_path, work):
    for run in (1, 2):
        done = _demo(tmp_path, work)
        assert done.returncode == 0, f"run {run}:\n{done.stdout}\n{done.stderr}"
        assert "wrote" in done.stdout and _frames(DEFAULT_OUT) == 17


def test_demo_keeps_a_file_the_user_named(tmp_path, work):
    mine = tmp_path / "mine.mp4"
    mine.write_bytes(b"the user's own video")
    done = _demo(tmp_path, work, DEMO_OUT=str(mine))
    assert done.returncode == 2
    # The demo takes no flags: the answer names DEMO_OUT and what to do, never --overwrite.
    assert done.stderr.strip().splitlines() == [f"[demo] DEMO_OUT={mine} exists; it is kept. Remove it, or set "
                                                "DEMO_OUT to a name that does not exist"], done.stderr
    assert mine.read_bytes() == b"the user's own video" and "generating" not in done.stdout


def test_first_run_says_what_it_installs_before_pip_starts(tmp_path, work):
    """A stand-in environment whose Python lacks the packages: the script must announce the
    install before pip's first line, and go on after it."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    calls = tmp_path / "calls.log"
    python = venv / "bin" / "python"
    python.write_text(f"""#!/usr/bin/env bash
echo "python $*" >> {calls}
if [[ "$1" == -c && "$2" == "import torch"* ]]; then [[ -f {tmp_path}/installed ]]; exit $?; fi
if [[ "$1" == -m && "$2" == pip ]]; then echo "PIP RUNS"; touch {tmp_path}/installed; fi
exit 0
""")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    done = _demo(tmp_path, work, LINGBOT_VENV=str(venv), DEMO_OUT=str(tmp_path / "v.mp4"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    announce = next(i for i, line in enumerate(lines) if line.startswith("[demo] first run: installing"))
    assert announce < lines.index("PIP RUNS") < lines.index("[demo] installed")
    assert "torch==2.14.1 -r requirements.txt" in calls.read_text()
    assert "-q" not in calls.read_text().split()  # pip's own progress is shown
