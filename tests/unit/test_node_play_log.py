"""nodes/play_log.py, LingBot-World Play Log (inside the ComfyUI host, no model): the logs it
offers, the values it reads back from a Play session's action log, and every way a log or
its start image can fail to replay, each refused naming the file and the field. A session
replayed through it bit for bit: tests/integration/test_play_replay.py."""
from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from comfy_host import use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
from comfyui_lingbot_world.nodes.play_log import LingBotWorldPlayLog, pixels_sha256  # noqa: E402
from comfyui_lingbot_world.pipeline.play.session import KEYFRAMES_PLAY  # noqa: E402

LOG = "LingBotWorld/play_00001_.json"


def image_pixels(path: Path) -> torch.Tensor:
    """What core Load Image gives for a plain RGB file."""
    with Image.open(path) as file:
        return torch.from_numpy(np.array(file.convert("RGB")).astype(np.float32) / 255.0)[None]


def session_log(comfy_dirs: dict, name: str = LOG, image: str = "street.png", **changes) -> dict:
    """A Play action log as the Play node saves it (beside its .mp4), its start image in input/."""
    picture = comfy_dirs["input"] / image
    if not picture.exists():
        Image.fromarray(np.random.default_rng(4).integers(0, 256, (24, 40, 3), dtype=np.uint8)).save(picture)
    log = {"actions": "w-8,wj-12", "frames": 21, "chunks": 2, "chunk_keys": ["w", "wj"], "seed": 7, "shift": 10.0,
           "kv_window": 6, "kv_sink": 3, "kv_dtype": "int8", "keyframes": KEYFRAMES_PLAY, "width": 48,
           "height": 32, "vae_precision": "bf16", "fps": 16, "mode": "turn", "ended": "stop",
           "prompt": "a street at night", "negative_prompt": "blur", "prompt_source": "text",
           "start_image": {"file": image, "sha256": hashlib.sha256(picture.read_bytes()).hexdigest(),
                           "pixels_sha256": pixels_sha256(image_pixels(picture))},
           "vae": "lingbot/pkg/Wan2.1_VAE.pth", **changes}
    path = comfy_dirs["output"] / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(log, indent=1))
    path.with_suffix(".mp4").write_bytes(b"")
    return log


def test_the_log_gives_the_fast_clip_nodes_inputs(comfy_dirs):
    log = session_log(comfy_dirs, steps=2)
    out = LingBotWorldPlayLog.execute(LOG).args
    image, rest = out[0], out[1:]
    assert torch.equal(image, image_pixels(comfy_dirs["input"] / "street.png"))
    assert rest == ("a street at night", "blur", "w-8,wj-12", 21, 48, 32, 7, 10.0, 6, 3, "int8", "bf16", 2)
    outputs = [o.id for o in LingBotWorldPlayLog.define_schema().outputs]
    assert outputs[-1] == "steps" and len(outputs) == len(out)  # appended: saved links keep their slots


def test_a_log_saved_before_the_steps_choice_replays_with_four_steps(comfy_dirs):
    session_log(comfy_dirs)  # no "steps" field, as every log written before it
    assert LingBotWorldPlayLog.execute(LOG).args[-1] == 4


def test_the_log_combo_offers_the_play_logs_newest_first(comfy_dirs):
    session_log(comfy_dirs, "LingBotWorld/play_00001_.json")
    session_log(comfy_dirs, "LingBotWorld/play_00002_.json")
    os.utime(comfy_dirs["output"] / "LingBotWorld/play_00001_.json", (time.time() + 60,) * 2)  # the newer one
    (comfy_dirs["output"] / "other.json").write_text("{}")  # no video beside it: not a Play log
    options = LingBotWorldPlayLog.INPUT_TYPES()["required"]["log"]
    offered = options[0] if isinstance(options[0], list) else options[1]["options"]
    assert offered == ["LingBotWorld/play_00001_.json", "LingBotWorld/play_00002_.json"]
    assert LingBotWorldPlayLog.validate_inputs(log="other.json").startswith("log: 'other.json' is not offered")


def test_a_log_replaced_under_the_same_name_runs_again(comfy_dirs):
    session_log(comfy_dirs)
    before = LingBotWorldPlayLog.fingerprint_inputs(LOG)
    session_log(comfy_dirs, seed=8)
    path = comfy_dirs["output"] / LOG
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert LingBotWorldPlayLog.fingerprint_inputs(LOG) != before


@pytest.mark.parametrize("change, message", [
    ({"seed": "7"}, "seed is '7', expected a seed"),
    ({"frames": 20}, "frames is 20, expected 4n+1 frames"),
    ({"frames": 25}, "actions hold 20 frames of keys; a session of 25 frames has 24"),
    ({"actions": "w-8,x-12"}, "actions is not an action string"),
    ({"width": 50}, "width is 50, expected a multiple of 16"),
    ({"kv_sink": 4}, "kv_sink is 4, expected a whole number of latent frames below kv_window - 2 = 4"),
    ({"kv_dtype": "fp8"}, "kv_dtype is 'fp8', expected one of bf16, int8"),
    ({"vae_precision": "fp16"}, "vae_precision is 'fp16', expected one of fp32, bf16"),
    ({"shift": -1}, "shift is -1, expected a number above 0"),
    ({"steps": 5}, "steps is 5, expected one of 4, 3, 2, 1"),
    ({"steps": "2"}, "steps is '2', expected one of 4, 3, 2, 1"),
    ({"steps": True}, "steps is True, expected one of 4, 3, 2, 1"),
    ({"steps": None}, "steps is None, expected one of 4, 3, 2, 1"),
    ({"prompt": None, "prompt_source": "positive: a CONDITIONING"}, "prompt is not recorded: the session took its "
     "prompt from a CONDITIONING input"),
    ({"start_image": {"file": "street.png", "sha256": None, "pixels_sha256": "12"}},
     "start_image.pixels_sha256 is '12', expected a sha256"),
])
def test_a_log_field_that_cannot_replay_is_named(comfy_dirs, change, message):
    session_log(comfy_dirs, **change)
    with pytest.raises(ValueError, match=f"^log '{LOG}': ") as error:
        LingBotWorldPlayLog.execute(LOG)
    assert message in str(error.value)


def test_a_log_missing_a_field_says_which(comfy_dirs):
    session_log(comfy_dirs)
    path = comfy_dirs["output"] / LOG
    log = json.loads(path.read_text())
    del log["kv_window"]
    path.write_text(json.dumps(log))
    with pytest.raises(ValueError, match=f"log '{LOG}': kv_window is missing"):
        LingBotWorldPlayLog.execute(LOG)


@pytest.mark.parametrize("text, message", [
    ("{not json", "not JSON"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({"actions": "w-8", "frames": 9}), "not a LingBot-World Play action log"),
    ("\udcff", "not UTF-8"),
])
def test_a_file_that_is_not_a_play_log_is_refused(comfy_dirs, text, message):
    path = comfy_dirs["output"] / LOG
    path.parent.mkdir(parents=True)
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(ValueError, match=f"log '{LOG}': {message}"):
        LingBotWorldPlayLog.execute(LOG)


@pytest.mark.parametrize("name, message", [
    ("(none)", "log: choose the action log of a LingBot-World Play session"),
    ("LingBotWorld/gone.json", "log: 'LingBotWorld/gone.json' not found in ComfyUI's output folder"),
    ("../input/street.json", "log: '../input/street.json' is outside ComfyUI's output folder"),
    ("LingBotWorld/play_00001_.mp4", "is not a .json file"),
])
def test_a_log_name_outside_the_output_folder_or_missing_is_refused(comfy_dirs, name, message):
    session_log(comfy_dirs)
    (comfy_dirs["input"] / "street.json").write_text("{}")
    with pytest.raises(ValueError, match=re.escape(message)):
        LingBotWorldPlayLog.execute(name)


def test_a_start_image_that_changed_or_went_is_refused_naming_the_file(comfy_dirs):
    session_log(comfy_dirs)
    picture = comfy_dirs["input"] / "street.png"
    Image.fromarray(np.zeros((24, 40, 3), dtype=np.uint8)).save(picture)
    with pytest.raises(ValueError, match="the start image 'street.png' has changed since the session"):
        LingBotWorldPlayLog.execute(LOG)
    picture.unlink()
    with pytest.raises(ValueError, match="the start image 'street.png' is not in ComfyUI's input folder any more"):
        LingBotWorldPlayLog.execute(LOG)


def test_a_start_image_name_that_leaves_the_input_folder_is_refused(comfy_dirs):
    log = session_log(comfy_dirs)
    session_log(comfy_dirs, start_image={**log["start_image"], "file": "../../etc/passwd"})
    with pytest.raises(ValueError, match="start_image.file: '../../etc/passwd' is outside ComfyUI's input folder"):
        LingBotWorldPlayLog.execute(LOG)


def test_the_image_input_replaces_the_file_only_with_the_sessions_pixels(comfy_dirs):
    log = session_log(comfy_dirs)
    pixels = image_pixels(comfy_dirs["input"] / "street.png")
    session_log(comfy_dirs, start_image={**log["start_image"], "file": None, "sha256": None})
    with pytest.raises(ValueError, match="start_image.file is not recorded .*connect that image to this node's image"):
        LingBotWorldPlayLog.execute(LOG)
    assert torch.equal(LingBotWorldPlayLog.execute(LOG, image=pixels).args[0], pixels)
    with pytest.raises(ValueError, match="image: these are not the pixels the session .* started from"):
        LingBotWorldPlayLog.execute(LOG, image=pixels.flip(1))
