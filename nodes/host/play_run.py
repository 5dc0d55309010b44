"""A Play session under ComfyUI: the VAE opened on the transformer's device, the .mp4
writer, the page's websocket and the Play routes' controller, ComfyUI's interrupt flag; the
VAE freed however the session ends (``nodes/play.py`` gives it the loaded transformer)."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from PIL import Image

import comfy.model_management as mm

from ...pipeline.image import VAESource, open_vae, vae_dtype
from ...pipeline.memory import build_or_release, release_module
from ...pipeline.play import PlaySession, PlaySettings
from ...pipeline.play.session import PlayResult
from ...pipeline.video_file import VideoWriter
from .devices import check_interrupt
from .fast_model import PreparedRun
from .play_routes import client_connected, controller_id, emitter


def interrupt_types() -> tuple[type[BaseException], ...]:
    kind = getattr(mm, "InterruptProcessingException", None)
    return (kind,) if isinstance(kind, type) else ()


def start_image_file(video: Path) -> Path:
    """Where the start image of a session's .mp4 is saved: beside it, ``<name>_start.png``."""
    return video.with_name(video.stem + "_start.png")


def save_start_image(image: torch.Tensor, video: Path) -> dict:
    """The session's start image (``image[0]``, as the node got it) as a PNG beside the video,
    and what the action log says of it: the file, its sha256, and whether the PNG holds the
    image exactly (8-bit pixels, as Load Image gives them: then Load Image of this file
    replays the session bit for bit)."""
    pixels = (image[0].float().clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()
    path = start_image_file(video)
    partial = path.with_name(path.name + ".partial")
    Image.fromarray(pixels).save(partial, format="PNG")
    os.replace(partial, path)  # a new file renamed into place
    exact = torch.equal(torch.from_numpy(pixels.astype(np.float32) / 255.0), image[0].float().cpu())
    return {"file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "exact": exact}


def prompt_recipe(text) -> dict:
    """The prompt texts for the action log: the T5 node's, or None with a word on where they are."""
    if text is not None and getattr(text, "prompt", None) is not None:
        return {"prompt": text.prompt, "negative_prompt": text.negative_prompt, "prompt_source": "text"}
    return {"prompt": None, "negative_prompt": None,
            "prompt_source": "positive: a CONDITIONING whose text this node does not see (copy it from its encoder)"}


def run_play_session(run: PreparedRun[PlaySettings], prompt: torch.Tensor, vae: VAESource, pixels: torch.Tensor,
                     path: Path, video_ref: dict, node_id: str | None,
                     on_end: Callable[[PlaySession], None], recipe: dict | None = None) -> PlayResult:
    """Run one session (``run``: the loaded transformer, the settings, the memory plan:
    where the VAE goes, whether the decode overlaps) into the .mp4 at ``path``;
    ``on_end(session)`` once it has ended (also after a Cancel or an error), e.g. to save
    its action log."""
    settings, device = run.run, run.vae_device
    vae_module = build_or_release(lambda: open_vae(vae, device, vae_dtype(device, settings.vae_precision)))
    session = None
    controller = controller_id()
    try:
        with VideoWriter(path, fps=settings.fps) as writer:
            session = PlaySession(run.model, prompt, vae_module, pixels, settings, writer=writer, emit=emitter(),
                                  controller=controller, node_id=node_id,
                                  client_connected=client_connected(controller), check_interrupt=check_interrupt,
                                  interrupt_types=interrupt_types(), video_ref=video_ref, overlap=run.overlap,
                                  recipe=recipe)
            return session.run()
    finally:
        release_module(vae_module)
        del vae_module
        if session is not None:
            on_end(session)


__all__ = ["interrupt_types", "prompt_recipe", "run_play_session", "save_start_image", "start_image_file"]
