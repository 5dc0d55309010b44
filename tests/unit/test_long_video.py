"""wan/long_video.py and pipeline/long_video.py: long videos as chained windows (the plan,
the mask, the per-window camera) and the windowed run on a tiny synthetic package (CPU),
also through pipeline/generate.py, the whole run outside ComfyUI."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from comfyui_lingbot_world.loaders.package import find_package
from comfyui_lingbot_world.loaders.vae_loader import load_vae
from comfyui_lingbot_world.pipeline import camera as cam
from comfyui_lingbot_world.pipeline import long_video as lv
from comfyui_lingbot_world.pipeline.generate import generate
from comfyui_lingbot_world.pipeline.decode import decode
from comfyui_lingbot_world.pipeline.experts import DiskExperts
from comfyui_lingbot_world.pipeline.image import encode_image
from comfyui_lingbot_world.pipeline.sampling import SamplingParams, sample
from comfyui_lingbot_world.pipeline.text import encode_text
from comfyui_lingbot_world.wan.camera import CameraError, camera_tensor
from comfyui_lingbot_world.wan.camera_presets import preset_trajectory
from comfyui_lingbot_world.wan.act_control import act_control_from_actions, wasd_from_actions
from comfyui_lingbot_world.wan.camera_actions import (ActionError, act2cam_camera, act2cam_keyframes, action_poses,
                                                      default_intrinsics)
from comfyui_lingbot_world.wan.conditioning import first_frame_mask, given_frames_mask
from comfyui_lingbot_world.wan.long_video import (
    path_keyframes,
    plan_windows,
    translation_scale,
    window_camera,
    window_cuts,
)

H, W = 32, 48
PARAMS = SamplingParams(steps=3, shift=5.0, seed=11)


# --------------------------------------------------------------------------- plan


@pytest.mark.parametrize("frames, window, overlap", [
    (81, 81, 1), (5, 81, 1), (85, 81, 1), (161, 81, 1), (321, 81, 1), (961, 81, 1), (961, 81, 5),
    (961, 161, 9), (33, 9, 5), (17, 9, 1), (21, 13, 5),
])
def test_plan_covers_every_frame_once_with_the_given_overlap(frames, window, overlap) -> None:
    plan = plan_windows(frames, window, overlap)
    assert plan[0].start == 0 and plan[0].given == 1 and plan[-1].stop == frames
    covered = np.zeros(frames, dtype=int)
    for w in plan:
        assert w.frames <= window and (w.frames - 1) % 4 == 0 and w.start % 4 == 0
        new = range(w.stop - w.new_frames, w.stop)
        covered[list(new)] += 1
        if w.index:
            prev = plan[w.index - 1]
            assert w.given == overlap and w.start == prev.stop - overlap  # starts on the previous tail
            assert w.frames > overlap  # every window adds frames
            assert w.latent_start == w.start // 4
    assert (covered == 1).all()  # every frame written exactly once
    assert sum(w.new_frames for w in plan) == frames
    assert len(plan) == (1 if frames <= window else 1 + -(-(frames - window) // (window - overlap)))
    assert window_cuts(plan) == tuple(w.start for w in plan[1:])


def test_plan_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="at most 961"):
        plan_windows(965)
    with pytest.raises(ValueError, match="overlap"):
        plan_windows(161, 81, 81)
    with pytest.raises(ValueError, match="window must be 4n\\+1"):
        plan_windows(161, 80, 1)
    with pytest.raises(ValueError, match="overlap must be 4n\\+1"):
        plan_windows(161, 81, 2)


def test_given_frames_mask() -> None:
    torch.testing.assert_close(given_frames_mask(17, 1, 2, 3), first_frame_mask(17, 2, 3), rtol=0, atol=0)
    mask = given_frames_mask(17, 5, 2, 3)  # frame 0 and frames 1..4: latent frames 0 and 1 given
    assert mask.shape == (4, 5, 2, 3)
    assert (mask[:, :2] == 1).all() and (mask[:, 2:] == 0).all()
    mask = given_frames_mask(17, 3, 1, 1)  # latent frame 1 half given: channels are its 4 frames
    assert mask[:, 1, 0, 0].tolist() == [1.0, 1.0, 0.0, 0.0]


# --------------------------------------------------------------------------- camera


def _windows_vs_one_pass(poses: np.ndarray, k: np.ndarray, frames: int, window: int, overlap: int) -> None:
    one = camera_tensor(poses, k, frames, H, W, dtype=torch.float32)
    steps = path_keyframes(poses, frames)
    scale = translation_scale(steps)
    for w in plan_windows(frames, window, overlap):
        cam = window_camera(steps, scale, w, k, H, W)
        assert cam.shape == (1, 384, w.latent_frames, H // 8, W // 8)
        # Re-based: the window's first latent frame is the identity camera (one-pass frame 0),
        # the rest are the one-pass tensor's frames (frame-to-frame motion, same scale).
        # Tolerance: float32 rays from the same float64 poses, 1e-5 absolute.
        torch.testing.assert_close(cam[:, :, :1], one[:, :, :1], rtol=0, atol=1e-5)
        torch.testing.assert_close(cam[:, :, 1:], one[:, :, w.latent_start + 1: w.latent_start + w.latent_frames],
                                   rtol=0, atol=1e-5)


def test_camera_windows_equal_the_one_pass_tensor_rebased() -> None:
    poses = action_poses("w-40,l-30,wj-60,i-10,d-60,none-20,s-100", frames=321)
    _windows_vs_one_pass(poses, default_intrinsics(H, W), 321, 81, 1)
    _windows_vs_one_pass(poses, default_intrinsics(H, W), 161, 41, 9)
    orbit, k = preset_trajectory("orbit_left", 161, 1.5)
    _windows_vs_one_pass(orbit, k[0], 161, 33, 1)


def test_one_window_camera_is_the_one_pass_tensor_exactly() -> None:
    poses, k = preset_trajectory("dolly_in", 81, 1.0)
    steps = path_keyframes(poses, 81)
    cam = window_camera(steps, translation_scale(steps), plan_windows(81)[0], k[0], H, W)
    assert torch.equal(cam, camera_tensor(poses, k, 81, H, W, dtype=torch.float32))


def test_action_string_windows_are_the_act2cam_camera_rebased() -> None:
    """A long video of an action string: each window is its piece of the official act2cam
    camera (F + 1 poses sampled at linspace(0, F, F_lat)), re-based to its first frame."""
    text, frames = "w-40,l-30,wj-60,i-10,d-60,none-20,s-80", 321
    path = cam.path_from_actions(text, frames, H, W)
    one = act2cam_camera(text, frames, H, W)
    windowed = lv.WindowedCamera(path, frames, H, W)
    torch.testing.assert_close(windowed.steps, act2cam_keyframes(text, frames, normalize=False))
    for w in plan_windows(frames, 81, 1):
        got = windowed.condition(w).plucker
        torch.testing.assert_close(got[:, :, :1], one[:, :, :1], rtol=0, atol=1e-5)
        torch.testing.assert_close(got[:, :, 1:], one[:, :, w.latent_start + 1: w.latent_start + w.latent_frames],
                                   rtol=0, atol=1e-5)


def test_act_windows_take_the_key_rows_of_their_frames() -> None:
    """Act through the windows: directions-only rays of the window's camera, and the W/A/S/D
    rows window.start + 4j of the whole video; one window is the one-pass Act control."""
    text, frames = "w-20,a-10,wj-8,s-12,d-6", 57
    path = cam.path_from_actions(text, frames, H, W)
    windowed = lv.WindowedCamera(path, frames, H, W, control_type="act")
    keys = wasd_from_actions(text, frames)
    for w in plan_windows(frames, 21, 5):
        got = windowed.condition(w)
        assert got.control_type == "act" and got.plucker.shape == (1, 448, w.latent_frames, H // 8, W // 8)
        np.testing.assert_array_equal(got.plucker[0, 192::64, :, 3, 2].T.numpy(), keys[w.start:w.stop:4])
        # The rays are the Base-Cam window's directions (channels 3..5 of each pixel's six).
        base = lv.WindowedCamera(path, frames, H, W).condition(w).plucker
        torch.testing.assert_close(got.plucker[:, :192], base[:, 192:], rtol=0, atol=1e-6)
    (only,) = plan_windows(frames, 81, 1)
    torch.testing.assert_close(windowed.condition(only).plucker, act_control_from_actions(text, frames, H, W),
                               rtol=1e-6, atol=1e-6)


def test_one_translation_scale_for_the_whole_path() -> None:
    # Slow walk for 80 frames, then three times as fast: with one scale the slow window's
    # steps stay a third of the fast window's, instead of both being normalized to 1.
    slow = action_poses("w-81", frames=81)
    fast = slow[-1] @ action_poses("w-81", frames=81)
    fast[:, :3, 3] = slow[-1, :3, 3] + 3 * (fast[:, :3, 3] - slow[-1, :3, 3])
    poses = np.concatenate([slow, fast[1:]])
    steps = path_keyframes(poses, 161)
    scale = translation_scale(steps)
    first, second = plan_windows(161, 81, 1)
    # channel c·64 + dy·8 + dx: channels 0, 64, 128 are the ray origin's x, y, z at pixel (0, 0)
    t0 = window_camera(steps, scale, first, default_intrinsics(H, W), H, W)[0, [0, 64, 128], 1:, 0, 0].norm(dim=0)
    t1 = window_camera(steps, scale, second, default_intrinsics(H, W), H, W)[0, [0, 64, 128], 1:, 0, 0].norm(dim=0)
    torch.testing.assert_close(t1, torch.ones_like(t1), rtol=0, atol=1e-5)
    torch.testing.assert_close(t0, torch.full_like(t0, 1 / 3), rtol=0, atol=1e-5)
    # A quantile below 1 makes the ordinary (slow) step the unit.
    assert translation_scale(steps, 0.25) == pytest.approx(0.2, rel=1e-6)


def test_windowed_camera_checks_coverage() -> None:
    path = cam.path_from_preset("dolly_in", 1.0, 21)
    with pytest.raises(CameraError, match="cover only 21 frames"):
        lv.WindowedCamera(path, 41, H, W)
    # An action string covers any video at least as long as itself, never a shorter one.
    walk = cam.path_from_actions("w-20", 21, H, W)
    assert lv.WindowedCamera(walk, 41, H, W).steps.shape[0] == 11
    with pytest.raises(ActionError, match="20 action frames but the video has 17 frames"):
        lv.WindowedCamera(walk, 17, H, W)


# --------------------------------------------------------------------------- runs (tiny package)


@pytest.fixture(scope="module")
def text(package, tmp_path_factory):
    files = find_package(package)
    return encode_text(files.t5, files.tokenizer, "a long walk through a forest", "", "cpu",
                       tmp_path_factory.mktemp("cache"))


@pytest.fixture
def image() -> Image.Image:
    return Image.fromarray(np.random.default_rng(3).integers(0, 255, (40, 60, 3), dtype=np.uint8))


def test_one_window_equals_the_ordinary_run_bit_for_bit(package, text, image) -> None:
    files = find_package(package)
    frames = 9
    latents, pieces = [], []
    path = cam.path_from_preset("orbit_left", 1.0, frames)
    experts = DiskExperts(files.high, files.low, "cpu")
    result = lv.sample_windows(experts, text, files.vae, image, frames, H, W, lv.WindowedCamera(path, frames, H, W),
                               PARAMS, lv.WindowParams(window=81), pieces.append, device="cpu",
                               on_latent=lambda w, x: latents.append(x))
    experts.close()
    assert result.windows_done == 1 and result.frames_written == frames
    condition = encode_image(files.vae, image, frames, H, W, "cpu")
    camera = cam.camera_condition(cam.path_from_preset("orbit_left", 1.0, frames), frames, H, W)
    experts = DiskExperts(files.high, files.low, "cpu")
    today = sample(experts, text, condition, camera, PARAMS)
    experts.close()
    assert torch.equal(latents[0], today)
    assert torch.equal(pieces[0], decode(files.vae, today, "cpu"))


def test_several_windows_continue_from_the_previous_tail(package, text, image, monkeypatch) -> None:
    files = find_package(package)
    frames, window, overlap = 21, 13, 5  # windows [0, 13) and [8, 21)
    latents, pieces, tails = [], [], []
    real = lv._continuation

    def spy(vae, tail, w, device):
        tails.append((w.index, tail.clone()))
        condition = real(vae, tail, w, device)
        tails.append((w.index, condition.y))
        return condition

    monkeypatch.setattr(lv, "_continuation", spy)
    steps_seen: list[tuple[int, int]] = []
    path = cam.path_from_actions("w-8,l-6,w-6", frames, H, W)
    experts = DiskExperts(files.high, files.low, "cpu")
    result = lv.sample_windows(experts, text, files.vae, image, frames, H, W, lv.WindowedCamera(path, frames, H, W),
                               PARAMS, lv.WindowParams(window, overlap), pieces.append, device="cpu",
                               on_latent=lambda w, x: latents.append(x),
                               on_step=lambda i, n: steps_seen.append((i, n)))
    experts.close()
    assert result.windows_done == 2 and [w.start for w in result.windows] == [0, 8]
    assert [p.shape[1] for p in pieces] == [13, 8] and result.frames_written == frames
    assert steps_seen == [(i, 6) for i in range(1, 7)]
    first = decode(files.vae, latents[0], "cpu")
    second = decode(files.vae, latents[1], "cpu")
    assert torch.equal(pieces[0], first)
    assert torch.equal(pieces[1], second[:, overlap:])  # the given frames are not written twice
    (index, tail), (_, y) = tails
    assert index == 1 and torch.equal(tail, first[:, -overlap:])  # window 1 starts on window 0's last 5
    # Its condition: mask 1 for the 5 given frames (latent frames 0 and 1), the VAE latent of
    # [tail, zeros] after it.
    assert (y[:4, :2] == 1).all() and (y[:4, 2:] == 0).all()
    vae = load_vae(files.vae, "cpu", torch.float32)
    clip = torch.zeros(3, window, H, W)
    clip[:, :overlap] = tail
    with torch.inference_mode():
        assert torch.equal(y[4:], vae.encode(clip[None])[0])
    # The seeds differ per window (seed + index): the second window is not a copy.
    assert not torch.equal(latents[0][:, :2], latents[1][:, :2])


def test_cancel_between_windows_keeps_the_finished_frames(package, image, tmp_path) -> None:
    import av

    calls = {"windows": 0}

    class Cancelled(Exception):
        pass

    def check() -> None:
        if calls["windows"] >= 1:
            raise Cancelled("stop")

    out = tmp_path / "walk.mp4"
    with pytest.raises(Cancelled):
        generate(package, image, "a walk", "", 25, H, W, out,
                 camera=cam.path_from_actions("w-24", 25, H, W), params=PARAMS,
                 windows=lv.WindowParams(9, 1), device="cpu", cache_dir=tmp_path / "cache",
                 on_window=lambda i, n: calls.__setitem__("windows", i), check_interrupt=check)
    with av.open(str(out)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 9  # the first window, playable


def test_generate_long_writes_every_frame(package, image, tmp_path) -> None:
    import av

    out = tmp_path / "walk.mp4"
    result = generate(package, image, "a walk", "", 25, H, W, out,
                      camera=cam.path_from_actions("w-10,l-10,w-4", 25, H, W), params=PARAMS,
                      windows=lv.WindowParams(9, 1), device="cpu", cache_dir=tmp_path / "cache",
                      keep_resident=True)
    assert result.windows_done == 3 and result.frames_written == 25
    with av.open(str(out)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == 25 and frames[0].shape == (H, W, 3)


def test_resident_experts_load_each_expert_once(package, monkeypatch) -> None:
    from comfyui_lingbot_world.pipeline import experts as experts_mod

    loads: list[str] = []
    real = experts_mod.load_expert
    monkeypatch.setattr(experts_mod, "load_expert",
                        lambda folder, *a, **k: loads.append(str(folder)) or real(folder, *a, **k))
    files = find_package(package)
    experts = DiskExperts(files.high, files.low, "cpu", keep_resident=True)
    for _ in range(3):  # three windows' worth of high → low switches
        experts.acquire("high"), experts.release("high"), experts.acquire("low"), experts.release("low")
    assert len(loads) == 2
    experts.close()
    assert not experts._resident
