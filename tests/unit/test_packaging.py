"""What the pack declares and what it publishes: pyproject.toml and requirements.txt name the
same runtime requirements, and `comfy node pack` leaves out tests/ and bench/ (comfy-cli's
rule, comfy_cli/file_utils.py ``zip_files``: the git-tracked files, minus those a
``.comfyignore`` gitwildmatch pattern matches, except paths under [tool.comfy] ``includes``)
while keeping everything the pack runs on."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
# The forms of gitwildmatch pattern this test reads exactly like git/pathspec: an anchored
# folder ("/tests/": everything below it) or an anchored file ("/scripts/test.sh").
_ANCHORED = re.compile(r"^/[^*?\[\]!#\s]+$")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _requirements_txt() -> list[str]:
    lines = (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines()
    return [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]


def _normalized(specs: list[str]) -> dict[str, str]:
    out = {}
    for spec in specs:
        req = Requirement(spec)
        out[re.sub(r"[-_.]+", "-", req.name).lower()] = str(req.specifier)
    return out


def test_pyproject_and_requirements_txt_name_the_same_runtime_requirements():
    declared = _normalized(_pyproject()["project"]["dependencies"])
    listed = _normalized(_requirements_txt())
    assert declared == listed, (f"only in pyproject.toml: {sorted(declared.keys() - listed.keys())}; only in "
                                f"requirements.txt: {sorted(listed.keys() - declared.keys())}; versions differ: "
                                f"{sorted(k for k in declared.keys() & listed.keys() if declared[k] != listed[k])}")
    assert "huggingface-hub" in declared  # `hf download`, the README's model download command


def _comfyignore() -> list[str]:
    lines = (ROOT / ".comfyignore").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def _ignored(path: str, patterns: list[str]) -> bool:
    for pattern in patterns:
        body = pattern[1:]
        if body.endswith("/") and path.startswith(body):
            return True
        if path == body:
            return True
    return False


def published_files() -> list[str]:
    """The files `comfy node pack` zips from this checkout (comfy-cli's rule)."""
    try:
        tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True,
                                 check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: comfy node pack zips the git-tracked files")
    patterns = _comfyignore()
    includes = [p.strip("/") for p in _pyproject()["tool"]["comfy"].get("includes", [])]
    forced = lambda path: any(path == p or path.startswith(p + "/") for p in includes)  # noqa: E731
    return [f for f in tracked if forced(f) or not _ignored(f, patterns)]


def test_comfyignore_uses_only_patterns_read_the_same_by_git_and_by_this_test():
    patterns = _comfyignore()
    assert patterns and all(_ANCHORED.match(p) for p in patterns), patterns


def test_comfy_node_pack_leaves_out_tests_and_bench_data_and_keeps_what_the_pack_runs_on():
    files = published_files()
    assert not [f for f in files if f.startswith("tests/")]
    assert [f for f in files if f.startswith("bench/")] == ["bench/RESULTS.md"]  # cited by README and tooltips
    size = sum((ROOT / f).stat().st_size for f in files if (ROOT / f).is_file())
    assert size < 3 * 2**20, f"the published pack is {size / 2**20:.1f} MiB"
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True,
                             check=True).stdout.splitlines()
    runtime = [f for f in tracked if f.split("/")[0] in ("wan", "loaders", "pipeline", "nodes", "tools", "web",
                                                          "example_workflows", "workflows", "docs")]
    runtime += ["__init__.py", "__main__.py", "_standalone.py", "pyproject.toml", "requirements.txt", "README.md",
                "LICENSE", "scripts/demo.sh"]
    assert sorted(set(runtime) - set(files)) == []


def test_the_published_files_run_the_command_line_tools(tmp_path):
    """The zip's tree alone (no tests/, no bench/) runs a tool end to end."""
    tree = tmp_path / "comfyui-lingbot-world"
    for f in published_files():
        if (ROOT / f).is_file():
            (tree / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, tree / f)
    done = subprocess.run([sys.executable, str(tree), "make_checkpoint", "--preset", "tiny", "--layout", "nf4",
                           "--out", str(tmp_path / "pkg"), "--parts", "vae,tokenizer"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "pkg" / "Wan2.1_VAE.pth").is_file()
