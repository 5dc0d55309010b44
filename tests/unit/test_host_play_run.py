"""nodes/host/play_run.py, what a Play session under ComfyUI records for its replay: the Load
Image file behind the node's image (from ComfyUI's hidden prompt), the start image's file
and pixel hashes, the prompt texts or where they came from; and ComfyUI's interrupt type.
A whole session through it: test_node_play.py; its log read back: test_node_play_log.py."""
from __future__ import annotations

import hashlib
from types import SimpleNamespace

import numpy as np
import torch
from PIL import Image

from comfy_host import use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
import comfy.model_management as mm  # noqa: E402

from comfyui_lingbot_world.nodes.host.play_run import (  # noqa: E402
    interrupt_types,
    prompt_recipe,
    start_image_record,
    start_image_source,
)

PLAY_ID = "12"


def hidden(prompt: dict | None, unique_id: str | None = PLAY_ID) -> SimpleNamespace:
    return SimpleNamespace(prompt=prompt, unique_id=unique_id)


def play_fed_by(source: dict) -> dict:
    """A prompt where node 3 feeds the Play node's image."""
    return {"3": source, PLAY_ID: {"class_type": "LingBotWorldPlay", "inputs": {"image": ["3", 0], "width": 48}}}


def test_the_load_image_file_behind_the_image_is_found_in_the_prompt():
    load_image = {"class_type": "LoadImage", "inputs": {"image": "street.png", "upload": "image"}}
    assert start_image_source(hidden(play_fed_by(load_image))) == "street.png"
    assert start_image_source(hidden(play_fed_by(load_image), unique_id=12)) == "street.png"  # an int id too


def test_no_file_when_another_node_feeds_the_image_or_there_is_no_prompt():
    assert start_image_source(hidden(play_fed_by({"class_type": "ImageScale", "inputs": {"image": "x.png"}}))) is None
    assert start_image_source(hidden(play_fed_by({"class_type": "LoadImage", "inputs": {"image": ["9", 0]}}))) is None
    assert start_image_source(hidden({PLAY_ID: {"inputs": {"image": "pasted"}}})) is None  # not a link
    assert start_image_source(hidden(None)) is None and start_image_source(hidden({}, unique_id=None)) is None
    assert start_image_source(None) is None


def test_the_record_hashes_the_file_and_the_float32_pixels_the_node_got(comfy_dirs):
    picture = comfy_dirs["input"] / "street.png"
    Image.fromarray(np.random.default_rng(2).integers(0, 256, (8, 12, 3), dtype=np.uint8)).save(picture)
    image = torch.rand(1, 8, 12, 3, dtype=torch.float64)  # the batch's first image, as float32
    pixels = hashlib.sha256(image[0].float().numpy().tobytes()).hexdigest()
    assert start_image_record(image, "street.png") == {
        "file": "street.png", "sha256": hashlib.sha256(picture.read_bytes()).hexdigest(), "pixels_sha256": pixels}
    assert start_image_record(image, None) == {"file": None, "sha256": None, "pixels_sha256": pixels}
    # a name whose file went: the name stays, its hash is unknown
    assert start_image_record(image, "gone.png") == {"file": "gone.png", "sha256": None, "pixels_sha256": pixels}


def test_the_prompt_texts_come_from_the_text_encoder_or_the_log_says_where_they_are():
    text = SimpleNamespace(prompt="a street at night", negative_prompt="blur")
    assert prompt_recipe(text) == {"prompt": "a street at night", "negative_prompt": "blur", "prompt_source": "text"}
    for other in (None, SimpleNamespace(prompt=None, negative_prompt=None)):  # a CONDITIONING, or an old text
        recipe = prompt_recipe(other)
        assert (recipe["prompt"], recipe["negative_prompt"]) == (None, None)
        assert recipe["prompt_source"].startswith("positive: a CONDITIONING")


def test_comfyuis_interrupt_is_what_ends_a_session_as_interrupted():
    assert interrupt_types() == (mm.InterruptProcessingException,)
