"""docs/architecture.md against the tree: every module under wan/, loaders/, pipeline/ and
nodes/ is named in it, every module it names exists, and imports point one way
(nodes → pipeline → loaders → wan; tools above pipeline, beside nodes), with ComfyUI
imported only in nodes/."""
from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
LAYERS = ("wan", "loaders", "pipeline", "nodes")
# What each top-level folder may import from the pack.
ALLOWED = {
    "wan": {"wan"},
    "loaders": {"loaders", "wan"},
    "pipeline": {"pipeline", "loaders", "wan"},
    "nodes": {"nodes", "pipeline", "loaders", "wan"},
    "tools": {"tools", "pipeline", "loaders", "wan"},
}
HOST_MODULES = {"comfy", "comfy_api", "comfy_extras", "folder_paths", "latent_preview", "server", "nodes"}


def _modules(folders=LAYERS) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def _only_a_docstring(path: Path) -> bool:
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body)


def _named_in_doc() -> set[str]:
    return set(re.findall(r"\b((?:wan|loaders|pipeline|nodes|tools)/[\w/]+\.py)\b", DOC.read_text(encoding="utf-8")))


def test_every_module_is_named_in_the_architecture_doc() -> None:
    named = _named_in_doc()
    wanted = [p.relative_to(ROOT).as_posix() for p in _modules()
              if not (p.name == "__init__.py" and _only_a_docstring(p))]
    assert len(wanted) > 60, wanted  # the scan sees the package
    missing = [m for m in wanted if m not in named]
    assert missing == [], f"docs/architecture.md does not name {missing}: add a line for each"


def test_every_module_the_doc_names_exists() -> None:
    stale = sorted(m for m in _named_in_doc() if not (ROOT / m).is_file())
    assert stale == [], f"docs/architecture.md names modules that do not exist: {stale}"


def _pack_imports(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, top-level pack folder) of every import of the pack in ``path`` (or in
    ``source``, read as if it were that file); imports of the host as "host:<name>"."""
    rel = path.relative_to(ROOT)
    found = []
    text = path.read_text(encoding="utf-8") if source is None else source
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(rel.parts[:-1])
            if node.level > 1:
                base = base[: len(base) - (node.level - 1)]
            target = base + (node.module.split(".") if node.module else [])
            found.append((node.lineno, target[0] if target else ""))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in HOST_MODULES:
            found.append((node.lineno, f"host:{node.module}"))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, f"host:{a.name}") for a in node.names if a.name.split(".")[0] in HOST_MODULES]
    return found


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_imports_point_one_way(folder: str) -> None:
    wrong = []
    for path in _modules((folder,)):
        for line, target in _pack_imports(path):
            where = f"{path.relative_to(ROOT)}:{line}"
            if target.startswith("host:"):
                if folder != "nodes":
                    wrong.append(f"{where} imports ComfyUI ({target[5:]})")
            elif target not in ALLOWED[folder]:
                wrong.append(f"{where} imports {target}/")
    assert wrong == []


def test_the_import_check_sees_upward_imports() -> None:
    """The check itself: an upward import and a host import below nodes/ are found."""
    source = "from ..pipeline import camera\nimport folder_paths\nfrom .errors import CheckpointError\n"
    found = _pack_imports(ROOT / "loaders" / "probe.py", source)
    assert found == [(1, "pipeline"), (2, "host:folder_paths"), (3, "loaders")]
    assert _pack_imports(ROOT / "nodes" / "host" / "probe.py", "from ...wan import camera\n") == [(1, "wan")]


def _section(title: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _pack_module(path: str):
    return importlib.import_module("comfyui_lingbot_world." + path.removesuffix(".py").replace("/", "."))


def test_where_to_add_things_names_the_modules_that_hold_the_tables() -> None:
    """Each "goes in" of the table (`module.py` `TABLE`) is a table in that module, and each
    walk-through below it names files that exist."""
    section = _section("Where to add things")
    places = re.findall(r"^\| [^|]+ \| `((?:wan|loaders|pipeline|nodes|tools)/[\w/]+\.py)` `([A-Z_]+)`", section,
                        flags=re.M)
    assert len(places) >= 5, places  # layouts, GEMM kinds, attention backends, switches, samplers
    for path, table in places:
        rows = getattr(_pack_module(path), table, None)
        assert isinstance(rows, dict) and rows, f"{path} holds no table {table}"
    named = set(re.findall(r"`((?:tests|wan|loaders|pipeline|nodes|tools)/[\w/]+\.py)`", section))
    assert {p for p in named if "<" not in p and not (ROOT / p).is_file()} == set()
    for walk in ("GEMM kind", "attention backend", "checkpoint layout"):
        assert f"\n### Adding a{'n' if walk[0] in 'aeiou' else ''} {walk}\n" in section, walk


def test_each_auto_names_its_one_decider() -> None:
    deciders = _section("Where to add things").split("\n### One decider per `auto`\n", 1)[1].split("\n### ", 1)[0]
    rows = re.findall(r"^\| ([\w ()]+) \| `((?:wan|pipeline|loaders)/[\w/]+\.py)` `(\w+)` \|", deciders, flags=re.M)
    assert {choice for choice, _, _ in rows} >= {"attention", "kv_dtype (Fast)", "weights"}
    for choice, path, function in rows:
        decider = getattr(_pack_module(path), function, None)
        assert callable(decider) and decider.__doc__, (choice, path, function)
