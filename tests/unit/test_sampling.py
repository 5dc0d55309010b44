"""pipeline/sampling.py: the two-expert denoising loop on stand-in experts (CPU).

Which expert runs when, one resident at a time, the guidance per expert, the noise the
reference draws, the camera size check, progress and previews, and what an error or an
out-of-memory leaves behind. Step caching and CFG truncation: test_step_cache.py; several
devices: test_placement.py.
"""
from __future__ import annotations

import pytest
import torch

from stand_in_dit import TinyDiT

from comfyui_lingbot_world.pipeline.camera import CameraCondition
from comfyui_lingbot_world.pipeline.image import I2VCondition
from comfyui_lingbot_world.pipeline.sampling import (
    SamplingParams,
    check_camera_matches,
    expert_for,
    initial_noise,
    sample,
)
from comfyui_lingbot_world.pipeline.text import TextEmbeddings
from comfyui_lingbot_world.wan.scheduler import make_sampler


class RecordingExperts:
    """An ExpertSource over two stand-in experts that records what is acquired and released."""

    def __init__(self) -> None:
        self.models = {"high": TinyDiT(1), "low": TinyDiT(2)}
        self.events: list[tuple[str, str]] = []
        self.resident: set[str] = set()
        self.most_resident = 0
        self.aborted = False

    def acquire(self, name: str) -> torch.nn.Module:
        self.events.append(("acquire", name))
        self.resident.add(name)
        self.most_resident = max(self.most_resident, len(self.resident))
        return self.models[name]

    def release(self, name: str) -> None:
        self.events.append(("release", name))
        self.resident.discard(name)

    def abort(self) -> None:
        self.aborted = True
        self.resident.clear()


def _inputs(frames: int = 9) -> tuple[TextEmbeddings, I2VCondition]:
    g = torch.Generator().manual_seed(5)
    text = TextEmbeddings(positive=torch.randn(6, 8, generator=g), negative=torch.randn(4, 8, generator=g),
                          from_cache=False)
    f_lat = (frames - 1) // 4 + 1
    condition = I2VCondition(y=torch.randn(20, f_lat, 4, 6, generator=g), frames=frames, height=32, width=48)
    return text, condition


def test_expert_choice_follows_boundary():
    assert expert_for(950.0, 0.947) == "high"
    assert expert_for(947.0, 0.947) == "high"
    assert expert_for(946.9, 0.947) == "low"


def test_high_then_low_one_resident_at_a_time():
    text, condition = _inputs()
    params = SamplingParams(steps=6, shift=5.0, seed=3, boundary=0.9)
    names = [expert_for(t, params.boundary) for t in make_sampler("unipc", 6, 5.0).timesteps.tolist()]
    assert names[0] == "high" and names[-1] == "low" and "high" in names and "low" in names
    experts = RecordingExperts()
    steps: list[tuple[int, int]] = []
    latent = sample(experts, text, condition, None, params, on_step=lambda i, n: steps.append((i, n)))
    assert experts.events == [("acquire", "high"), ("release", "high"), ("acquire", "low"), ("release", "low")]
    assert experts.most_resident == 1 and not experts.resident
    assert steps == [(i, 6) for i in range(1, 7)]
    assert latent.shape == (16, 3, 4, 6) and latent.dtype == torch.float32 and latent.device.type == "cpu"
    assert torch.equal(latent, sample(RecordingExperts(), text, condition, None, params))  # same seed, same latent
    assert not torch.equal(latent, sample(RecordingExperts(), text, condition, None,
                                          SamplingParams(steps=6, shift=5.0, seed=4, boundary=0.9)))


def test_initial_noise_is_the_references_seeded_randn():
    _, condition = _inputs(frames=13)
    expected = torch.randn(16, 4, 4, 6, generator=torch.Generator().manual_seed(11), dtype=torch.float32)
    assert torch.equal(initial_noise(condition, 11), expected)


def test_guidance_one_skips_the_negative_pass_of_that_expert_only():
    text, condition = _inputs()
    experts = RecordingExperts()
    sample(experts, text, condition, None, SamplingParams(steps=6, shift=5.0, boundary=0.9, cfg_high=1.0, cfg_low=4.0))
    high_steps = sum(1 for t in make_sampler("unipc", 6, 5.0).timesteps.tolist() if expert_for(t, 0.9) == "high")
    assert experts.models["high"].calls == high_steps  # one row per step: the prompt only
    assert experts.models["low"].calls == 2 * (6 - high_steps)  # prompt and negative prompt


def test_batched_and_separate_cfg_branches_agree():
    text, condition = _inputs()
    batched = sample(RecordingExperts(), text, condition, None, SamplingParams(steps=4, shift=5.0, batch_cfg=True))
    separate = sample(RecordingExperts(), text, condition, None, SamplingParams(steps=4, shift=5.0, batch_cfg=False))
    torch.testing.assert_close(batched, separate, rtol=1e-6, atol=1e-6)


def test_previews_are_the_clean_latent_of_each_step():
    text, condition = _inputs()
    previews: list[tuple[int, int, torch.Tensor]] = []
    sample(RecordingExperts(), text, condition, None, SamplingParams(steps=3, shift=5.0),
           on_preview=lambda i, n, x0: previews.append((i, n, x0)))
    assert [(i, n) for i, n, _ in previews] == [(1, 3), (2, 3), (3, 3)]
    assert all(x0.shape == (16, 3, 4, 6) for _, _, x0 in previews)


def test_a_camera_of_another_size_is_refused_before_any_expert_loads():
    text, condition = _inputs()
    camera = CameraCondition(plucker=torch.zeros(1, 384, 3, 4, 8), frames=9, height=32, width=64, poses=None)
    with pytest.raises(ValueError, match=r"camera is for 9 frames at 64x32 .* 9 frames at 48x32"):
        check_camera_matches(camera, condition)
    experts = RecordingExperts()
    with pytest.raises(ValueError, match="camera is for"):
        sample(experts, text, condition, camera, SamplingParams(steps=2))
    assert experts.events == []


def test_an_error_in_a_step_releases_the_expert_and_aborts_the_source():
    text, condition = _inputs()
    experts = RecordingExperts()

    def cancel(i: int, n: int) -> None:
        raise KeyboardInterrupt("cancelled")

    with pytest.raises(KeyboardInterrupt):
        sample(experts, text, condition, None, SamplingParams(steps=4, shift=5.0), on_step=cancel)
    assert experts.events == [("acquire", "high"), ("release", "high")] and experts.aborted


def test_out_of_memory_is_explained_and_the_experts_released(monkeypatch):
    text, condition = _inputs()
    experts = RecordingExperts()

    def no_room(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.50 GiB")

    monkeypatch.setattr(experts.models["high"], "forward", no_room)
    with pytest.raises(torch.cuda.OutOfMemoryError) as error:
        sample(experts, text, condition, None, SamplingParams(steps=2, shift=5.0))
    message = str(error.value)
    assert "while sampling 9 frames at 48x32" in message and "Tried to allocate 9.50 GiB" in message
    assert "block swap" in message
    assert experts.aborted and not experts.resident
