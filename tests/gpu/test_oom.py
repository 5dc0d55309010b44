"""A real CUDA out-of-memory error in sampling (forced with a small memory cap).

The cap is set when the expert's first forward starts: the weights and the step inputs are
on the GPU, and the allocator may hand out only a few more megabytes, far less than one
forward needs. The error must name the size and suggest a smaller one or block swap, the
expert must be gone (VRAM back to where it was before sampling), and the next run, without
the cap, must work.

The CPU simulation of the same path (forward raising the error) is in
tests/unit/test_bad_inputs.py; the ComfyUI server path in tests/integration/test_reliability.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import tiny_package
from comfyui_lingbot_world.loaders.package import find_package
from comfyui_lingbot_world.pipeline.experts import DiskExperts
from comfyui_lingbot_world.pipeline.image import encode_image
from comfyui_lingbot_world.pipeline.sampling import OOM_HINT, SamplingParams, sample
from comfyui_lingbot_world.pipeline.text import encode_text

pytestmark = pytest.mark.gpu

FRAMES, HEIGHT, WIDTH = 81, 480, 832  # 32,760 tokens: megabytes per activation even for the tiny model
HEADROOM = 2 * 2**20


class CappedExperts(DiskExperts):
    """Disk experts that cap the CUDA allocator once the first forward of an expert starts."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.capped = False

    def acquire(self, name: str):
        model = super().acquire(name)

        def cap(module, args, kwargs):
            if not self.capped:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                total = torch.cuda.get_device_properties(0).total_memory
                torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + HEADROOM) / total)
                self.capped = True

        model.register_forward_pre_hook(cap, with_kwargs=True)
        return model


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    package = tiny_package.build(tmp_path_factory.mktemp("oom_pkg"), "nf4")
    files = find_package(package)
    text = encode_text(files.t5, files.tokenizer, "a castle above the clouds", "blurry", "cuda")
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (480, 832, 3), dtype=np.uint8))
    condition = encode_image(files.vae, image, FRAMES, HEIGHT, WIDTH, "cuda")
    return files, text, condition


@pytest.fixture(autouse=True)
def uncapped():
    yield
    torch.cuda.set_per_process_memory_fraction(1.0)
    torch.cuda.empty_cache()


def test_real_cuda_oom_is_explained_releases_the_expert_and_the_next_run_works(inputs) -> None:
    files, text, condition = inputs
    params = SamplingParams(steps=2, shift=5.0, seed=3)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    experts = CappedExperts(files.high, files.low, "cuda")
    with pytest.raises(torch.cuda.OutOfMemoryError) as info:
        sample(experts, text, condition, None, params)
    message = str(info.value)
    del info
    torch.cuda.set_per_process_memory_fraction(1.0)
    assert experts.capped, "the cap was never set: the forward did not start"
    assert OOM_HINT in message and f"{FRAMES} frames at {WIDTH}x{HEIGHT}" in message, message
    assert "Tried to allocate" in message, message  # torch's own detail is kept
    assert experts._resident == {}
    torch.cuda.empty_cache()
    assert torch.cuda.memory_allocated() <= before + 2**20, (
        f"{(torch.cuda.memory_allocated() - before) / 2**20:.1f} MB still allocated after the OOM")

    latent = sample(DiskExperts(files.high, files.low, "cuda"), text, condition, None, params)
    assert latent.shape == (16, (FRAMES - 1) // 4 + 1, HEIGHT // 8, WIDTH // 8)
    assert torch.isfinite(latent).all()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_allocated() <= before + 2**20
