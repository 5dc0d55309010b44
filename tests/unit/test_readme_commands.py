"""The README's commands as a new user runs them: from a fresh clone at
ComfyUI/custom_nodes/comfyui-lingbot-world, on the tiny synthetic packages, on the CPU.

Every ```bash block of the README has a marker on the line before it (tests/readme_blocks.py):
``<!-- readme-check: runs -->`` blocks hold only ``python . TOOL ...`` lines, and each line runs
here; ``<!-- readme-check: skip: REASON -->`` blocks (downloads, installs, a running server, the
suite itself) are reported skipped with their reason. What differs from a user's machine, and
nothing else:

- the working folder is ``<tmp>/ComfyUI/custom_nodes/comfyui-lingbot-world``, holding the
  checkout's files that git does not ignore (what a fresh clone has);
- ``../../models/lingbot/lingbot-world-base-cam-nf4`` is the tiny NF4 package and
  ``../../models/lingbot/lingbot-world-base-cam`` the tiny bf16 release: each is there when a
  line of the block reads it (``--package``, ``--src``) and no line of the block writes it (``--out``);
- ``photo.jpg``, the user's picture, is a 320×192 gradient;
- for a CPU: ``generate`` gets ``--device cpu --size 32x48 --steps 1`` and 5 frames (an
  ``--actions`` string cut to them by ``wan.camera_actions.cut_actions``), and ``--device cuda``
  becomes ``--device cpu``;
- to stay within two minutes on two loaded cores, the lines run one after the other in one
  Python process, each as ``python .`` runs the folder (``runpy.run_path(".")`` with the line's
  arguments), so torch is imported once.

Every ``hf download`` line is checked by hf's own parser, offline.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import av
import pytest
from PIL import Image

import readme_blocks
import tiny_package
from comfyui_lingbot_world.wan.camera_actions import cut_actions

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = readme_blocks.blocks()
CPU_FRAMES = 5
CPU_GENERATE = ["--device", "cpu", "--size", "32x48", "--steps", "1"]
MODELS = PurePosixPath("../../models/lingbot")  # from the pack's folder
TINY = {MODELS / tiny_package.COMFY_PACKAGE_NAME: "nf4", MODELS / "lingbot-world-base-cam": "bf16"}


def _id(index: int, block: readme_blocks.Block) -> str:
    return f"{index}-" + re.sub(r"\W+", "_", block.section).strip("_")


def test_every_bash_block_says_whether_it_runs():
    assert [b.section for b in BLOCKS if b.marker is None] == []
    runs = [b for b in BLOCKS if b.marker == "runs"]
    assert len(runs) >= 4 and all(b.commands() for b in runs)
    assert [c for b in runs for c in b.commands() if c[:2] != ["python", "."]] == []


def test_the_markers_are_read_and_a_block_without_one_is_seen():
    text = ("## A\n<!-- readme-check: runs -->\n```bash\npython . generate --help\n```\n"
            "text\n```bash\nls\n```\n<!-- readme-check: skip: a download -->\n   ```bash\n   hf download x\n   ```\n")
    assert [(b.section, b.marker, b.reason) for b in readme_blocks.blocks(text)] == [
        ("A", "runs", ""), ("A", None, ""), ("A", "skip", "a download")]


@pytest.fixture(scope="module")
def comfy(tmp_path_factory) -> Path:
    """``<tmp>/ComfyUI`` with the pack at custom_nodes/comfyui-lingbot-world: the checkout's
    files that git does not ignore (tracked, and new ones not yet committed)."""
    root = tmp_path_factory.mktemp("fresh") / "ComfyUI"
    pack = root / "custom_nodes" / "comfyui-lingbot-world"
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: a fresh clone holds the files git tracks")
    for name in filter(None, listed.stdout.split("\0")):
        if (ROOT / name).is_file():  # a file deleted and not yet committed is not in a clone either
            (pack / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, pack / name)
    Image.radial_gradient("L").convert("RGB").resize((320, 192)).save(pack / "photo.jpg")
    return root


def _value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def _on_the_cpu(argv: list[str]) -> list[str]:
    """``python . TOOL ...`` as this test runs it (the module's docstring)."""
    args = list(argv[2:])
    for i, word in enumerate(args[:-1]):
        if word == "--device" and args[i + 1] == "cuda":
            args[i + 1] = "cpu"
    if args[0] == "generate":
        if "--frames" in args:
            args[args.index("--frames") + 1] = str(CPU_FRAMES)
        else:
            args += ["--frames", str(CPU_FRAMES)]
        if "--actions" in args:
            at = args.index("--actions") + 1
            args[at] = cut_actions(args[at], CPU_FRAMES)
        args += CPU_GENERATE
    return [sys.executable, ".", *args]


def _models_for(block: readme_blocks.Block, packages: dict[str, Path]) -> dict[str, str]:
    """ComfyUI/models/lingbot/ as the block expects it: {folder name: the tiny package it links to}
    for the packages a line reads and none writes."""
    read = {PurePosixPath(v) for c in block.commands() for v in (_value(c, "--package"), _value(c, "--src")) if v}
    written = {PurePosixPath(v) for c in block.commands() if (v := _value(c, "--out"))}
    return {path.name: str(packages[layout]) for path, layout in TINY.items() if path in read and path not in written}


# Runs the plan's lines in the pack's folder, one Python process for all (the module's docstring).
_DRIVER = r"""
import contextlib, io, json, os, runpy, shutil, sys, traceback
plan_file, results_file = sys.argv[1:3]  # sys.argv becomes each line's
plan, results = json.load(open(plan_file)), []
for step in plan:
    models = os.path.join("..", "..", "models", "lingbot")
    shutil.rmtree(models, ignore_errors=True)
    os.makedirs(models)
    for name, target in step["models"].items():
        os.symlink(target, os.path.join(models, name), target_is_directory=True)
    for args in step["lines"]:
        out, code = io.StringIO(), 0
        sys.argv = [".", *args]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                runpy.run_path(".", run_name="__main__")
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
            except BaseException:
                traceback.print_exc()
                code = 1
        written = args[args.index("--out") + 1]
        results.append({"code": code, "output": out.getvalue()[-4000:], "wrote": os.path.exists(written)})
json.dump(results, open(results_file, "w"))
"""


@pytest.fixture(scope="module")
def runs(comfy, packages, tmp_path_factory) -> dict[int, list[dict]]:
    """Every "runs" block's lines run from the clone: {block index: one result per line}."""
    plan = [{"block": i, "models": _models_for(b, packages), "lines": [_on_the_cpu(c)[2:] for c in b.commands()]}
            for i, b in enumerate(BLOCKS) if b.marker == "runs"]
    for step in plan:  # the user's first run: nothing written yet
        for args in step["lines"]:
            target = comfy / "custom_nodes" / "comfyui-lingbot-world" / args[args.index("--out") + 1]
            shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
    work = tmp_path_factory.mktemp("readme_runs")
    (work / "plan.json").write_text(json.dumps(plan))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    done = subprocess.run([sys.executable, "-c", _DRIVER, str(work / "plan.json"), str(work / "results.json")],
                          cwd=comfy / "custom_nodes" / "comfyui-lingbot-world", capture_output=True, text=True,
                          env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    results = iter(json.loads((work / "results.json").read_text()))
    return {step["block"]: [next(results) for _ in step["lines"]] for step in plan}


@pytest.mark.parametrize("block", BLOCKS, ids=[_id(i, b) for i, b in enumerate(BLOCKS)])
def test_a_readme_block_runs_as_written_from_a_fresh_clone(block, comfy, request):
    if block.marker != "runs":
        pytest.skip(block.reason or "no marker (test_every_bash_block_says_whether_it_runs fails)")
    results = request.getfixturevalue("runs")[BLOCKS.index(block)]
    pack = comfy / "custom_nodes" / "comfyui-lingbot-world"
    for argv, result in zip(block.commands(), results):
        assert result["code"] == 0, f"{' '.join(argv)}\n{result['output']}"
        assert result["wrote"], f"{' '.join(argv)} wrote no {_value(argv, '--out')}\n{result['output']}"
        if argv[2] == "generate":
            with av.open(str(pack / _value(argv, "--out"))) as video:
                assert sum(1 for _ in video.decode(video=0)) == CPU_FRAMES
            preview = _value(argv, "--preview")
            assert preview is None or (pack / preview).stat().st_size > 0


def test_the_cpu_substitution_keeps_the_command_and_cuts_only_what_a_cpu_cannot_afford():
    argv = ["python", ".", "generate", "--package", "p", "--frames", "961", "--actions", "w-120,l-30",
            "--device", "cuda", "--out", "o.mp4"]
    assert _on_the_cpu(argv)[1:] == [".", "generate", "--package", "p", "--frames", "5", "--actions", "w-5",
                                     "--device", "cpu", "--out", "o.mp4", *CPU_GENERATE]


DOWNLOADS = [c for b in BLOCKS for c in b.commands() if c[:2] == ["hf", "download"]]


@pytest.mark.parametrize("command", DOWNLOADS, ids=[c[2] for c in DOWNLOADS])
def test_a_readme_download_is_one_hf_accepts_and_lands_in_the_models_folder(command):
    done = readme_blocks.hf_help(command)
    assert done.returncode == 0, done.stdout + done.stderr
    # From ComfyUI/custom_nodes (the Quick start's folder) into ComfyUI/models/lingbot/, and the
    # Fast transformer into the NF4 package under the folder name the Fast templates read.
    landed = PurePosixPath(os.path.normpath(PurePosixPath("ComfyUI/custom_nodes") / _value(command, "--local-dir")))
    assert landed.parts[:3] == ("ComfyUI", "models", "lingbot"), landed
    if "fast" in command[2]:
        assert landed == (PurePosixPath("ComfyUI/models/lingbot") / tiny_package.COMFY_PACKAGE_NAME
                          / tiny_package.FAST_FOLDER)
