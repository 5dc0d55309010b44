"""docs/architecture.md against the tree: every module under wan/, loaders/, pipeline/ and
nodes/ is named in it, every module it names exists, and imports point one way
(nodes → pipeline → loaders → wan; tools above pipeline, beside nodes), with ComfyUI
imported only in nodes/. And tests/README.md against tests/: every package module (tools/
too) has a test file found by the naming rule or the table there, and one of those files
imports it (directly, through a package's re-export, or through a helper in tests/)."""
from __future__ import annotations

import ast
import functools
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
TESTS = ROOT / "tests"
TESTS_DOC = TESTS / "README.md"
LAYERS = ("wan", "loaders", "pipeline", "nodes")
PACKAGE = "comfyui_lingbot_world"
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


# ------------------------------------------------------------------ tests/README.md: a test per module


def rule_test(module: str) -> str:
    """The unit test file tests/README.md's naming rule gives ``module`` (a path under the
    pack, e.g. ``pipeline/fast/generator.py`` -> ``test_fast_generator.py``)."""
    parts = module[:-len(".py")].split("/")
    if module in ("nodes/__init__.py", "nodes/inputs.py"):
        return "test_node_schemas.py"
    if parts[0] == "nodes":
        return f"test_host_{parts[-1]}.py" if parts[1] == "host" else f"test_node_{parts[-1]}.py"
    if len(parts) == 2 or parts[:2] == ["wan", "runtime"]:
        return f"test_{parts[-1]}.py"
    return f"test_{parts[-2]}_{parts[-1]}.py"  # a subpackage's module


def table_tests(text: str) -> dict[str, list[str]]:
    """Module -> the test files (relative to tests/; a bare name is in unit/) of the table."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) < 4 or not cells[1].strip().startswith("`"):
            continue
        tests = [name if "/" in name else f"unit/{name}"
                 for name in re.findall(r"`((?:integration/|unit/|gpu/)?test_\w+\.py)`", cells[2])]
        for module in re.findall(r"`((?:wan|loaders|pipeline|nodes|tools)/[\w/]+\.py)`", cells[1]):
            found.setdefault(module, []).extend(tests)
    return found


def _re_exports(package: str) -> dict[str, str]:
    """Name -> module of what a pack package's __init__.py imports from its own modules."""
    init = ROOT / package.replace(".", "/") / "__init__.py"
    if not package or not init.is_file():
        return {}
    return {alias.asname or alias.name: f"{package}.{node.module}"
            for node in ast.parse(init.read_text(encoding="utf-8")).body
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module for alias in node.names}


@functools.lru_cache(maxsize=None)
def imported_modules(path: Path, source: str | None = None) -> frozenset[str]:
    """The pack modules (dotted, below the pack: ``pipeline.fast.generator``) that the test
    file at ``path`` (or ``source`` read as that file) imports, also through a package's
    re-export and through the helpers it imports from tests/ or its own folder."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8") if source is None else source)):
        names = []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            if node.module.split(".")[0] == PACKAGE:
                base = node.module.partition(".")[2]
                found.add(base)
                exports = _re_exports(base)
                for alias in node.names:
                    found.add(f"{base}.{alias.name}".lstrip("."))
                    found.update([exports[alias.name]] if alias.name in exports else [])
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
            found.update(n.partition(".")[2] for n in names if n.split(".")[0] == PACKAGE)
        for name in names:
            helper = next((folder / f"{name}.py" for folder in (TESTS, path.parent)
                           if (folder / f"{name}.py").is_file()), None)
            if helper is not None and helper != path:
                found |= imported_modules(helper)
    return frozenset(found)


def _package_modules() -> list[str]:
    return [p.relative_to(ROOT).as_posix() for p in _modules((*LAYERS, "tools"))
            if not (p.name == "__init__.py" and _only_a_docstring(p))]


def _dotted(module: str) -> str:
    return module[:-len(".py")].replace("/", ".").removesuffix(".__init__")


def test_every_package_module_has_a_findable_test_that_imports_it() -> None:
    table = table_tests(TESTS_DOC.read_text(encoding="utf-8"))
    unfound, unheld = [], []
    for module in _package_modules():
        by_rule = f"unit/{rule_test(module)}"
        tests = ([by_rule] if (TESTS / by_rule).is_file() else []) + table.get(module, [])
        if not tests:
            unfound.append(f"{module}: no tests/{by_rule}; write it, or add a row to tests/README.md's table")
        elif not any(_dotted(module) in imported_modules(TESTS / t) for t in tests if (TESTS / t).is_file()):
            unheld.append(f"{module}: none of {tests} imports it; test it there, or fix the table's row")
    assert len(_package_modules()) > 80  # the scan sees the package
    assert unfound + unheld == []


def test_the_test_table_names_modules_and_tests_that_exist() -> None:
    table = table_tests(TESTS_DOC.read_text(encoding="utf-8"))
    assert len(table) > 20  # the parse sees the table
    stale = sorted({m for m in table if not (ROOT / m).is_file()}
                   | {t for tests in table.values() for t in tests if not (TESTS / t).is_file()})
    assert stale == [], f"tests/README.md's table names files that do not exist: {stale}"


def test_the_naming_rule_and_the_import_scan() -> None:
    """The check itself: the rule of each layer, a re-export and a helper followed."""
    assert [rule_test(m) for m in ("wan/runtime/kv_cache.py", "loaders/nf4.py", "pipeline/fast/generator.py",
                                   "nodes/camera.py", "nodes/host/fast_model.py", "nodes/inputs.py",
                                   "tools/synthetic/dit.py")] == [
        "test_kv_cache.py", "test_nf4.py", "test_fast_generator.py", "test_node_camera.py", "test_host_fast_model.py",
        "test_node_schemas.py", "test_synthetic_dit.py"]
    source = ("from comfyui_lingbot_world.pipeline.fast import FastParams\nimport comfyui_lingbot_world.wan.vae\n"
              "from comfyui_lingbot_world import nodes\nfrom node_runs import load_fast\n")
    found = imported_modules(TESTS / "unit" / "test_probe.py", source)
    assert {"pipeline.fast", "pipeline.fast.generator", "wan.vae", "nodes"} <= found
    assert "pipeline.fast.stream" not in found
    assert imported_modules(TESTS / "node_runs.py") <= found  # the helper's imports count


def _section(title: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _pack_module(path: str):
    return importlib.import_module("comfyui_lingbot_world." + path.removesuffix(".py").replace("/", "."))


def _where_to_add_rows(section: str) -> list[list[str]]:
    """The cells of the "a new … | goes in" table, the first table of the section."""
    table = section.split("\n| a new … |", 1)[1].split("\n\n", 1)[0]
    return [line.split("|")[1:-1] for line in table.splitlines() if line.startswith("| ")]


def test_where_to_add_things_names_the_modules_that_hold_the_tables() -> None:
    """Each row of "Where to add things" names the module and the table a new entry goes in
    (`module.py` `TABLE`): the module exists and holds that table; each walk-through below
    the table names files that exist."""
    section = _section("Where to add things")
    rows = _where_to_add_rows(section)
    assert len(rows) >= 6, rows  # layouts, GEMM kinds, attention backends, switches, samplers, devices modes
    for cells in rows:
        found = re.search(r"`((?:wan|loaders|pipeline|nodes|tools)/[\w/]+\.py)` `([A-Z_]+)`", cells[1])
        assert found, f"docs/architecture.md, Where to add things: {cells[0].strip()!r} names no `module.py` `TABLE`"
        table = getattr(_pack_module(found.group(1)), found.group(2), None)
        assert isinstance(table, dict) and table, f"{found.group(1)} holds no table {found.group(2)}"
    named = set(re.findall(r"`((?:tests|wan|loaders|pipeline|nodes|tools)/[\w/]+\.py)`", section))
    assert {p for p in named if "<" not in p and not (ROOT / p).is_file()} == set()
    for walk in ("GEMM kind", "attention backend", "checkpoint layout", "parallel strategy"):
        assert f"\n### Adding a{'n' if walk[0] in 'aeiou' else ''} {walk}\n" in section, walk


def test_each_auto_names_its_one_decider() -> None:
    deciders = _section("Where to add things").split("\n### One decider per `auto`\n", 1)[1].split("\n### ", 1)[0]
    rows = re.findall(r"^\| ([\w ()]+) \| `((?:wan|pipeline|loaders)/[\w/]+\.py)` `(\w+)` \|", deciders, flags=re.M)
    assert {choice for choice, _, _ in rows} >= {"attention", "kv_dtype (Fast)", "weights", "devices"}
    for choice, path, function in rows:
        decider = getattr(_pack_module(path), function, None)
        assert callable(decider) and decider.__doc__, (choice, path, function)
