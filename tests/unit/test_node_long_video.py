"""nodes/long_video.py: LingBot-World Long Video inside the ComfyUI host (CPU) on the tiny
package: the .mp4 written window by window, cancel, the checks of its inputs, the LoRAs of
the LoRA Loader (applied and refused as the sampler does), the output file checked before
the first window (a read-only folder, a full disk, a bad prefix), no latent previews; the
Act checkpoint through the windows, and the refusal of a wrong checkpoint/controls pairing."""
from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from comfy_host import comfy_state_reset, use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
import av  # noqa: E402
import comfy.model_management as mm  # noqa: E402
import comfy.utils  # noqa: E402

from node_runs import ACT_PKG, H, PKG, W  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from synthetic_lora import kohya_state, write_kohya_lora  # noqa: E402
from comfyui_lingbot_world.loaders.errors import CheckpointError  # noqa: E402
from comfyui_lingbot_world.nodes.camera import LingBotWorldCamera  # noqa: E402
from comfyui_lingbot_world.nodes.dit_loader import LingBotWorldDiTLoader  # noqa: E402
from comfyui_lingbot_world.nodes.host import model_files  # noqa: E402
from comfyui_lingbot_world.nodes.long_video import LingBotWorldLongVideo  # noqa: E402
from comfyui_lingbot_world.nodes.lora_loader import LingBotWorldLoraLoader  # noqa: E402
from comfyui_lingbot_world.nodes.text_encode import LingBotWorldTextEncode  # noqa: E402

NONE = model_files.NO_FILE

clean_comfy_state = pytest.fixture(autouse=True)(comfy_state_reset)


def _camera(source="preset", preset="pan_left", poses=NONE, intrinsics=NONE, frames=9, actions="w-20,j-10,w-30",
            export=NONE, normalize=True, window=81, overlap=1, width=W, height=H):
    return LingBotWorldCamera.execute(source, preset, 1.0, poses, intrinsics, width, height, frames, actions, export,
                                      normalize, window, overlap)


def _text():
    return LingBotWorldTextEncode.execute(f"{PKG}/models_t5_umt5-xxl-enc-bf16.pth", f"{PKG}/tokenizer",
                                          "a walk", "blurry", "auto")[0]


def _dit(package=PKG):
    return LingBotWorldDiTLoader.execute(f"{package}/high_noise_model_bnb_nf4", f"{package}/low_noise_model_bnb_nf4",
                                         "none")[0]


def _long(installed, frames=13, window=9, steps=2, camera_path=None, dit=None, text=None, package=PKG, **kw):
    text = text if text is not None else _text()
    dit = dit if dit is not None else _dit(package)
    image = torch.from_numpy(np.random.default_rng(0).random((1, 40, 60, 3), dtype=np.float32))
    args = dict(dit=dit, image=image, vae=f"{PKG}/Wan2.1_VAE.pth", width=W, height=H, frames=frames, window=window,
                overlap=1, scale_quantile=1.0, steps=steps, shift=5.0, cfg_high=4.0, cfg_low=4.0, boundary=0.9, seed=3,
                sampler="unipc", decode_tile=0, keep_experts=False, fps=16, filename_prefix="LingBotWorld/long",
                text=text, camera_path=camera_path)
    args.update(kw)
    return dit, LingBotWorldLongVideo.execute(**args)


def _frames_in(path: Path) -> int:
    with av.open(str(path)) as container:
        return sum(1 for _ in container.decode(video=0))


def test_long_video_node_writes_the_mp4_window_by_window(installed):
    _, _, path = _camera("actions", frames=13, window=9, actions="w-6,l-6")
    seen = []
    comfy.utils.set_progress_bar_global_hook(lambda value, total, preview, node_id=None: seen.append((value, total)))
    dit, out = _long(installed, camera_path=path)
    files = sorted((installed["output"] / "LingBotWorld").glob("long_*.mp4"))
    assert [f.name for f in files] == ["long_00001_.mp4"]
    assert _frames_in(files[0]) == 13
    video = out.args[0]
    assert video.get_dimensions() == (W, H)
    assert out.ui.as_dict()["images"] == [{"filename": "long_00001_.mp4", "subfolder": "LingBotWorld", "type": "output"}]
    assert seen[-1] == (4, 4) and len(seen) == 4  # 2 windows x 2 steps
    assert dit.high.expert is None and dit.low.expert is None
    kept, _ = _long(installed, keep_experts=True, steps=1)  # a second run gets a new file, experts kept then closed
    assert kept.high.expert is None and kept.low.expert is None
    assert len(list((installed["output"] / "LingBotWorld").glob("long_*.mp4"))) == 2


def test_cancel_in_window_two_keeps_window_one(installed):
    def hook(value, total, preview, node_id=None):
        if value == 3:  # the first step of window 2
            mm.interrupt_current_processing(True)

    comfy.utils.set_progress_bar_global_hook(hook)
    with pytest.raises(mm.InterruptProcessingException):
        dit, _ = _long(installed, frames=17, window=9)
    files = list((installed["output"] / "LingBotWorld").glob("long_*.mp4"))
    assert len(files) == 1 and _frames_in(files[0]) == 9


def test_long_video_node_checks_its_inputs(installed):
    with pytest.raises(ValueError, match="camera_path: expected"):
        _long(installed, camera_path="not a path")
    with pytest.raises(ValueError, match="overlap"):
        _long(installed, overlap=9)
    # A pose path of 9 frames cannot drive more (an action string can: the camera holds still after it).
    _, _, short = _camera("preset", frames=9, window=9)
    with pytest.raises(ValueError, match="cover only"):
        _long(installed, camera_path=short)
    assert not list(installed["output"].rglob("*.mp4"))  # nothing written before the checks pass


def _decoded(path: Path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def _one_window(installed, dit, text, **kw) -> np.ndarray:
    """The frames of a one-window Long Video (5 frames, 2 steps), read back from its .mp4."""
    _, out = _long(installed, frames=5, window=5, dit=dit, text=text, **kw)
    return _decoded(Path(out.args[0].get_stream_source()))


def _mp4s(installed) -> list[Path]:
    return sorted(installed["output"].rglob("*.mp4"))


def test_long_video_applies_the_loras_of_the_lora_loader(installed):
    """As the sampler does (tests/unit/test_node_lora_loader.py): strength 0 is the plain
    video, a LoRA changes it, and the experts are clean again afterwards."""
    text, dit = _text(), _dit()
    write_kohya_lora(installed["loras"] / "h.safetensors", installed["package"] / "high_noise_model_bnb_nf4")
    write_kohya_lora(installed["loras"] / "l.safetensors", installed["package"] / "low_noise_model_bnb_nf4", seed=3)
    plain = _one_window(installed, dit, text)
    zero = LingBotWorldLoraLoader.execute(dit, "h.safetensors", 0.0, "l.safetensors", 0.0)[0]
    assert np.array_equal(_one_window(installed, zero, text), plain)
    strong = LingBotWorldLoraLoader.execute(dit, "h.safetensors", 4.0, "l.safetensors", 4.0)[0]
    with_lora = _one_window(installed, strong, text)
    assert with_lora.shape == plain.shape and np.abs(with_lora.astype(int) - plain).mean() > 1
    assert dit.high.expert is None and dit.low.expert is None
    assert np.array_equal(_one_window(installed, dit, text), plain)  # adapters detached on release


def _bad_lora(installed, what: str) -> str:
    """A kohya LoRA for the high-noise expert with NaN in one factor, or of rank 0."""
    state = kohya_state(installed["package"] / "high_noise_model_bnb_nf4")
    key = "lora_unet_blocks_0_ffn_0.lora_up.weight"
    if what == "nan":
        state[key][0, 0] = float("nan")
    else:  # rank 0: both factors of one layer empty
        state[key] = state[key][:, :0].contiguous()
        down = key.replace("lora_up", "lora_down")
        state[down] = state[down][:0].contiguous()
    save_file(state, str(installed["loras"] / f"{what}.safetensors"))
    return f"{what}.safetensors"


@pytest.mark.parametrize("what, problem", [("nan", "non-finite"), ("rank0", "rank 0")])
def test_long_video_refuses_a_bad_lora_like_the_sampler_and_leaves_no_file(installed, what, problem):
    text, dit = _text(), _dit()
    bad = LingBotWorldLoraLoader.execute(dit, _bad_lora(installed, what), 1.0, "none", 1.0)[0]
    with pytest.raises(CheckpointError) as error:
        _long(installed, frames=5, window=5, dit=bad, text=text)
    message = str(error.value)
    assert message.startswith(f"loras/{what}.safetensors:") and problem in message, message
    assert dit.high.expert is None and dit.low.expert is None
    assert _mp4s(installed) == []  # failed before its first frame: no empty file left


@contextlib.contextmanager
def _read_only(folder: Path):
    """``folder`` made read-only for this process: chmod, and as root (whom chmod does not
    stop) the immutable attribute."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o555)
    immutable = os.geteuid() == 0
    if immutable and subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        folder.chmod(0o755)
        pytest.skip("running as root without chattr: cannot make a folder read-only")
    try:
        yield folder
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        folder.chmod(0o755)


@contextlib.contextmanager
def _full_disk(limit: int = 64 * 1024):
    """Writes past ``limit`` bytes of any file fail (EFBIG), as on a disk with that little room."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an error instead of the signal's kill
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def _count_loads(monkeypatch) -> list:
    loads = []
    real = mm.load_models_gpu
    monkeypatch.setattr(mm, "load_models_gpu", lambda models, *a, **k: (loads.append(models), real(models, *a, **k))[1])
    return loads


def test_long_video_into_a_read_only_folder_fails_before_the_first_window_naming_it(installed, monkeypatch):
    text, dit = _text(), _dit()
    loads = _count_loads(monkeypatch)
    with _read_only(installed["output"] / "LingBotWorld"):
        with pytest.raises(OSError) as error:
            _long(installed, frames=5, window=5, dit=dit, text=text)
    assert "output/LingBotWorld/long_00001_.mp4: cannot create the video file" in str(error.value)
    assert str(installed["output"]) not in str(error.value)  # named relative to the output folder
    assert loads == [] and _mp4s(installed) == []


def test_long_video_onto_a_full_disk_fails_before_the_first_window_naming_the_file(installed, monkeypatch):
    text, dit = _text(), _dit()
    loads = _count_loads(monkeypatch)
    with _full_disk():
        with pytest.raises(OSError) as error:
            _long(installed, frames=5, window=5, dit=dit, text=text)
    assert "output/LingBotWorld/long_00001_.mp4: cannot write 1 MiB to the video file" in str(error.value)
    assert loads == [] and _mp4s(installed) == []


@pytest.mark.parametrize("prefix, problem", [
    ("Ling\x00Bot/long", "control character"),
    ("/etc/long", "points outside the output folder"),
    ("../long", "points outside the output folder"),
])
def test_long_video_refuses_a_bad_prefix_before_the_first_window_naming_the_input(installed, monkeypatch,
                                                                                   prefix, problem):
    loads = _count_loads(monkeypatch)
    with pytest.raises(ValueError, match=f"^filename_prefix: .*{problem}"):
        _long(installed, frames=5, window=5, filename_prefix=prefix)
    assert loads == [] and _mp4s(installed) == []


def test_long_video_with_live_previews_on_sends_progress_but_no_latent_preview(installed, monkeypatch):
    """The page shows a node's latent previews instead of its outputs until the node runs
    again, so an output node that sent them would end showing a blurry latent, not its video
    (nodes/host/progress.LivePreview): the Long Video moves the bar and sends no image."""
    import latent_preview
    from comfy.cli_args import LatentPreviewMethod

    monkeypatch.setattr(latent_preview.args, "preview_method", LatentPreviewMethod.Latent2RGB)
    ticks = []
    comfy.utils.set_progress_bar_global_hook(
        lambda value, total, preview, node_id=None: ticks.append((value, total, preview)))
    _long(installed, frames=13, window=9, steps=2)
    # 2 windows x 2 steps; newer hosts throttle plain progress but keep the first and last
    assert ticks[0][:2] == (1, 4) and ticks[-1][:2] == (4, 4)
    assert [p for _, _, p in ticks] == [None] * len(ticks)


def test_the_act_checkpoint_through_the_windows(installed_act, monkeypatch):
    """An action string on the Act checkpoint, 13 frames in windows of 9: every window gets
    the Act control (directions + its W/A/S/D rows), and the video has every frame."""
    from comfyui_lingbot_world.pipeline import long_video as pipeline_long_video
    from comfyui_lingbot_world.wan.act_control import wasd_from_actions

    _, _, path = _camera("actions", frames=13, window=9, actions="w-3,d-4,s-5")
    seen = []
    real = pipeline_long_video.sample

    def spying_sample(experts, text, condition, camera, *args, **kwargs):
        seen.append(camera)
        return real(experts, text, condition, camera, *args, **kwargs)

    monkeypatch.setattr(pipeline_long_video, "sample", spying_sample)
    dit, _ = _long(installed_act, camera_path=path, package=ACT_PKG)
    assert dit.config.control_type == "act" and [c.control_type for c in seen] == ["act", "act"]
    keys = wasd_from_actions("w-3,d-4,s-5", 13)
    for camera, (start, frames) in zip(seen, ((0, 9), (8, 5))):  # windows 0..8 and 8..12
        assert camera.plucker.shape == (1, 448, (frames - 1) // 4 + 1, H // 8, W // 8)
        np.testing.assert_array_equal(camera.plucker[0, 192::64, :, 0, 0].T.numpy(), keys[start:start + frames:4])
    (video,) = (installed_act["output"] / "LingBotWorld").glob("long_*.mp4")
    assert _frames_in(video) == 13


def test_the_wrong_pairing_is_refused_before_any_expert_loads(installed_act, monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("an expert was loaded")

    monkeypatch.setattr(mm, "load_models_gpu", no_load)
    _, _, preset = _camera("preset", frames=13, window=9)
    with pytest.raises(ValueError, match=r"act/high_noise_model_bnb_nf4\) is an Act checkpoint .* the camera "
                                         r"\(preset 'pan_left'\) gives Base-Cam Plücker rays"):
        _long(installed_act, camera_path=preset, package=ACT_PKG)
    assert not list(installed_act["output"].rglob("*.mp4"))  # nothing written before the checks pass
