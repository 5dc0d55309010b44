"""LingBot-World Play Log: a Play session's action log (the .json beside its .mp4 in the
output folder) read back as the inputs of the Fast clip nodes, so that the session renders
again from the log file alone: the prompt texts for T5 Encode, the start image (the file
the log names, checked against its recorded hashes), the keys and size for the Camera node
(source actions, keyframes per chunk (Play)), the frames for VAE Encode, and the seed, shift,
steps and cache settings for the Fast Sampler."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from comfy_api.latest import io
from PIL import Image, ImageOps, ImageSequence, UnidentifiedImageError

import folder_paths

from ..pipeline.play.log_file import PlayLog, read_play_log
from . import inputs
from .host.model_files import NO_FILE, file_stamp, list_play_logs, resolve_play_log

# A COMBO output: links into a combo widget (the Fast Sampler's kv_dtype, VAE Encode's precision).
ComboValue = io.Custom("COMBO")
IMAGE_FOLDERS = ("input", "output", "temp")  # where a Load Image name may point ("x.png [output]")


def pixels_sha256(image: torch.Tensor) -> str:
    """The hash the Play node records of its start image: ``image[0]`` as float32 bytes."""
    return hashlib.sha256(image[0].detach().float().cpu().contiguous().numpy().tobytes()).hexdigest()


def image_file(name: str, field: str) -> Path:
    """The file a Load Image name points at, never outside ComfyUI's input, output or temp folder."""
    path = Path(folder_paths.get_annotated_filepath(name)).resolve()
    folders = [Path(d).resolve() for d in map(folder_paths.get_directory_by_type, IMAGE_FOLDERS) if d]
    if not any(path.is_relative_to(folder) for folder in folders):
        raise ValueError(f"{field}: {name!r} is outside ComfyUI's input folder")
    return path


def load_image(path: Path, field: str) -> torch.Tensor:
    """An image file as a ComfyUI IMAGE [1, H, W, 3] in 0..1, decoded as Load Image decodes it
    (first frame, EXIF orientation applied, 16-bit grey scaled, RGB)."""
    try:
        with Image.open(path) as file:
            frame = ImageOps.exif_transpose(next(ImageSequence.Iterator(file)))
            if frame.mode == "I":
                frame = frame.point(lambda value: value * (1 / 255))
            pixels = np.array(frame.convert("RGB")).astype(np.float32) / 255.0
    except (OSError, UnidentifiedImageError) as error:
        raise ValueError(f"{field}: {path.name} is not an image the replay can read ({error})") from error
    return torch.from_numpy(pixels)[None]


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
            name = json.loads(path.read_text(encoding="utf-8"))["start_image"]["file"]
            stamps.append(file_stamp(image_file(name, "start_image.file")))
        except (ValueError, OSError, KeyError, TypeError):
            pass
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
    """The session's start image: ``image`` when connected, else the file the log names;
    either must hash to what the log recorded."""
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
    if record.sha256 is not None and hashlib.sha256(path.read_bytes()).hexdigest() != record.sha256:
        raise ValueError(f"log {log!r}: the start image {record.file!r} has changed since the session (its sha256 "
                         "differs from the log's start_image.sha256); put the session's image back under that "
                         "name, or connect it to the image input")
    pixels = load_image(path, "start_image.file")
    if pixels_sha256(pixels) != record.pixels_sha256:
        raise ValueError(f"log {log!r}: the start image {record.file!r} decodes to other pixels than the session "
                         "started from (start_image.pixels_sha256 differs); connect the session's image to the "
                         "image input")
    return pixels


__all__ = ["LingBotWorldPlayLog", "load_image", "pixels_sha256", "start_image"]
