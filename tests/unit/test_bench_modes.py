"""bench/modes.py, the benchmark modes as data, against bench/RESULTS.md and bench/run_device.sh:
every mode names a section of RESULTS.md that cites it, every mode that RESULTS.md, the README,
docs/, tests/ or bench/ cite exists, and run_device.sh runs the table's commands (shown with
--show; an unknown name stops it before any set-up)."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "RESULTS.md"
RUN_DEVICE = ROOT / "bench" / "run_device.sh"


def _modes():
    spec = importlib.util.spec_from_file_location("bench_modes", ROOT / "bench" / "modes.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


modes = _modes()

# A citation: `[VAR=value ...] [bash] [bench/]run_device.sh NAME ...` in backticks, or such a line of a
# fenced code block.
_COMMAND = r"(?:[A-Z_]+=\S*\s+)*(?:bash\s+)?(?:bench/)?run_device\.sh\b"
_SPAN = re.compile(rf"`({_COMMAND}[^`]*)`")
_LINE = re.compile(rf"^\s*({_COMMAND}.*)$", re.M)
_FENCE = re.compile(r"^\s*```[^\n]*\n(.*?)^\s*```", re.M | re.S)


def _names_after(command: str) -> list[str]:
    """The mode names a run_device.sh command line gives: the words after the script up to a
    comment or a shell operator, less options, VAR=value and placeholders (MODE, ...)."""
    names = []
    for word in command.split("run_device.sh", 1)[1].split():
        if word.startswith("#") or word in (";", "&&", "||", "|"):
            break
        if not (word.startswith("-") or "=" in word or word.isupper() or "…" in word or "..." in word):
            names.append(word.rstrip(";,."))
    return names


def citations(text: str) -> list[str]:
    """Every mode name ``text`` cites in a run_device.sh command (inline code or a code block)."""
    blocks = _FENCE.findall(text)
    found = [name for span in _SPAN.findall(_FENCE.sub("", text)) for name in _names_after(span)]
    return found + [name for block in blocks for line in _LINE.findall(block) for name in _names_after(line)]


def results_citations() -> dict[str, list[str]]:
    """RESULTS.md's sections ("## " headings) -> the mode names each cites: the backticked names
    of its tables' "mode" column (VAR=value settings aside) and its run_device.sh commands."""
    cited: dict[str, list[str]] = defaultdict(list)
    section, column, body = "", None, defaultdict(str)
    for line in RESULTS.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            section, column = line[3:], None
            cited[section]
            continue
        body[section] += line + "\n"
        if not line.startswith("|"):
            column = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if column is None:  # a table's header row
            column = cells.index("mode") if "mode" in cells else -1
        elif column >= 0 and not set(cells[0]) <= set("-: "):
            cited[section] += [n for n in re.findall(r"`([^`]+)`", cells[column]) if "=" not in n]
    for name, text in body.items():
        cited[name] += citations(text)
    return dict(cited)


def test_the_modes_have_one_row_each_and_commands_bash_can_parse():
    names = [m.name for m in modes.MODES]
    assert len(names) == len(set(names)) and len(names) > 40
    for mode in modes.MODES:
        assert re.fullmatch(r"[a-z0-9_]+", mode.name), mode.name
        assert mode.gpus in (1, 2, 4) and all(c.startswith(".") for c in mode.carry), mode
        done = subprocess.run(["bash", "-n", "-c", mode.command], capture_output=True, text=True)
        assert done.returncode == 0, f"{mode.name}: {done.stderr}"


def test_every_mode_backs_a_section_of_results_that_cites_it():
    cited = results_citations()
    for mode in modes.MODES:
        assert mode.section in cited, f"{mode.name}: bench/RESULTS.md has no section '## {mode.section}'"
        assert mode.name in cited[mode.section], f"{mode.name}: '## {mode.section}' does not cite it"


def test_every_mode_results_cites_exists():
    wrong = {section: sorted(set(names) - set(modes.BY_NAME)) for section, names in results_citations().items()}
    assert {s: n for s, n in wrong.items() if n} == {}
    assert sum(len(n) for n in results_citations().values()) > 80  # the parser sees the tables


@pytest.mark.parametrize("pattern", ["README.md", "docs/*.md", "tests/**/*.md", "tests/**/*.py", "bench/*.py",
                                     "bench/*.sh"])
def test_every_mode_cited_outside_results_exists(pattern):
    wrong = {str(p.relative_to(ROOT)): sorted(set(citations(p.read_text(encoding="utf-8"))) - set(modes.BY_NAME))
             for p in ROOT.glob(pattern)}
    assert {p: n for p, n in wrong.items() if n} == {}


def test_the_citation_parser_sees_commands_and_leaves_out_settings():
    text = ("`PLAY_MODES=turn bash bench/run_device.sh play60_cap16 fast81` and\n```bash\n"
            "bash bench/run_device.sh --show p480 swap12   # comment load\n```\n`run_device.sh MODE...`")
    assert citations(text) == ["play60_cap16", "fast81", "p480", "swap12"]


def _run_device(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(RUN_DEVICE), *args], capture_output=True, text=True, timeout=60)


def test_run_device_runs_the_commands_of_the_table():
    chosen = ["fast81_cap16", "sp_overlap_ab"]
    done = _run_device("--show", *chosen)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "".join(f"=== {n}\n{modes.BY_NAME[n].command}\n" for n in chosen)
    listed = _run_device("--list")
    assert listed.returncode == 0 and all(re.search(rf"^{m.name}\s", listed.stdout, re.M) for m in modes.MODES)


def test_an_unknown_mode_stops_run_device_before_anything_runs():
    done = _run_device("p480", "fast81_cap8")
    assert done.returncode == 2
    assert "fast81_cap8" in done.stderr and "fast81_cap16" in done.stderr  # the nearest names
    assert "=== " not in done.stdout and "nvidia-smi" not in done.stderr
