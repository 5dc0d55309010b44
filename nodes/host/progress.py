"""ComfyUI's progress bar and latent previews for the sampling nodes."""
from __future__ import annotations

import torch

import comfy.latent_formats
import comfy.model_management as mm
import comfy.utils
import latent_preview

PREVIEW_FORMAT = "JPEG"


class LivePreview:
    """ComfyUI's progress bar with a latent preview each step, through ComfyUI's own
    previewer: it follows the user's preview setting (none, latent2rgb, or the TAE video
    decoder lighttaew2_1 from models/vae_approx).

    ``images=False``: the bar only. For output nodes: the frontend shows a node's latent
    previews instead of its outputs for as long as it has any (they are dropped only when
    the node runs again), so an output node that sent previews would never show its result.
    """

    def __init__(self, total_steps: int, images: bool = True) -> None:
        self.previewer = (latent_preview.get_previewer(mm.get_torch_device(), comfy.latent_formats.Wan21())
                          if images else None)
        self.progress = comfy.utils.ProgressBar(total_steps)

    def on_step(self, done: int, total: int) -> None:
        if self.previewer is None:  # with previews, on_preview moves the bar
            self.progress.update_absolute(done, total)

    def on_preview(self, done: int, total: int, x0: torch.Tensor) -> None:
        image = self.previewer.decode_latent_to_preview_image(PREVIEW_FORMAT, x0[None].float()) if self.previewer else None
        self.progress.update_absolute(done, total, image)


class ChunkProgress:
    """The LingBot-World Fast nodes' bar and previews: the bar moves once per forward (a
    chunk's 4 denoising steps, then its commit pass; a clip's last chunk skips the commit),
    and each finished chunk's latent is the preview, through the same previewer.

    ``on_step`` and ``on_preview`` take ``pipeline.fast.sample_fast``'s counts (steps done of
    all steps; chunks done of all chunks). ``images=False``: the bar only (an output node,
    see ``LivePreview``)."""

    def __init__(self, chunks: int, steps: int = 4, last_commit: bool = False, images: bool = True) -> None:
        self.steps = steps
        self.total = chunks * (steps + 1) - (0 if last_commit else 1)
        self.live = LivePreview(self.total, images=images)

    def on_step(self, done: int, total: int) -> None:
        chunk, step = divmod(done - 1, self.steps)
        self.live.progress.update_absolute(chunk * (self.steps + 1) + step + 1, self.total)

    def on_preview(self, done: int, total: int, x0: torch.Tensor) -> None:
        self.live.on_preview(min(done * (self.steps + 1), self.total), self.total, x0)
