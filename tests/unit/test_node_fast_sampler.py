"""nodes/fast_sampler.py: LingBot-World Fast Sampler inside the ComfyUI host (CPU) on the tiny
Fast transformer: chunks, progress per forward and a preview per chunk, the LATENT in
ComfyUI's convention, the prompt from text or core CONDITIONING, refusals that name the
input (frames that do not fill a chunk, window and sink; a model the files mark as Base:
test_node_fast_dit_loader.py),
Cancel mid-chunk, and the transformer never left resident."""
from __future__ import annotations

import gc
import math
import weakref

import pytest
import torch

from comfy_host import comfy_state_reset, use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
import comfy.model_management as mm  # noqa: E402
import comfy.utils  # noqa: E402
import latent_preview  # noqa: E402

from node_runs import (FAST_FRAMES, H, VAE_FILE, W, core_conditioning, encode_prompt, encode_start,  # noqa: E402
                       fast_not_resident, load_fast, run_fast_sampler)
from comfyui_lingbot_world.nodes.camera import LingBotWorldCamera  # noqa: E402
from comfyui_lingbot_world.nodes.fast_sampler import LingBotWorldFastSampler  # noqa: E402
from comfyui_lingbot_world.nodes.host import model_files  # noqa: E402
from comfyui_lingbot_world.nodes.vae import LingBotWorldVAEDecode  # noqa: E402
from comfyui_lingbot_world.pipeline.latent import from_comfy_latent  # noqa: E402

clean_comfy_state = pytest.fixture(autouse=True)(comfy_state_reset)
NONE = model_files.NO_FILE
FORWARDS = 2 * 5 - 1  # two chunks of 4 steps + a commit pass, the last chunk without its commit


def _camera(frames=FAST_FRAMES, width=W):
    return LingBotWorldCamera.execute("preset", "orbit_left", 1.0, NONE, NONE, width, H, frames)[0]


def _record_progress():
    ticks = []
    comfy.utils.set_progress_bar_global_hook(
        lambda value, total, preview, node_id=None: ticks.append((value, total, preview)))
    return ticks


def test_fast_sampler_makes_the_clip_chunk_by_chunk_and_leaves_nothing_resident(fast_installed, monkeypatch):
    from comfy.cli_args import LatentPreviewMethod

    monkeypatch.setattr(latent_preview.args, "preview_method", LatentPreviewMethod.Latent2RGB)
    text, i2v = encode_prompt(), encode_start(FAST_FRAMES)
    fast, info = load_fast()
    loads = []
    real_load = mm.load_models_gpu

    def recording_load(models, *args, **kwargs):
        real_load(models, *args, **kwargs)
        assert kwargs.get("force_full_load") is True and kwargs.get("memory_required", 0) > 0
        loads.append([m.model.name for m in models])

    monkeypatch.setattr(mm, "load_models_gpu", recording_load)
    ticks = _record_progress()
    latent = run_fast_sampler(fast, text, i2v, _camera())["samples"]
    assert tuple(latent.shape) == (1, 16, 6, H // 8, W // 8) and latent.dtype == torch.float32
    assert torch.isfinite(latent).all()
    assert loads == [["fast"]]
    # The bar: one tick per forward; a preview image at the end of each chunk.
    assert [v for v, _, _ in ticks] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 9] and {t for _, t, _ in ticks} == {FORWARDS}
    images = [(v, p) for v, _, p in ticks if p is not None]
    assert [v for v, _ in images] == [5, 9]
    for _, (kind, image, _) in images:
        assert kind == "JPEG" and image.size == (W // 8, H // 8)
    assert fast_not_resident(fast)
    # Same seed, same latent; the camera changes it; another seed too.
    torch.testing.assert_close(run_fast_sampler(fast, text, i2v, _camera())["samples"], latent, rtol=0, atol=0)
    assert not torch.allclose(run_fast_sampler(fast, text, i2v, None)["samples"], latent)
    assert not torch.allclose(run_fast_sampler(fast, text, i2v, _camera(), seed=2)["samples"], latent)
    assert fast_not_resident(fast)


def test_steps_takes_the_first_timesteps_and_four_is_a_graph_without_the_widget(fast_installed):
    """steps 2: 3 forwards a chunk (the bar counts them; the last chunk skips its commit);
    steps 4 is what a graph saved before the widget runs, bit for bit."""
    text, i2v, (fast, _) = encode_prompt(), encode_start(FAST_FRAMES), load_fast()
    camera = _camera()
    ticks = _record_progress()
    two = run_fast_sampler(fast, text, i2v, camera, steps=2)["samples"]
    assert [v for v, _, _ in ticks if v] == [1, 2, 3, 4, 5, 5] and {t for _, t, _ in ticks} == {2 * 3 - 1}
    legacy = run_fast_sampler(fast, text, i2v, camera)["samples"]  # no steps input: an older graph
    assert torch.equal(run_fast_sampler(fast, text, i2v, camera, steps=4)["samples"], legacy)
    assert (two - legacy).abs().max() > 1e-3
    assert fast_not_resident(fast)


def test_a_short_clip_is_the_start_of_a_longer_one(fast_installed):
    """ChunkNoise: each chunk's noise comes from (seed, chunk), and the window keeps the first
    chunk's attention the same, so 9 frames are the first chunk of 21 with the same seed."""
    text, (fast, _) = encode_prompt(), load_fast()
    short = run_fast_sampler(fast, text, encode_start(9))["samples"]
    long = run_fast_sampler(fast, text, encode_start(21))["samples"]
    assert short.shape[2] == 3 and long.shape[2] == 6
    assert torch.equal(long[:, :, :3], short)


def test_the_latent_decodes_with_the_packs_decoder(fast_installed):
    text, i2v, (fast, _) = encode_prompt(), encode_start(9), load_fast()
    samples = run_fast_sampler(fast, text, i2v)
    frames = LingBotWorldVAEDecode.execute(samples, VAE_FILE, 0, "auto")[0]
    assert tuple(frames.shape) == (9, H, W, 3) and 0 <= float(frames.min()) <= float(frames.max()) <= 1
    # The LATENT is ComfyUI's raw Wan 2.1 latent: normalized back, it is the model's x0 scale.
    assert from_comfy_latent(samples["samples"][0]).abs().max() < 50


def test_fast_sampler_takes_core_conditioning_instead_of_text(fast_installed):
    text, i2v, (fast, _) = encode_prompt(), encode_start(9), load_fast()
    by_text = run_fast_sampler(fast, text, i2v)["samples"]
    positive = core_conditioning(text.positive, mask=True)
    torch.testing.assert_close(run_fast_sampler(fast, None, i2v, positive=positive)["samples"], by_text)
    with pytest.raises(ValueError, match="both connected"):
        run_fast_sampler(fast, text, i2v, positive=positive)
    with pytest.raises(ValueError, match="no prompt"):
        run_fast_sampler(fast, None, i2v)
    with pytest.raises(ValueError, match="positive: the text encoder gives 4096 features per token but the Fast "
                       "transformer takes 32"):
        run_fast_sampler(fast, None, i2v, positive=core_conditioning(torch.randn(4, 4096)))
    assert "negative" not in LingBotWorldFastSampler.INPUT_TYPES().get("optional", {})  # no CFG
    assert fast_not_resident(fast)


def test_auto_kv_dtype_is_the_memory_plans_at_the_cards_limit(fast_installed, monkeypatch, caplog):
    """kv_dtype auto is one rule (pipeline.memory.plan_fast_memory, which the bench applies
    too): the same clip as bf16 on a card where the bf16 run fits with the allocator's slack;
    one byte less and it is int8 with every block on the card (the same latent as asking for
    int8), never bf16 with blocks swapped; the log says which."""
    from comfyui_lingbot_world.nodes.host import fast_model
    from comfyui_lingbot_world.pipeline.memory import ALLOCATOR_SLACK, AUTO_FIT_SHARE

    text, i2v = encode_prompt(), encode_start(FAST_FRAMES)
    fast, _ = load_fast()
    camera = _camera()
    bf16 = run_fast_sampler(fast, text, i2v, camera, kv_dtype="bf16")["samples"]
    int8 = run_fast_sampler(fast, text, i2v, camera, kv_dtype="int8")["samples"]
    assert not torch.equal(bf16, int8)  # the cache's precision shows in the result
    need = {dtype: fast.patcher.model_size() + mm.minimum_inference_memory()
            + fast_model.run_memory(fast, fast_model.CachePolicy(window=9, sink=3, dtype=dtype), H // 8, W // 8,
                                    (FAST_FRAMES - 1) // 4 + 1) for dtype in ("bf16", "int8")}
    limit = math.ceil((need["bf16"] + ALLOCATOR_SLACK) / AUTO_FIT_SHARE)  # the least card bf16 fits
    assert (need["int8"] + ALLOCATOR_SLACK) / AUTO_FIT_SHARE <= limit - 1  # where int8 still fits
    plans = []
    real_plan = fast_model.memory_plan
    monkeypatch.setattr(fast_model, "memory_plan", lambda *a, **k: plans.append(real_plan(*a, **k)) or plans[-1])
    with caplog.at_level("INFO"):
        monkeypatch.setattr(mm, "get_total_memory", lambda *a, **k: limit)
        assert torch.equal(run_fast_sampler(fast, text, i2v, camera, kv_dtype="auto")["samples"], bf16)
        assert "kv_dtype auto -> bf16" in caplog.text
        monkeypatch.setattr(mm, "get_total_memory", lambda *a, **k: limit - 1)
        assert torch.equal(run_fast_sampler(fast, text, i2v, camera, kv_dtype="auto")["samples"], int8)
        assert "kv_dtype auto -> int8" in caplog.text
    assert [(p.kv_dtype, p.blocks_on_gpu, p.fits) for p in plans] == [("bf16", None, True), ("int8", None, True)]
    assert fast_not_resident(fast)


# --------------------------------------------------------------------------- refusals


def test_frames_that_do_not_fill_a_chunk_name_the_vae_encode_and_the_nearest_counts(fast_installed):
    text, (fast, _) = encode_prompt(), load_fast()
    with pytest.raises(ValueError, match=r"i2v: the LingBot-World Wan VAE Encode node's frames=13 \(4 latent frames\)"
                       r" does not fill whole chunks .* use 9 or 21"):
        run_fast_sampler(fast, text, encode_start(13))
    with pytest.raises(ValueError, match=r"frames=5 .* use 9"):
        run_fast_sampler(fast, text, encode_start(5))
    assert fast_not_resident(fast)


BAD_POLICIES = [  # kv_window, kv_sink, kv_dtype: what the node says
    (2, 0, "bf16", r"kv_window=2 latent frames is smaller than one chunk \(3\)"),
    (6, 6, "bf16", r"kv_sink=6 must be smaller than kv_window=6"),
    (6, 4, "bf16", r"kv_sink=4 plus one chunk \(3\) exceeds kv_window=6"),
    (9, 3, "fp8", r"kv_dtype: 'fp8' is not one of auto, bf16, int8"),
    (9.5, 3, "bf16", r"kv_window: 9.5 is not a whole number"),
]


def test_window_sink_and_dtype_errors_name_the_widget(fast_installed, monkeypatch):
    text, i2v, (fast, _) = encode_prompt(), encode_start(9), load_fast()
    monkeypatch.setattr(mm, "load_models_gpu", lambda *a, **k: pytest.fail("loaded before the inputs were checked"))
    for window, sink, dtype, message in BAD_POLICIES:
        with pytest.raises(ValueError, match=message):
            run_fast_sampler(fast, text, i2v, kv_window=window, kv_sink=sink, kv_dtype=dtype)
    with pytest.raises(ValueError, match="kv_cache: 'ring' is not one of sliding_window, full"):
        run_fast_sampler(fast, text, i2v, kv_cache="ring")
    assert fast_not_resident(fast)


def test_other_inputs_are_checked_before_the_transformer_loads(fast_installed, monkeypatch):
    text, i2v, (fast, _) = encode_prompt(), encode_start(9), load_fast()
    monkeypatch.setattr(mm, "load_models_gpu", lambda *a, **k: pytest.fail("loaded before the inputs were checked"))
    with pytest.raises(ValueError, match="fast_dit: expected the output of LingBot-World Fast DiT Loader"):
        run_fast_sampler("not a model", text, i2v)
    with pytest.raises(ValueError, match="i2v: expected the output of LingBot-World Wan VAE Encode"):
        run_fast_sampler(fast, text, None)
    with pytest.raises(ValueError, match=r"camera is for 9 frames at 64x32 .* 9 frames at 48x32"):
        run_fast_sampler(fast, text, i2v, _camera(9, width=64))
    with pytest.raises(ValueError, match="shift"):
        run_fast_sampler(fast, text, i2v, shift=0.0)
    with pytest.raises(ValueError, match="steps: 5 is not one of 4, 3, 2, 1"):
        run_fast_sampler(fast, text, i2v, steps=5)


# --------------------------------------------------------------------------- cancel and memory


def test_cancel_mid_chunk_frees_the_cache_and_the_transformer_and_the_next_run_works(fast_installed, monkeypatch):
    from comfyui_lingbot_world.wan.runtime import kv_cache as kv

    text, i2v, (fast, _) = encode_prompt(), encode_start(FAST_FRAMES), load_fast()
    caches = []
    real_init = kv.KVCache.__init__

    def tracking_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        caches.append(weakref.ref(self))

    monkeypatch.setattr(kv.KVCache, "__init__", tracking_init)
    seen = []

    def hook(value, total, preview, node_id=None):
        seen.append(value)
        if value == 6:  # the first step of chunk 2: Cancel lands inside it (checked per block)
            mm.interrupt_current_processing(True)

    comfy.utils.set_progress_bar_global_hook(hook)
    with pytest.raises(mm.InterruptProcessingException):
        run_fast_sampler(fast, text, i2v)
    assert seen == [1, 2, 3, 4, 5, 6]  # stopped inside chunk 2, in its second step
    assert fast_not_resident(fast) and not mm.processing_interrupted()
    gc.collect()
    assert all(ref() is None or ref().closed for ref in caches)
    comfy.utils.set_progress_bar_global_hook(None)
    assert run_fast_sampler(fast, text, i2v)["samples"].shape[2] == 6
    assert fast_not_resident(fast)


def test_out_of_memory_names_the_size_and_the_cache_and_unloads_everything(fast_installed, monkeypatch):
    from comfyui_lingbot_world.wan.model import LingBotDiT

    text, i2v, (fast, _) = encode_prompt(), encode_start(FAST_FRAMES), load_fast()
    original = LingBotDiT.forward
    forwards = iter(range(100))

    def failing(self, *args, **kwargs):
        if next(forwards) == 6:  # chunk 2, step 2
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(LingBotDiT, "forward", failing)
    with pytest.raises(torch.cuda.OutOfMemoryError) as err:
        run_fast_sampler(fast, text, i2v, kv_dtype="int8")
    message = str(err.value)
    assert f"{FAST_FRAMES} frames at {W}x{H}" in message and "window 9 sink 3, int8" in message
    assert "chunk 2" in message and "kv_window" in message and "Tried to allocate 3.00 GiB" in message
    assert fast_not_resident(fast)


def test_the_loaders_attention_choice_is_what_the_run_attends_with(fast_installed, monkeypatch):
    """The Fast DiT Loader's attention input reaches the run (Fast Sampler, Long Video and Play
    share prepared_fast_run): each forward runs inside that backend's scope."""
    from comfyui_lingbot_world.nodes.fast_dit_loader import LingBotWorldFastDiTLoader
    from comfyui_lingbot_world.pipeline.fast import generator
    from node_runs import FAST

    text, i2v = encode_prompt(), encode_start(9)
    fast, info = LingBotWorldFastDiTLoader.execute(FAST, "none", 0, attention="sdpa").args
    assert fast.attention == "sdpa" and info.endswith("; attention sdpa")
    seen, scope = [], generator.attention_backend
    monkeypatch.setattr(generator, "attention_backend", lambda name: seen.append(name) or scope(name))
    run_fast_sampler(fast, text, i2v)
    assert seen and set(seen) == {"sdpa"}
    # A kernel that cannot run here fails the run by its name, before a latent is made.
    fast, _ = LingBotWorldFastDiTLoader.execute(FAST, "none", 0, attention="flash_fp8").args
    with pytest.raises(ValueError, match="attention 'flash_fp8' cannot run here: flash_fp8 needs a CUDA GPU"):
        run_fast_sampler(fast, text, i2v)
    with pytest.raises(ValueError, match="attention: 'xformers' is not one of auto, sdpa"):
        LingBotWorldFastDiTLoader.execute(FAST, "none", 0, attention="xformers")
