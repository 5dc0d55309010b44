"""LingBot-World Play Log: a Play session's action log (the .json beside its .mp4 in the
output folder) read back as the inputs of the Fast clip nodes, so that the session renders
again from the log file alone: the prompt texts for T5 Encode, the start image (the file
the log names, checked against its recorded hashes), the keys and size for the Camera node
(source actions, keyframes per chunk (Play)), the frames for VAE Encode, and the seed, shift,
steps and cache settings for the Fast Sampler.

The start image is decoded by this ComfyUI's own Load Image, the decoder that gave the
session its pixels (ComfyUI decodes with PIL before 0.21 and with PyAV since: a JPEG comes
out as other pixels from each), then, for a log made on a ComfyUI before 0.21, with PIL as
that Load Image did; the pixels' hash must be the log's either way, so the replay is the
session's bit for bit or refused, never close."""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from comfy_api.latest import io

import folder_paths

from ..loaders.image_file import open_image
from ..pipeline.play.log_file import PlayLog, file_sha256, pixels_sha256, read_play_log
from . import inputs
from .host.model_files import NO_FILE, file_stamp, list_play_logs, resolve_play_log

log = logging.getLogger(__name__)

# A COMBO output: links into a combo widget (the Fast Sampler's kv_dtype, VAE Encode's precision).
ComboValue = io.Custom("COMBO")
IMAGE_FOLDERS = ("input", "output", "temp")  # where a Load Image name may point ("x.png [output]")


def image_file(name: str, field: str) -> Path:
    """The file a Load Image name points at, never outside ComfyUI's input, output or temp folder."""
    path = Path(folder_paths.get_annotated_filepath(name)).resolve()
    folders = [Path(d).resolve() for d in map(folder_paths.get_directory_by_type, IMAGE_FOLDERS) if d]
    if not any(path.is_relative_to(folder) for folder in folders):
        raise ValueError(f"{field}: {name!r} is outside ComfyUI's input folder")
    return path


def load_image(path: Path, field: str) -> torch.Tensor:
    """An image file as a ComfyUI IMAGE [1, H, W, 3] in 0..1, decoded as Load Image decodes it
    before ComfyUI 0.21 (PIL: first frame, EXIF orientation applied, 16-bit grey scaled, RGB)."""
    try:
        frame = open_image(path, note=log.info)  # the pack's one opener: first frame, upright
    except ValueError as error:
        raise ValueError(f"{field}: {path.name} is not an image the replay can read ({error})") from error
    if frame.mode == "I":  # 16-bit grey, scaled as Load Image scales it
        frame = frame.point(lambda value: value * (1 / 255))
    pixels = np.array(frame.convert("RGB")).astype(np.float32) / 255.0
    return torch.from_numpy(pixels)[None]


Decoder = Callable[[Path, str], torch.Tensor]  # (the file, its Load Image name) -> IMAGE [1, H, W, 3]


def host_load_image() -> Decoder | None:
    """This ComfyUI's core Load Image (``LoadImage`` of its nodes.py), as a decoder of the
    image's first frame; None outside ComfyUI."""
    loader = getattr(sys.modules.get("nodes"), "LoadImage", None)
    if not isinstance(loader, type) or not callable(getattr(loader, "load_image", None)):
        return None

    def decode(path: Path, name: str) -> torch.Tensor:
        try:
            image = loader().load_image(name)[0]
        except Exception as error:  # the host's decoders raise their own types; the message names the file
            raise ValueError(f"start_image.file: {path.name} is not an image this ComfyUI's Load Image reads "
                             f"({error})") from error
        return image[:1]

    return decode


def start_image_decoders() -> list[tuple[str, Decoder]]:
    """The decoders a start image file is tried with, in order: the host's Load Image (the
    session's, when it ran here), then PIL as Load Image decoded before ComfyUI 0.21."""
    host = host_load_image()
    pil = ("PIL (Load Image before ComfyUI 0.21)", lambda path, name: load_image(path, "start_image.file"))
    return ([("this ComfyUI's Load Image", host)] if host is not None else []) + [pil]


class LingBotWorldPlayLog(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        logs = list_play_logs()
        return io.Schema(
            node_id="LingBotWorldPlayLog",
            display_name="LingBot-World Play Log",
            category=inputs.PLAY_CATEGORY,
            **inputs.search_aliases("lingbot play replay", "lingbot play log", "lingbot replay", "lingbot fast"),
            description=(
                "Replays a LingBot-World Play session: reads its action log (the .json saved beside the session's "
                ".mp4 in the output folder) and outputs what the Fast clip nodes need to render the same video "
                "again, bit for bit: the prompt texts (T5 Encode), the start image (the Load Image file the log "
                "names, checked against its recorded sha256), the keys, frames and size (Camera with source "
                "actions and keyframes per chunk (Play); VAE Encode), the seed, shift, steps and cache settings "
                "(Fast Sampler). The template 'LingBot-World Play replay' wires it."
            ),
            inputs=[
                io.Combo.Input("log", options=logs or [NO_FILE], default=logs[0] if logs else NO_FILE,
                               tooltip="A Play session's action log in ComfyUI's output folder (the .json beside "
                               "its .mp4; newest first). The first session of the Play template saves "
                               "LingBotWorld/play_00001_.json."),
                io.Image.Input("image", optional=True,
                               tooltip="Optional: the start image, when the log names no file (the Play node's "
                               "image came from another node) or the file moved. It must be the session's pixels "
                               "(checked against the log's pixels_sha256)."),
            ],
            outputs=[
                io.Image.Output("start_image", display_name="start_image",
                                tooltip="The session's start image, for VAE Encode."),
                io.String.Output("prompt", display_name="prompt", tooltip="The prompt, for T5 Encode."),
                io.String.Output("negative_prompt", display_name="negative_prompt",
                                 tooltip="The negative prompt, for T5 Encode (Fast does not use it)."),
                io.String.Output("actions", display_name="actions",
                                 tooltip="The keys of every frame, for the Camera node (source actions, keyframes "
                                 "per chunk (Play))."),
                io.Int.Output("frames", display_name="frames", tooltip="The session's frames (Camera, VAE Encode)."),
                io.Int.Output("width", display_name="width", tooltip="The session's width (Camera, VAE Encode)."),
                io.Int.Output("height", display_name="height", tooltip="The session's height (Camera, VAE Encode)."),
                io.Int.Output("seed", display_name="seed", tooltip="The Fast Sampler's seed."),
                io.Float.Output("shift", display_name="shift", tooltip="The Fast Sampler's shift."),
                io.Int.Output("kv_window", display_name="kv_window", tooltip="The Fast Sampler's kv_window."),
                io.Int.Output("kv_sink", display_name="kv_sink", tooltip="The Fast Sampler's kv_sink."),
                ComboValue.Output("kv_dtype", display_name="kv_dtype",
                                  tooltip="The cache precision the session ran with (auto already resolved), for "
                                  "the Fast Sampler's kv_dtype."),
                ComboValue.Output("precision", display_name="precision",
                                  tooltip="The VAE precision of the session, for VAE Encode's precision."),
                io.Int.Output("steps", display_name="steps",
                              tooltip="The Fast Sampler's steps: the session's steps per chunk (4 for a log saved "
                              "before the steps choice)."),
            ],
        )

    @classmethod
    def validate_inputs(cls, log) -> bool | str:
        return inputs.offered(cls, log=log)

    @classmethod
    def fingerprint_inputs(cls, log, image=None) -> str:
        # Same name, new contents (a later session under the same name): run again.
        # The start image it names too: a changed file must be checked again.
        try:
            path = resolve_play_log(log)
            stamps = [file_stamp(path)]
        except (ValueError, OSError):
            return str(log)  # the run itself reports the problem
        try:
            name = read_play_log(path, f"log {log!r}").start_image.file
            if name is not None:
                stamps.append(file_stamp(image_file(name, "start_image.file")))
        except (ValueError, OSError):
            pass  # the run itself reports the problem
        return "|".join(stamps)

    @classmethod
    def execute(cls, log: str, image: torch.Tensor | None = None) -> io.NodeOutput:
        path = resolve_play_log(log)
        recipe = read_play_log(path, f"log {log!r}")
        start = start_image(recipe, image, log)
        return io.NodeOutput(start, recipe.prompt, recipe.negative_prompt, recipe.actions, recipe.frames,
                             recipe.width, recipe.height, recipe.seed, recipe.shift, recipe.kv_window,
                             recipe.kv_sink, recipe.kv_dtype, recipe.vae_precision, recipe.steps)


def start_image(recipe: PlayLog, image: torch.Tensor | None, log: str) -> torch.Tensor:
    """The session's start image: ``image`` when connected, else the file the log names
    (hashed a piece at a time, at most ``MAX_IMAGE_BYTES``); either must hash to what the
    log recorded."""
    record = recipe.start_image
    if image is not None:
        inputs.check_image(image)
        if pixels_sha256(image) != record.pixels_sha256:
            raise ValueError(f"image: these are not the pixels the session of log {log!r} started from (their "
                             "sha256 differs from the log's start_image.pixels_sha256); connect the same image, "
                             "or disconnect image to load the file the log names")
        return image[:1]
    if record.file is None:
        raise ValueError(f"log {log!r}: start_image.file is not recorded (the Play node's image came from another "
                         "node than Load Image); connect that image to this node's image input")
    path = image_file(record.file, "start_image.file")
    if not path.is_file():
        raise ValueError(f"log {log!r}: the start image {record.file!r} is not in ComfyUI's input folder any more; "
                         "put the session's start image back under that name, or connect it to the image input")
    try:
        digest = file_sha256(path, f"log {log!r}: the start image {record.file!r}")
    except OSError as error:
        raise ValueError(f"log {log!r}: the start image {record.file!r} cannot be read ({error.strerror or error})"
                         ) from error
    if record.sha256 is not None and digest != record.sha256:
        raise ValueError(f"log {log!r}: the start image {record.file!r} has changed since the session (its sha256 "
                         "differs from the log's start_image.sha256); put the session's image back under that "
                         "name, or connect it to the image input")
    decoders = start_image_decoders()
    unread = []  # each decoder that could not read the file, and why: the next one may
    for _, decode in decoders:
        try:
            pixels = decode(path, record.file)
        except ValueError as error:
            unread.append(str(error))
            continue
        if pixels_sha256(pixels) == record.pixels_sha256:
            return pixels
    if len(unread) == len(decoders):
        raise ValueError("; ".join(unread))
    tried = " or ".join(label for label, _ in decoders)
    if record.sha256 is not None:
        raise ValueError(f"log {log!r}: the start image {record.file!r} is the session's file (its sha256 matches) "
                         f"but {tried} decodes it to other pixels than the session's ComfyUI did (Load Image "
                         "decodes with PIL before ComfyUI 0.21 and with PyAV since, and a JPEG differs between "
                         "them); replay it on a ComfyUI of the session's kind, or connect the session's pixels to "
                         "the image input")
    raise ValueError(f"log {log!r}: the start image {record.file!r} decodes to other pixels than the session "
                     f"started from with {tried} (start_image.pixels_sha256 differs); connect the session's image "
                     "to the image input")


__all__ = ["LingBotWorldPlayLog", "host_load_image", "load_image", "start_image", "start_image_decoders"]
