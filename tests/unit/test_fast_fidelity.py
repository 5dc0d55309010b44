"""LingBot-World Fast against the official generate_fast math (docs/conventions.md#lingbot-world-fast).

The reference is tests/reference/official_fast.py: an independent plain-torch restatement
of the official loop and causal model (its own cache dict with global/local end indices,
complex float64 RoPE, the scheduler's two sigma lookups, the official noise order), run
on the same tiny float32 weights as the pack's model. Y and the camera are built once for
the whole video and split, as the official code does. Each ``steps`` setting (4, 3, 2, 1)
is the official loop run with the same ``timesteps_index`` (docs/conventions.md#fewer-fast-steps).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from comfyui_lingbot_world.pipeline.camera import CameraCondition
from comfyui_lingbot_world.pipeline.fast import (FastGenerator, FastParams, KeyframeCamera, OfficialOrderNoise,
                                                 SlicedCamera, StreamedI2V, WholeI2V, fast_latent_frames,
                                                 sample_fast)
from i2v_reference import build_i2v_condition
from comfyui_lingbot_world.wan.runtime.kv_cache import CachePolicy
from comfyui_lingbot_world.wan.scheduler import (FAST_STEP_INDICES, FAST_STEPS, FAST_TIMESTEP_INDICES, fast_schedule,
                                                  fast_step_indices)
from comfyui_lingbot_world.wan.config import TINY
from fast_helpers import (HEIGHT, LAT_H, LAT_W, WIDTH, camera_path, image, prompt, tiny_vae,
                          video_frames, whole_camera)
from fast_helpers import one_thread, model  # noqa: F401  (module fixtures)
from reference.official_fast import OfficialFastModel, generate_fast

SEED = 1234


def conditioning(latent_frames: int):
    frames = video_frames(latent_frames)
    with torch.inference_mode():
        y = build_i2v_condition(tiny_vae(), image(), frames)
    return y.float(), whole_camera(frames)


def pack_clip(model, latent_frames: int, policy: CachePolicy, y: torch.Tensor, plucker: torch.Tensor,
              steps: int = 4):
    frames = video_frames(latent_frames)
    camera = CameraCondition(plucker, frames, HEIGHT, WIDTH, camera_path(frames)[0])
    noise = OfficialOrderNoise(SEED, latent_frames, LAT_H, LAT_W, renoises=steps - 1)
    params = FastParams(seed=SEED, policy=policy, timestep_indices=fast_step_indices(steps))
    return sample_fast(model, prompt(), WholeI2V(y), camera, params, frames, noise=noise)


def relative_max(ours: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    err = (ours - ref).abs().max().item()
    return err, err / ref.abs().max().item()


def test_the_four_timesteps_follow_the_official_formula():
    """An independent numpy evaluation of the official schedule: FlowUniPC(shift=1) sigma
    table, set_timesteps(1000, shift=10), integer timesteps, the argmin and second-match
    sigma lookups."""
    alphas = np.linspace(1, 1 / 1000, 1000)[::-1]
    top = float(np.float32(1.0 - alphas[0]))
    sig = np.linspace(top, 0.0, 1001)[:-1]
    sig = 10.0 * sig / (1 + 9.0 * sig)
    timesteps = (sig * 1000).astype(np.int64)
    table = np.concatenate([sig, [0.0]]).astype(np.float32)
    chosen = timesteps[list(FAST_TIMESTEP_INDICES)]
    ours = fast_schedule(10.0)
    assert list(ours.timesteps) == chosen.tolist() == [999, 978, 947, 825]
    for i, t in enumerate(chosen):
        assert ours.sigmas[i] == float(table[np.argmin(np.abs(timesteps - t))])
    for i, t in enumerate(chosen[1:]):
        matches = np.flatnonzero(timesteps == t)
        assert ours.renoise_sigmas[i] == float(table[matches[1] if len(matches) > 1 else matches[0]])
    # 978 repeats over entries 176..182: x0 uses entry 176, the re-noise to it entry 177.
    assert ours.sigmas[1] == float(table[176]) and ours.renoise_sigmas[0] == float(table[177])
    assert fast_schedule(5.0).timesteps == (999, 957, 899, 702)  # the generate() default shift


def test_fast_clip_equals_the_official_generate_fast_with_the_full_cache(model):
    latent_frames = 9  # 3 chunks
    y, plucker = conditioning(latent_frames)
    ours = pack_clip(model, latent_frames, CachePolicy(window=None), y, plucker)
    reference = OfficialFastModel(model.state_dict(), TINY)
    ref, trace = generate_fast(reference, prompt(), y, plucker, SEED)
    assert trace["timesteps"] == [999, 978, 947, 825] and trace["forwards"] == 15
    err, rel = relative_max(ours, ref)
    print(f"full cache: max abs error {err:.3e}, relative {rel:.3e} (latent max {ref.abs().max():.3f})")
    assert rel <= 1e-5, f"max abs error {err:.3e} ({rel:.3e} of the latent's largest value)"
    assert ref.abs().max() > 0.5  # a real signal, not a vanishing one


def test_each_steps_setting_is_a_prefix_of_the_official_timesteps():
    """steps -> the first N entries of the official list: 3 -> 999, 978, 947; 2 -> 999, 978;
    1 -> 999 (the 4-step schedule's first t and sigma); 4 is the official list itself."""
    assert FAST_STEPS == (4, 3, 2, 1) and FAST_STEP_INDICES[4] == FAST_TIMESTEP_INDICES == (0, 179, 358, 679)
    four = fast_schedule(10.0)
    for steps in FAST_STEPS:
        schedule = fast_schedule(10.0, fast_step_indices(steps))
        assert schedule.steps == steps and fast_step_indices(steps) == FAST_TIMESTEP_INDICES[:steps]
        assert schedule.timesteps == four.timesteps[:steps] and schedule.sigmas == four.sigmas[:steps]
        assert schedule.renoise_sigmas == four.renoise_sigmas[:steps - 1]
    assert fast_schedule(10.0, fast_step_indices(1)).timesteps == (999,)
    for wrong in (0, 5, 2.0, True, "2"):
        with pytest.raises(ValueError, match="steps: .* is not one of 4, 3, 2, 1"):
            fast_step_indices(wrong)


@pytest.mark.parametrize("steps", FAST_STEPS)
def test_each_steps_setting_equals_the_official_generate_with_the_same_timesteps_index(model, steps):
    """The official loop with ``timesteps_index`` = the setting's indices (fewer denoising
    forwards, the commit pass after each chunk, steps - 1 re-noise draws a chunk) against the
    pack's clip with ``steps``, sliding window with eviction (5 chunks in a 6-frame window)."""
    latent_frames = 15
    y, plucker = conditioning(latent_frames)
    ours = pack_clip(model, latent_frames, CachePolicy(window=6, sink=3), y, plucker, steps=steps)
    reference = OfficialFastModel(model.state_dict(), TINY, local_attn_size=6, sink_size=3)
    ref, trace = generate_fast(reference, prompt(), y, plucker, SEED, timesteps_index=FAST_STEP_INDICES[steps],
                               kv_frames=6)
    assert trace["timesteps"] == [999, 978, 947, 825][:steps] and trace["forwards"] == 5 * (steps + 1)
    err, rel = relative_max(ours, ref)
    print(f"{steps} steps: max abs error {err:.3e}, relative {rel:.3e}")
    assert rel <= 1e-5, f"max abs error {err:.3e} ({rel:.3e} of the latent's largest value)"
    assert ref.abs().max() > 0.5


def test_four_steps_is_the_default_path_bit_for_bit(model):
    """``steps`` 4 gives FastParams' default indices, so a run with the setting is the run
    without it, bit for bit; another setting is another video."""
    latent_frames = 6
    frames = video_frames(latent_frames)
    y, plucker = conditioning(latent_frames)
    camera = CameraCondition(plucker, frames, HEIGHT, WIDTH, None)
    default = sample_fast(model, prompt(), WholeI2V(y), camera, FastParams(seed=SEED), frames)
    four = sample_fast(model, prompt(), WholeI2V(y), camera,
                       FastParams(seed=SEED, timestep_indices=fast_step_indices(4)), frames)
    two = sample_fast(model, prompt(), WholeI2V(y), camera,
                      FastParams(seed=SEED, timestep_indices=fast_step_indices(2)), frames)
    assert FastParams().steps == 4 and torch.equal(four, default)
    assert (two - default).abs().max() > 1e-3


@pytest.mark.parametrize("window,sink", [(6, 3), (9, 3), (6, 0)])
def test_sink_and_window_equal_the_official_roll(model, window, sink):
    """The official roll (Self-Forcing: a cache of `window` frames, the first `sink` kept,
    the oldest others evicted) against the pack's slot cache, 5 chunks."""
    latent_frames = 15
    y, plucker = conditioning(latent_frames)
    ours = pack_clip(model, latent_frames, CachePolicy(window=window, sink=sink), y, plucker)
    reference = OfficialFastModel(model.state_dict(), TINY, local_attn_size=window, sink_size=sink)
    ref, _ = generate_fast(reference, prompt(), y, plucker, SEED, kv_frames=window)
    err, rel = relative_max(ours, ref)
    print(f"window {window} sink {sink}: max abs error {err:.3e}, relative {rel:.3e}")
    assert rel <= 1e-5, f"max abs error {err:.3e} ({rel:.3e} of the latent's largest value)"
    full, _ = generate_fast(OfficialFastModel(model.state_dict(), TINY), prompt(), y, plucker, SEED)
    assert (full - ref).abs().max() > 1e-3  # the window really changed what the model saw


def test_sink_and_window_equal_the_full_cache_when_the_window_covers_the_video(model):
    """An open-ended session (the window is not clipped to the video) whose window holds the
    whole video never evicts: it equals the full cache bit for bit, sink or not."""
    latent_frames = 9
    y, plucker = conditioning(latent_frames)
    full = pack_clip(model, latent_frames, CachePolicy(window=None), y, plucker)
    for window, sink in ((9, 3), (12, 0), (12, 6)):
        params = FastParams(seed=SEED, policy=CachePolicy(window=window, sink=sink))
        noise = OfficialOrderNoise(SEED, latent_frames, LAT_H, LAT_W)
        with FastGenerator(model, prompt(), WholeI2V(y), params, noise, latent_frames=None) as session:
            assert session.cache.window == window  # really the window's cache, not resolved to the full one
            chunks = [session.next_chunk(plucker[:, :, c:c + 3]) for c in range(0, latent_frames, 3)]
        assert torch.equal(torch.cat(chunks, 1), full), (window, sink)


def test_streamed_condition_and_keyframe_camera_equal_the_whole_tensors(model):
    """The per-chunk sources (lazy VAE stream, per-chunk rays) give the whole-video y and
    camera bitwise, so the clip equals the one built from whole tensors."""
    latent_frames = 6
    frames = video_frames(latent_frames)
    y, plucker = conditioning(latent_frames)
    streamed = StreamedI2V(tiny_vae(), image(), latent_frames)
    keyframes = KeyframeCamera(*camera_path(frames), frames, HEIGHT, WIDTH)
    for c in range(0, latent_frames, 3):
        assert torch.equal(streamed.chunk(c, 3), y[:, c:c + 3])
        assert torch.equal(keyframes.chunk(c, 3), plucker[:, :, c:c + 3])
        assert torch.equal(SlicedCamera(CameraCondition(plucker, frames, HEIGHT, WIDTH, None)).chunk(c, 3),
                           plucker[:, :, c:c + 3])
    params = FastParams(seed=SEED, policy=CachePolicy(window=None))
    a = sample_fast(model, prompt(), StreamedI2V(tiny_vae(), image(), latent_frames), keyframes, params, frames)
    b = sample_fast(model, prompt(), WholeI2V(y), CameraCondition(plucker, frames, HEIGHT, WIDTH, None), params, frames)
    assert torch.equal(a, b)


def test_frame_counts_follow_the_official_chunk_cut():
    """The official code cuts the latent length down to a multiple of 3; the pack refuses
    other counts naming the input and the nearest counts that work."""
    for frames in (9, 21, 81, 957):
        lat = (frames - 1) // 4 + 1
        assert fast_latent_frames(frames) == lat - lat % 3 == lat
    with pytest.raises(ValueError, match=r"frames=961 \(241 latent frames\).*use 957 or 969"):
        fast_latent_frames(961)
    with pytest.raises(ValueError, match=r"frames=5 .*use 9"):
        fast_latent_frames(5)
    with pytest.raises(ValueError, match="4n\\+1"):
        fast_latent_frames(80)
