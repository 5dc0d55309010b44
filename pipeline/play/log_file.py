"""A Play session's action log read back as a recipe (``PlaySession.action_log``, the .json
beside the session's .mp4): every field the Fast clip nodes need to render the session
again, checked, each error naming the file and the field; and the hashes the log keeps of
the start image (the file's, streamed, and the pixels'). ``steps`` may be absent: a log
written before the steps choice was a session of the official 4 steps."""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from ...loaders.json_file import JsonProblem, parse_json
from ...wan.camera_actions import action_frames
from ...wan.geometry import CHUNK_FRAMES, MAX_SEED, video_frames
from ...wan.runtime.kv_cache import KV_DTYPES
from ...wan.scheduler import DEFAULT_FAST_STEPS, FAST_STEPS
from ..fast.generator import fast_latent_frames
from ..guards import VAE_PRECISIONS
from .session import KEYFRAMES_PLAY, MAX_CHUNK_BUDGET

MAX_LOG_BYTES = 4 * 1024 * 1024  # a 957-frame session's log is a few KB; anything larger is not one
MAX_FRAMES = video_frames(MAX_CHUNK_BUDGET * CHUNK_FRAMES)  # the longest session
MAX_SIZE = 4096  # the nodes' width/height maximum
# A start image file: a 7680x4320 16-bit RGB PNG holds about 200 MB; a larger file is not a
# picture a session started from, and is refused before it is read.
MAX_IMAGE_BYTES = 256 * 1024 * 1024
HASH_PIECE = 1 << 20  # bytes hashed at a time: a file's hash costs this much memory, whatever its size


PLAY_FRAMES_SHOWN = tuple(video_frames(CHUNK_FRAMES * c) for c in (1, 2, 3, 4))  # 9, 21, 33, 45


class PlayLogError(ValueError):
    """A log that cannot replay a session; the message names the file and the field."""


@dataclass(frozen=True)
class StartImage:
    """The start image as the log records it: the Load Image file's name (None when another
    node fed the Play node), that file's sha256, and the sha256 of the float32 pixels."""

    file: str | None
    sha256: str | None
    pixels_sha256: str


@dataclass(frozen=True)
class PlayLog:
    """What a Play log says, for the Fast clip nodes (T5 Encode, Load Image, Camera with the
    per-chunk keyframes, VAE Encode, Fast Sampler)."""

    prompt: str
    negative_prompt: str
    start_image: StartImage
    actions: str
    frames: int
    width: int
    height: int
    seed: int
    shift: float
    kv_window: int
    kv_sink: int
    kv_dtype: str
    vae_precision: str
    vae: str | None
    fps: int
    steps: int = DEFAULT_FAST_STEPS


def file_sha256(path: Path, name: str, limit: int = MAX_IMAGE_BYTES) -> str:
    """The sha256 of the file at ``path``, read a piece at a time; a file over ``limit``
    bytes is refused (``name``: how the message names it) before any of it is read."""
    size = path.stat().st_size
    if size > limit:
        raise PlayLogError(f"{name}: {size:,} bytes, more than an image a session starts from ({limit:,} at "
                           "most); choose the session's start image")
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while piece := file.read(HASH_PIECE):
            digest.update(piece)
    return digest.hexdigest()


def pixels_sha256(image: torch.Tensor) -> str:
    """The hash the Play node records of its start image: ``image[0]`` (a ComfyUI IMAGE
    [B, H, W, 3]) as float32 bytes."""
    return hashlib.sha256(image[0].detach().float().cpu().contiguous().numpy().tobytes()).hexdigest()


def play_frames(frames: int) -> bool:
    """Whether a session can have made ``frames`` frames: whole Fast chunks (9, then 12 a chunk)."""
    try:
        fast_latent_frames(frames)
    except ValueError:
        return False
    return 1 <= frames <= MAX_FRAMES


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_sha256(value) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def parse_play_log(text: str, name: str) -> PlayLog:
    """The recipe in a log's text; ``name``: how errors name the file."""
    def bad(field: str, problem: str) -> PlayLogError:
        return PlayLogError(f"{name}: {field} {problem}")

    try:
        log = parse_json(text, "a Play action log")
    except JsonProblem as error:
        raise PlayLogError(f"{name}: {error}; choose the .json a LingBot-World Play session saved beside its "
                           ".mp4") from error
    if not isinstance(log, dict):
        raise PlayLogError(f"{name}: expected a JSON object (a LingBot-World Play action log), got "
                           f"{type(log).__name__}")
    if log.get("keyframes") != KEYFRAMES_PLAY or "actions" not in log:
        raise PlayLogError(f"{name}: not a LingBot-World Play action log (it has no actions with keyframes "
                           f"{KEYFRAMES_PLAY!r}); choose the .json a Play session saved beside its .mp4")

    def field(key: str, check, expected: str):
        if key not in log:
            raise bad(key, f"is missing (expected {expected}); the log was saved by an older version of the "
                      "pack or edited: replay it by hand (README, Play the world)")
        value = log[key]
        if not check(value):
            raise bad(key, f"is {value!r}, expected {expected}")
        return value

    actions = field("actions", lambda v: isinstance(v, str) and v.strip() != "", "an action string")
    frames = field("frames", lambda v: _is_int(v) and play_frames(v),
                   f"the frames of whole chunks: 9 + 12 a chunk ({', '.join(map(str, PLAY_FRAMES_SHOWN))}, ..., "
                   f"{MAX_FRAMES})")
    try:
        held = action_frames(actions)
    except ValueError as error:
        raise bad("actions", f"is not an action string: {error}") from error
    if held != frames - 1:
        raise bad("actions", f"hold {held} frames of keys; a session of {frames} frames has {frames - 1}")
    size = lambda v: _is_int(v) and 16 <= v <= MAX_SIZE and v % 16 == 0  # noqa: E731
    width = field("width", size, "a multiple of 16 pixels")
    height = field("height", size, "a multiple of 16 pixels")
    seed = field("seed", lambda v: _is_int(v) and 0 <= v <= MAX_SEED, f"a seed within 0..{MAX_SEED}")
    shift = field("shift", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                  and v > 0, "a number above 0")
    window = field("kv_window", lambda v: _is_int(v) and v >= 3, "a whole number of latent frames (3 or more)")
    sink = field("kv_sink", lambda v: _is_int(v) and 0 <= v < window - 2,
                 f"a whole number of latent frames below kv_window - 2 = {window - 2}")
    kv_dtype = field("kv_dtype", lambda v: v in KV_DTYPES, f"one of {', '.join(KV_DTYPES)}")
    precision = field("vae_precision", lambda v: v in VAE_PRECISIONS, f"one of {', '.join(VAE_PRECISIONS)}")
    fps = field("fps", lambda v: _is_int(v) and 1 <= v <= 120, "a frame rate of 1..120")
    # A log saved before the steps choice was a session of the official 4 steps.
    steps = log.get("steps", DEFAULT_FAST_STEPS)
    if not (_is_int(steps) and steps in FAST_STEPS):
        raise bad("steps", f"is {steps!r}, expected one of {', '.join(map(str, FAST_STEPS))}")
    vae = log.get("vae")
    if vae is not None and not isinstance(vae, str):
        raise bad("vae", f"is {vae!r}, expected the VAE file's name")
    prompt = field("prompt", lambda v: v is None or isinstance(v, str), "the prompt text")
    if prompt is None:
        raise bad("prompt", "is not recorded: the session took its prompt from a CONDITIONING input "
                  f"({log.get('prompt_source', 'positive')}); replay it by hand with that encoder's text")
    negative = field("negative_prompt", lambda v: isinstance(v, str), "the negative prompt text")
    record = field("start_image", lambda v: isinstance(v, dict), "the start image's record (file, sha256, "
                   "pixels_sha256)")
    pixels = record.get("pixels_sha256")
    if not _is_sha256(pixels):
        raise bad("start_image.pixels_sha256", f"is {pixels!r}, expected a sha256 in hex")
    file, file_hash = record.get("file"), record.get("sha256")
    if file is not None and (not isinstance(file, str) or not file.strip()):
        raise bad("start_image.file", f"is {file!r}, expected the Load Image file's name")
    if file_hash is not None and not _is_sha256(file_hash):
        raise bad("start_image.sha256", f"is {file_hash!r}, expected a sha256 in hex")
    return PlayLog(prompt=prompt, negative_prompt=negative, start_image=StartImage(file, file_hash, pixels),
                   actions=actions, frames=frames, width=width, height=height, seed=seed, shift=float(shift),
                   kv_window=window, kv_sink=sink, kv_dtype=kv_dtype, vae_precision=precision, vae=vae, fps=fps,
                   steps=steps)


def read_play_log(path: Path, name: str) -> PlayLog:
    """The recipe in the log file at ``path`` (``name``: how errors name it)."""
    try:
        size = path.stat().st_size
        if size > MAX_LOG_BYTES:
            raise PlayLogError(f"{name}: {size} bytes, more than a Play action log holds ({MAX_LOG_BYTES})")
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise PlayLogError(f"{name}: not UTF-8 text; choose the .json a Play session saved") from error
    except OSError as error:
        raise PlayLogError(f"{name}: cannot be read ({error.strerror or error})") from error
    return parse_play_log(text, name)


__all__ = ["MAX_IMAGE_BYTES", "PlayLog", "PlayLogError", "StartImage", "file_sha256", "parse_play_log",
           "pixels_sha256", "play_frames", "read_play_log"]
