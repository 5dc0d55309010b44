"""A Play session under ComfyUI: the VAE opened on the transformer's device, the .mp4
writer, the page's websocket and the Play routes' controller, ComfyUI's interrupt flag; the
VAE freed however the session ends (``nodes/play.py`` gives it the loaded transformer)."""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, Iterator

import torch

import folder_paths

import comfy.model_management as mm

from ...pipeline.image import VAESource, open_vae, vae_dtype
from ...pipeline.memory import build_or_release, release_module
from ...pipeline.play import PlaySession, PlaySettings
from ...pipeline.play.log_file import file_sha256, pixels_sha256
from ...pipeline.play.protocol import EVENT_STARTED, EVENT_STARTING, STARTING_MODEL
from ...pipeline.play.session import PlayResult
from ...pipeline.video_file import VideoWriter
from .devices import check_interrupt
from .fast_model import PreparedRun
from .play_routes import client_connected, controller_id, emitter
from .tiny_vae import live_decoder as tiny_live_decoder


def interrupt_types() -> tuple[type[BaseException], ...]:
    kind = getattr(mm, "InterruptProcessingException", None)
    return (kind,) if isinstance(kind, type) else ()


def start_image_source(hidden) -> str | None:
    """The input file of the Load Image node that feeds this node's ``image`` in the running
    prompt (ComfyUI's hidden prompt and node id), or None (another node feeds it, or no prompt)."""
    prompt = getattr(hidden, "prompt", None) if hidden is not None else None
    node_id = getattr(hidden, "unique_id", None) if hidden is not None else None
    if not isinstance(prompt, dict) or node_id is None:
        return None
    link = prompt.get(str(node_id), {}).get("inputs", {}).get("image")
    if not (isinstance(link, list) and len(link) == 2):
        return None
    source = prompt.get(str(link[0]), {})
    name = source.get("inputs", {}).get("image") if source.get("class_type") == "LoadImage" else None
    return name if isinstance(name, str) else None


def start_image_record(image: torch.Tensor, name: str | None) -> dict:
    """What the action log says of the start image: the Load Image file's name and sha256
    (the replay loads the same file), and the sha256 of the pixels the node got (``image[0]``
    as float32), which tell a changed file or another source apart."""
    record = {"file": name, "sha256": None, "pixels_sha256": pixels_sha256(image)}
    if name is not None:
        try:
            record["sha256"] = file_sha256(Path(folder_paths.get_annotated_filepath(name)), name)
        except (OSError, ValueError):
            pass  # the name stays; the file's hash is unknown (unreadable, or larger than a start image)
    return record


def prompt_recipe(text) -> dict:
    """The prompt texts for the action log: the T5 node's, or None with a word on where they are."""
    if text is not None and getattr(text, "prompt", None) is not None:
        return {"prompt": text.prompt, "negative_prompt": text.negative_prompt, "prompt_source": "text"}
    return {"prompt": None, "negative_prompt": None,
            "prompt_source": "positive: a CONDITIONING whose text this node does not see (copy it from its encoder)"}


class Start:
    """A Play node's start as the pages hear it: ``began`` once its session said ``started``."""

    def __init__(self) -> None:
        self.began = False

    def emitter(self) -> Callable[[str, dict], None]:
        """The pages' emitter, noting the session's ``started``."""
        emit = emitter()

        def send(event: str, data: dict) -> None:
            if event == EVENT_STARTED:
                self.began = True
            emit(event, data)
        return send


@contextlib.contextmanager
def announced_start(node_id: str | None) -> Iterator[Start]:
    """Tells every page that the Play node ``node_id`` is starting a session ("loading the
    model"; the session then says "encoding the image" and "warming up"), and, when the node
    fails before its session started (the transformer or the VAE would not load, a Cancel
    while loading), that it did not start: ``step`` null and the error's first line. A failure
    after the start is the session's own to tell (its state events)."""
    emit = emitter()
    emit(EVENT_STARTING, {"session_id": None, "node_id": node_id, "step": STARTING_MODEL})
    start = Start()
    try:
        yield start
    except BaseException as error:
        if not start.began:
            first = ("cancelled" if isinstance(error, interrupt_types()) else
                     (str(error).strip().splitlines() or [type(error).__name__])[0])
            emit(EVENT_STARTING, {"session_id": None, "node_id": node_id, "step": None, "error": first})
        raise


def run_play_session(run: PreparedRun[PlaySettings], prompt: torch.Tensor, vae: VAESource, pixels: torch.Tensor,
                     path: Path, video_ref: dict, node_id: str | None,
                     save_log: Callable[[dict], None], recipe: dict | None = None,
                     live_decoder=None, start: Start | None = None) -> PlayResult:
    """Run one session (``run``: the loaded transformer, the settings, the memory plan:
    where the VAE goes, whether the decode overlaps) into the .mp4 at ``path``;
    ``save_log(log)`` after every chunk and at the end (``PlaySession``). ``live_decoder``:
    ComfyUI's tiny video VAE (Load VAE with lighttaew2_1) decodes the chunks instead of the
    Wan VAE, which then only encodes the start image. ``start``: the node's ``announced_start``,
    told when the session started."""
    settings, device = run.run, run.vae_device
    decoder = tiny_live_decoder(live_decoder, device) if live_decoder is not None else None
    vae_module = build_or_release(lambda: open_vae(vae, device, vae_dtype(device, settings.vae_precision)))
    controller = controller_id()
    try:
        with VideoWriter(path, fps=settings.fps) as writer:
            emit = (start or Start()).emitter()
            session = PlaySession(run.model, prompt, vae_module, pixels, settings, writer=writer, emit=emit,
                                  controller=controller, node_id=node_id,
                                  client_connected=client_connected(controller), check_interrupt=check_interrupt,
                                  interrupt_types=interrupt_types(), video_ref=video_ref, overlap=run.overlap,
                                  recipe=recipe, decoder=decoder, save_log=save_log)
            return session.run()
    finally:
        release_module(vae_module)
        del vae_module, decoder


__all__ = ["Start", "announced_start", "interrupt_types", "prompt_recipe", "run_play_session", "start_image_record", "start_image_source"]
