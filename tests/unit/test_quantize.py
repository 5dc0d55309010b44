"""tools/quantize.py and loaders/release.py: an official bf16 release (Base-Cam, Act, Fast)
becomes the NF4 layout once; the models are told apart by what their files say; a mistake
answers in one line naming the flag, before any work; nothing the user has is replaced
without --overwrite; an interrupted run leaves nothing that looks complete."""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from comfyui_lingbot_world.loaders.bf16 import load_bf16_expert
from comfyui_lingbot_world.tools.synthetic.experts import save_bf16_expert
from comfyui_lingbot_world.loaders.nf4 import nf4_tensors
from comfyui_lingbot_world.loaders.package import find_package
from comfyui_lingbot_world.loaders.release import ReleaseExpert, find_release
from comfyui_lingbot_world.tools import cli, quantize
from comfyui_lingbot_world.tools.synthetic.dit import make_synthetic_expert
from comfyui_lingbot_world.wan.config import TINY_ACT
from test_nf4_convert import _file_tensors, assert_same_tensors

ROOT = Path(__file__).resolve().parents[2]
EXPERT_FILES = ["config.json", "model.safetensors", "quantization_meta.json"]
SHARED = ["Wan2.1_VAE.pth", "models_t5_umt5-xxl-enc-bf16.pth", "tokenizer"]
FAST_FIELDS = {"_class_name": "WanModelFast", "local_attn_size": -1, "sink_size": 0}


@pytest.fixture
def release(packages, tmp_path) -> Path:
    """A copy of the tiny bf16 package: the official release's layout."""
    return Path(shutil.copytree(packages["bf16"], tmp_path / "lingbot-world-base-cam"))


def make_fast(folder: Path, base_expert: Path, fields: dict | None = None) -> Path:
    """A Fast transformer folder: a Base expert's shards, config.json with WanModelFast's fields."""
    shutil.copytree(base_expert, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **(FAST_FIELDS if fields is None else fields)}))
    return folder


def _run(argv: list[str], capsys) -> tuple[int, list[str], list[str]]:
    code = cli.run("quantize", quantize.main, argv)
    captured = capsys.readouterr()
    return code, captured.out.strip().splitlines(), captured.err.strip().splitlines()


@pytest.fixture
def nothing_converts(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("an expert would have been converted")

    monkeypatch.setattr(quantize, "convert_to_nf4", refuse)


def test_base_release_becomes_the_nf4_package(release, tmp_path, capsys):
    out = tmp_path / "lingbot-world-base-cam-nf4"
    code, lines, err = _run(["--src", str(release), "--out", str(out)], capsys)
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == sorted(["high_noise_model_bnb_nf4", "low_noise_model_bnb_nf4",
                                                            *SHARED])
    for name in ("high_noise_model", "low_noise_model"):
        folder = out / f"{name}_bnb_nf4"
        assert sorted(p.name for p in folder.iterdir()) == EXPERT_FILES
        wanted = dict(nf4_tensors(load_bf16_expert(release / name, "cpu", quantize="nf4")))
        assert_same_tensors(_file_tensors(folder), wanted)
    paths = find_package(out)
    assert paths.high.name == "high_noise_model_bnb_nf4" and paths.low.name == "low_noise_model_bnb_nf4"
    # The shared files are hard links (same filesystem): no copy, and the release keeps them.
    for name in ("Wan2.1_VAE.pth", "models_t5_umt5-xxl-enc-bf16.pth", "tokenizer/tokenizer.json"):
        assert (out / name).samefile(release / name)
    text = "\n".join(lines)
    assert "high_noise_model (Base-Cam)" in text and "tensors," in text and "written" in text
    assert "Wan2.1_VAE.pth: hard-linked" in text and "tokenizer/: hard-linked" in text
    assert "-> " in text and "NF4 in high_noise_model_bnb_nf4/" in text and "peak RSS" in text
    assert not list(out.glob(".*")), "temporary folders left behind"


def test_fast_inside_the_base_release_is_converted_too_and_keeps_its_fields(release, tmp_path, capsys):
    make_fast(release / "lingbot_world_fast", release / "high_noise_model")
    out = tmp_path / "out"
    code, lines, err = _run(["--src", str(release), "--out", str(out)], capsys)
    assert code == 0, err
    fast = out / "lingbot_world_fast_bnb_nf4"
    assert sorted(p.name for p in fast.iterdir()) == EXPERT_FILES
    config = json.loads((fast / "config.json").read_text())
    assert {k: config[k] for k in FAST_FIELDS} == FAST_FIELDS
    assert_same_tensors(_file_tensors(fast), _file_tensors(out / "high_noise_model_bnb_nf4"))  # same weights
    assert any(line.startswith("lingbot_world_fast (LingBot-World Fast)") for line in lines)


def test_fast_downloaded_alone_is_told_by_its_config(release, tmp_path, capsys):
    src = make_fast(tmp_path / "lingbot-world-fast", release / "high_noise_model")
    out = tmp_path / "out"
    code, lines, err = _run(["--src", str(src), "--out", str(out)], capsys)
    assert code == 0, err
    assert [p.name for p in out.iterdir()] == ["lingbot_world_fast_bnb_nf4"]
    assert any("one expert folder" in line and "Base-Cam release" in line for line in lines)


def test_fast_folder_without_fast_fields_is_assumed_fast_and_says_so(release, tmp_path, capsys):
    src = make_fast(tmp_path / "lingbot_world_fast", release / "high_noise_model", fields={})
    code, lines, err = _run(["--src", str(src), "--out", str(tmp_path / "out")], capsys)
    assert code == 0, err
    assert any(line.startswith("note:") and "taken as LingBot-World Fast by its folder name" in line for line in lines)
    assert (tmp_path / "out" / "lingbot_world_fast_bnb_nf4" / "model.safetensors").is_file()


def test_act_release_is_converted_with_its_control_told_by_shape(tmp_path, capsys):
    src = tmp_path / "lingbot-world-base-act"
    for seed, name in enumerate(("high_noise_model", "low_noise_model")):
        save_bf16_expert(make_synthetic_expert(TINY_ACT, seed=seed), src / name)
    code, lines, err = _run(["--src", str(src), "--out", str(tmp_path / "out")], capsys)
    assert code == 0, err
    assert any(line.startswith("high_noise_model (Act)") for line in lines)
    assert any("has no models_t5_umt5-xxl-enc-bf16.pth, Wan2.1_VAE.pth, tokenizer" in line for line in lines)


def _one_line(code, err, flag, *fragments):
    assert code == 2, err
    assert len(err) == 1, err
    assert err[0].startswith(f"quantize: error: {flag}:"), err[0]
    for fragment in fragments:
        assert fragment in err[0], err[0]


def test_the_release_is_read_as_its_experts_and_shared_files(release):
    """loaders/release.py, what quantize converts: each expert with its role, in the order of
    conversion, the shared files found and those missing; a lone expert folder alone."""
    make_fast(release / "lingbot_world_fast", release / "high_noise_model")
    shutil.rmtree(release / "tokenizer")
    found = find_release(release)
    assert found.experts == tuple(ReleaseExpert(release / name, name)
                                  for name in ("high_noise_model", "low_noise_model", "lingbot_world_fast"))
    assert found.shared == (release / "models_t5_umt5-xxl-enc-bf16.pth", release / "Wan2.1_VAE.pth")
    assert found.missing_shared == ("tokenizer",)
    alone = find_release(release / "low_noise_model")
    assert alone.experts == (ReleaseExpert(release / "low_noise_model", "low_noise_model"),)
    assert alone.shared == alone.missing_shared == ()


def test_base_folder_with_fast_fields_is_refused(release, tmp_path, capsys, nothing_converts):
    config = release / "low_noise_model" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "local_attn_size": -1}))
    code, _, err = _run(["--src", str(release), "--out", str(tmp_path / "out")], capsys)
    _one_line(code, err, "--src", str(config), "local_attn_size", "low_noise_model/")
    assert not (tmp_path / "out").exists()


def test_experts_of_different_models_are_refused(release, tmp_path, capsys, nothing_converts):
    shutil.rmtree(release / "low_noise_model")
    save_bf16_expert(make_synthetic_expert(TINY_ACT), release / "low_noise_model")
    code, _, err = _run(["--src", str(release), "--out", str(tmp_path / "out")], capsys)
    _one_line(code, err, "--src", "high_noise_model/ is Base-Cam", "low_noise_model/ is Act")


@pytest.mark.parametrize(
    "make, fragments",
    [
        (lambda r, t: t / "missing", ["does not exist"]),
        (lambda r, t: r / "Wan2.1_VAE.pth", ["is a file"]),
        (lambda r, t: (shutil.rmtree(r / "low_noise_model"), r)[1],
         ["holds high_noise_model/ but not low_noise_model/"]),
        (lambda r, t: r / "tokenizer", ["holds no bf16 expert folder", "found special_tokens_map.json"]),
        (lambda r, t: (t / "empty").mkdir() or t / "empty", ["holds no bf16 expert folder", "found nothing"]),
        (lambda r, t: (shutil.copytree(r / "high_noise_model", t / "expert"), t / "expert")[1],
         ["neither its name nor its config.json says which"]),
    ],
    ids=["missing", "a-file", "one-expert-only", "not-an-expert", "empty", "unnamed-expert"],
)
def test_src_mistakes(release, tmp_path, capsys, nothing_converts, make, fragments):
    src = make(release, tmp_path)
    code, _, err = _run(["--src", str(src), "--out", str(tmp_path / "out")], capsys)
    _one_line(code, err, "--src", *fragments)


def test_nf4_package_as_src_says_it_is_already_nf4(package, tmp_path, capsys, nothing_converts):
    code, _, err = _run(["--src", str(package), "--out", str(tmp_path / "out")], capsys)
    _one_line(code, err, "--src", "high_noise_model_bnb_nf4, low_noise_model_bnb_nf4 are already quantized (nf4)")
    code, _, err = _run(["--src", str(package / "high_noise_model_bnb_nf4"), "--out", str(tmp_path / "out")], capsys)
    _one_line(code, err, "--src", "is already an NF4 expert")


def test_out_mistakes(release, tmp_path, capsys, nothing_converts, monkeypatch):
    code, _, err = _run(["--src", str(release), "--out", str(tmp_path / "no" / "such" / "out")], capsys)
    _one_line(code, err, "--out", "does not exist; create it first")
    (tmp_path / "file").write_text("x")
    code, _, err = _run(["--src", str(release), "--out", str(tmp_path / "file")], capsys)
    _one_line(code, err, "--out", "is a file")
    monkeypatch.setattr(quantize.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9, 1000))
    code, _, err = _run(["--src", str(release), "--out", str(tmp_path / "out")], capsys)
    _one_line(code, err, "--out", "needs up to", "make room")
    real_access = os.access
    monkeypatch.setattr(quantize.os, "access", lambda p, mode: False if Path(p) == tmp_path else real_access(p, mode))
    code, _, err = _run(["--src", str(release), "--out", str(tmp_path / "out")], capsys)
    _one_line(code, err, "--out", "not writable")
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_refused(release, tmp_path, capsys, nothing_converts):
    code, _, err = _run(["--src", str(release), "--out", str(tmp_path / "out"), "--device", "cuda"], capsys)
    _one_line(code, err, "--device", "no CUDA device")


def test_existing_output_is_kept_unless_overwrite(release, tmp_path, capsys):
    out = tmp_path / "out"
    assert _run(["--src", str(release), "--out", str(out)], capsys)[0] == 0
    weights = out / "high_noise_model_bnb_nf4" / "model.safetensors"
    before = weights.stat()
    (out / "my_notes.txt").write_text("mine")
    code, _, err = _run(["--src", str(release), "--out", str(out)], capsys)
    _one_line(code, err, "--out", "already holds high_noise_model_bnb_nf4/, low_noise_model_bnb_nf4/",
              "pass --overwrite")
    assert weights.stat().st_ino == before.st_ino and weights.stat().st_mtime_ns == before.st_mtime_ns
    # The shared files already linked are the same files: not in the way.
    assert "Wan2.1_VAE.pth" not in err[0] and "tokenizer" not in err[0]
    code, lines, err = _run(["--src", str(release), "--out", str(out), "--overwrite"], capsys)
    assert code == 0, err
    assert weights.stat().st_ino != before.st_ino  # a new file, renamed into place
    assert (out / "my_notes.txt").read_text() == "mine"
    assert any("Wan2.1_VAE.pth: already there (the same)" in line for line in lines)
    assert any("tokenizer/: already there (the same)" in line for line in lines)
    assert not list(out.glob(".*"))


def test_a_different_shared_file_in_out_needs_overwrite(release, tmp_path, capsys, nothing_converts):
    out = tmp_path / "out"
    out.mkdir()
    (out / "Wan2.1_VAE.pth").write_bytes(b"another VAE")
    code, _, err = _run(["--src", str(release), "--out", str(out)], capsys)
    _one_line(code, err, "--out", "already holds Wan2.1_VAE.pth")
    assert (out / "Wan2.1_VAE.pth").read_bytes() == b"another VAE"


def test_an_identical_copy_of_a_shared_file_is_not_in_the_way(release, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(release / "Wan2.1_VAE.pth", out / "Wan2.1_VAE.pth")
    copy = (out / "Wan2.1_VAE.pth").stat()
    code, lines, err = _run(["--src", str(release), "--out", str(out)], capsys)
    assert code == 0, err
    assert any("Wan2.1_VAE.pth: already there (the same)" in line for line in lines)
    assert (out / "Wan2.1_VAE.pth").stat().st_ino == copy.st_ino


def test_interrupted_run_leaves_nothing_that_looks_complete(release, tmp_path, capsys, monkeypatch):
    real = quantize.convert_to_nf4
    calls = []

    def interrupted(plan, folder, device, progress):
        calls.append(folder)
        if len(calls) == 2:  # the second expert, midway: part of its file is written
            def stop(p):
                if p.tensors_done == 20:
                    raise KeyboardInterrupt
            return real(plan, folder, device, stop)
        return real(plan, folder, device, progress)

    monkeypatch.setattr(quantize, "convert_to_nf4", interrupted)
    out = tmp_path / "out"
    code, _, err = _run(["--src", str(release), "--out", str(out)], capsys)
    assert code == 130 and err == ["quantize: interrupted"]
    assert calls[1].name.startswith(".low_noise_model_bnb_nf4.partial-")
    assert not calls[1].exists() and not (out / "low_noise_model_bnb_nf4").exists()
    assert (out / "high_noise_model_bnb_nf4" / "model.safetensors").is_file()  # finished before the interruption


def test_a_killed_run_s_leftover_is_hidden_and_named(release, tmp_path, capsys):
    out = tmp_path / "out"
    leftover = out / ".high_noise_model_bnb_nf4.partial-12345"
    leftover.mkdir(parents=True)
    (leftover / "model.safetensors").write_bytes(b"half")
    code, lines, err = _run(["--src", str(release), "--out", str(out)], capsys)
    assert code == 0, err
    assert f"note: {leftover} is left from an interrupted run; delete it" in lines
    assert find_package(out).high.name == "high_noise_model_bnb_nf4"


def test_other_filesystem_copies_and_says_so(release, tmp_path, capsys, monkeypatch):
    def no_link(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(quantize.os, "link", no_link)
    out = tmp_path / "out"
    code, lines, err = _run(["--src", str(release), "--out", str(out)], capsys)
    assert code == 0, err
    assert "Wan2.1_VAE.pth: copied (--out is on another filesystem)" in "\n".join(lines)
    for name in ("Wan2.1_VAE.pth", "tokenizer/tokenizer.json"):
        assert not (out / name).samefile(release / name)
        assert (out / name).read_bytes() == (release / name).read_bytes()
        assert (release / name).is_file()  # copied, never moved


def test_progress_lines_count_tensors_bytes_and_time_left(release, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(quantize, "PROGRESS_SECONDS", 0.0)
    code, lines, err = _run(["--src", str(release), "--out", str(tmp_path / "out")], capsys)
    assert code == 0, err
    progress = [line for line in lines if line.startswith("  high_noise_model: ")]
    assert len(progress) == 91  # one per source tensor when nothing throttles them
    assert progress[0].startswith("  high_noise_model: 1/91 tensors, ") and " MB of ~" in progress[0]
    assert progress[0].endswith(" left") and not progress[-1].endswith(" left")
    assert progress[-1].startswith("  high_noise_model: 91/91 tensors, ")


def test_help_lists_the_defaults(capsys):
    with pytest.raises(SystemExit):
        quantize.parse_args(["--help"])
    text = capsys.readouterr().out
    assert "(default: cpu)" in text and "--overwrite" in text and "9.6 GB NF4" in text


def test_checkout_entry_point(release, tmp_path):
    """The real process through `python <checkout> quantize`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    done = subprocess.run([sys.executable, str(ROOT), "quantize", "--src", str(release), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "kernels" not in done.stderr
    assert "peak RSS" in done.stdout and (tmp_path / "o" / "low_noise_model_bnb_nf4" / "model.safetensors").is_file()
    done = subprocess.run([sys.executable, str(ROOT), "quantize", "--src", str(tmp_path / "nope"), "--out", "x"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"quantize: error: --src: {tmp_path / 'nope'} does not exist"]


@pytest.mark.parametrize("inside", [".", "high_noise_model", "high_noise_model/nf4"])
def test_an_out_inside_the_release_is_refused_naming_both(release, tmp_path, capsys, nothing_converts, inside):
    """--out inside --src wrote the package into the release's own (expert) folders."""
    out = release / inside
    code, _, err = _run(["--src", str(release), "--out", str(out)], capsys)
    _one_line(code, err, "--out", str(out), str(release), "choose an --out outside")
    assert not any(release.rglob("*_bnb_nf4")) and not any(release.rglob(".*partial*"))


def test_an_out_inside_another_expert_folder_is_refused(release, package, tmp_path, capsys, nothing_converts):
    out = package / "high_noise_model_bnb_nf4" / "more"
    code, _, err = _run(["--src", str(release), "--out", str(out)], capsys)
    _one_line(code, err, "--out", str(out), f"inside the expert folder {package / 'high_noise_model_bnb_nf4'}")
