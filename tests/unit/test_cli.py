"""The command-line tools: a user mistake answers in one line naming the flag and the fix,
before anything is loaded; --help shows defaults; third-party start-up noise is silenced."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from comfyui_lingbot_world.tools import cli, generate, make_checkpoint

ROOT = Path(__file__).resolve().parents[2]


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


def _run_generate(argv: list[str], capsys) -> tuple[int, list[str]]:
    code = cli.run("generate", generate.main, argv)
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


def _base(package: Path, image: Path, out: Path) -> list[str]:
    return ["--package", str(package), "--image", str(image), "--prompt", "a walk", "--out", str(out),
            "--size", "32x32", "--frames", "5", "--steps", "1"]


@pytest.mark.parametrize(
    "change, flag, fix",
    [
        (lambda a, t: a.__setitem__(1, str(t / "missing_package")), "--package", "does not exist"),
        (lambda a, t: a.__setitem__(3, str(t / "missing.jpg")), "--image", "does not exist"),
        (lambda a, t: a.__setitem__(9, "31x32"), "--size", "multiple of 16"),
        (lambda a, t: a.__setitem__(9, "big"), "--size", "HEIGHTxWIDTH"),
        (lambda a, t: a.__setitem__(11, "6"), "--frames", "4n+1"),
        (lambda a, t: a.__setitem__(7, str(t / "no_such_folder" / "v.mp4")), "--out", "create it first"),
        (lambda a, t: a.__setitem__(7, str(t / "v.gif")), "--out", "must end in .mp4"),
        (lambda a, t: a.__setitem__(13, "0"), "--steps", "at least 1"),
        (lambda a, t: a.extend(["--actions", "w-10,q-3"]), "--actions", "'q-3'"),
        (lambda a, t: a.extend(["--window", "8"]), "--window", "4n+1"),
    ],
    ids=["missing-package", "missing-image", "size-not-16", "size-not-HxW", "bad-frames", "out-folder-missing",
         "out-suffix", "zero-steps", "bad-action", "bad-window"],
)
def test_each_mistake_is_one_line_naming_the_flag(package, image, tmp_path, capsys, nothing_loads, change, flag, fix):
    argv = _base(package, image, tmp_path / "v.mp4")
    change(argv, tmp_path)
    code, err = _run_generate(argv, capsys)
    assert code == 2
    assert len(err) == 1, err
    assert err[0].startswith(f"generate: error: {flag}:"), err[0]
    assert fix in err[0]


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only folder")
def test_unwritable_out_folder(package, image, tmp_path, capsys, nothing_loads):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        code, err = _run_generate(_base(package, image, locked / "v.mp4"), capsys)
    finally:
        locked.chmod(0o700)
    assert code == 2 and len(err) == 1 and "--out" in err[0] and "not writable" in err[0]


def test_unwritable_out_is_refused_by_access_check(package, image, tmp_path, capsys, nothing_loads, monkeypatch):
    # The same rule where the test runs as root (CI): os.access is what the check asks.
    real_access = os.access
    monkeypatch.setattr(cli.os, "access", lambda p, mode: False if Path(p) == tmp_path else real_access(p, mode))
    code, err = _run_generate(_base(package, image, tmp_path / "v.mp4"), capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("generate: error: --out:") and "not writable" in err[0]


def test_existing_out_is_kept_unless_overwrite(package, image, tmp_path, capsys, nothing_loads):
    out = tmp_path / "v.mp4"
    out.write_bytes(b"the user's video")
    code, err = _run_generate(_base(package, image, out), capsys)
    assert code == 2 and "--overwrite" in err[0]
    assert out.read_bytes() == b"the user's video"


def test_incomplete_package_names_what_is_missing(image, tmp_path, capsys, nothing_loads):
    empty = tmp_path / "pkg"
    empty.mkdir()
    code, err = _run_generate(_base(empty, image, tmp_path / "v.mp4"), capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("generate: error: --package:")  # a usage error: rc 2
    assert "high-noise expert folder" in err[0] and "text encoder" in err[0]


def test_one_expert_folder_as_the_package_names_the_folder_above(packages, image, tmp_path, capsys, nothing_loads):
    for layout, folder in (("nf4", "high_noise_model_bnb_nf4"), ("bf16", "low_noise_model")):
        expert = packages[layout] / folder
        code, err = _run_generate(_base(expert, image, tmp_path / "v.mp4"), capsys)
        expected = (f"generate: error: --package: {expert}: is the folder of one expert ({layout}); give the package "
                    f"folder above it ({packages[layout]}), which holds both experts, the text encoder, the VAE and "
                    "the tokenizer")
        assert (code, err) == (2, [expected])


@pytest.mark.parametrize("weights, quantize, held", [("int8", [], "int8"), ("as stored", ["--quantize", "nf4"], "nf4"),
                                                     ("auto", [], None)])
def test_weights_reach_the_experts_through_the_loaders_decider(packages, image, tmp_path, capsys, monkeypatch,
                                                               weights, quantize, held):
    """--weights is the DiT loaders' weights input: decided per expert by
    pipeline.experts.weight_kind_for (auto off CUDA: as stored), the kind each expert loads in."""
    from comfyui_lingbot_world.pipeline import experts

    loaded = []

    def record(folder, device, quantize=None, blocks_on_gpu=None):
        loaded.append((Path(folder).name, quantize))
        raise KeyboardInterrupt  # nothing more to see: the run stops at its first expert
    monkeypatch.setattr(experts, "load_expert", record)
    code, _ = _run_generate(_base(packages["bf16"], image, tmp_path / "v.mp4") + ["--weights", weights, *quantize],
                            capsys)
    assert code == 130 and loaded == [("high_noise_model", held)]


def test_bad_pose_folder_fails_before_loading(package, image, tmp_path, capsys, nothing_loads):
    poses = tmp_path / "cam"
    poses.mkdir()
    (poses / "poses.npy").write_bytes(b"not numpy")
    (poses / "intrinsics.npy").write_bytes(b"not numpy")
    code, err = _run_generate(_base(package, image, tmp_path / "v.mp4") + ["--camera-dir", str(poses)], capsys)
    assert code == 2 and len(err) == 1 and "poses.npy" in err[0] and "--camera-dir" in err[0]  # a usage error: rc 2


def test_help_text_lists_defaults_and_rules(capsys):
    with pytest.raises(SystemExit):
        generate.parse_args(["--help"])
    out = capsys.readouterr().out
    for expected in ("(default: 81)", "4n+1", "(default: 40)", "(default: 5.0 5.0)", "(default: 0)", "multiples of 16"):
        assert expected in out
    with pytest.raises(SystemExit):
        make_checkpoint.parse_args(["--help"])
    assert "(default: cpu)" in capsys.readouterr().out


def test_checkout_entry_point_is_quiet_and_one_line(tmp_path, image):
    """The real process: one stderr line, exit 2, no traceback, no bitsandbytes chatter."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    done = subprocess.run(
        [sys.executable, str(ROOT), "generate", "--package", str(tmp_path / "nope"), "--image", str(image),
         "--prompt", "x", "--out", str(tmp_path / "v.mp4")],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines == [f"generate: error: --package: package folder {tmp_path / 'nope'} does not exist"], done.stderr
    assert "Traceback" not in done.stderr and "kernels" not in done.stderr


# --------------------------------------------------------------------------- generate: Base-Cam or Act


def _act_folder(tmp_path: Path, frames: int = 9, action: bool = True) -> Path:
    import numpy as np

    from comfyui_lingbot_world.wan.act_control import wasd_from_actions
    from comfyui_lingbot_world.wan.camera_presets import preset_trajectory

    folder = tmp_path / "act_example"
    folder.mkdir()
    poses, k = preset_trajectory("orbit_left", frames)
    np.save(folder / "poses.npy", poses)
    np.save(folder / "intrinsics.npy", k)
    if action:
        np.save(folder / "action.npy", wasd_from_actions("w-4,d-5", frames))
    return folder


def test_an_action_string_longer_than_the_video_is_one_line_naming_both(package, image, tmp_path, capsys,
                                                                        nothing_loads):
    code, err = _run_generate(_base(package, image, tmp_path / "v.mp4") + ["--actions", "w-6,j-3"], capsys)
    assert code == 2 and len(err) == 1
    assert err[0].startswith("generate: error: --actions:") and "9 action frames but the video has 5 frames" in err[0]


@pytest.mark.parametrize("camera, fix", [
    (["--preset", "dolly_in"], "--preset: --package .*tiny_act_nf4 is an Act checkpoint .* the camera "
                               "\\(preset 'dolly_in'\\) .* --actions and --camera-dir"),
    ("camera-dir-without-action", "--camera-dir: the package is an Act checkpoint: it needs the W/A/S/D keys"),
])
def test_an_act_package_with_base_cam_controls_is_refused_before_loading(act_packages, image, tmp_path, capsys,
                                                                        nothing_loads, camera, fix):
    if camera == "camera-dir-without-action":
        camera = ["--camera-dir", str(_act_folder(tmp_path, action=False))]
    code, err = _run_generate(_base(act_packages["nf4"], image, tmp_path / "v.mp4") + camera, capsys)
    assert code == 2 and len(err) == 1
    assert re.search(fix, err[0]), err[0]


def test_generate_runs_the_act_package_from_actions_and_from_action_npy(act_packages, packages, image, tmp_path):
    """Whole runs on the tiny Act package (CPU): an action string, and poses + action.npy. The
    Base-Cam package reads the same folder as a plain camera path (action.npy unused)."""
    folder = _act_folder(tmp_path)
    runs = {"act-actions": (act_packages["nf4"], ["--actions", "w-3,aj-4"]),
            "act-files": (act_packages["nf4"], ["--camera-dir", str(folder)]),
            "base-files": (packages["nf4"], ["--camera-dir", str(folder)])}
    for name, (package, camera) in runs.items():
        out = tmp_path / f"{name}.mp4"
        argv = _base(package, image, out) + camera
        argv[argv.index("--frames") + 1] = "9"
        assert cli.run("generate", generate.main, argv) == 0, name
        assert out.is_file() and out.stat().st_size > 0, name


# --------------------------------------------------------------------------- generate: the picture


@pytest.fixture
def captured(monkeypatch) -> dict:
    """What generate would make the video from (the pipeline is not run)."""
    seen: dict = {}

    class Result:
        frames_written, windows_done = 5, 1

    def record(package, image, prompt, negative, frames, height, width, out, *args, **kwargs):
        seen.update(image=image, height=height, width=width, prompt=prompt)
        with out:  # the GrowingFile at --out, as pipeline/generate.py fills it
            out.path.write_bytes(b"frames")
            out.piece_done()
        return Result()

    monkeypatch.setattr(generate, "generate", record)
    return seen


def test_a_portrait_phone_photo_makes_an_upright_portrait_video(package, tmp_path, capsys, captured):
    from test_image_file import phone_photo

    photo = tmp_path / "phone.jpg"
    upright = phone_photo(photo, 6)  # stored 96 wide, 48 tall, Orientation 6: a portrait photo
    argv = _base(package, photo, tmp_path / "v.mp4")
    del argv[8:10]  # no --size: the picture's aspect decides
    code, err = _run_generate(argv, capsys)
    assert code == 0, err
    assert captured["image"].size == upright.size == (48, 96)
    assert (captured["height"], captured["width"]) == (880, 432)  # about 480*832 pixels, standing up
    assert err[0] == "5 frames at 432x880 in 1 window(s) of up to 81"


def test_a_picture_far_from_the_models_aspect_needs_size(package, tmp_path, capsys, captured):
    strip = tmp_path / "strip.png"
    Image.new("RGB", (16, 4000), (40, 90, 160)).save(strip)
    argv = _base(package, strip, tmp_path / "v.mp4")
    code, err = _run_generate(argv[:8] + argv[10:], capsys)  # no --size
    assert code == 2 and len(err) == 1 and not captured, err
    assert err[0] == (f"generate: error: --image: {strip} is 16×4000 pixels, an aspect of 250.0:1, far from the 832×480 "
                      "(1.7:1, or portrait) the model was trained near; at its aspect the video would be 9984x32. Give "
                      "--size HEIGHTxWIDTH (e.g. --size 480x832; the picture is stretched to it), or crop the picture")
    code, err = _run_generate(argv, capsys)  # --size 32x32: made, with a note
    assert code == 0 and (captured["height"], captured["width"]) == (32, 32)
    assert err[0] == "generate: note: --image: strip.png is 16×4000 pixels, an aspect of 250.0:1, far from the " \
                     "832×480 (1.7:1, or portrait) the model was trained near"


def test_a_huge_picture_is_a_note_and_one_beyond_pillows_limit_one_line(package, tmp_path, capsys, captured):
    import warnings

    huge, bomb = tmp_path / "huge.png", tmp_path / "bomb.png"
    Image.new("1", (10000, 10000)).save(huge)
    Image.new("1", (20000, 10000)).save(bomb)
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)  # printed raw, were it let through
        code, err = _run_generate(_base(package, huge, tmp_path / "v.mp4"), capsys)
    assert code == 0, err
    assert err[0].startswith("generate: note: --image: huge.png is 10000×10000 pixels (100 megapixels)")
    code, err = _run_generate(_base(package, bomb, tmp_path / "w.mp4"), capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith(f"generate: error: --image: {bomb} holds more than 179 "
                                                             "megapixels"), err
