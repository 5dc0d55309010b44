"""nodes/play_log.py, LingBot-World Play Log (inside the ComfyUI host, no model): the logs it
offers, the values it reads back from a Play session's action log, and every way a log or
its start image can fail to replay, each refused naming the file and the field. A session
replayed through it bit for bit: tests/integration/test_play_replay.py."""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from comfy_host import use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
from comfyui_lingbot_world.nodes.play_log import LingBotWorldPlayLog  # noqa: E402
from comfyui_lingbot_world.pipeline.play.log_file import pixels_sha256  # noqa: E402
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
    ({"frames": 20}, "frames is 20, expected the frames of whole chunks: 9 + 12 a chunk (9, 21, 33, 45, ..., 3837)"),
    # 17 frames is 4n+1 with keys for every frame, but no session makes it (5 latent frames, not whole chunks)
    ({"frames": 17, "actions": "w-8,wj-8"}, "frames is 17, expected the frames of whole chunks: 9 + 12 a chunk (9, 21, 33, 45, ..., 3837)"),
    ({"frames": 33}, "actions hold 20 frames of keys; a session of 33 frames has 32"),
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
    ("{not json", "is not valid JSON"),
    ("[" * 100_000 + "]" * 100_000, "is nested too deeply to be a Play action log"),
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


# --------------------------------------------------------------------------- the start image's decoder
# Core Load Image decoded with PIL up to ComfyUI 0.20 and with PyAV since 0.21 (nodes.py:
# InputImpl.VideoFromFile(path).get_components(); a JPEG's yuvj420p frame as rgb24 / 255):
# the same JPEG gives other pixels from each. The Play node hashes what Load Image gave it.

def pil_load_image(path: Path) -> torch.Tensor:
    """Load Image up to ComfyUI 0.20 (PIL): EXIF orientation applied, RGB, / 255."""
    from PIL import ImageOps

    with Image.open(path) as file:
        frame = ImageOps.exif_transpose(file).convert("RGB")
        return torch.from_numpy(np.array(frame).astype(np.float32) / 255.0)[None]


def pyav_load_image(path: Path) -> torch.Tensor:
    """Load Image from ComfyUI 0.21 on (PyAV): the first frame of the file as rgb24, / 255."""
    import av

    with av.open(str(path)) as container:
        frame = next(container.decode(container.streams.video[0]))
        return torch.from_numpy(frame.to_ndarray(format="rgb24")).float()[None] / 255.0


DECODERS = {"pil": pil_load_image, "pyav": pyav_load_image}


def host_with_load_image(monkeypatch, comfy_dirs, decode) -> None:
    """This process as a ComfyUI whose core Load Image (``nodes.LoadImage``) decodes with ``decode``."""
    import types

    class LoadImage:
        def load_image(self, image: str):
            return decode(comfy_dirs["input"] / image), torch.zeros(1, 64, 64)

    monkeypatch.setitem(sys.modules, "nodes", types.SimpleNamespace(LoadImage=LoadImage))


def jpeg_session_log(comfy_dirs, decode) -> torch.Tensor:
    """A session whose start image is a JPEG, recorded as the Play node records what ``decode`` gave it."""
    from comfyui_lingbot_world.nodes.host.play_run import start_image_record

    picture = comfy_dirs["input"] / "street.jpg"
    Image.fromarray(np.random.default_rng(5).integers(0, 256, (24, 40, 3), dtype=np.uint8)).save(picture, quality=90)
    pixels = decode(picture)
    session_log(comfy_dirs, image="street.jpg", start_image=start_image_record(pixels, "street.jpg"))
    return pixels


def test_the_two_decoders_give_a_jpeg_other_pixels(comfy_dirs):
    picture = comfy_dirs["input"] / "street.jpg"
    Image.fromarray(np.random.default_rng(5).integers(0, 256, (24, 40, 3), dtype=np.uint8)).save(picture, quality=90)
    assert not torch.equal(pil_load_image(picture), pyav_load_image(picture))  # what the tests below rely on


@pytest.mark.parametrize("decoder", sorted(DECODERS))
def test_a_jpeg_session_replays_on_the_host_that_ran_it_whatever_its_decoder(comfy_dirs, monkeypatch, decoder):
    """The replay template as shipped (a JPEG) failed on ComfyUI 0.21+: the session's pixels
    came from PyAV, the Play Log node decoded the file with PIL."""
    decode = DECODERS[decoder]
    host_with_load_image(monkeypatch, comfy_dirs, decode)
    pixels = jpeg_session_log(comfy_dirs, decode)
    assert torch.equal(LingBotWorldPlayLog.execute(LOG).args[0], pixels)


def test_a_session_of_a_pil_host_replays_on_a_pyav_host(comfy_dirs, monkeypatch):
    pixels = jpeg_session_log(comfy_dirs, pil_load_image)  # recorded on ComfyUI 0.20 or older
    host_with_load_image(monkeypatch, comfy_dirs, pyav_load_image)
    assert torch.equal(LingBotWorldPlayLog.execute(LOG).args[0], pixels)


def test_a_host_load_image_that_cannot_read_the_file_leaves_it_to_pil(comfy_dirs, monkeypatch):
    """The host's decoder failing (a format its PyAV build lacks, say) is not the end: PIL, as
    Load Image decoded before 0.21, still replays a session that started from PIL's pixels."""
    def unreadable(path):
        raise RuntimeError("no decoder for this file")

    pixels = jpeg_session_log(comfy_dirs, pil_load_image)
    host_with_load_image(monkeypatch, comfy_dirs, unreadable)
    assert torch.equal(LingBotWorldPlayLog.execute(LOG).args[0], pixels)


def test_a_session_of_a_pyav_host_on_a_pil_host_is_refused_saying_why(comfy_dirs, monkeypatch):
    jpeg_session_log(comfy_dirs, pyav_load_image)
    host_with_load_image(monkeypatch, comfy_dirs, pil_load_image)
    with pytest.raises(ValueError, match=f"log '{LOG}': the start image 'street.jpg' is the session's file .* "
                       "decodes it to other pixels than the session's ComfyUI did"):
        LingBotWorldPlayLog.execute(LOG)


# --------------------------------------------------------------------------- a start image file too large


def test_a_start_image_file_larger_than_an_image_is_refused_unread(comfy_dirs):
    from comfyui_lingbot_world.pipeline.play.log_file import MAX_IMAGE_BYTES

    log = session_log(comfy_dirs)
    huge = comfy_dirs["input"] / "huge.png"
    with open(huge, "wb") as file:
        file.truncate(MAX_IMAGE_BYTES + 1)  # sparse: no disk used
    session_log(comfy_dirs, start_image={**log["start_image"], "file": "huge.png"})
    with pytest.raises(ValueError, match=f"log '{LOG}': the start image 'huge.png': {MAX_IMAGE_BYTES + 1:,} bytes, "
                       "more than an image a session starts from"):
        LingBotWorldPlayLog.execute(LOG)


def test_the_start_image_file_is_hashed_a_piece_at_a_time(comfy_dirs):
    """A log naming a 3 GiB file took the server to +3 GB: the whole file was read to hash it."""
    import tracemalloc

    size = 48 * 1024 * 1024
    big = comfy_dirs["input"] / "big.png"
    with open(big, "wb") as file:
        file.truncate(size)
    digest = hashlib.sha256(bytes(size)).hexdigest()
    log = session_log(comfy_dirs)
    session_log(comfy_dirs, start_image={**log["start_image"], "file": "big.png", "sha256": digest})
    with pytest.raises(ValueError, match="big.png is not an image"):  # once untraced: the decoders' first imports
        LingBotWorldPlayLog.execute(LOG)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="big.png is not an image"):  # its hash matched: then decoded
            LingBotWorldPlayLog.execute(LOG)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < size // 8, f"{peak:,} bytes allocated to check a {size:,}-byte file"
