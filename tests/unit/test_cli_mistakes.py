"""Command-line mistakes: each answers in one line naming the flag, exit code
2, before any model loads; and the help texts a new user reads."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import tiny_package
from comfyui_lingbot_world.pipeline import generate as whole_run
from comfyui_lingbot_world.tools import cli, generate, make_checkpoint

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    return tiny_package.build(tmp_path_factory.mktemp("cli_mistakes"), "nf4")


@pytest.fixture
def image(tmp_path) -> Path:
    path = tmp_path / "start.png"
    Image.new("RGB", (64, 48), (40, 90, 160)).save(path)
    return path


@pytest.fixture
def nothing_loads(monkeypatch):
    """Fail the test if the pipeline (the first thing that loads a model) is reached."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model would have been loaded")

    monkeypatch.setattr(generate, "generate", refuse)  # tools/generate.py's pipeline.generate.generate
    monkeypatch.setattr(whole_run, "encode_text", refuse)


def _answer(argv: list[str], capsys) -> tuple[int, list[str]]:
    code = cli.run("generate", generate.main, argv)
    return code, capsys.readouterr().err.strip().splitlines()


def _argv(package: Path, image: Path, out: Path, *extra: str) -> list[str]:
    return ["--package", str(package), "--image", str(image), "--prompt", "a walk", "--out", str(out),
            "--size", "32x32", "--steps", "1", *extra]


def _one_line_naming(code: int, err: list[str], flag: str) -> str:
    assert code == 2, (code, err)
    assert len(err) == 1, err
    assert err[0].startswith(f"generate: error: {flag}:"), err[0]
    return err[0]


# (ids without the word "gpu": tests/conftest.py skips tests whose keywords hold it)
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "gpu", "cuda:x"], ids=["cuda", "cuda-0", "the-word", "cuda-x"])
def test_device_without_a_gpu_is_one_line(package, image, tmp_path, capsys, nothing_loads, monkeypatch, device):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    line = _one_line_naming(*_answer(_argv(package, image, tmp_path / "v.mp4", "--device", device), capsys),
                            "--device")
    assert "cpu" in line


def test_device_index_beyond_the_gpus_is_one_line(package, image, tmp_path, capsys, nothing_loads, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    line = _one_line_naming(*_answer(_argv(package, image, tmp_path / "v.mp4", "--device", "cuda:3"), capsys),
                            "--device")
    assert "cuda:0" in line


def test_zero_frames_is_refused_not_replaced_by_81(package, image, tmp_path, capsys, nothing_loads):
    line = _one_line_naming(*_answer(_argv(package, image, tmp_path / "v.mp4", "--frames", "0"), capsys), "--frames")
    assert "got 0" in line


def test_empty_action_string_is_refused_not_a_video_without_camera(package, image, tmp_path, capsys, nothing_loads):
    line = _one_line_naming(*_answer(_argv(package, image, tmp_path / "v.mp4", "--actions", ""), capsys),
                            "--actions")
    assert "empty" in line


@pytest.mark.parametrize("seed", ["12345678901234567890123", "-1", str(2**64)])
def test_seed_out_of_range_is_refused_before_the_text_encoder(package, image, tmp_path, capsys, nothing_loads, seed):
    line = _one_line_naming(*_answer(_argv(package, image, tmp_path / "v.mp4", "--frames", "5", "--seed", seed),
                                     capsys), "--seed")
    assert str(2**64 - 1) in line


def test_largest_seed_is_accepted(package, image, tmp_path, capsys, monkeypatch):
    seen = {}

    def record(*args, **kwargs):
        seen["seed"] = args[9].seed  # generate(..., camera, params, ...)
        raise KeyboardInterrupt

    monkeypatch.setattr(generate, "generate", record)
    code, _ = _answer(_argv(package, image, tmp_path / "v.mp4", "--frames", "5", "--seed", str(2**64 - 1)), capsys)
    assert code == 130 and seen["seed"] == 2**64 - 1


def test_incomplete_package_names_the_flag(image, tmp_path, capsys, nothing_loads):
    folder = tmp_path / "half"
    folder.mkdir()
    (folder / "Wan2.1_VAE.pth").write_bytes(b"x")
    line = _one_line_naming(*_answer(_argv(folder, image, tmp_path / "v.mp4"), capsys), "--package")
    assert "high-noise expert folder" in line


def test_missing_poses_file_names_the_flag(package, image, tmp_path, capsys, nothing_loads):
    folder = tmp_path / "camera"
    folder.mkdir()
    np.save(folder / "intrinsics.npy", np.array([500.0, 500.0, 416.0, 240.0]))
    line = _one_line_naming(*_answer(_argv(package, image, tmp_path / "v.mp4", "--frames", "5", "--camera-dir",
                                           str(folder)), capsys), "--camera-dir")
    assert "poses.npy" in line and "not found" in line


def test_missing_pose_export_and_bad_intrinsics_name_their_flags(package, image, tmp_path, capsys, nothing_loads):
    _one_line_naming(*_answer(_argv(package, image, tmp_path / "v.mp4", "--frames", "5", "--poses-from",
                                    str(tmp_path / "nope.npz")), capsys), "--poses-from")
    scalar = tmp_path / "intrinsics.npy"
    np.save(scalar, np.float64(500.0))  # a 0-d array
    line = _one_line_naming(*_answer(_argv(package, image, tmp_path / "v.mp4", "--frames", "5", "--actions", "w-4",
                                           "--intrinsics", str(scalar)), capsys), "--intrinsics")
    assert "expected [N, 4] or [4]" in line


def _run_checkout(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    return subprocess.run([sys.executable, str(ROOT), *args], capture_output=True, text=True, env=env, timeout=120)


def test_checkout_help_exits_0_and_lists_the_tools():
    done = _run_checkout("--help")
    assert done.returncode == 0, done.stderr
    assert "generate" in done.stdout and "make_checkpoint" in done.stdout


def test_unknown_tool_is_one_line_exit_2():
    done = _run_checkout("frobnicate")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1



@pytest.mark.parametrize("tool", [generate, make_checkpoint], ids=["generate", "make_checkpoint"])
def test_help_prints_each_default_once_and_no_document_references(tool, capsys):
    with pytest.raises(SystemExit) as stop:
        tool.parse_args(["--help"])
    assert stop.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines anywhere
    assert not re.search(r"\(default: [^()]*\)\s*\(default:", text), text
    assert "SPEC" not in text and "layout A" not in text and "layout B" not in text


def test_parts_default_is_printed_once(capsys):
    with pytest.raises(SystemExit):
        make_checkpoint.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert text.count("(default: experts,t5,vae,tokenizer)") == 1


# ------------------------------------------------------- mistakes found only at the first step before

@pytest.mark.parametrize("backend", ["flash", "flash_fp8", "sage"])
def test_attention_backend_that_cannot_run_here_is_one_line_before_work(package, image, tmp_path, capsys,
                                                                         nothing_loads, backend, monkeypatch):
    """On the CPU (or a GPU the kernel was not built for) the choice answers now, not as a
    traceback at the first sampling step."""
    line = _one_line_naming(*_answer(_argv(package, image, tmp_path / "v.mp4", "--frames", "5", "--device", "cpu",
                                           "--attention", backend), capsys), "--attention")
    assert backend in line and "sdpa" in line
    # The kernel that runs here passes the same check.
    seen = {}

    def record(*args, **kwargs):
        seen["attention"] = args[9].attention
        raise KeyboardInterrupt

    monkeypatch.setattr(generate, "generate", record)
    code, _ = _answer(_argv(package, image, tmp_path / "v.mp4", "--frames", "5", "--device", "cpu",
                            "--attention", "sdpa"), capsys)
    assert code == 130 and seen["attention"] == "sdpa"


@pytest.mark.parametrize("variable, value, expected", [
    ("LINGBOT_ATTENTION", "flash", "generate: error: LINGBOT_ATTENTION=flash cannot run here: flash needs a CUDA GPU, "
     "and attention runs on cpu; what runs here: sdpa; unset LINGBOT_ATTENTION or set it to sdpa"),
    ("LINGBOT_ATTENTION", "xformers", "generate: error: LINGBOT_ATTENTION='xformers' is not a value it takes: one of "
     "sdpa, flash, flash_fp8, sage (unset: auto's own pick); unset LINGBOT_ATTENTION for its default"),
    ("LINGBOT_FUSED", "maybe", "generate: error: LINGBOT_FUSED='maybe' is not a value it takes: 0 or 1 (unset: 1); "
     "unset LINGBOT_FUSED for its default"),
])
def test_an_environment_switch_is_checked_as_early_as_the_flags(package, image, tmp_path, variable, value, expected):
    """The real process with a switch set to what cannot run or is no value: one line naming the
    variable, its value and what runs, exit 2, before any model loads (no plan line)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")} | {variable: value}
    done = subprocess.run([sys.executable, str(ROOT), "generate", *_argv(package, image, tmp_path / "v.mp4", "--frames",
                                                                         "5", "--device", "cpu")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert (done.returncode, done.stderr.strip().splitlines()) == (2, [expected]), done.stderr[-2000:]
    assert not (tmp_path / "v.mp4").exists()


@pytest.mark.parametrize("content", [b"not a safetensors file at all", "unrelated"], ids=["junk-bytes", "other-model"])
def test_junk_lora_file_is_one_line_before_work(package, image, tmp_path, capsys, nothing_loads, content,
                                                monkeypatch):
    lora = tmp_path / "style.safetensors"
    if content == "unrelated":
        from safetensors.torch import save_file
        save_file({"text_model.layer.lora_down.weight": torch.zeros(4, 32),
                   "text_model.layer.lora_up.weight": torch.zeros(32, 4)}, str(lora))
    else:
        lora.write_bytes(content)
    line = _one_line_naming(*_answer(_argv(package, image, tmp_path / "v.mp4", "--frames", "5", "--device", "cpu",
                                           "--lora", str(lora), "1.0", "1.0"), capsys), "--lora")
    assert "style.safetensors" in line
    # A LoRA that fits the experts passes the same check and reaches the run.
    from synthetic_lora import write_kohya_lora

    from comfyui_lingbot_world.loaders.package import find_package

    fits = write_kohya_lora(tmp_path / "fits.safetensors", find_package(package).high)
    seen = {}

    def record(*args, **kwargs):
        seen["loras"] = kwargs["loras"]
        raise KeyboardInterrupt

    monkeypatch.setattr(generate, "generate", record)
    code, err = _answer(_argv(package, image, tmp_path / "v.mp4", "--frames", "5", "--device", "cpu",
                              "--lora", str(fits), "1.0", "0.5"), capsys)
    assert code == 130, err
    assert [(spec.path, spec.strength_high, spec.strength_low) for spec in seen["loras"]] == [(fits, 1.0, 0.5)]


def test_camera_dir_shorter_than_the_video_is_one_line_before_work(package, image, tmp_path, capsys, nothing_loads):
    from comfyui_lingbot_world.wan.camera_presets import preset_trajectory

    folder = tmp_path / "camera"
    folder.mkdir()
    poses, k = preset_trajectory("orbit_left", 9)
    np.save(folder / "poses.npy", poses)
    np.save(folder / "intrinsics.npy", k)
    line = _one_line_naming(*_answer(_argv(package, image, tmp_path / "v.mp4", "--frames", "33", "--camera-dir",
                                           str(folder)), capsys), "--camera-dir")
    assert "9 poses" in line and "33" in line


@pytest.mark.parametrize("inside", [False, True], ids=["the-file", "below-a-file"])
def test_cache_dir_that_is_a_file_is_one_line_before_work(package, image, tmp_path, capsys, nothing_loads, inside):
    blocker = tmp_path / "cache.txt"
    blocker.write_text("a file")
    cache = blocker / "prompts" if inside else blocker
    line = _one_line_naming(*_answer(_argv(package, image, tmp_path / "v.mp4", "--frames", "5", "--cache-dir",
                                           str(cache)), capsys), "--cache-dir")
    assert "cache.txt" in line and "is a file" in line



# ------------------------------------------------------- the words of the answers

def test_an_empty_prompt_file_is_refused_and_a_byte_order_mark_is_not_part_of_the_prompt(package, image, tmp_path,
                                                                                          capsys, monkeypatch):
    prompts = []

    def record(package, image, prompt, *args, **kwargs):
        prompts.append(prompt)
        raise KeyboardInterrupt  # stop before any model loads

    monkeypatch.setattr(generate, "generate", record)
    prompt_file = tmp_path / "prompt.txt"
    argv = _argv(package, image, tmp_path / "v.mp4", "--frames", "5")
    argv[argv.index("--prompt"):argv.index("--prompt") + 2] = ["--prompt-file", str(prompt_file)]
    for empty in (b"", b"\xef\xbb\xbf \n"):  # nothing, or only a byte-order mark and blanks
        prompt_file.write_bytes(empty)
        line = _one_line_naming(*_answer(argv, capsys), "--prompt-file")
        assert line.endswith(f'{prompt_file} holds no text; write the prompt in it, or give --prompt "" for a video '
                             "without a prompt")
    prompt_file.write_bytes("\ufeffa walk by the sea\n".encode("utf-8"))  # what Notepad saves
    assert _answer(argv, capsys)[0] == 130 and prompts == ["a walk by the sea"]


def test_a_file_given_for_a_folder_and_a_folder_for_a_file_say_it_once(package, image, tmp_path, capsys,
                                                                       nothing_loads):
    line = _one_line_naming(*_answer(_argv(image, image, tmp_path / "v.mp4"), capsys), "--package")
    assert line.endswith(f"{image} is a file; give the package folder")
    line = _one_line_naming(*_answer(_argv(package, tmp_path, tmp_path / "v.mp4"), capsys), "--image")
    assert line.endswith(f"{tmp_path} is a folder; give the image file")


def test_an_unwritable_preview_folder_names_preview(package, image, tmp_path, capsys, nothing_loads, monkeypatch):
    locked = tmp_path / "pictures"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(cli.os, "access", lambda p, mode: False if Path(p) == locked else real_access(p, mode))
    line = _one_line_naming(*_answer(_argv(package, image, tmp_path / "v.mp4", "--preset", "dolly_in", "--preview",
                                           str(locked / "path.png")), capsys), "--preview")
    assert line.endswith(f"folder {locked} is not writable; choose another --preview")


@pytest.mark.parametrize("tool", [generate, make_checkpoint], ids=["generate", "make_checkpoint"])
def test_help_shows_no_empty_default(tool, capsys):
    with pytest.raises(SystemExit):
        tool.parse_args(["--help"])
    assert "(default: )" not in capsys.readouterr().out


def test_a_tool_name_with_a_capital_gets_a_suggestion_and_version_prints_the_version():
    done = _run_checkout("Generate")
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "error: 'Generate' is not a tool; did you mean generate? (tools: make_checkpoint, generate, quantize; "
        "python <checkout> --help)"]
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    done = _run_checkout("--version")
    assert done.returncode == 0 and done.stdout == f"comfyui-lingbot-world {version}\n", done.stderr
