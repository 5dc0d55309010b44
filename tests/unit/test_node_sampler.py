"""nodes/sampler.py: LingBot-World Dual-Expert Sampler inside the ComfyUI host (CPU): both
experts, one resident at a time; the prompt from text or core CONDITIONING; previews,
cancel, refusals; the fast-mode inputs (step cache, CFG truncation, attention, preset); the
Act checkpoint's controls and the refusal of a wrong checkpoint/controls pairing."""
from __future__ import annotations

import itertools
import logging
import re

import pytest
import torch

from comfy_host import comfy_state_reset, use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
import comfy.model_management as mm  # noqa: E402
import comfy.utils  # noqa: E402
import latent_preview  # noqa: E402

from node_runs import (ACT_PKG, FRAMES, H, W, core_conditioning, encode_prompt, encode_start, load_dit,  # noqa: E402
                       not_resident, run_sampler)
from comfyui_lingbot_world.nodes import sampler as sampler_module  # noqa: E402
from comfyui_lingbot_world.nodes.camera import LingBotWorldCamera  # noqa: E402
from comfyui_lingbot_world.nodes.host import model_files  # noqa: E402
from comfyui_lingbot_world.nodes.host.expert_patcher import ComfyExpertSource  # noqa: E402
from comfyui_lingbot_world.nodes.sampler import LingBotWorldSampler  # noqa: E402
from comfyui_lingbot_world.pipeline.latent import to_comfy_latent  # noqa: E402
from comfyui_lingbot_world.pipeline.sampling import SamplingParams, sample  # noqa: E402
from comfyui_lingbot_world.wan.runtime import attention as attn, switches  # noqa: E402


clean_comfy_state = pytest.fixture(autouse=True)(comfy_state_reset)


def test_sampler_runs_both_experts_and_leaves_none_resident(installed, monkeypatch):
    text, i2v, dit = encode_prompt(), encode_start(), load_dit()
    loads = []
    real_load = mm.load_models_gpu

    def recording_load(models, *args, **kwargs):
        real_load(models, *args, **kwargs)
        assert kwargs.get("force_full_load") is True
        assert not (dit.high.is_resident() and dit.low.is_resident()), "both experts resident at once"
        loads.append([m.model.name for m in models])

    monkeypatch.setattr(mm, "load_models_gpu", recording_load)
    camera, _, _ = LingBotWorldCamera.execute("preset", "dolly_in", 1.0, model_files.NO_FILE, model_files.NO_FILE, W, H, FRAMES)
    ticks = []
    comfy.utils.set_progress_bar_global_hook(lambda value, total, preview, node_id=None: ticks.append((value, total)))
    out = run_sampler(dit, text, i2v, camera, steps=3)
    latent = out["samples"]
    assert tuple(latent.shape) == (1, 16, 2, H // 8, W // 8) and latent.dtype == torch.float32
    assert torch.isfinite(latent).all()
    # Every step on 0.3.x; newer hosts throttle plain progress but keep the first and last.
    assert ticks[0] == (1, 3) and ticks[-1] == (3, 3) and ticks == sorted(set(ticks))
    assert loads == [["high"], ["low"]]  # boundary 0.9 with shift 4: step 1 high, steps 2-3 low
    assert dit.high.expert is None and dit.low.expert is None
    assert not any(m is dit.high or m is dit.low for m in mm.loaded_models())
    # The same seed gives the same latent; the camera changes it.
    torch.testing.assert_close(run_sampler(dit, text, i2v, camera, steps=3)["samples"], latent)
    without = run_sampler(dit, text, i2v, None, steps=3)["samples"]
    assert not torch.allclose(without, latent)


def test_sampler_takes_core_conditioning_instead_of_text(installed):
    text, i2v, dit = encode_prompt(), encode_start(), load_dit()
    core = {"positive": core_conditioning(text.positive), "negative": core_conditioning(text.negative, mask=True)}
    by_text = run_sampler(dit, text, i2v, steps=2)["samples"]
    torch.testing.assert_close(run_sampler(dit, None, i2v, steps=2, **core)["samples"], by_text)
    with pytest.raises(ValueError, match="both connected"):
        run_sampler(dit, text, i2v, steps=2, **core)
    with pytest.raises(ValueError, match="no prompt"):
        run_sampler(dit, None, i2v, steps=2)
    with pytest.raises(ValueError, match="negative: connect"):
        run_sampler(dit, None, i2v, steps=2, positive=core["positive"])
    with pytest.raises(ValueError, match="positive: connect"):
        run_sampler(dit, None, i2v, steps=2, negative=core["negative"])
    with pytest.raises(ValueError, match="features per token but the DiT takes 32"):
        run_sampler(dit, None, i2v, steps=2, positive=core_conditioning(torch.randn(4, 4096)),
                negative=core_conditioning(torch.randn(4, 4096)))
    assert dit.high.expert is None and dit.low.expert is None


def test_sampler_sends_a_latent_preview_every_step(installed, monkeypatch):
    from comfy.cli_args import LatentPreviewMethod

    monkeypatch.setattr(latent_preview.args, "preview_method", LatentPreviewMethod.Latent2RGB)
    text, i2v, dit = encode_prompt(), encode_start(), load_dit()
    previews = []
    comfy.utils.set_progress_bar_global_hook(
        lambda value, total, preview, node_id=None: previews.append((value, total, preview)))
    run_sampler(dit, text, i2v, steps=3)
    assert [(v, t) for v, t, _ in previews] == [(1, 3), (2, 3), (3, 3)]
    for _, _, preview in previews:
        kind, image, max_size = preview
        assert kind == "JPEG" and image.size == (W // 8, H // 8) and max_size > 0
    monkeypatch.setattr(latent_preview.args, "preview_method", LatentPreviewMethod.NoPreviews)
    previews.clear()
    run_sampler(dit, text, i2v, steps=2)
    assert [p for _, _, p in previews] == [None, None]


def test_sampler_rejects_a_camera_of_another_size(installed):
    text, i2v, dit = encode_prompt(), encode_start(), load_dit()
    camera, _, _ = LingBotWorldCamera.execute("preset", "static", 1.0, model_files.NO_FILE, model_files.NO_FILE, 64, H, FRAMES)
    with pytest.raises(ValueError, match=r"camera is for 5 frames at 64x32 .* 5 frames at 48x32"):
        run_sampler(dit, text, i2v, camera)
    assert dit.high.expert is None


def test_sampler_interrupt_propagates_and_drops_the_expert(installed):
    text, i2v, dit = encode_prompt(), encode_start(), load_dit()
    calls = []

    def hook(value, total, preview, node_id=None):
        calls.append(value)
        mm.interrupt_current_processing(True)  # the user presses Cancel after step 1

    comfy.utils.set_progress_bar_global_hook(hook)
    with pytest.raises(mm.InterruptProcessingException):
        run_sampler(dit, text, i2v, steps=4)
    assert calls == [1]
    assert dit.high.expert is None and dit.low.expert is None
    assert not mm.processing_interrupted()  # consumed by the raise, as ComfyUI expects


# --------------------------------------------------------------------------- fast-mode inputs


OLD_WIDGETS = ["steps", "shift", "cfg_high", "cfg_low", "boundary", "seed", "sampler"]

FAST_WIDGETS = ["cache_threshold", "cfg_truncate", "attention", "preset"]

STATS = re.compile(r"(\d+) of (\d+) forwards computed over (\d+) steps \((\d+) skipped by the step cache, "
                   r"(\d+) dropped by CFG truncation")


def _inputs():
    return encode_prompt(), encode_start(), load_dit()


def _latent(dit, text, i2v, steps=3, seed=1, **fast) -> torch.Tensor:
    return run_sampler(dit, text, i2v, steps=steps, seed=seed, **fast)["samples"]


def _stats(caplog) -> tuple[int, ...]:
    lines = [r.getMessage() for r in caplog.records if "forwards computed" in r.getMessage()]
    assert lines, "the sampler logged no forwards line"
    return tuple(int(v) for v in STATS.search(lines[-1]).groups())


def test_fast_inputs_are_optional_widgets_after_the_old_ones():
    schema = LingBotWorldSampler.INPUT_TYPES()
    assert list(schema["required"])[2:] == OLD_WIDGETS  # where saved workflows have their values
    assert list(schema["optional"])[-len(FAST_WIDGETS):] == FAST_WIDGETS
    opt = schema["optional"]
    assert opt["cache_threshold"][0] == "FLOAT" and {k: opt["cache_threshold"][1][k] for k in
                                                     ("default", "min", "max", "step")} == \
        {"default": 0.0, "min": 0.0, "max": 1.0, "step": 0.005}
    assert {k: opt["cfg_truncate"][1][k] for k in ("default", "min", "max", "step")} == \
        {"default": 0.0, "min": 0.0, "max": 1.0, "step": 0.05}
    combos = {k: (opt[k][1]["options"], opt[k][1]["default"]) for k in ("attention", "preset")}
    assert combos == {"attention": (["auto", "sdpa", "flash", "flash_fp8", "sage"], "auto"),
                      "preset": (["none", "lightning_4step", "official_act2cam", "official_act"], "none")}
    assert "EasyCache" in opt["cache_threshold"][1]["tooltip"] and "0.05" in opt["cache_threshold"][1]["tooltip"]


def test_all_off_is_the_old_sampler_bit_for_bit(installed):
    text, i2v, dit = _inputs()
    # What the node ran before these inputs existed: the process-default attention, no policy options.
    source = ComfyExpertSource(dit, inference_memory=0)
    try:
        old = sample(source, text, i2v, None, SamplingParams(steps=3, shift=5.0, cfg_high=5.0, cfg_low=4.0,
                                                             boundary=0.9, seed=1, sampler="unipc"))
    finally:
        source.close()
    old = to_comfy_latent(old)[None]
    assert torch.equal(_latent(dit, text, i2v), old)  # an API graph without the new inputs
    assert torch.equal(_latent(dit, text, i2v, cache_threshold=0.0, cfg_truncate=0.0, attention="auto",
                               preset="none"), old)
    assert torch.equal(_latent(dit, text, i2v, attention="sdpa"), old)
    assert not_resident(dit)


# Optional attention kernels as their modules: FlashAttention 3 (either package), flash-attn 2
# and SageAttention. A test "installs" one by putting a stand-in module in sys.modules and
# removes one by putting None there (import fails, find_spec says absent).
_KERNEL_MODULES = {"fa3": ("flash_attn_interface", "fa3_fwd_interface"), "fa2": ("flash_attn",),
                   "sage": ("sageattention",)}


def _install_kernels(monkeypatch, kernels: set[str]) -> None:
    import importlib.machinery
    import sys
    import types

    for kernel, names in _KERNEL_MODULES.items():
        for name in names:
            module = None
            if kernel in kernels:
                module = types.ModuleType(name)
                module.__spec__ = importlib.machinery.ModuleSpec(name, None)
                module.flash_attn_func = module.sageattn = lambda q, k, v, **kw: q
            monkeypatch.setitem(sys.modules, name, module)


class _Stop(Exception):
    """Ends a run at its attention scope, once the scope's outcomes are read."""


def _outcomes_at_the_scope(monkeypatch, module, capabilities) -> dict:
    """Patch ``module``'s ``attention_backend`` (the scope a run attends in): the first scope a run
    opens records, for each GPU compute capability, the backend attention picks on cuda:0 in it
    (or "refused"), and stops the run."""
    scope, seen = attn.attention_backend, {}  # what both modules import
    capability = {"now": None}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: capability["now"])

    def recording(name):
        for capability["now"] in capabilities:
            attn.reset_backend_choice()
            with scope(name):
                try:
                    seen[capability["now"]] = attn.backend_name(torch.device("cuda", 0))
                except (RuntimeError, ValueError):
                    seen[capability["now"]] = "refused"
        raise _Stop
    monkeypatch.setattr(module, "attention_backend", recording)
    return seen


# GPU generations: A100, RTX 30, RTX 40, H100, RTX 50.
CAPABILITIES = ((8, 0), (8, 6), (8, 9), (9, 0), (12, 0))
INSTALLS = [set(), {"fa2"}, {"fa3"}, {"sage"}, {"fa2", "sage"}, {"fa3", "sage"}]


def _rule(env: str | None, installed: set[str], capability: tuple[int, int]) -> str:
    """The documented rule of ``auto`` (wan/runtime/attention.py auto_backend and decide)."""
    if env is not None:
        runs = {"sdpa": True, "sage": "sage" in installed and capability >= (8, 0),
                "flash": bool({"fa3", "fa2"} & installed) and capability >= (8, 0)}[env]
        return env if runs else "refused"
    if "fa3" in installed and capability == (9, 0):
        return "flash"
    if "sage" in installed and capability in ((8, 6), (8, 9)):
        return "sage"
    if "fa2" in installed and capability < (9, 0):
        return "flash"
    return "sdpa"


def test_base_and_fast_auto_attention_pick_the_same_kernel(fast_installed, monkeypatch):
    """The Dual-Expert Sampler's and the Fast nodes' (Fast DiT Loader's) attention ``auto`` pick
    the same kernel on every GPU generation under each install of the optional kernels and each
    LINGBOT_ATTENTION: the one rule of wan/runtime/attention.py."""
    from comfyui_lingbot_world.nodes.fast_dit_loader import LingBotWorldFastDiTLoader
    from comfyui_lingbot_world.pipeline import sampling
    from comfyui_lingbot_world.pipeline.fast import generator
    from node_runs import FAST, run_fast_sampler

    text, i2v, dit = _inputs()
    fast = LingBotWorldFastDiTLoader.execute(FAST, "none", 0, attention="auto").args[0]
    fast_i2v = encode_start(9)
    try:
        for env, installed in itertools.product((None, "sdpa", "sage", "flash"), INSTALLS):
            if env is None:
                monkeypatch.delenv(switches.ATTENTION.name, raising=False)
            else:
                monkeypatch.setenv(switches.ATTENTION.name, env)
            _install_kernels(monkeypatch, installed)
            base = _outcomes_at_the_scope(monkeypatch, sampling, CAPABILITIES)
            with pytest.raises(_Stop):
                _latent(dit, text, i2v, attention="auto")
            fast_seen = _outcomes_at_the_scope(monkeypatch, generator, CAPABILITIES)
            with pytest.raises(_Stop):
                run_fast_sampler(fast, text, fast_i2v)
            expected = {capability: _rule(env, installed, capability) for capability in CAPABILITIES}
            assert base == fast_seen == expected, (env, sorted(installed), base, fast_seen)
    finally:
        attn.reset_backend_choice()
    assert not_resident(dit)


def test_cache_and_cfg_truncation_compute_fewer_forwards(installed, caplog):
    text, i2v, dit = _inputs()
    caplog.set_level(logging.INFO, logger=sampler_module.__name__)
    exact = _latent(dit, text, i2v, steps=12)
    computed, total, steps, skipped, truncated = _stats(caplog)
    assert (computed, total, steps, skipped, truncated) == (24, 24, 12, 0, 0)

    ticks = []
    comfy.utils.set_progress_bar_global_hook(lambda value, t, preview, node_id=None: ticks.append((value, t)))
    fast = _latent(dit, text, i2v, steps=12, cache_threshold=0.05, cfg_truncate=0.2)
    computed, total, steps, skipped, truncated = _stats(caplog)
    assert total == 24 and steps == 12
    assert truncated == 2  # floor(0.2 * 12) last steps without the negative pass
    assert computed == total - skipped - truncated and computed < total
    assert ticks[-1] == (12, 12)
    assert torch.isfinite(fast).all() and not torch.equal(fast, exact)
    rel = float((fast - exact).norm() / exact.norm())
    assert rel < 0.5, rel  # close to the exact run, not a different video
    assert not_resident(dit)

    truncated_only = _latent(dit, text, i2v, steps=12, cfg_truncate=0.5)
    assert _stats(caplog)[:5] == (18, 24, 12, 0, 6)
    assert not torch.equal(truncated_only, exact)


def test_lightning_preset_overrides_the_schedule(installed, caplog):
    text, i2v, dit = _inputs()
    caplog.set_level(logging.INFO, logger=sampler_module.__name__)
    ticks = []
    comfy.utils.set_progress_bar_global_hook(lambda value, t, preview, node_id=None: ticks.append((value, t)))
    latent = _latent(dit, text, i2v, steps=40, cache_threshold=0.05, preset="lightning_4step")
    assert ticks[-1] == (4, 4)
    assert _stats(caplog) == (4, 4, 4, 0, 0)  # 4 steps at cfg 1: one forward each, caching off
    assert torch.isfinite(latent).all()


def test_bad_fast_inputs_name_the_input(installed):
    text, i2v, dit = _inputs()
    for fast, field in (({"attention": "xformers"}, "attention"), ({"preset": "turbo"}, "preset"),
                        ({"cache_threshold": 1.5}, "cache_threshold"), ({"cfg_truncate": -0.1}, "cfg_truncate")):
        with pytest.raises(ValueError, match=f"^{field}: "):
            _latent(dit, text, i2v, **fast)
    assert not_resident(dit)


# --------------------------------------------------------------------------- Base-Cam or Act


def _act_files(installed, frames=FRAMES):
    import numpy as np

    from comfyui_lingbot_world.wan.act_control import wasd_from_actions
    from comfyui_lingbot_world.wan.camera_presets import preset_trajectory

    folder = installed["input"] / "act"
    folder.mkdir()
    poses, k = preset_trajectory("orbit_left", frames)
    np.save(folder / "poses.npy", poses)
    np.save(folder / "intrinsics.npy", k)
    np.save(folder / "action.npy", wasd_from_actions("w-2,d-3", frames))
    return LingBotWorldCamera.execute("act_files", "static", 1.0, "act/poses.npy", "act/intrinsics.npy", W, H,
                                      FRAMES)[0]


def test_the_act_checkpoint_follows_action_strings_and_act_files(installed_act, monkeypatch):
    from comfyui_lingbot_world.wan.act_control import act_control_from_actions

    text, i2v, dit = encode_prompt(), encode_start(), load_dit(ACT_PKG)
    seen = []
    real_sample = sampler_module.sample

    def spying_sample(experts, text, condition, camera, *args, **kwargs):
        seen.append(camera)
        return real_sample(experts, text, condition, camera, *args, **kwargs)

    monkeypatch.setattr(sampler_module, "sample", spying_sample)
    # An action string: the Camera node builds the Base-Cam camera, the sampler rebuilds it as Act.
    strings = LingBotWorldCamera.execute("actions", "static", 1.0, model_files.NO_FILE, model_files.NO_FILE, W, H,
                                         FRAMES, "w-2,aj-2")[0]
    assert strings.control_type == "cam" and strings.plucker.shape[1] == 384
    walked = run_sampler(dit, text, i2v, strings, steps=2)["samples"]
    assert seen[-1].control_type == "act"
    torch.testing.assert_close(seen[-1].plucker, act_control_from_actions("w-2,aj-2", FRAMES, H, W), rtol=0, atol=0)
    from_files = run_sampler(dit, text, i2v, _act_files(installed_act), steps=2)["samples"]
    assert seen[-1].control_type == "act" and seen[-1].plucker.shape[1] == 448
    assert torch.isfinite(walked).all() and torch.isfinite(from_files).all()
    assert not torch.allclose(walked, from_files)
    assert not_resident(dit)


def test_the_wrong_pairing_is_refused_naming_both_before_any_expert_loads(installed_act, monkeypatch):
    text, i2v = encode_prompt(), encode_start()

    def no_load(*args, **kwargs):
        raise AssertionError("an expert was loaded")

    monkeypatch.setattr(mm, "load_models_gpu", no_load)
    act_camera = _act_files(installed_act)
    with pytest.raises(ValueError, match=r"DiT Loader's checkpoint \(high_noise pkg/high_noise_model_bnb_nf4\) is a "
                                         r"Base-Cam checkpoint .* but the camera \(poses\.npy/intrinsics\.npy/"
                                         r"action\.npy\) gives Act controls .*robbyant/lingbot-world-base-act"):
        run_sampler(load_dit(), text, i2v, act_camera)
    preset = LingBotWorldCamera.execute("preset", "dolly_in", 1.0, model_files.NO_FILE, model_files.NO_FILE, W, H,
                                        FRAMES)[0]
    with pytest.raises(ValueError, match=r"\(high_noise act/high_noise_model_bnb_nf4\) is an Act checkpoint .* but "
                                         r"the camera \(preset 'dolly_in'\) gives Base-Cam Plücker rays, "
                                         r"without keys"):
        run_sampler(load_dit(ACT_PKG), text, i2v, preset)
