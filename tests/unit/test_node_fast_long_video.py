"""nodes/fast_long_video.py: LingBot-World Fast Long Video inside the ComfyUI host (CPU) on the
tiny Fast transformer: one causal pass written chunk by chunk into an .mp4 equal to the clip
sampler's video, the camera made per chunk (never a whole-video tensor), frames rounded down
to whole chunks, Cancel keeping the chunks written, the checks of its inputs, progress without
latent previews (an output node), and no empty file after a failure before the first frame."""
from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest
import torch

from comfy_host import comfy_state_reset, use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
import comfy.model_management as mm  # noqa: E402
import comfy.utils  # noqa: E402

from node_runs import (H, VAE_FILE, W, MemoryPlanAsked, encode_prompt, fast_not_resident, load_fast,  # noqa: E402
                       record_fast_runs, run_fast_sampler)
from comfyui_lingbot_world.nodes.camera import LingBotWorldCamera  # noqa: E402
from comfyui_lingbot_world.nodes.fast_long_video import LingBotWorldFastLongVideo  # noqa: E402
from comfyui_lingbot_world.nodes.host import model_files  # noqa: E402
from comfyui_lingbot_world.nodes.vae import LingBotWorldVAEDecode, LingBotWorldVAEEncode  # noqa: E402
from comfyui_lingbot_world.pipeline.fast import conditions  # noqa: E402
from comfyui_lingbot_world.wan import camera as wan_camera  # noqa: E402

NONE = model_files.NO_FILE
clean_comfy_state = pytest.fixture(autouse=True)(comfy_state_reset)


def _image() -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(0).random((1, 40, 60, 3), dtype=np.float32))


def _path(frames: int, actions: str = "w-8,l-6,w-6"):
    return LingBotWorldCamera.execute("actions", "static", 1.0, NONE, NONE, W, H, frames, actions, NONE, True,
                                      81, 1)[2]


def _stream(fast, text, frames=21, camera_path=None, prefix="LingBotWorld/fast_long", **kw):
    args = dict(fast_dit=fast, image=_image(), vae=VAE_FILE, width=W, height=H, frames=frames,
                kv_cache="sliding_window", kv_window=9, kv_sink=3, kv_dtype="bf16", shift=10.0, seed=1, decode_tile=0,
                fps=16, filename_prefix=prefix, text=text, camera_path=camera_path)
    args.update(kw)
    return LingBotWorldFastLongVideo.execute(**args)


def _frames(path: Path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def test_the_stream_writes_the_clip_samplers_video_chunk_by_chunk(fast_installed):
    from comfyui_lingbot_world.pipeline.video_file import VideoWriter

    text, (fast, _) = encode_prompt(), load_fast()
    path = _path(21)
    ticks = []
    comfy.utils.set_progress_bar_global_hook(lambda value, total, preview, node_id=None: ticks.append((value, total)))
    writes = []
    real_write = VideoWriter.write

    def counting_write(self, video):
        writes.append(video.shape[1])
        return real_write(self, video)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(VideoWriter, "write", counting_write)
        patch.setattr(wan_camera, "camera_tensor", lambda *a, **k: pytest.fail("a whole-video camera was built"))
        out = _stream(fast, text, camera_path=path)
    assert writes == [9, 12]  # the first chunk's 9 frames, then 12: written as each chunk finished
    assert ticks[-1] == (9, 9) and [v for v, _ in ticks] == sorted(v for v, _ in ticks)
    files = sorted((fast_installed["output"] / "LingBotWorld").glob("fast_long_*.mp4"))
    assert [f.name for f in files] == ["fast_long_00001_.mp4"]
    streamed = _frames(files[0])
    assert streamed.shape == (21, H, W, 3)
    assert out.ui["images"] == [{"filename": "fast_long_00001_.mp4", "subfolder": "LingBotWorld", "type": "output"}]
    assert "text" not in out.ui  # 21 frames fill whole chunks: nothing to say
    assert fast_not_resident(fast)

    # The same video as the clip workflow: VAE Encode -> Fast Sampler (whole camera) -> decode.
    i2v = LingBotWorldVAEEncode.execute(_image(), VAE_FILE, W, H, 21, "auto")[0]
    camera = LingBotWorldCamera.execute("actions", "static", 1.0, NONE, NONE, W, H, 21, "w-8,l-6,w-6", NONE, True,
                                        81, 1)[0]
    samples = run_fast_sampler(fast, text, i2v, camera)
    clip = LingBotWorldVAEDecode.execute(samples, VAE_FILE, 0, "auto")[0]
    with VideoWriter(fast_installed["output"] / "clip.mp4", fps=16) as writer:
        writer.write(clip.permute(3, 0, 1, 2) * 2 - 1)
    # The pixels agree before the codec (pipeline equality: test_fast_stream.py) up to the
    # LATENT's float round trip; through the same encoder the two files then nearly agree.
    diff = np.abs(streamed.astype(np.int16) - _frames(fast_installed["output"] / "clip.mp4").astype(np.int16))
    print(f"stream vs clip .mp4: mean {diff.mean():.4f}, max {diff.max()}")
    assert diff.mean() < 0.5, diff.mean()


def test_961_frames_asked_make_957_and_the_node_says_so(fast_installed, monkeypatch, caplog):
    """Not run at 957 frames here: the frame count is checked and rounded before anything loads."""
    from comfyui_lingbot_world.nodes import fast_long_video as node

    made = []
    monkeypatch.setattr(node, "stream_fast_video", lambda model, prompt, vae, image, frames, *a, **k: made.append(frames))
    text, (fast, _) = encode_prompt(), load_fast()
    with caplog.at_level("WARNING"):
        out = _stream(fast, text, frames=961)
    assert made == [957]
    assert "frames=961 asked; 957 made (whole 12-frame chunks)" in caplog.text
    assert out.ui["text"] == ["frames=961 asked; 957 made (whole 12-frame chunks)"]
    _stream(fast, text, frames=25)  # 25 -> 21
    assert made[-1] == 21


def test_cancel_in_chunk_two_keeps_chunk_one(fast_installed):
    text, (fast, _) = encode_prompt(), load_fast()

    def hook(value, total, preview, node_id=None):
        if value == 7:  # inside chunk 2
            mm.interrupt_current_processing(True)

    comfy.utils.set_progress_bar_global_hook(hook)
    with pytest.raises(mm.InterruptProcessingException):
        _stream(fast, text, frames=33, prefix="LingBotWorld/cancel")
    (video,) = (fast_installed["output"] / "LingBotWorld").glob("cancel_*.mp4")
    assert _frames(video).shape[0] == 9  # the first chunk, playable
    assert fast_not_resident(fast) and not mm.processing_interrupted()


def test_the_inputs_are_checked_before_anything_loads(fast_installed, monkeypatch):
    text, (fast, _) = encode_prompt(), load_fast()
    monkeypatch.setattr(mm, "load_models_gpu", lambda *a, **k: pytest.fail("loaded before the inputs were checked"))
    with pytest.raises(ValueError, match="camera_path: expected"):
        _stream(fast, text, camera_path="not a path")
    short = LingBotWorldCamera.execute("preset", "orbit_left", 1.0, NONE, NONE, W, H, 9)[2]
    with pytest.raises(ValueError, match=r"camera_path: preset 'orbit_left': 9 poses cover only 9 frames but 21"):
        _stream(fast, text, camera_path=short)
    # An action string is the act2cam camera of the stream's own length: longer than it is refused.
    with pytest.raises(ValueError, match=r"camera_path: action string 'w-40' holds 40 action frames but the video "
                                         r"has 21 frames"):
        _stream(fast, text, camera_path=_path(45, "w-40"))
    with pytest.raises(ValueError, match="frames=5 is shorter than one chunk of 12 frames; use at least 9"):
        _stream(fast, text, frames=5)
    with pytest.raises(ValueError, match="kv_sink=9 must be smaller than kv_window=9"):
        _stream(fast, text, kv_sink=9)
    with pytest.raises(ValueError, match="precision"):
        _stream(fast, text, precision="fp16")
    with pytest.raises(ValueError, match="fast_dit: expected the output of LingBot-World Fast DiT Loader"):
        _stream(None, text)
    assert not list(fast_installed["output"].rglob("*.mp4"))  # nothing written before the checks pass


def test_the_camera_is_made_chunk_by_chunk(fast_installed, monkeypatch):
    """KeyframeCamera builds each chunk's rays; no Plücker tensor of the whole video exists."""
    text, (fast, _) = encode_prompt(), load_fast()
    asked = []
    real_chunk = conditions.KeyframeCamera.chunk
    monkeypatch.setattr(conditions.KeyframeCamera, "chunk",
                        lambda self, start, count: asked.append((start, count)) or real_chunk(self, start, count))
    _stream(fast, text, frames=33, camera_path=_path(33))
    assert asked == [(0, 3), (3, 3), (6, 3)]


def test_the_stream_sends_progress_but_no_latent_preview(fast_installed, monkeypatch):
    """An output node: the page shows a node's latent previews instead of its video until it
    runs again (nodes/host/progress.LivePreview), so the bar moves with no image."""
    import latent_preview
    from comfy.cli_args import LatentPreviewMethod

    monkeypatch.setattr(latent_preview.args, "preview_method", LatentPreviewMethod.Latent2RGB)
    text, (fast, _) = encode_prompt(), load_fast()
    ticks = []
    comfy.utils.set_progress_bar_global_hook(
        lambda value, total, preview, node_id=None: ticks.append((value, total, preview)))
    _stream(fast, text, frames=21)
    assert ticks and ticks[-1][:2] == (9, 9)
    assert [p for _, _, p in ticks] == [None] * len(ticks)


def test_steps_sets_the_passes_of_every_chunk(fast_installed):
    """steps 2: 3 forwards a chunk (2 for the last, which skips its commit), the whole video
    written; another video than the official 4 steps make."""
    text, (fast, _) = encode_prompt(), load_fast()
    ticks = []
    comfy.utils.set_progress_bar_global_hook(lambda value, total, preview, node_id=None: ticks.append((value, total)))
    two = Path(_stream(fast, text, frames=21, steps=2, prefix="LingBotWorld/two").args[0].get_stream_source())
    assert ticks[-1] == (5, 5)
    four = Path(_stream(fast, text, frames=21, prefix="LingBotWorld/four").args[0].get_stream_source())
    assert _frames(two).shape == _frames(four).shape == (21, H, W, 3)
    assert not np.array_equal(_frames(two), _frames(four))
    with pytest.raises(ValueError, match="steps: 0 is not one of 4, 3, 2, 1"):
        _stream(fast, text, frames=21, steps=0)
    assert fast_not_resident(fast)


def test_a_failure_before_the_first_frame_leaves_no_file(fast_installed, monkeypatch):
    from comfyui_lingbot_world.nodes import fast_long_video as node

    def failing(*args, **kwargs):
        raise RuntimeError("out of memory in the first chunk")

    monkeypatch.setattr(node, "stream_fast_video", failing)
    text, (fast, _) = encode_prompt(), load_fast()
    with pytest.raises(RuntimeError, match="out of memory"):
        _stream(fast, text, frames=21)
    assert not list(fast_installed["output"].rglob("*.mp4"))
    assert fast_not_resident(fast)


def test_961_frames_with_the_long_walk_string_run_with_the_camera_over_the_961_asked(fast_installed, monkeypatch):
    """The README's long walk (960 action frames) at 961 frames: no "set frames to 961" with
    961 set; the video is 957 frames, the camera spread over the 961 asked (official generate_fast)."""
    from comfyui_lingbot_world.nodes import fast_long_video as node
    from comfyui_lingbot_world.pipeline.camera import path_from_actions
    from comfyui_lingbot_world.pipeline.fast import path_camera

    seen = []
    monkeypatch.setattr(node, "stream_fast_video",
                        lambda model, prompt, vae, image, frames, h, w, camera, *a, **k: seen.append((frames, camera)))
    actions = "w-480,d-240,w-240"
    path = path_from_actions(actions, 961, H, W)
    text, (fast, _) = encode_prompt(), load_fast()
    _stream(fast, text, frames=961, camera_path=path)
    (frames, camera), = seen
    assert frames == 957 and camera.keyframes.shape[0] == 240
    assert torch.equal(camera.keyframes, path_camera(path, 961, H, W).keyframes)


def test_the_memory_plan_gets_the_vae_streams_budget(fast_installed, monkeypatch):
    """The room asked for the VAE and its streams is ``vae_budgets`` of the VAE file's size,
    the video's size and the precision (as Play's: test_node_play.py)."""
    from comfyui_lingbot_world.nodes import fast_long_video
    from comfyui_lingbot_world.pipeline.memory import vae_budgets

    calls = record_fast_runs(monkeypatch, fast_long_video)
    text, (fast, _) = encode_prompt(), load_fast()
    for precision in ("fp32", "bf16"):
        with pytest.raises(MemoryPlanAsked):
            _stream(fast, text, precision=precision)
    size = (fast_installed["package"] / "Wan2.1_VAE.pth").stat().st_size
    assert [(c["vae"], c["decode"]) for c in calls] == [vae_budgets(size, H, W, p) for p in ("fp32", "bf16")]
    assert list(fast_installed["output"].rglob("*.mp4")) == []  # stopped before its first frame: no file
