"""nodes/host/progress.py, ComfyUI's progress bar for the sampling nodes as its hook sees it:
a latent preview per step through ComfyUI's previewer (the user's preview setting), the bar
alone for output nodes; the Fast nodes' bar moving once per forward (four steps and the
commit pass of each chunk) with each finished chunk as the preview. The nodes with it:
test_node_sampler.py, test_node_fast_sampler.py, test_node_fast_long_video.py."""
from __future__ import annotations

import pytest
import torch

from comfy_host import use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
import comfy.utils  # noqa: E402
from comfy.cli_args import LatentPreviewMethod, args  # noqa: E402
from PIL import Image  # noqa: E402

from comfyui_lingbot_world.nodes.host.progress import PREVIEW_FORMAT, ChunkProgress, LivePreview  # noqa: E402

X0 = torch.randn(16, 3, 4, 6)  # one chunk's latent [C, F, h, w]


@pytest.fixture
def bar(monkeypatch) -> list[tuple]:
    """What ComfyUI's progress hook receives: (value, total, preview or None)."""
    seen: list[tuple] = []
    monkeypatch.setattr(comfy.utils, "PROGRESS_BAR_HOOK",
                        lambda value, total, preview, node_id=None: seen.append((value, total, preview)))
    return seen


@pytest.fixture
def previews(monkeypatch):
    monkeypatch.setattr(args, "preview_method", LatentPreviewMethod.Latent2RGB)


def test_with_previews_each_step_sends_its_latent_as_an_image(bar, previews):
    live = LivePreview(3)
    live.on_step(1, 3)  # the preview moves the bar, not the step
    live.on_preview(1, 3, X0)
    (value, total, preview), = bar
    assert (value, total, preview[0]) == (1, 3, PREVIEW_FORMAT) and isinstance(preview[1], Image.Image)


@pytest.mark.parametrize("images, method", [(False, LatentPreviewMethod.Latent2RGB),
                                            (True, LatentPreviewMethod.NoPreviews)])
def test_without_previews_the_bar_moves_with_no_image(bar, monkeypatch, images, method):
    """An output node (images=False), or a user who turned previews off."""
    monkeypatch.setattr(args, "preview_method", method)
    live = LivePreview(3, images=images)
    live.on_step(1, 3)
    live.on_preview(2, 3, X0)
    assert bar == [(1, 3, None), (2, 3, None)]


@pytest.mark.parametrize("last_commit, total", [(False, 9), (True, 10)])
def test_the_fast_bar_counts_each_chunks_steps_and_its_commit_pass(bar, last_commit, total):
    """Two chunks of four steps: 1-4, the commit pass with chunk 1's preview (5), 6-9, and the
    last chunk's commit (10) only where the run makes one."""
    progress = ChunkProgress(2, steps=4, last_commit=last_commit, images=False)
    for step in range(1, 9):
        progress.on_step(step, 8)
        if step % 4 == 0:
            progress.on_preview(step // 4, 2, X0)
    assert [value for value, _, _ in bar] == [1, 2, 3, 4, 5, 6, 7, 8, 9, min(10, total)]
    assert {t for _, t, _ in bar} == {total} and all(preview is None for _, _, preview in bar)


def test_the_fast_bar_sends_each_finished_chunk_as_the_preview(bar, previews):
    progress = ChunkProgress(2, steps=4)
    progress.on_step(4, 8)
    progress.on_preview(1, 2, X0)
    assert [(value, preview is None) for value, _, preview in bar] == [(4, True), (5, False)]
