"""Fast mode in the node layer: the sampler's cache/CFG/attention/preset inputs and the
LoRA Loader node, inside the real ComfyUI host on the CPU with the tiny package."""
from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from comfy_host import comfy_state_reset, use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
import comfy.model_management as mm  # noqa: E402
import comfy.utils  # noqa: E402
import folder_paths  # noqa: E402

import tiny_package  # noqa: E402
from synthetic_lora import write_kohya_lora  # noqa: E402
from comfyui_lingbot_world import nodes as pack_nodes  # noqa: E402
from comfyui_lingbot_world.loaders.errors import CheckpointError  # noqa: E402
from comfyui_lingbot_world.nodes import sampler as sampler_module  # noqa: E402
from comfyui_lingbot_world.nodes.dit_loader import LingBotWorldDiTLoader  # noqa: E402
from comfyui_lingbot_world.nodes.expert_patcher import ComfyExpertSource, DiTExperts  # noqa: E402
from comfyui_lingbot_world.nodes.lora_loader import LingBotWorldLoraLoader  # noqa: E402
from comfyui_lingbot_world.nodes.sampler import LingBotWorldSampler, attention_choice  # noqa: E402
from comfyui_lingbot_world.nodes.text_encode import LingBotWorldTextEncode  # noqa: E402
from comfyui_lingbot_world.nodes.vae import LingBotWorldVAEEncode  # noqa: E402
from comfyui_lingbot_world.pipeline.latent import to_comfy_latent  # noqa: E402
from comfyui_lingbot_world.pipeline.lora import LoraSpec  # noqa: E402
from comfyui_lingbot_world.pipeline.sampling import SamplingParams, sample  # noqa: E402
from comfyui_lingbot_world.wan.runtime import attention as attn  # noqa: E402

H, W, FRAMES = 32, 48, 5
PKG = "lingbot/pkg"
HIGH, LOW = f"{PKG}/high_noise_model_bnb_nf4", f"{PKG}/low_noise_model_bnb_nf4"
OLD_WIDGETS = ["steps", "shift", "cfg_high", "cfg_low", "boundary", "seed", "sampler"]
FAST_WIDGETS = ["cache_threshold", "cfg_truncate", "attention", "preset"]
STATS = re.compile(r"(\d+) of (\d+) forwards computed over (\d+) steps \((\d+) skipped by the step cache, "
                   r"(\d+) dropped by CFG truncation")


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    return tiny_package.build(tmp_path_factory.mktemp("lingbot_pkg"), "nf4")


@pytest.fixture
def installed(tmp_path, monkeypatch, package) -> dict[str, Path]:
    """The tiny package as models/lingbot/pkg, an empty models/loras, fresh user folder."""
    dirs = {kind: tmp_path / "models" / kind for kind in ("lingbot", "text_encoders", "vae", "diffusion_models",
                                                          "loras")}
    for kind, path in dirs.items():
        path.mkdir(parents=True)
        monkeypatch.setitem(folder_paths.folder_names_and_paths, kind,
                            ([str(path)], set(folder_paths.supported_pt_extensions)))
    dirs["user"] = tmp_path / "user"
    dirs["user"].mkdir()
    monkeypatch.setattr(folder_paths, "user_directory", str(dirs["user"]))
    (dirs["lingbot"] / "pkg").symlink_to(package, target_is_directory=True)
    dirs["package"] = package
    return dirs


clean_comfy_state = pytest.fixture(autouse=True)(comfy_state_reset)


def _inputs():
    text = LingBotWorldTextEncode.execute(f"{PKG}/models_t5_umt5-xxl-enc-bf16.pth", f"{PKG}/tokenizer",
                                          "a castle in the clouds", "blurry", "auto")[0]
    image = torch.from_numpy(np.random.default_rng(0).random((1, 40, 60, 3), dtype=np.float32))
    i2v = LingBotWorldVAEEncode.execute(image, f"{PKG}/Wan2.1_VAE.pth", W, H, FRAMES, "auto")[0]
    dit = LingBotWorldDiTLoader.execute(HIGH, LOW, "none")[0]
    return text, i2v, dit


def _sample(dit, text, i2v, steps=3, seed=1, **fast) -> torch.Tensor:
    return LingBotWorldSampler.execute(dit, i2v, steps, 5.0, 5.0, 4.0, 0.9, seed, "unipc", text=text,
                                       **fast)[0]["samples"]


def _stats(caplog) -> tuple[int, ...]:
    lines = [r.getMessage() for r in caplog.records if "forwards computed" in r.getMessage()]
    assert lines, "the sampler logged no forwards line"
    return tuple(int(v) for v in STATS.search(lines[-1]).groups())


def _not_resident(dit: DiTExperts) -> bool:
    return dit.high.expert is None and dit.low.expert is None and \
        not any(m is dit.high or m is dit.low for m in mm.loaded_models())


# --------------------------------------------------------------------------- sampler inputs


def test_fast_inputs_are_optional_widgets_after_the_old_ones():
    schema = LingBotWorldSampler.INPUT_TYPES()
    assert list(schema["required"]) == ["dit", "i2v", *OLD_WIDGETS]
    assert list(schema["optional"]) == ["text", "camera", "positive", "negative", *FAST_WIDGETS]
    opt = schema["optional"]
    assert opt["cache_threshold"][0] == "FLOAT" and {k: opt["cache_threshold"][1][k] for k in
                                                     ("default", "min", "max", "step")} == \
        {"default": 0.0, "min": 0.0, "max": 1.0, "step": 0.005}
    assert {k: opt["cfg_truncate"][1][k] for k in ("default", "min", "max", "step")} == \
        {"default": 0.0, "min": 0.0, "max": 1.0, "step": 0.05}
    combos = {k: (opt[k][1]["options"], opt[k][1]["default"]) for k in ("attention", "preset")}
    assert combos == {"attention": (["auto", "sdpa", "flash", "sage"], "auto"),
                      "preset": (["none", "lightning_4step"], "none")}
    assert "EasyCache" in opt["cache_threshold"][1]["tooltip"] and "0.05" in opt["cache_threshold"][1]["tooltip"]


def test_all_off_is_the_old_sampler_bit_for_bit(installed):
    text, i2v, dit = _inputs()
    # What the node ran before these inputs existed: the process-default attention, no policy options.
    source = ComfyExpertSource(dit, inference_memory=0)
    try:
        old = sample(source, text, i2v, None, SamplingParams(steps=3, shift=5.0, guide_high=5.0, guide_low=4.0,
                                                             boundary=0.9, seed=1, sampler="unipc"))
    finally:
        source.close()
    old = to_comfy_latent(old)[None]
    assert torch.equal(_sample(dit, text, i2v), old)  # an API graph without the new inputs
    assert torch.equal(_sample(dit, text, i2v, cache_threshold=0.0, cfg_truncate=0.0, attention="auto",
                               preset="none"), old)
    assert torch.equal(_sample(dit, text, i2v, attention="sdpa"), old)
    assert _not_resident(dit)


def test_auto_attention_without_sageattention_is_sdpa(monkeypatch):
    monkeypatch.delenv(attn.ENV_VAR, raising=False)
    monkeypatch.setattr(sampler_module, "sage_installed", lambda: False)
    monkeypatch.setitem(attn._LOADERS, "sage", lambda: None)  # sageattention not installed
    attn.reset_backend_choice()
    try:
        assert attention_choice("auto") is None  # the process default, as before the input existed
        with attn.attention_backend(attention_choice("auto")):
            assert attn.backend_name("cpu") == "sdpa"
        monkeypatch.setattr(sampler_module, "sage_installed", lambda: True)
        assert attention_choice("auto") == "auto"  # then the per-run pick by GPU
        with attn.attention_backend(attention_choice("auto")):
            assert attn.backend_name("cpu") == "sdpa"
        for capability in ((8, 6), (8, 9), (9, 0), (8, 0)):  # RTX 30, RTX 40, H100, A100
            assert attn.auto_backend(capability, sage_installed=False) == "sdpa"
        assert attn.auto_backend((8, 9), sage_installed=True) == "sage"
        assert attn.auto_backend((9, 0), sage_installed=True) == "sdpa"
        # A backend forced for the whole process stays in charge under auto.
        monkeypatch.setenv(attn.ENV_VAR, "sdpa")
        assert attention_choice("auto") is None and attention_choice("sdpa") == "sdpa"
    finally:
        attn.reset_backend_choice()
    with pytest.raises(ValueError, match="attention: 'xformers'"):
        attention_choice("xformers")


def test_cache_and_cfg_truncation_compute_fewer_forwards(installed, caplog):
    text, i2v, dit = _inputs()
    caplog.set_level(logging.INFO, logger=sampler_module.__name__)
    exact = _sample(dit, text, i2v, steps=12)
    computed, total, steps, skipped, truncated = _stats(caplog)
    assert (computed, total, steps, skipped, truncated) == (24, 24, 12, 0, 0)

    ticks = []
    comfy.utils.set_progress_bar_global_hook(lambda value, t, preview, node_id=None: ticks.append((value, t)))
    fast = _sample(dit, text, i2v, steps=12, cache_threshold=0.05, cfg_truncate=0.2)
    computed, total, steps, skipped, truncated = _stats(caplog)
    assert total == 24 and steps == 12
    assert truncated == 2  # floor(0.2 * 12) last steps without the negative pass
    assert computed == total - skipped - truncated and computed < total
    assert ticks[-1] == (12, 12)
    assert torch.isfinite(fast).all() and not torch.equal(fast, exact)
    rel = float((fast - exact).norm() / exact.norm())
    assert rel < 0.5, rel  # close to the exact run, not a different video
    assert _not_resident(dit)

    truncated_only = _sample(dit, text, i2v, steps=12, cfg_truncate=0.5)
    assert _stats(caplog)[:5] == (18, 24, 12, 0, 6)
    assert not torch.equal(truncated_only, exact)


def test_lightning_preset_overrides_the_schedule(installed, caplog):
    text, i2v, dit = _inputs()
    caplog.set_level(logging.INFO, logger=sampler_module.__name__)
    ticks = []
    comfy.utils.set_progress_bar_global_hook(lambda value, t, preview, node_id=None: ticks.append((value, t)))
    latent = _sample(dit, text, i2v, steps=40, cache_threshold=0.05, preset="lightning_4step")
    assert ticks[-1] == (4, 4)
    assert _stats(caplog) == (4, 4, 4, 0, 0)  # 4 steps at cfg 1: one forward each, caching off
    assert torch.isfinite(latent).all()


def test_bad_fast_inputs_name_the_input(installed):
    text, i2v, dit = _inputs()
    for fast, field in (({"attention": "xformers"}, "attention"), ({"preset": "turbo"}, "preset"),
                        ({"cache_threshold": 1.5}, "cache_threshold"), ({"cfg_truncate": -0.1}, "cfg_truncate")):
        with pytest.raises(ValueError, match=f"^{field}: "):
            _sample(dit, text, i2v, **fast)
    assert _not_resident(dit)


# --------------------------------------------------------------------------- LoRA loader


def test_lora_loader_schema_and_registration(installed):
    assert pack_nodes.NODE_CLASS_MAPPINGS["LingBotWorldLoraLoader"] is LingBotWorldLoraLoader
    assert pack_nodes.NODE_DISPLAY_NAME_MAPPINGS["LingBotWorldLoraLoader"] == "LingBot-World LoRA Loader"
    write_kohya_lora(installed["loras"] / "wan" / "style_high.safetensors", installed["package"] / "high_noise_model_bnb_nf4")
    schema = LingBotWorldLoraLoader.INPUT_TYPES()
    assert list(schema["required"]) == ["dit", "lora_high_noise", "strength_high", "lora_low_noise", "strength_low"]
    assert schema["required"]["dit"][0] == "LINGBOT_DIT"
    for key in ("lora_high_noise", "lora_low_noise"):
        assert schema["required"][key][1]["options"] == ["none", "wan/style_high.safetensors"]
        assert schema["required"][key][1]["default"] == "none"
    for key in ("strength_high", "strength_low"):
        spec = schema["required"][key][1]
        assert (spec["default"], spec["min"], spec["max"], spec["step"]) == (1.0, -4.0, 4.0, 0.05)
    schema = LingBotWorldLoraLoader.GET_SCHEMA()
    assert schema.category == "LingBot-World" and [o.get_io_type() for o in schema.outputs] == ["LINGBOT_DIT"]
    assert LingBotWorldLoraLoader.validate_inputs("none", "wan/style_high.safetensors") is True
    assert "lora_low_noise: 'gone.safetensors' is not offered" in \
        LingBotWorldLoraLoader.validate_inputs("none", "gone.safetensors")


def test_lora_loader_chains_and_keeps_the_experts(installed):
    high = write_kohya_lora(installed["loras"] / "a_high.safetensors", installed["package"] / "high_noise_model_bnb_nf4")
    low = write_kohya_lora(installed["loras"] / "a_low.safetensors", installed["package"] / "low_noise_model_bnb_nf4",
                           seed=1)
    dit = LingBotWorldDiTLoader.execute(HIGH, LOW, "none")[0]
    once = LingBotWorldLoraLoader.execute(dit, "a_high.safetensors", 0.5, "a_low.safetensors", 1.5)[0]
    assert once.loras == (LoraSpec(high, 0.5, 0.0), LoraSpec(low, 0.0, 1.5))
    assert once.high is dit.high and once.low is dit.low and once.config == dit.config
    assert dit.loras == ()  # the input is left as it was (ComfyUI may reuse it)
    twice = LingBotWorldLoraLoader.execute(once, "none", 1.0, "a_high.safetensors", -1.0)[0]
    assert twice.loras == once.loras + (LoraSpec(high, 0.0, -1.0),)
    assert LingBotWorldLoraLoader.execute(dit, "none", 1.0, "none", 1.0)[0].loras == ()
    with pytest.raises(ValueError, match="^lora_high_noise: LoRA file 'missing.safetensors' not found in models/loras"):
        LingBotWorldLoraLoader.execute(dit, "missing.safetensors", 1.0, "none", 1.0)
    with pytest.raises(ValueError, match="^strength_low: "):
        LingBotWorldLoraLoader.execute(dit, "none", 1.0, "none", 9.0)
    with pytest.raises(ValueError, match="^dit: "):
        LingBotWorldLoraLoader.execute("not a dit", "none", 1.0, "none", 1.0)


def test_sampler_applies_the_loras_and_leaves_the_experts_clean(installed):
    text, i2v, dit = _inputs()
    write_kohya_lora(installed["loras"] / "h.safetensors", installed["package"] / "high_noise_model_bnb_nf4")
    write_kohya_lora(installed["loras"] / "l.safetensors", installed["package"] / "low_noise_model_bnb_nf4", seed=3)
    plain = _sample(dit, text, i2v)
    zero = LingBotWorldLoraLoader.execute(dit, "h.safetensors", 0.0, "l.safetensors", 0.0)[0]
    assert torch.equal(_sample(zero, text, i2v), plain)  # strength 0: the expert as it was
    only_low = LingBotWorldLoraLoader.execute(dit, "none", 1.0, "l.safetensors", 1.0)[0]
    both = LingBotWorldLoraLoader.execute(dit, "h.safetensors", 1.0, "l.safetensors", 1.0)[0]
    with_low, with_both = _sample(only_low, text, i2v), _sample(both, text, i2v)
    assert torch.isfinite(with_both).all()
    assert not torch.equal(with_low, plain) and not torch.equal(with_both, with_low)
    assert _not_resident(dit)
    # Adapters are detached on release: the same experts sample the plain latent again.
    assert torch.equal(_sample(dit, text, i2v), plain)


def test_malformed_lora_fails_naming_file_and_key_and_releases_the_expert(installed):
    text, i2v, dit = _inputs()
    key = "lora_unet_blocks_0_ffn_0.lora_up.weight"
    bad = write_kohya_lora(installed["loras"] / "bad.safetensors", installed["package"] / "high_noise_model_bnb_nf4",
                           wrong_shape_key=key)
    broken = LingBotWorldLoraLoader.execute(dit, "bad.safetensors", 1.0, "none", 1.0)[0]
    with pytest.raises(CheckpointError) as error:
        _sample(broken, text, i2v)
    message = str(error.value)
    # issue 17: named relative to the loras folder, not by the server's absolute path
    assert message.startswith(f"loras/{bad.name}:") and "lora_unet_blocks_0_ffn_0" in message
    assert _not_resident(dit)
    assert torch.isfinite(_sample(dit, text, i2v)).all()  # the next run is clean
