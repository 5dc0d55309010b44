"""A Play session under ComfyUI: the VAE opened on the transformer's device, the .mp4
writer, the page's websocket and the Play routes' controller, ComfyUI's interrupt flag; the
VAE freed however the session ends (``nodes/play.py`` gives it the loaded transformer)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

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


def run_play_session(run: PreparedRun[PlaySettings], prompt: torch.Tensor, vae: VAESource, pixels: torch.Tensor,
                     path: Path, video_ref: dict, node_id: str | None,
                     on_end: Callable[[PlaySession], None]) -> PlayResult:
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
                                  interrupt_types=interrupt_types(), video_ref=video_ref, overlap=run.overlap)
            return session.run()
    finally:
        release_module(vae_module)
        del vae_module
        if session is not None:
            on_end(session)


__all__ = ["interrupt_types", "run_play_session"]
