"""README.md as a new user reads it: a table of contents that reaches every section, "What you
need" naming the GPU vendor and the OS, "What runs on my card" by card memory and GPU count
with each figure's card and date (a section of bench/RESULTS.md of that date and card), the
Base step cache kept apart from LingBot-World Fast, the official act2cam command making the
official single 121-frame pass, and no words of the team's history in the README or in
bench/RESULTS.md. The README's commands run in test_readme_commands.py."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

from comfyui_lingbot_world.tools import generate
from comfyui_lingbot_world.wan.long_video import plan_windows

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "README.md").read_text(encoding="utf-8")
RESULTS = (ROOT / "bench" / "RESULTS.md").read_text(encoding="utf-8")
CARD_SECTION = "What runs on my card"
# A figure's source: "(H100, 12 GiB cap, 2026-11-28)", "(2 H100s, 2026-11-28)".
CITATION = re.compile(r"\(([^()]*?\b(H100|H200)s?\b[^()]*?)\b(20\d\d-\d\d-\d\d)\)")
FIGURE = re.compile(r"\d[\d.,]*\s*(?:s|GiB|frames/s)\b(?! cap)")  # "a 12 GiB cap" is a setting
# Words of the team's work history, which a user cannot know. "Play session" (a live keyboard
# run) is a product term and stays; what is refused is a session of work: numbered, or "this
# session" and the like.
HISTORY = {
    "a wave of work": r"\bwaves?\b",
    "a numbered session": r"(?<![-\w])(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\d+(?:st|nd|rd|th))"
                          r"\s+session",
    "a session of work": r"\b(?:this|that|last|previous|earlier|later|next)\s+session\b(?!'s)",
    "an issue number": r"\bissues?\s*#?\s*\d+",
    "a lent machine": r"\blent\b",
    "device time": r"\bdevice (?:time|calls?)\b",
}


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but - and _ dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _section(title: str) -> str:
    return TEXT.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _tables(text: str) -> list[list[list[str]]]:
    """The markdown tables of ``text``: rows of cells, the header row first, the rule row left out."""
    tables, rows = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(set(c) <= set("-: ") for c in cells):
                rows.append(cells)
        elif rows:
            tables.append(rows)
            rows = []
    return tables


def test_table_of_contents_links_every_section_and_only_real_ones():
    headings = re.findall(r"^## (.+)$", TEXT, flags=re.M)
    contents = TEXT.split("**Contents:**", 1)[1].split("\n\n", 1)[0]
    links = re.findall(r"\]\(#([^)]+)\)", contents)
    assert links == [_anchor(h) for h in headings]
    assert {_anchor(h) for h in headings} >= set(re.findall(r"\]\(#([^)]+)\)", TEXT))  # every inner link lands


def test_what_you_need_names_vendor_os_and_where_the_memory_of_each_card_is():
    need = _section("What you need")
    assert TEXT.count("\n## What you need\n") == 1 and len(_tables(need)) == 1
    for row in ("**GPU vendor**", "NVIDIA", "CUDA", "**OS**", "Linux", "Windows", "**RAM**", "**Disk**",
                f"[{CARD_SECTION}](#{_anchor(CARD_SECTION)})"):
        assert row in need, row


def test_what_runs_on_my_card_has_every_card_size_and_gpu_count_with_each_figures_card_and_date():
    cards = _section(CARD_SECTION)
    one, several = _tables(cards)
    assert [r[0] for r in one[1:]] == ["**8 GB**", "**12 GB**", "**16 GB**", "**24 GB**", "**48 GB**",
                                       "**80 GB** (H100, H200)"]
    assert [re.match(r"\*\*(\d) ", r[0]).group(1) for r in several[1:]] == ["2", "4", "2", "2"]
    for table in (one, several):
        assert [h.split(":")[0] for h in table[0][1:]] == ["Base", "LingBot-World Fast", "Play", "what to set"]
        for row in table[1:]:
            for cell in row[1:4]:  # Base, Fast, Play: each figure with the card and the date it was measured on
                assert not FIGURE.search(cell) or CITATION.search(cell), f"{row[0]}: {cell}"
                assert FIGURE.search(cell) or re.search(r"not measured|as (?:\d+ GB|one GPU)", cell), f"{row[0]}: {cell}"
    assert "int8" in cards and "estimate" in cards
    gib = set(re.findall(r"(\d+(?:\.\d+)?) GiB(?! cap)", cards))
    assert gib and sorted(f for f in gib if not _in_results(f)) == []


def _in_results(figure: str) -> bool:
    """A README memory figure is a figure of bench/RESULTS.md, or one rounded from it (12.35 -> 12.4)."""
    places = Decimal(1).scaleb(Decimal(figure).as_tuple().exponent)
    return any(Decimal(r).quantize(places, ROUND_HALF_UP) == Decimal(figure)
               for r in re.findall(r"(\d+(?:\.\d+)?) GiB", RESULTS))


def test_every_card_and_date_the_readme_cites_has_its_section_in_results():
    headings = re.findall(r"^## (20\d\d-\d\d-\d\d)(?: to 20\d\d-\d\d-\d\d)?, ([^:]+):", RESULTS, flags=re.M)
    cited = CITATION.findall(TEXT)
    assert len(cited) > 30
    missing = sorted({(card, date) for _, card, date in cited
                      if not any(day == date and card in cards for day, cards in headings)})
    assert missing == [], f"bench/RESULTS.md has no section of these cards and dates: {missing}"


@pytest.mark.parametrize("name, text", [("README.md", TEXT), ("bench/RESULTS.md", RESULTS)])
def test_no_words_of_the_teams_history(name, text):
    found = {what: sorted(set(m.group(0) for m in re.finditer(rule, text, flags=re.I)))
             for what, rule in HISTORY.items()}
    assert {what: words for what, words in found.items() if words} == {}, name


def test_the_history_rule_refuses_work_sessions_and_keeps_play_sessions():
    def refused(text: str) -> bool:
        return any(re.search(rule, text, flags=re.I) for rule in HISTORY.values())

    assert all(refused(t) for t in ("third wave", "the sixth session", "in that session", "issue #39",
                                    "no H100 was lent", "17 minutes of device time", "the 3rd session"))
    assert not any(refused(t) for t in ("a 60-second Play session", "a 20-second session", "the session's log",
                                        "a session ends on Stop", "waveform", "the issues page"))


def test_the_base_step_cache_is_not_called_fast_mode_beside_lingbot_world_fast():
    assert "## Fast mode" not in TEXT and "## Step cache and other speed-ups (Base)" in TEXT
    speedups = _section("Step cache and other speed-ups (Base)")
    assert "not **LingBot-World Fast**" in speedups
    assert "fast mode:" not in TEXT


def test_readme_official_act2cam_command_is_one_121_frame_pass():
    blocks = re.findall(r"```bash\n(.*?)```", _section("Command line (without ComfyUI)"), flags=re.S)
    commands = [shlex.split(re.sub(r"\\\n\s*", " ", b)) for b in blocks if "official_act2cam" in b]
    assert len(commands) == 1
    argv = commands[0][commands[0].index("generate") + 1:]
    args = generate.parse_args(argv)
    assert args.sampling_preset == "official_act2cam" and args.frames == 121
    plan = plan_windows(args.frames, args.window, args.overlap)
    assert len(plan) == 1 and plan[0].frames == 121


def test_readme_says_fast_and_play_have_no_command_line_path():
    assert "LingBot-World Fast and Play have no command-line path" in _section("Command line (without ComfyUI)")
    listed = subprocess.run([sys.executable, str(ROOT), "--help"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and "{make_checkpoint,generate,quantize}" in listed.stdout, listed
    for tool in ("fast", "play"):
        refused = subprocess.run([sys.executable, str(ROOT), tool], capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2 and f"'{tool}' is not a tool (tools: make_checkpoint, generate, quantize" in \
            refused.stderr, refused
