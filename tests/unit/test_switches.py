"""wan/runtime/switches.py: every LINGBOT_* environment switch parsed in one place with one
truthiness rule, refused by name when set to what it does not take; read where it is used
(the modules that use one follow it); the README's table of switches is the module's."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from comfyui_lingbot_world.wan.runtime import attention, block_swap, cuda_graphs, switches
from comfyui_lingbot_world.wan.runtime.kv_cache import CachePolicy, KVCache

ROOT = Path(__file__).resolve().parents[2]
FLAGS = [s for s in switches.SWITCHES.values() if s.default is True]


@pytest.mark.parametrize("switch", FLAGS, ids=lambda s: s.name)
@pytest.mark.parametrize("raw, expected", [(None, True), ("", True), ("  ", True), ("0", False), (" 0 ", False),
                                           ("off", False), ("FALSE", False), ("no", False), ("1", True),
                                           ("On", True), ("true", True), ("yes", True)])
def test_every_flag_reads_the_one_truthiness_rule(monkeypatch, switch, raw, expected):
    if raw is None:
        monkeypatch.delenv(switch.name, raising=False)
    else:
        monkeypatch.setenv(switch.name, raw)
    assert switch() is expected
    switches.check()


@pytest.mark.parametrize("switch, raw", [(switches.FUSED, "2"), (switches.CUDA_GRAPHS, "maybe"),
                                         (switches.ATTENTION, "xformers"), (switches.CANCEL_SYNC_BLOCKS, "0"),
                                         (switches.CANCEL_SYNC_BLOCKS, "eight")])
def test_a_value_a_switch_does_not_take_is_refused_naming_it(monkeypatch, switch, raw):
    monkeypatch.setenv(switch.name, raw)
    with pytest.raises(ValueError, match=rf"^{switch.name}='{raw}' is not a value it takes: .*unset {switch.name}"):
        switch()
    monkeypatch.setenv(switches.SP_OVERLAP.name, "sometimes")
    with pytest.raises(ValueError) as err:  # check names every wrong one at once
        switches.check()
    assert switch.name in str(err.value) and switches.SP_OVERLAP.name in str(err.value)


def test_value_switches(monkeypatch):
    monkeypatch.delenv(switches.ATTENTION.name, raising=False)
    monkeypatch.delenv(switches.CANCEL_SYNC_BLOCKS.name, raising=False)
    assert switches.ATTENTION() is None and switches.CANCEL_SYNC_BLOCKS() == 8
    monkeypatch.setenv(switches.ATTENTION.name, " Flash_FP8 ")
    monkeypatch.setenv(switches.CANCEL_SYNC_BLOCKS.name, "1")
    assert switches.ATTENTION() == "flash_fp8" and switches.CANCEL_SYNC_BLOCKS() == 1
    assert switches.ATTENTION.takes().startswith(f"one of {', '.join(attention.BACKENDS)}")  # the table's rows


def test_the_modules_follow_their_switch(monkeypatch):
    """A switch changed between runs is what the next run reads (nothing caches it)."""
    policy = CachePolicy(window=9, sink=3)
    kept = dict(layers=2, heads=2, head_dim=8, frame_tokens=4, dtype_bytes=2, latent_frames=None, text_tokens=3,
                fp8_operands=True)
    for raw, spread, graphs in (("1", [1, 3], None), ("0", [2, 3], False)):
        monkeypatch.setenv(switches.SWAP_SPREAD.name, raw)
        monkeypatch.setenv(switches.CUDA_GRAPHS.name, raw)
        monkeypatch.setenv(switches.KV_FP8_KEEP.name, raw)
        assert block_swap.swapped_blocks(2, 4) == spread
        if graphs is not None:
            assert cuda_graphs.graphs_supported(torch.device("cpu")) is graphs
        with_kept = KVCache.estimate_bytes(policy, **kept)
        assert (with_kept > KVCache.estimate_bytes(policy, **{**kept, "fp8_operands": False})) is (raw == "1")


def _readme_table() -> list[tuple[str, str, str]]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Environment switches\n", 1)[1].split("\n## ", 1)[0]
    return [tuple(cell.strip() for cell in row.strip().strip("|").split(" | "))
            for row in section.splitlines() if row.startswith("| `LINGBOT_")]


def test_the_readme_table_is_the_modules():
    expected = [(f"`{s.name}`", s.takes(), s.doc) for s in switches.SWITCHES.values()]
    table = "\n".join(f"| {name} | {takes} | {doc} |" for name, takes, doc in expected)
    assert _readme_table() == expected, f"README.md's table of switches should read:\n{table}"


def _environment_reads(source: str) -> list[str]:
    """The LINGBOT_* names ``source`` reads from the environment itself (os.environ / os.getenv)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        target = node.func if isinstance(node, ast.Call) else node.value if isinstance(node, ast.Subscript) else None
        text = ast.unparse(target) if target is not None else ""
        if not re.match(r"^os\.(environ(\.get|\.setdefault|\.pop)?|getenv)$", text):
            continue
        args = node.args if isinstance(node, ast.Call) else [node.slice]
        found += [a.value for a in args[:1] if isinstance(a, ast.Constant) and str(a.value).startswith("LINGBOT_")]
    return found


def test_no_module_reads_a_switch_but_through_the_switches_module():
    reads = {str(p.relative_to(ROOT)): names for folder in ("wan", "loaders", "pipeline", "nodes", "tools")
             for p in (ROOT / folder).rglob("*.py")
             if p.name != "switches.py" and (names := _environment_reads(p.read_text(encoding="utf-8")))}
    assert reads == {}
    probe = 'os.environ.get("LINGBOT_X", "1")\nos.getenv("LINGBOT_Y")\nos.environ["LINGBOT_Z"]\nos.environ.get("HOME")'
    assert _environment_reads(probe) == ["LINGBOT_X", "LINGBOT_Y", "LINGBOT_Z"]  # the scan itself sees them
